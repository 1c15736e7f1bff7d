//! What the fuzz targets in `fuzz/` reach that the library otherwise keeps to itself: the HTTP/1
//! framing scanner and the RESP decoder. Not an API (hidden from the docs; the gateway never
//! goes through here), only a window onto the parsers exactly as the gateway runs them.

pub use crate::body_cost::json::{Found as JsonFound, JsonScan, MAX_DEPTH as JSON_MAX_DEPTH};
pub use crate::body_cost::sse::SseScan;
pub use crate::server::h1_scan::Scan as H1Scan;
pub use crate::store::redis::resp::{
    parse as resp_parse, Command as RespCommand, ProtocolError as RespError, Reply as RespReply,
};
