//! Envoy's messages the service **sends**, written with prost's derive: the fields it sets, with
//! Envoy's tags and types (`ratelimit.v3`'s `RateLimitResponse`, `rate_limit_quota.v3`'s
//! bucket actions, `type.v3`'s strategies, and the `google.protobuf` wrappers they carry).
//!
//! What the service reads is in [`super::message`] and [`super::rlqs_message`] (strings as
//! bytes). Together they are every message of both APIs the service touches, so the build does
//! not compile Envoy's whole generated API (`envoy-types`, a dependency of the tests only): a cold
//! release build is that much shorter (BENCHMARKS.md, stop 59). A field left out here is one the
//! service never sets; Envoy's decoders read its default, as they would of a message that omits
//! it. The tests check each message against Envoy's generated type both ways (encoded here,
//! decoded there to the same values, and back).

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `google.protobuf.UInt32Value`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct UInt32Value {
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `envoy.config.core.v3.HeaderValue` (its `raw_value`, tag 3, never set).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse` (never set: `request_headers_to_add` 4,
/// `raw_body` 5, `dynamic_metadata` 6, `quota` 7).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RateLimitResponse {
    #[prost(enumeration = "rate_limit_response::Code", tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<rate_limit_response::DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse`'s nested types.
pub mod rate_limit_response {
    /// `RateLimitResponse.Code`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Code {
        Unknown = 0,
        Ok = 1,
        OverLimit = 2,
    }

    /// `RateLimitResponse.RateLimit`.
    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct RateLimit {
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(uint32, tag = "1")]
        pub requests_per_unit: u32,
        #[prost(enumeration = "rate_limit::Unit", tag = "2")]
        pub unit: i32,
    }

    /// `RateLimitResponse.RateLimit`'s nested types.
    pub mod rate_limit {
        /// `RateLimitResponse.RateLimit.Unit` (`WEEK` is 7, after `YEAR`, as in Envoy's proto).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Unit {
            Unknown = 0,
            Second = 1,
            Minute = 2,
            Hour = 3,
            Day = 4,
            Week = 7,
            Month = 5,
            Year = 6,
        }
    }

    /// `RateLimitResponse.DescriptorStatus` (its `quota`, tag 5, never set).
    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct DescriptorStatus {
        #[prost(enumeration = "Code", tag = "1")]
        pub code: i32,
        #[prost(message, optional, tag = "2")]
        pub current_limit: Option<RateLimit>,
        #[prost(uint32, tag = "3")]
        pub limit_remaining: u32,
        #[prost(message, optional, tag = "4")]
        pub duration_until_reset: Option<super::Duration>,
    }
}

/// `envoy.type.v3.TokenBucket`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct TokenBucket {
    #[prost(uint32, tag = "1")]
    pub max_tokens: u32,
    #[prost(message, optional, tag = "2")]
    pub tokens_per_fill: Option<UInt32Value>,
    #[prost(message, optional, tag = "3")]
    pub fill_interval: Option<Duration>,
}

/// `envoy.type.v3.RateLimitStrategy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct RateLimitStrategy {
    #[prost(oneof = "rate_limit_strategy::Strategy", tags = "1, 3")]
    pub strategy: Option<rate_limit_strategy::Strategy>,
}

/// `RateLimitStrategy`'s nested types.
pub mod rate_limit_strategy {
    /// `RateLimitStrategy.BlanketRule`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum BlanketRule {
        AllowAll = 0,
        DenyAll = 1,
    }

    /// The `strategy` oneof (its `requests_per_time_unit`, tag 2, never sent: Envoy's filter
    /// does not enforce it).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Oneof)]
    pub enum Strategy {
        #[prost(enumeration = "BlanketRule", tag = "1")]
        BlanketRule(i32),
        #[prost(message, tag = "3")]
        TokenBucket(super::TokenBucket),
    }
}

/// `RateLimitQuotaResponse.BucketAction`'s actions (the message itself, whose `bucket_id` is
/// sent back as it came, is [`super::rlqs_message::BucketAction`]).
pub mod bucket_action {
    /// `BucketAction.QuotaAssignmentAction`.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
    pub struct QuotaAssignmentAction {
        #[prost(message, optional, tag = "2")]
        pub assignment_time_to_live: Option<super::Duration>,
        #[prost(message, optional, tag = "3")]
        pub rate_limit_strategy: Option<super::RateLimitStrategy>,
    }

    /// `BucketAction.AbandonAction`.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
    pub struct AbandonAction {}

    /// The `bucket_action` oneof.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Oneof)]
    pub enum BucketAction {
        #[prost(message, tag = "2")]
        QuotaAssignmentAction(QuotaAssignmentAction),
        #[prost(message, tag = "3")]
        AbandonAction(AbandonAction),
    }
}

#[cfg(test)]
mod tests {
    use super::bucket_action::{AbandonAction, BucketAction, QuotaAssignmentAction};
    use super::rate_limit_response::rate_limit::Unit;
    use super::rate_limit_response::{Code, DescriptorStatus, RateLimit};
    use super::rate_limit_strategy::{BlanketRule, Strategy};
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action as envoy_action;
    use envoy_types::pb::envoy::service::ratelimit::v3 as envoy_rls;
    use prost::Message;

    /// Every value `ours` holds, encoded here and decoded by Envoy's type `T`, encodes back to
    /// the same bytes (so no field was lost, renumbered or retyped), and decodes here to itself.
    fn same_in_envoys<M, T>(ours: &M) -> T
    where
        M: Message + Default + PartialEq + std::fmt::Debug,
        T: Message + Default,
    {
        let bytes = ours.encode_to_vec();
        let theirs = T::decode(bytes.as_slice()).expect("Envoy's type decodes ours");
        assert_eq!(
            theirs.encode_to_vec(),
            bytes,
            "Envoy's type re-encodes it alike"
        );
        assert_eq!(&M::decode(bytes.as_slice()).expect("decodes"), ours);
        theirs
    }

    fn status(code: Code, unit: Unit) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit {
                name: "per-user".into(),
                requests_per_unit: 3,
                unit: unit as i32,
            }),
            limit_remaining: 2,
            duration_until_reset: Some(Duration {
                seconds: 59,
                nanos: 500_000_000,
            }),
        }
    }

    #[test]
    fn the_should_rate_limit_reply_is_envoys() {
        let units = [
            Unit::Unknown,
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        let ours = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: units
                .iter()
                .enumerate()
                .map(|(i, u)| {
                    status(
                        if i % 2 == 0 {
                            Code::Ok
                        } else {
                            Code::OverLimit
                        },
                        *u,
                    )
                })
                .collect(),
            response_headers_to_add: vec![HeaderValue {
                key: "ratelimit".into(),
                value: "\"per-user\";r=2;t=60".into(),
            }],
        };
        let theirs: envoy_rls::RateLimitResponse = same_in_envoys(&ours);
        assert_eq!(
            theirs.overall_code,
            envoy_rls::rate_limit_response::Code::OverLimit as i32
        );
        let week = &theirs.statuses[5];
        assert_eq!(
            week.current_limit
                .as_ref()
                .map(|l| (l.name.as_str(), l.unit)),
            Some((
                "per-user",
                envoy_rls::rate_limit_response::rate_limit::Unit::Week as i32
            ))
        );
        assert_eq!(week.limit_remaining, 2);
        assert_eq!(week.duration_until_reset.map(|d| d.seconds), Some(59));
        assert_eq!(theirs.response_headers_to_add[0].key, "ratelimit");
        let ok = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        };
        let theirs: envoy_rls::RateLimitResponse = same_in_envoys(&ok);
        assert_eq!(
            theirs.overall_code,
            envoy_rls::rate_limit_response::Code::Ok as i32
        );
    }

    #[test]
    fn the_quota_services_actions_are_envoys() {
        let lease = TokenBucket {
            max_tokens: 40,
            tokens_per_fill: Some(UInt32Value { value: 7 }),
            fill_interval: Some(Duration {
                seconds: 1,
                nanos: 250,
            }),
        };
        for strategy in [
            Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Strategy::TokenBucket(lease),
        ] {
            let ours = QuotaAssignmentAction {
                assignment_time_to_live: Some(Duration {
                    seconds: 30,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            };
            let theirs: envoy_action::QuotaAssignmentAction = same_in_envoys(&ours);
            use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy as Theirs;
            let got = theirs.rate_limit_strategy.and_then(|s| s.strategy);
            match (strategy, got) {
                (Strategy::BlanketRule(a), Some(Theirs::BlanketRule(b))) => assert_eq!(a, b),
                (Strategy::TokenBucket(a), Some(Theirs::TokenBucket(b))) => {
                    assert_eq!(a.max_tokens, b.max_tokens);
                    assert_eq!(
                        a.tokens_per_fill.map(|v| v.value),
                        b.tokens_per_fill.map(|v| v.value)
                    );
                    assert_eq!(
                        a.fill_interval.map(|d| (d.seconds, d.nanos)),
                        b.fill_interval.map(|d| (d.seconds, d.nanos))
                    );
                }
                (a, b) => panic!("{a:?} arrived as {:?}", b.map(|_| ())),
            }
        }
        // The oneof's two arms, inside the response Envoy reads.
        for action in [
            BucketAction::AbandonAction(AbandonAction {}),
            BucketAction::QuotaAssignmentAction(QuotaAssignmentAction::default()),
        ] {
            let ours = super::super::rlqs_message::Response {
                bucket_action: vec![super::super::rlqs_message::BucketAction {
                    bucket_id: Some(super::super::rlqs_message::BucketId::of([("k", "v")])),
                    bucket_action: Some(action),
                }],
            };
            let theirs: envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse =
                same_in_envoys(&ours);
            let arm = theirs.bucket_action[0].bucket_action;
            match (action, arm) {
                (
                    BucketAction::AbandonAction(_),
                    Some(envoy_action::BucketAction::AbandonAction(_)),
                )
                | (
                    BucketAction::QuotaAssignmentAction(_),
                    Some(envoy_action::BucketAction::QuotaAssignmentAction(_)),
                ) => {}
                _ => panic!("the arm changed on the way"),
            }
        }
    }
}
