//! The rate limit service's message decoding (`rls::message::Call`: Envoy's `RateLimitRequest`
//! with its strings read as bytes) and the descriptor matching that reads it, on what any
//! client may send the `[rls]` listener. Envoy's quota reports (RLQS) are decoded too.
//!
//! Input: the message's bytes (the gRPC frame's payload).
//!
//! Properties:
//! - no message panics the decoder, the matching or the quota decoders; every quota report
//!   Envoy's generated type decodes, the service's (strings as bytes) decodes alike;
//! - every message Envoy's own generated type decodes, the service decodes to the same call
//!   (bytes for strings, nothing else different), and a message the service decodes whose
//!   strings are all UTF-8, Envoy's type decodes too: the two differ only on encoding;
//! - a decoded call encodes and decodes back to itself;
//! - matching a decoded call's descriptors (keys and values of any bytes) against a tree with
//!   values, wildcards and keys alone never panics, and a value that is not UTF-8 matches no
//!   exact configured value.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate::config::rls::RlsConfig;
use tollgate::config::rls_model::RawDomain;
use tollgate::fuzzing::{RlqsReports, RlsCall};
use tollgate::rls::Domains;

const YAML: &str = "\
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/*/x*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    value: a
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
";

fn domains() -> &'static Domains {
    static D: OnceLock<Domains> = OnceLock::new();
    D.get_or_init(|| {
        let raw: RawDomain = tollgate::rls::yaml::parse(YAML).expect("the tree parses");
        Domains::load(&RlsConfig {
            listen: "127.0.0.1:0".parse().expect("an address"),
            config_dir: None,
            ratelimit_headers: false,
            domains: vec![raw],
            quota: Vec::new(),
        })
        .expect("the tree compiles")
    })
}

/// A `ShouldRateLimit` message decoded with Envoy's own generated type (whose strings must be
/// UTF-8), as the service's [`RlsCall`]; `None` when that decoder refuses it.
fn rls_decode_envoy(bytes: &[u8]) -> Option<RlsCall> {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use tollgate::rls::message::{Descriptor, Entry, RateLimitOverride};
    use tollgate::rls::pb::UInt64Value;
    let r = RateLimitRequest::decode(bytes).ok()?;
    Some(RlsCall {
        domain: r.domain.into_bytes(),
        descriptors: r
            .descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key.into_bytes(),
                        value: e.value.into_bytes(),
                    })
                    .collect(),
                limit: d.limit.map(|l| RateLimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                hits_addend: d.hits_addend.map(|h| UInt64Value { value: h.value }),
            })
            .collect(),
        hits_addend: r.hits_addend,
    })
}

/// Envoy's quota service's (RLQS) report, decoded as the service decodes it (its strings as
/// bytes, `rls::rlqs_message`) and with Envoy's generated type: whether the two agree — every
/// report Envoy's type decodes, ours decodes to the same domain, counts and bucket_id maps (ours
/// decodes more: values that are not UTF-8).
fn rlqs_decodes_alike(bytes: &[u8]) -> bool {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
    let ours = RlqsReports::decode(bytes);
    let Ok(envoys) = RateLimitQuotaUsageReports::decode(bytes) else {
        return true;
    };
    let Ok(ours) = ours else {
        return false;
    };
    ours.domain == envoys.domain.as_bytes()
        && ours.bucket_quota_usages.len() == envoys.bucket_quota_usages.len()
        && ours
            .bucket_quota_usages
            .iter()
            .zip(&envoys.bucket_quota_usages)
            .all(|(a, b)| {
                a.num_requests_allowed == b.num_requests_allowed
                    && a.num_requests_denied == b.num_requests_denied
                    && a.time_elapsed.map(|d| (d.seconds, d.nanos))
                        == b.time_elapsed.map(|d| (d.seconds, d.nanos))
                    && a.bucket_id.as_ref().map(|i| i.map())
                        == b.bucket_id.as_ref().map(|i| {
                            i.bucket
                                .iter()
                                .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
                                .collect()
                        })
            })
}

fuzz_target!(|data: &[u8]| {
    assert!(
        rlqs_decodes_alike(data),
        "a report Envoy's type decodes, decoded otherwise"
    );
    let ours = RlsCall::decode(data);
    if let Some(envoys) = rls_decode_envoy(data) {
        assert_eq!(ours.as_ref().ok(), Some(&envoys), "Envoy's type decodes it");
    }
    let Ok(call) = ours else {
        return;
    };
    let utf8 = std::str::from_utf8(&call.domain).is_ok()
        && call.descriptors.iter().all(|d| {
            d.entries.iter().all(|e| {
                std::str::from_utf8(&e.key).is_ok() && std::str::from_utf8(&e.value).is_ok()
            })
        });
    let encoded = call.encode_to_vec();
    if utf8 {
        // Of the call as decoded, re-encoded: a field sent twice keeps its last value (protobuf),
        // and Envoy's type refuses the input when an earlier copy was not UTF-8 (prost checks
        // each), though what is decoded is UTF-8 all through.
        assert!(
            rls_decode_envoy(&encoded).is_some(),
            "all UTF-8, yet Envoy's type refuses it"
        );
    }
    let again = RlsCall::decode(encoded.as_slice()).expect("re-encoded decodes");
    assert_eq!(again, call);
    let Some(domain) = domains().get("d") else {
        return;
    };
    for d in call.descriptors.iter().take(64) {
        let Some(found) = domain.find(d.pairs()) else {
            continue;
        };
        let rule = found.rule;
        if rule.name.is_none() && &*rule.path == "user_vip" {
            let value = d.entries.first().map(|e| e.value.as_slice());
            assert_eq!(
                value,
                Some(&b"vip"[..]),
                "only `vip` matches the value `vip`"
            );
        }
    }
});
