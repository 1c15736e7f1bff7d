//! Response compression (#38 §1): which coding a client accepts ([`negotiate`], RFC 9110
//! §12.5.3), when a response must not be compressed ([`rules`]), what a compressed response's
//! head becomes ([`head`]) and the streaming encoder its body goes through ([`encode`]). The
//! decision and the head edits are made once, by the life-cycle driver
//! ([`crate::pipeline::drive`]), for both fronts; each front only runs the encoder over the
//! body it streams.

pub mod encode;
pub mod head;
pub mod negotiate;
pub mod rules;

pub use self::encode::{Encoder, Slot, Slots, MAX_ENCODERS_PER_WORKER};
pub use self::head::{decide, weak_etag, with_vary, Offer};
pub use self::negotiate::negotiate;
pub use self::rules::{encoded, may_compress, no_transform, ResponseView};
