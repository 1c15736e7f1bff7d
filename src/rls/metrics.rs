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

pub fn answered(a: Answer) {
    let code = match a {
        Answer::Ok => "ok",
        Answer::OverLimit => "over_limit",
        Answer::Invalid => "invalid",
        Answer::Unavailable => "unavailable",
    };
    metrics::counter!(RLS_REQUESTS, "code" => code).increment(1);
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
}

impl Refused {
    pub const ALL: [Refused; 9] = [
        Refused::EmptyDomain,
        Refused::NoDescriptors,
        Refused::TooManyDescriptors,
        Refused::EmptyDescriptor,
        Refused::TooManyEntries,
        Refused::EntryTooLong,
        Refused::UnknownDomain,
        Refused::NoMatch,
        Refused::Overridden,
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
        }
    }
}

pub fn refused(r: Refused) {
    metrics::counter!(RLS_REFUSED, "reason" => r.as_str()).increment(1);
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
