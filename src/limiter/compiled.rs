//! A limit compiled for the hot path, and the per-request [`Check`] against it.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::response_metrics::ResponseMetrics;
use super::Policy;
use crate::config::{Algorithm, ChargeAfter, LimitConfig, Mode, OnMissing, SubjectSpec};
use crate::metrics::LimitMetrics;
use crate::top::DeniedTop;

/// The first 128 bits of SHA-256 over a subject: what stores key state by, so raw API keys and
/// addresses never sit in memory dumps or Redis key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubjectDigest(pub [u8; 16]);

impl SubjectDigest {
    /// Hashes a subject of a kind (`b'i'` address, `b'h'` header, `b'q'` query, `b'g'` global).
    pub fn of(kind: u8, value: &[u8]) -> SubjectDigest {
        let mut h = Sha256::new();
        h.update([kind]);
        h.update(value);
        let full = h.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        SubjectDigest(out)
    }

    /// Lower-case hex, 32 characters, appended to `out`.
    pub fn write_hex(&self, out: &mut String) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in self.0 {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }

    /// The first 8 hex digits: how the admin API names a key subject without revealing it.
    pub fn short_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        self.write_hex(&mut s);
        s.truncate(8);
        s
    }
}

/// One limit of one route, ready for the hot path.
#[derive(Debug)]
pub struct CompiledLimit {
    pub route: Arc<str>,
    pub name: Arc<str>,
    pub policy: Policy,
    pub subject: SubjectSpec,
    pub shadow: bool,
    pub on_missing: OnMissing,
    /// Identifies (route, limit, algorithm, parameters) in the in-process store and the deny
    /// cache; stable across reloads, so the state of an unchanged limit survives one.
    pub uid: u64,
    /// `"name";q=L;w=P` for the `RateLimit-Policy` header.
    pub policy_item: String,
    pub metrics: LimitMetrics,
    /// The subjects this limit denies most (`/-/top`); carried over a reload by route and limit
    /// name (see `Snapshot::build`).
    pub top: Arc<DeniedTop>,
    /// Charged after the response (`count_status`, `cost_header`): only evaluated by `decide`.
    pub after: Option<ChargeAfter>,
    /// `charged_after` and `in_flight` (see [`super::charge`], [`super::concurrency`]).
    pub response_metrics: ResponseMetrics,
}

impl CompiledLimit {
    pub fn compile(route: &Arc<str>, l: &LimitConfig) -> CompiledLimit {
        let policy = Policy::from_config(l);
        let mut h = Sha256::new();
        h.update(route.as_bytes());
        h.update([0]);
        h.update(l.name.as_bytes());
        h.update([0]);
        h.update(format!("{:?}", l.algorithm).as_bytes());
        // The parameters too: a reload that changes them starts the limit afresh in process
        // and drops its cached denials, rather than judging by state kept for other numbers.
        for n in [policy.limit, policy.period, policy.burst, policy.cost] {
            h.update(n.to_le_bytes());
        }
        let d = h.finalize();
        let mut uid = [0u8; 8];
        uid.copy_from_slice(&d[..8]);
        let window_secs = l.period.as_secs_f64();
        let w = if window_secs.fract() == 0.0 {
            format!("{}", l.period.as_secs())
        } else {
            format!("{window_secs}")
        };
        let name: Arc<str> = Arc::from(l.name.as_str());
        CompiledLimit {
            route: route.clone(),
            name: name.clone(),
            policy,
            subject: l.subject.clone(),
            shadow: l.mode == Mode::Shadow,
            on_missing: l.on_missing,
            uid: u64::from_le_bytes(uid),
            policy_item: if l.algorithm == Algorithm::Concurrency {
                format!(
                    "\"{}\";q={};qu=\"concurrent-requests\"",
                    l.name,
                    policy.quota()
                )
            } else {
                format!("\"{}\";q={};w={w}", l.name, policy.quota())
            },
            metrics: LimitMetrics::new(route, &name),
            top: Arc::default(),
            after: l.after.clone(),
            response_metrics: ResponseMetrics::new(route, &name),
        }
    }
}

/// One limit to decide for one request.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub limit: &'a CompiledLimit,
    pub subject: SubjectDigest,
    pub op: Op,
}

/// What a store does with one [`Check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Op {
    /// `Store::decide`: evaluate, and charge when the request is admitted — except a limit
    /// charged after the response (only evaluated) and a concurrency limit (a slot is taken only
    /// under [`Op::Acquire`]).
    #[default]
    Decide,
    /// `Store::decide` of a concurrency limit: take a slot under this lease id (unique per
    /// request in the whole deployment).
    Acquire(u64),
    /// `Store::settle`: charge this many units whatever is left, clamped to a spent limit.
    Charge(u64),
    /// `Store::settle`: give back the slot of this lease.
    Release(u64),
}
