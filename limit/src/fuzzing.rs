//! What the gateway's fuzz window (`tollgate::fuzzing`) reaches of this crate: the RESP decoder
//! exactly as a Redis lane runs it. Not an API (hidden from the docs).

pub use crate::store::redis::resp::{
    parse as resp_parse, Command as RespCommand, ProtocolError as RespError, Reply as RespReply,
};

/// The RESP decoder as a Redis lane runs it: an array's bulk strings are keys' states (the
/// decide script's runs reply), 4 integers each.
pub fn resp_parse_states(
    buf: &[u8],
    ints: &mut Vec<i64>,
) -> Result<Option<(RespReply, usize)>, RespError> {
    crate::store::redis::resp::parse_with(buf, ints, crate::store::redis::replay::raw_state)
}
