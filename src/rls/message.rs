//! `ShouldRateLimit`'s request as the service decodes it: Envoy's `RateLimitRequest` with the
//! same fields and tags, but the domain and each entry's key and value read as **bytes**.
//!
//! protobuf `string` fields must hold UTF-8, and a decoder built from Envoy's own types (prost,
//! as tonic's generated server uses) refuses the whole message when one does not — with
//! `INTERNAL`, before the service runs, and Envoy then applies its `failure_mode_deny`
//! (fail-open by default). Envoy forwards a request header's bytes as they came (`X-User:
//! caf\xe9`), so one byte let any client past every limit of the call. As bytes, every message
//! that is valid protobuf decodes, and the service decides on the bytes: a value that is not
//! UTF-8 can match no configured value (those are UTF-8, from YAML or TOML), but it matches a
//! descriptor with a key alone or a wildcard, and is its own subject.
//!
//! Fields the service does not read (tag 4 `is_negative_hits`, unknown ones) are skipped, as
//! protobuf decoders do.

use super::pb::UInt64Value;

/// `envoy.service.ratelimit.v3.RateLimitRequest`, its strings as bytes.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Call {
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<Descriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Descriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// Envoy's per-request override (not taken: the configured limit decides; counted).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.RateLimitOverride` (its `unit` an `envoy.type.v3.RateLimitUnit`).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `RateLimitDescriptor.Entry`, its key and value as bytes.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Entry {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

impl Descriptor {
    /// The entries as (key, value) byte slices.
    pub fn pairs(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> {
        self.entries
            .iter()
            .map(|e| (e.key.as_slice(), e.value.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as PbEntry, RateLimitOverride as PbOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::google::protobuf::UInt64Value as PbUInt64Value;
    use prost::Message;

    #[test]
    fn envoys_encoding_decodes_to_the_same_call() {
        let r = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![PbEntry {
                    key: "user".into(),
                    value: "café".into(),
                }],
                limit: Some(PbOverride {
                    requests_per_unit: 5,
                    unit: 2,
                }),
                hits_addend: Some(PbUInt64Value { value: 7 }),
                is_negative_hits: true,
            }],
            hits_addend: 3,
        };
        let call = Call::decode(r.encode_to_vec().as_slice()).expect("decodes");
        // Every field the service reads landed where Envoy put it (strings as bytes).
        let d = &call.descriptors[0];
        assert_eq!(
            (call.domain.as_slice(), call.hits_addend),
            (&b"edge"[..], 3)
        );
        assert_eq!(
            d.pairs().collect::<Vec<_>>(),
            vec![(&b"user"[..], "café".as_bytes())]
        );
        assert_eq!(
            d.limit,
            Some(RateLimitOverride {
                requests_per_unit: 5,
                unit: 2
            })
        );
        assert_eq!(d.hits_addend, Some(UInt64Value { value: 7 }));
        // And ours, encoded, is Envoy's message less what the service does not read.
        let mut read = r.clone();
        read.descriptors[0].is_negative_hits = false;
        assert_eq!(call.encode_to_vec(), read.encode_to_vec());
    }

    #[test]
    fn a_value_that_is_not_utf8_decodes() {
        let call = Call {
            domain: b"edge".to_vec(),
            descriptors: vec![Descriptor {
                entries: vec![Entry {
                    key: b"user".to_vec(),
                    value: b"caf\xe9".to_vec(),
                }],
                ..Descriptor::default()
            }],
            hits_addend: 0,
        };
        let bytes = call.encode_to_vec();
        // Envoy's own type refuses it: the defect this module removes.
        assert!(RateLimitRequest::decode(bytes.as_slice()).is_err());
        assert_eq!(Call::decode(bytes.as_slice()).expect("decodes"), call);
    }
}
