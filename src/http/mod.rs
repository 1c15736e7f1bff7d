//! HTTP as the gateway reads and writes it, whatever the front: the request head's read-only view,
//! the normalised path, the request id, the gateway's own response fields and a body's pacing.

pub mod fields;
pub mod head;
pub mod pacing;
pub mod path;
pub mod request_id;
