//! The quota service's (RLQS) messages as it decodes and sends them: Envoy's
//! `RateLimitQuotaUsageReports` and `RateLimitQuotaResponse` with the same fields and tags, but
//! the stream's `domain` and each `bucket_id` entry read as **bytes** (issue 50 §1, as
//! [`super::message`] does for `ShouldRateLimit`).
//!
//! A `bucket_id` is a protobuf `map<string, string>` that Envoy's `bucket_id_builder` fills
//! from the request (a header's value, as it came). A decoder built from Envoy's own types
//! refuses the whole message when one value is not UTF-8 — and with it the whole stream
//! (`INTERNAL`), so every bucket of that Envoy lost its assignments and fell to its fallback
//! behaviour (open by default), and the next report of the same bucket did it again. As bytes,
//! every message that is valid protobuf decodes: a value that is not UTF-8 matches no
//! configured `match` value (those are UTF-8) but a `"*"`, it is its own subject, and its
//! bucket_id is sent back in the assignment exactly as it came (Envoy finds its bucket by it).
//!
//! A map is encoded as repeated entry messages (key = 1, value = 2), which is what
//! [`BucketId::entries`] reads; a key repeated in one map takes its last value, as protobuf
//! decoders do ([`BucketId::map`]).

use std::collections::BTreeMap;

use super::pb::bucket_action::BucketAction as Action;
use super::pb::Duration as PbDuration;

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports`, its strings as bytes.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Reports {
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub bucket_quota_usages: Vec<Usage>,
}

/// `RateLimitQuotaUsageReports.BucketQuotaUsage`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Usage {
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<BucketId>,
    #[prost(message, optional, tag = "2")]
    pub time_elapsed: Option<PbDuration>,
    #[prost(uint64, tag = "3")]
    pub num_requests_allowed: u64,
    #[prost(uint64, tag = "4")]
    pub num_requests_denied: u64,
}

/// `envoy.service.rate_limit_quota.v3.BucketId`: its `map<string, string> bucket` as the
/// entries it is encoded as, in the order they came.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct BucketId {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<MapEntry>,
}

/// One entry of a protobuf map (`key` = 1, `value` = 2), as bytes.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct MapEntry {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

impl BucketId {
    /// The map: by key, the last value of a repeated key.
    pub fn map(&self) -> BTreeMap<&[u8], &[u8]> {
        self.entries
            .iter()
            .map(|e| (e.key.as_slice(), e.value.as_slice()))
            .collect()
    }

    /// A bucket_id of UTF-8 entries (what tests and Envoy's own types build).
    pub fn of<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> BucketId {
        BucketId {
            entries: entries
                .into_iter()
                .map(|(k, v)| MapEntry {
                    key: k.as_bytes().to_vec(),
                    value: v.as_bytes().to_vec(),
                })
                .collect(),
        }
    }
}

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(message, repeated, tag = "1")]
    pub bucket_action: Vec<BucketAction>,
}

/// `RateLimitQuotaResponse.BucketAction`: the bucket_id as it came, and Envoy's own action.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketAction {
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<BucketId>,
    #[prost(oneof = "super::pb::bucket_action::BucketAction", tags = "2, 3")]
    pub bucket_action: Option<Action>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId as PbBucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };
    use envoy_types::pb::google::protobuf::Duration as EnvoyDuration;
    use prost::Message;

    /// The same reports from Envoy's type (whose strings are UTF-8).
    fn reports_of(r: &RateLimitQuotaUsageReports) -> Reports {
        Reports {
            domain: r.domain.as_bytes().to_vec(),
            bucket_quota_usages: r
                .bucket_quota_usages
                .iter()
                .map(|u| Usage {
                    bucket_id: u.bucket_id.as_ref().map(|b| {
                        let mut entries: Vec<(&str, &str)> = b
                            .bucket
                            .iter()
                            .map(|(k, v)| (k.as_str(), v.as_str()))
                            .collect();
                        entries.sort_unstable();
                        BucketId::of(entries)
                    }),
                    time_elapsed: u.time_elapsed.map(|d| PbDuration {
                        seconds: d.seconds,
                        nanos: d.nanos,
                    }),
                    num_requests_allowed: u.num_requests_allowed,
                    num_requests_denied: u.num_requests_denied,
                })
                .collect(),
        }
    }

    fn envoys() -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(PbBucketId {
                    bucket: [("route".to_owned(), "api".to_owned())].into(),
                }),
                time_elapsed: Some(EnvoyDuration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 7,
                num_requests_denied: 2,
            }],
        }
    }

    #[test]
    fn envoys_encoding_decodes_to_the_same_reports_and_back() {
        let r = envoys();
        let ours = Reports::decode(r.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(ours, reports_of(&r));
        // Ours, encoded, is Envoy's message again; a response with our bucket_id is Envoy's.
        let back = RateLimitQuotaUsageReports::decode(ours.encode_to_vec().as_slice())
            .expect("Envoy's type decodes ours");
        assert_eq!(back, r);
        let reply = Response {
            bucket_action: vec![BucketAction {
                bucket_id: ours.bucket_quota_usages[0].bucket_id.clone(),
                bucket_action: None,
            }],
        };
        let envoy = RateLimitQuotaResponse::decode(reply.encode_to_vec().as_slice())
            .expect("Envoy's type decodes the reply");
        assert_eq!(
            envoy.bucket_action[0].bucket_id,
            r.bucket_quota_usages[0].bucket_id
        );
    }

    #[test]
    fn a_value_that_is_not_utf8_decodes_and_a_repeated_key_takes_its_last_value() {
        let r = Reports {
            domain: b"edge".to_vec(),
            bucket_quota_usages: vec![Usage {
                bucket_id: Some(BucketId {
                    entries: vec![
                        MapEntry {
                            key: b"tenant".to_vec(),
                            value: b"first".to_vec(),
                        },
                        MapEntry {
                            key: b"tenant".to_vec(),
                            value: b"caf\xe9".to_vec(),
                        },
                    ],
                }),
                ..Usage::default()
            }],
        };
        let bytes = r.encode_to_vec();
        // Envoy's own type refuses it: the defect this module removes.
        assert!(RateLimitQuotaUsageReports::decode(bytes.as_slice()).is_err());
        let ours = Reports::decode(bytes.as_slice()).expect("decodes");
        let id = ours.bucket_quota_usages[0]
            .bucket_id
            .as_ref()
            .expect("an id");
        assert_eq!(id.map().get(&b"tenant"[..]), Some(&&b"caf\xe9"[..]));
        assert_eq!(id.map().len(), 1);
    }
}
