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
pub use crate::head::RequestHead;
pub use crate::rls::message::Call as RlsCall;
pub use tollgate_limit::fuzzing::{
    resp_parse, resp_parse_states, RespCommand, RespError, RespReply,
};

/// A `ShouldRateLimit` message decoded with Envoy's own generated type (whose strings must be
/// UTF-8), as the service's [`RlsCall`]; `None` when that decoder refuses it.
pub fn rls_decode_envoy(bytes: &[u8]) -> Option<RlsCall> {
    use prost::Message;
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest::decode(bytes)
        .ok()
        .map(|r| RlsCall::from(&r))
}

/// Envoy's quota service's (RLQS) report, decoded as the service decodes it (its strings as
/// bytes, [`crate::rls::rlqs_message`]) and with Envoy's generated type: whether the two agree
/// — every report Envoy's type decodes, ours decodes to the same domain, counts and bucket_id
/// maps (ours decodes more: values that are not UTF-8).
pub fn rlqs_decodes_alike(bytes: &[u8]) -> bool {
    use crate::rls::rlqs_message::Reports;
    use prost::Message;
    let ours = Reports::decode(bytes);
    let Ok(envoys) =
        envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports::decode(
            bytes,
        )
    else {
        return true;
    };
    let Ok(ours) = ours else {
        return false;
    };
    let theirs = Reports::from(&envoys);
    ours.domain == theirs.domain
        && ours.bucket_quota_usages.len() == theirs.bucket_quota_usages.len()
        && ours
            .bucket_quota_usages
            .iter()
            .zip(&theirs.bucket_quota_usages)
            .all(|(a, b)| {
                a.num_requests_allowed == b.num_requests_allowed
                    && a.num_requests_denied == b.num_requests_denied
                    && a.time_elapsed == b.time_elapsed
                    && a.bucket_id.as_ref().map(|i| i.map())
                        == b.bucket_id.as_ref().map(|i| i.map())
            })
}
