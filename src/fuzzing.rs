//! What the fuzz targets in `fuzz/` reach that the library otherwise keeps to itself: the HTTP/1
//! framing scanner, the fast HTTP/1 front's head parser, chunked decoder and round trip
//! (`http1::roundtrip`), and the RESP decoder. Not an API (hidden from the docs; the gateway never
//! goes through here), only a window onto the parsers exactly as the gateway runs them.

pub use crate::body_cost::json::{Found as JsonFound, JsonScan, MAX_DEPTH as JSON_MAX_DEPTH};
pub use crate::body_cost::sse::SseScan;
pub use crate::front::http1::codec::{ChunkError, ChunkedDecoder};
pub use crate::front::http1::parse::{
    scan as h1_head_scan, BodyKind as H1BodyKind, Head as H1Head, Parsed as H1Parsed,
};
pub use crate::front::http1::roundtrip::{
    requests as h1_round_trip_requests, response as h1_round_trip_response, Decided as H1Decided,
    ResponseTrip as H1ResponseTrip, CLIENT as H1_ROUND_TRIP_CLIENT,
};
pub use crate::front::server::h1_scan::Scan as H1Scan;
pub use crate::http::head::RequestHead;
pub use crate::rls::message::Call as RlsCall;
pub use crate::rls::rlqs_message::Reports as RlqsReports;
pub use tollgate_limit::fuzzing::{
    resp_parse, resp_parse_states, RespCommand, RespError, RespReply,
};
