//! The rate-limit service's metrics, recorded through small typed helpers. Labels are bounded:
//! the domain and the configured descriptor (`rate_limit.name` or its configured path) — a
//! request's own values never become a label (an unknown domain is counted by reason alone).

use std::sync::{Arc, OnceLock};

use metrics::Counter;

use crate::metrics::{RLS_DECISIONS, RLS_REFUSED, RLS_REQUESTS};

/// A configured descriptor's decision counters. Registered at the first decision, not when
/// the configuration is compiled: `tollgate check` and start-up compile it before the metrics
/// recorder is installed.
#[derive(Debug)]
pub struct RuleMetrics {
    domain: Arc<str>,
    descriptor: Arc<str>,
    counters: OnceLock<Box<Counters>>,
}

/// The registered counters of one descriptor.
#[derive(Debug)]
pub struct Counters {
    pub ok: Counter,
    pub over_limit: Counter,
    /// A `shadow_mode` descriptor that would have refused.
    pub shadow: Counter,
    /// An `unlimited` descriptor matched.
    pub unlimited: Counter,
}

impl RuleMetrics {
    pub fn new(domain: &Arc<str>, descriptor: &Arc<str>) -> RuleMetrics {
        RuleMetrics {
            domain: domain.clone(),
            descriptor: descriptor.clone(),
            counters: OnceLock::new(),
        }
    }

    pub fn get(&self) -> &Counters {
        self.counters.get_or_init(|| {
            let c = |decision: &'static str| {
                metrics::counter!(
                    RLS_DECISIONS,
                    "domain" => self.domain.to_string(),
                    "descriptor" => self.descriptor.to_string(),
                    "decision" => decision
                )
            };
            Box::new(Counters {
                ok: c("ok"),
                over_limit: c("over_limit"),
                shadow: c("shadow"),
                unlimited: c("unlimited"),
            })
        })
    }
}

/// How a call was answered.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    Ok,
    OverLimit,
    Invalid,
    Unavailable,
}

impl Answer {
    fn code(self) -> &'static str {
        match self {
            Answer::Ok => "ok",
            Answer::OverLimit => "over_limit",
            Answer::Invalid => "invalid",
            Answer::Unavailable => "unavailable",
        }
    }
}

pub fn answered(a: Answer) {
    metrics::counter!(RLS_REQUESTS, "code" => a.code()).increment(1);
}

/// `tollgate_rls_requests_total` by code, registered once (the service's, built when it starts
/// serving, after the recorder is installed): counting a call looks nothing up.
#[derive(Debug, Clone)]
pub struct Answers {
    ok: Counter,
    over_limit: Counter,
    invalid: Counter,
    unavailable: Counter,
}

impl Answers {
    pub fn register() -> Answers {
        let c = |a: Answer| metrics::counter!(RLS_REQUESTS, "code" => a.code());
        Answers {
            ok: c(Answer::Ok),
            over_limit: c(Answer::OverLimit),
            invalid: c(Answer::Invalid),
            unavailable: c(Answer::Unavailable),
        }
    }

    pub fn count(&self, a: Answer) {
        match a {
            Answer::Ok => &self.ok,
            Answer::OverLimit => &self.over_limit,
            Answer::Invalid => &self.invalid,
            Answer::Unavailable => &self.unavailable,
        }
        .increment(1);
    }
}

/// Why a call (or one descriptor) was refused or matched nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    EmptyDomain,
    NoDescriptors,
    TooManyDescriptors,
    EmptyDescriptor,
    TooManyEntries,
    EntryTooLong,
    UnknownDomain,
    NoMatch,
    Overridden,
    /// The message is not a `RateLimitRequest` (not protobuf): failed before the service ran.
    Malformed,
    /// The message is over the listener's size bound.
    TooLarge,
    /// Another method, a compressed message, or any other failure before the service ran.
    Unsupported,
}

impl Refused {
    pub const ALL: [Refused; 12] = [
        Refused::EmptyDomain,
        Refused::NoDescriptors,
        Refused::TooManyDescriptors,
        Refused::EmptyDescriptor,
        Refused::TooManyEntries,
        Refused::EntryTooLong,
        Refused::UnknownDomain,
        Refused::NoMatch,
        Refused::Overridden,
        Refused::Malformed,
        Refused::TooLarge,
        Refused::Unsupported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refused::EmptyDomain => "empty_domain",
            Refused::NoDescriptors => "no_descriptors",
            Refused::TooManyDescriptors => "too_many_descriptors",
            Refused::EmptyDescriptor => "empty_descriptor",
            Refused::TooManyEntries => "too_many_entries",
            Refused::EntryTooLong => "entry_too_long",
            Refused::UnknownDomain => "unknown_domain",
            Refused::NoMatch => "no_match",
            Refused::Overridden => "limit_override",
            Refused::Malformed => "malformed",
            Refused::TooLarge => "too_large",
            Refused::Unsupported => "unsupported",
        }
    }
}

pub fn refused(r: Refused) {
    metrics::counter!(RLS_REFUSED, "reason" => r.as_str()).increment(1);
}

/// A call that failed before the service ran, by its gRPC code: counted as refused (by reason)
/// and answered `invalid`, so every call that fails is counted.
pub fn undecoded(code: tonic::Code) {
    refused(match code {
        tonic::Code::Internal => Refused::Malformed,
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => Refused::TooLarge,
        _ => Refused::Unsupported,
    });
    answered(Answer::Invalid);
}

/// Registers the series at 0 (dashboards see a 0, not nothing).
pub fn register() {
    for r in Refused::ALL {
        metrics::counter!(RLS_REFUSED, "reason" => r.as_str()).absolute(0);
    }
    for code in ["ok", "over_limit", "invalid", "unavailable"] {
        metrics::counter!(RLS_REQUESTS, "code" => code).absolute(0);
    }
}

/// The quota service's (RLQS) metrics: labels are the quota's configured name and bounded
/// kinds, never a bucket's values.
pub mod rlqs {
    use metrics::Counter;

    use crate::metrics::{RLQS_ASSIGNMENTS, RLQS_REFUSED, RLQS_REPORTED, RLQS_STREAMS, RLQS_UNITS};

    /// Why a bucket got no lease.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Refused {
        /// A usage without a bucket_id (or an empty one).
        NoBucketId,
        /// A bucket_id of more than 16 entries, or an entry over 4096 bytes.
        BucketIdTooLarge,
        /// Over the stream's (or a report's) bucket bound.
        TooManyBuckets,
        /// No `[[rls.quota]]` maps the bucket: it is answered `ALLOW_ALL`.
        NoMatch,
        /// The store could not decide (or take units back).
        StoreError,
        /// A usage reporting more requests than [`MAX_REPORTED`](crate::rls::rlqs::MAX_REPORTED).
        CountTooLarge,
        /// The call failed: a report that is no protobuf, or cut short.
        MalformedReport,
        /// The call failed: a report over the listener's message size.
        ReportTooLarge,
        /// The call failed: a compressed report (no `grpc-encoding` is accepted).
        CompressedReport,
        /// The call failed in its transport (a broken connection, an HTTP/2 error).
        BrokenStream,
        /// Over the connection's bucket bound.
        ConnectionBuckets,
        /// Over the process's bucket bound.
        ProcessBuckets,
        /// A stream over the connection's stream bound.
        ConnectionStreams,
        /// A stream over the process's stream bound.
        ProcessStreams,
        /// A stream ended: its reply did not fit the connection's or the process's bound on
        /// replies not yet taken by the client.
        UnreadReplies,
    }

    impl Refused {
        pub const ALL: [Refused; 15] = [
            Refused::NoBucketId,
            Refused::BucketIdTooLarge,
            Refused::TooManyBuckets,
            Refused::NoMatch,
            Refused::StoreError,
            Refused::CountTooLarge,
            Refused::MalformedReport,
            Refused::ReportTooLarge,
            Refused::CompressedReport,
            Refused::BrokenStream,
            Refused::ConnectionBuckets,
            Refused::ProcessBuckets,
            Refused::ConnectionStreams,
            Refused::ProcessStreams,
            Refused::UnreadReplies,
        ];

        pub fn as_str(self) -> &'static str {
            match self {
                Refused::NoBucketId => "no_bucket_id",
                Refused::BucketIdTooLarge => "bucket_id_too_large",
                Refused::TooManyBuckets => "too_many_buckets",
                Refused::NoMatch => "no_match",
                Refused::StoreError => "store_error",
                Refused::CountTooLarge => "count_too_large",
                Refused::MalformedReport => "malformed_report",
                Refused::ReportTooLarge => "report_too_large",
                Refused::CompressedReport => "compressed_report",
                Refused::BrokenStream => "broken_stream",
                Refused::ConnectionBuckets => "connection_buckets",
                Refused::ProcessBuckets => "process_buckets",
                Refused::ConnectionStreams => "connection_streams",
                Refused::ProcessStreams => "process_streams",
                Refused::UnreadReplies => "unread_replies",
            }
        }
    }

    pub fn refused(r: Refused, n: usize) {
        metrics::counter!(RLQS_REFUSED, "reason" => r.as_str()).increment(n as u64);
    }

    /// One quota's counters (looked up per report, not per request: Envoy decides those).
    pub struct QuotaMetrics {
        pub granted: Counter,
        pub returned: Counter,
        pub lapsed: Counter,
        pub assigned: Counter,
        pub denied: Counter,
        allowed_reported: Counter,
        denied_reported: Counter,
    }

    impl QuotaMetrics {
        pub fn of(quota: &str) -> QuotaMetrics {
            let units = |kind: &'static str| metrics::counter!(RLQS_UNITS, "quota" => quota.to_owned(), "kind" => kind);
            let assigned = |action: &'static str| metrics::counter!(RLQS_ASSIGNMENTS, "quota" => quota.to_owned(), "action" => action);
            let reported = |decision: &'static str| metrics::counter!(RLQS_REPORTED, "quota" => quota.to_owned(), "decision" => decision);
            QuotaMetrics {
                granted: units("granted"),
                returned: units("returned"),
                lapsed: units("lapsed"),
                assigned: assigned("token_bucket"),
                denied: assigned("deny_all"),
                allowed_reported: reported("allowed"),
                denied_reported: reported("denied"),
            }
        }

        pub fn reported(&self, allowed: u64, denied: u64) {
            self.allowed_reported.increment(allowed);
            self.denied_reported.increment(denied);
        }
    }

    /// Counts a stream open while it lives.
    pub struct StreamGuard(());

    impl StreamGuard {
        pub fn open() -> StreamGuard {
            metrics::gauge!(RLQS_STREAMS).increment(1.0);
            StreamGuard(())
        }
    }

    impl Drop for StreamGuard {
        fn drop(&mut self) {
            metrics::gauge!(RLQS_STREAMS).decrement(1.0);
        }
    }

    /// Registers the series at 0.
    pub fn register() {
        for r in Refused::ALL {
            metrics::counter!(RLQS_REFUSED, "reason" => r.as_str()).absolute(0);
        }
        metrics::gauge!(RLQS_STREAMS).set(0.0);
    }
}
