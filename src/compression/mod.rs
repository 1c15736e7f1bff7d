//! Response compression (#38 §1), its front-neutral part: which coding a client accepts
//! ([`negotiate`], RFC 9110 §12.5.3) and when a response must not be compressed ([`rules`]).
//! Pure functions over header values, so both fronts (and the life-cycle driver that will run
//! the response phase once) share one rule. Not wired into a front yet; the streaming encoder
//! comes with that wiring.

pub mod negotiate;
pub mod rules;

pub use self::negotiate::{negotiate, Coding};
pub use self::rules::{may_compress, ResponseView};
