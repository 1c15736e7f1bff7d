//! A limit compiled for the hot path, and the per-request [`Check`] against it.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::denied_top::DeniedTop;
use super::response_metrics::ResponseMetrics;
use super::Policy;
use crate::config::{
    Algorithm, ChargeAfter, Exempt, LimitConfig, Mode, OnMissing, Prefixes, Reserve, SubjectSpec,
};
use crate::metrics::LimitMetrics;

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

    /// As a structured-field byte sequence (`:base64:`, RFC 8941 §3.3.5), appended to `out`:
    /// the `pk` (partition key) parameter of the RateLimit fields.
    pub fn write_sf_bytes(&self, out: &mut String) {
        const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        // 16 bytes: five whole 3-byte groups and one byte left (`xx==`), between colons.
        let mut buf = [b'='; 26];
        buf[0] = b':';
        buf[25] = b':';
        let mut at = 1;
        for chunk in self.0.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                buf[at + i] = B64[((n >> (18 - 6 * i)) & 63) as usize];
            }
            at += 4;
        }
        // Every byte is ASCII (the alphabet, `=` and `:`).
        out.push_str(std::str::from_utf8(&buf).unwrap_or_default());
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
    /// Whose count this is, in store keys: the route for a route's limit; for a plan's limit
    /// `@<plan>` (one count per consumer across routes) or `<route>@<plan>` (`scope = "route"`).
    /// `@` never appears in a route name, so the two never collide.
    pub scope: Arc<str>,
    /// The plan this limit belongs to (`None`: the route's own limit).
    pub plan: Option<Arc<str>>,
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
    /// Whether the RateLimit fields carry the subject as `pk` (every limit but a `global` one).
    pub partitioned: bool,
    /// The subjects this limit denies most (`/-/top`); carried over a reload by route and limit
    /// name (see `Snapshot::build`).
    pub top: Arc<DeniedTop>,
    /// A plan's limit with parts: the combinations it counted per consumer (usage, reset);
    /// shared by every route's copy of the limit and carried over a reload (see
    /// `Snapshot::build`).
    pub seen: Arc<super::seen_keys::SeenKeys>,
    /// Charged after the response (`count_status`, `cost_header`): only evaluated by `decide`.
    pub after: Option<ChargeAfter>,
    /// `charged_after` and `in_flight` (see [`super::charge`], [`super::concurrency`]).
    pub response_metrics: ResponseMetrics,
    /// Kept in this process whatever the `[store]` (`store = "local"`).
    pub local: bool,
    /// `sync = "lease"`: the lease settings and counters.
    pub lease: Option<(crate::config::LeaseConfig, crate::metrics::LeaseMetrics)>,
    /// The networks client addresses are counted by.
    pub prefixes: Prefixes,
    /// Whom the limit does not apply to.
    pub exempt: Exempt,
}

impl CompiledLimit {
    /// Whether `decide` only evaluates this limit (charged after the response, nothing
    /// reserved): a limit with `reserve` is charged its reservation when admitted.
    pub fn evaluated_only(&self) -> bool {
        self.after.as_ref().is_some_and(|a| a.reserve.is_none())
    }

    /// What the limit reserves when a request is admitted (`reserve`), settled after the
    /// response; a request's own amount is its check's ([`Check::reserved`]).
    pub fn reserve(&self) -> Option<&crate::config::Reserve> {
        self.after.as_ref().and_then(|a| a.reserve.as_ref())
    }

    pub fn compile(route: &Arc<str>, l: &LimitConfig) -> CompiledLimit {
        CompiledLimit::compile_in(route, route, None, l)
    }

    /// A limit of `plan` as applied on `route`, counted under `scope` (see [`CompiledLimit::scope`]).
    pub fn compile_in(
        route: &Arc<str>,
        scope: &Arc<str>,
        plan: Option<&Arc<str>>,
        l: &LimitConfig,
    ) -> CompiledLimit {
        let mut policy = Policy::from_config(l);
        if let Some(Reserve::Units(r)) = l.after.as_ref().and_then(|a| a.reserve.as_ref()) {
            // A reservation is what the request takes when admitted (settled after). One read
            // from the body is each request's own (`Op::Reserve`); the policy keeps `cost`,
            // what a request without the field reserves.
            policy.cost = *r;
        }
        let mut h = Sha256::new();
        h.update(scope.as_bytes());
        h.update([0]);
        h.update(l.name.as_bytes());
        h.update([0]);
        h.update(format!("{:?}", l.algorithm).as_bytes());
        // The parameters too: a reload that changes them starts the limit afresh in process
        // and drops its cached denials, rather than judging by state kept for other numbers.
        for n in [policy.limit, policy.period, policy.burst, policy.cost] {
            h.update(n.to_le_bytes());
        }
        if let Some(c) = policy.calendar {
            h.update(c.as_str().as_bytes());
            // A billing day or an offset other than the defaults (the plain units hash as
            // before: their state survives an upgrade).
            if c.script_code() > 3 {
                h.update(c.script_code().to_le_bytes());
            }
        }
        let d = h.finalize();
        let mut uid = [0u8; 8];
        uid.copy_from_slice(&d[..8]);
        let window_secs = l.period.as_secs_f64();
        let w = if let Some(c) = l.calendar {
            format!("{}", c.nominal_secs())
        } else if window_secs.fract() == 0.0 {
            format!("{}", l.period.as_secs())
        } else {
            format!("{window_secs}")
        };
        let name: Arc<str> = Arc::from(l.name.as_str());
        CompiledLimit {
            route: route.clone(),
            name: name.clone(),
            scope: scope.clone(),
            plan: plan.cloned(),
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
            partitioned: plan.is_some() || l.subject != SubjectSpec::Global,
            metrics: LimitMetrics::with_plan(route, &name, plan.map_or("", |p| &**p)),
            top: Arc::default(),
            seen: Arc::default(),
            after: l.after.clone(),
            response_metrics: ResponseMetrics::new(route, &name, plan.map_or("", |p| &**p)),
            local: l.fleet.store == crate::config::LimitStore::Local,
            lease: l
                .fleet
                .lease
                .map(|c| (c, crate::metrics::LeaseMetrics::new(route, &l.name))),
            prefixes: l.prefixes,
            exempt: l.exempt.clone(),
        }
    }

    /// A copy of this limit for what outlives a request (a lease's return): the same key,
    /// policy and labels; its decision counters are fresh handles to the same series.
    pub fn twin(&self) -> CompiledLimit {
        CompiledLimit {
            route: self.route.clone(),
            name: self.name.clone(),
            scope: self.scope.clone(),
            plan: self.plan.clone(),
            policy: self.policy,
            subject: self.subject.clone(),
            shadow: self.shadow,
            on_missing: self.on_missing,
            uid: self.uid,
            policy_item: self.policy_item.clone(),
            metrics: LimitMetrics::with_plan(
                &self.route,
                &self.name,
                self.plan.as_deref().unwrap_or(""),
            ),
            partitioned: self.partitioned,
            top: self.top.clone(),
            seen: self.seen.clone(),
            after: self.after.clone(),
            response_metrics: ResponseMetrics::new(
                &self.route,
                &self.name,
                self.plan.as_deref().unwrap_or(""),
            ),
            local: self.local,
            lease: self.lease.clone(),
            prefixes: self.prefixes,
            exempt: self.exempt.clone(),
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

impl Check<'_> {
    /// The units this request reserved when admitted, settled after the response: its own
    /// amount (`Op::Reserve`, read from its body), else the limit's fixed `reserve`; `None`
    /// for a limit without one.
    pub fn reserved(&self) -> Option<u64> {
        match (self.op, self.limit.reserve()?) {
            (Op::Reserve(n), _) => Some(n),
            (_, Reserve::Units(n)) => Some(*n),
            (_, Reserve::Json { .. }) => Some(self.limit.policy.cost),
        }
    }

    /// The policy this check is decided under: the limit's, taking a reservation's units as
    /// the request's cost under `Op::Reserve`.
    pub fn decided_policy(&self) -> Policy {
        match self.op {
            Op::Reserve(n) => Policy {
                cost: n,
                ..self.limit.policy
            },
            _ => self.limit.policy,
        }
    }
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
    /// `Store::decide` of a limit that reserves what the request's body asks
    /// (`reserve = "json:…"`): as `Decide`, with this many units as the request's cost. Never
    /// answered by the deny cache (a denial of one amount says nothing of another).
    Reserve(u64),
    /// `Store::settle`: charge this many units whatever is left, clamped to a spent limit.
    Charge(u64),
    /// `Store::settle`: give back the slot of this lease.
    Release(u64),
    /// `Store::decide` of a limit with `sync = "lease"`: take up to this many units (at least
    /// the limit's cost) in one step; the decision's `delay` carries the units granted (see
    /// [`super::lease`]).
    Lease(u64),
    /// `Store::settle`: give back this many units (a reservation's unused part).
    Return(u64),
    /// `Store::settle`: give back this many unused units of a lease, into the generation of the
    /// state it was granted from (its number, from the grant) and no other: see
    /// `crate::store::Leasing`.
    LeaseReturn(u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_are_base64_byte_sequences() {
        let mut s = String::new();
        SubjectDigest([0xfb; 16]).write_sf_bytes(&mut s);
        assert_eq!(s, ":+/v7+/v7+/v7+/v7+/v7+w==:");
        let mut s = String::new();
        SubjectDigest(*b"0123456789abcdef").write_sf_bytes(&mut s);
        assert_eq!(s, ":MDEyMzQ1Njc4OWFiY2RlZg==:");
    }
}
