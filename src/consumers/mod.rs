//! API consumers: who is calling, found by the SHA-256 of their key, and their plan.
//!
//! `key` holds the hashing shared by the request path, the consumers file and `tollgate key`;
//! `table` loads the consumers file into a hash map probed once per request (no file access,
//! no scan); `request` reads a request's key and finds its consumer.

mod key;
mod request;
mod table;

pub use self::key::{hash_key, hex, new_key, parse_hex, KeyHash};
pub use self::request::{identify, strip_query_param, Identity};
pub use self::table::{Consumer, ConsumerTable, ConsumersFileError};
