//! A limit compiled for the hot path, and the per-request [`Check`] against it.
//!
//! A [`CompiledLimit`] is the crate's [`Limit`] (what a store decides by: key, policy, shadow,
//! tier, lease) and what only the gateway needs (the subject rule, headers, metrics, `/-/top`).
//! It dereferences to its [`Limit`], so `limit.policy`, `limit.uid`… read as before and a store
//! decides a [`Check`] of it without a copy.

use std::ops::Deref;
use std::sync::Arc;

use super::convert::policy_of;
use super::denied_top::DeniedTop;
use super::response_metrics::ResponseMetrics;
use super::{LeaseSettings, Limit};
use crate::config::{
    Algorithm, ChargeAfter, Exempt, LimitConfig, Mode, OnMissing, Prefixes, Reserve, SubjectSpec,
};
use crate::metrics::LimitMetrics;

/// One limit of one route, ready for the hot path.
#[derive(Debug)]
pub struct CompiledLimit {
    /// What a store decides by: `name`, `scope`, `policy`, `uid`, `shadow`, `local`, `lease`
    /// (read through `Deref`). The scope is whose count this is, in store keys: the route for
    /// a route's limit; for a plan's limit `@<plan>` (one count per consumer across routes) or
    /// `<route>@<plan>` (`scope = "route"`). `@` never appears in a route name, so the two
    /// never collide. The uid identifies (route, limit, algorithm, parameters) in the
    /// in-process store and the deny cache; stable across reloads, so the state of an
    /// unchanged limit survives one.
    pub core: Limit,
    pub route: Arc<str>,
    /// The plan this limit belongs to (`None`: the route's own limit).
    pub plan: Option<Arc<str>>,
    pub subject: SubjectSpec,
    pub on_missing: OnMissing,
    /// `"name";q=L;w=P` for the `RateLimit-Policy` header (`;qu="content-bytes"` for a byte
    /// limit, `qu="concurrent-requests"` without `w` for a concurrency one).
    pub policy_item: Arc<str>,
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
    /// The networks client addresses are counted by.
    pub prefixes: Prefixes,
    /// Whom the limit does not apply to.
    pub exempt: Exempt,
    /// The shape of its refusals (`refusal`; `None`: the route's).
    pub refusal: Option<Arc<crate::config::Refusal>>,
    /// `limit_from`: the limit per caller, and its compiled variants.
    pub callers: Option<Box<Callers>>,
    /// `ban_after`/`ban_for`: the rule and the penalty box (carried over a reload by route and
    /// limit name, as `top`; shared by the limit's `limit_from` variants).
    pub ban: Option<(super::bans::Rule, Arc<super::bans::Bans>)>,
}

/// How many limits per caller one limit compiles (distinct values of its `limit_from`); past
/// them a caller gets the configured limit (and a warning is logged).
pub const MAX_CALLER_LIMITS: usize = 64;

/// A limit with `limit_from`: its config, to compile a caller's variant, and the variants made
/// so far — a fixed table of write-once slots, so that a request's check borrows its variant
/// for as long as the snapshot lives, without a lock held.
#[derive(Debug)]
pub struct Callers {
    pub from: crate::config::LimitFrom,
    config: LimitConfig,
    route: Arc<str>,
    slots: Box<[std::sync::OnceLock<Arc<CompiledLimit>>]>,
}

impl CompiledLimit {
    /// The limit a caller whose `limit_from` value is `value` is counted under: this one for no
    /// value or the configured limit, else a variant whose `limit` is `value` (already clamped
    /// to `limit_max`), counted under its own key: the scope `<route>#<value>` — a caller
    /// whose value changes starts a new count, and the old one expires on its own.
    pub fn for_caller(self: &Arc<CompiledLimit>, value: Option<u64>) -> &Arc<CompiledLimit> {
        let (Some(c), Some(v)) = (self.callers.as_deref(), value) else {
            return self;
        };
        if v == c.config.limit {
            return self;
        }
        let n = c.slots.len();
        // Open addressing over write-once slots: a slot holds one value's variant for good.
        let start = usize::try_from(v.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32).unwrap_or(0) % n;
        for i in 0..n {
            let slot = &c.slots[(start + i) % n];
            let got = slot.get_or_init(|| Arc::new(self.variant(c, v)));
            if got.policy_limit() == v {
                return got;
            }
        }
        static FULL: tollgate_limit::log_throttle::Throttles<1> =
            tollgate_limit::log_throttle::Throttles::new();
        if let Some(suppressed) = FULL.allow(0) {
            tracing::warn!(
                route = &*self.route,
                limit = &*self.name,
                suppressed,
                "limit_from: more distinct limits than {MAX_CALLER_LIMITS}; the rest get the configured limit"
            );
        }
        self
    }

    /// The limit a variant was compiled with.
    fn policy_limit(&self) -> u64 {
        self.callers
            .as_deref()
            .map_or(self.core.policy.limit, |c| c.config.limit)
    }

    fn variant(&self, c: &Callers, v: u64) -> CompiledLimit {
        let mut cfg = c.config.clone();
        // A burst that follows the limit follows the caller's (as a consumer's override).
        if matches!(cfg.algorithm, Algorithm::TokenBucket | Algorithm::Gcra)
            && cfg.burst == cfg.limit
        {
            cfg.burst = v;
        }
        cfg.limit = v;
        cfg.limit_from = None;
        let scope: Arc<str> = Arc::from(format!("{}#{v}", c.route));
        let mut l = CompiledLimit::compile_in(&c.route, &scope, None, &cfg);
        // One `/-/top` and one penalty box for the limit, whatever each caller's number.
        l.top = self.top.clone();
        l.ban = self.ban.clone();
        // Its limit, for `for_caller`'s lookup.
        l.callers = Some(Box::new(Callers {
            from: c.from.clone(),
            config: cfg,
            route: c.route.clone(),
            slots: Box::default(),
        }));
        l
    }
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
        let mut policy = policy_of(l);
        if let Some(Reserve::Units(r)) = l.after.as_ref().and_then(|a| a.reserve.as_ref()) {
            // A reservation is what the request takes when admitted (settled after). One read
            // from the body is each request's own (`Op::Reserve`); the policy keeps `cost`,
            // what a request without the field reserves.
            policy.cost = *r;
        }
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
            core: Limit {
                name: name.clone(),
                scope: scope.clone(),
                policy,
                // Hashes the algorithm's name as the config spells its variant (`{:?}`).
                uid: Limit::uid_of(scope, &l.name, &policy),
                shadow: l.mode == Mode::Shadow,
                local: l.fleet.store == crate::config::LimitStore::Local,
                charged_after: l.after.is_some(),
                reserves: l.after.as_ref().is_some_and(|a| a.reserve.is_some()),
                // The penalty box is shared through the store (read in the decision).
                bans: l.ban.is_some(),
                lease: l.fleet.lease.map(|c| {
                    (
                        LeaseSettings {
                            ttl: c.ttl,
                            max: c.max,
                        },
                        crate::metrics::LeaseMetrics::new(route, &l.name),
                    )
                }),
            },
            route: route.clone(),
            plan: plan.cloned(),
            subject: l.subject.clone(),
            on_missing: l.on_missing,
            policy_item: if l.algorithm == Algorithm::Concurrency {
                format!(
                    "\"{}\";q={};qu=\"concurrent-requests\"",
                    l.name,
                    policy.quota()
                )
            } else if l.after.as_ref().is_some_and(|a| a.bytes.is_some()) {
                format!(
                    "\"{}\";q={};w={w};qu=\"content-bytes\"",
                    l.name,
                    policy.quota()
                )
            } else {
                format!("\"{}\";q={};w={w}", l.name, policy.quota())
            }
            .into(),
            partitioned: plan.is_some() || l.subject != SubjectSpec::Global,
            metrics: LimitMetrics::with_plan(route, &name, plan.map_or("", |p| &**p)),
            top: Arc::default(),
            seen: Arc::default(),
            after: l.after.clone(),
            response_metrics: ResponseMetrics::new(route, &name, plan.map_or("", |p| &**p)),
            prefixes: l.prefixes,
            exempt: l.exempt.clone(),
            refusal: l.refusal.clone(),
            ban: l.ban.map(|b| {
                (
                    super::bans::Rule {
                        after: b.after,
                        window: u64::try_from(l.period.as_micros()).unwrap_or(u64::MAX),
                        ban: u64::try_from(b.ban_for.as_micros()).unwrap_or(u64::MAX),
                    },
                    Arc::default(),
                )
            }),
            callers: l.limit_from.as_ref().map(|f| {
                Box::new(Callers {
                    from: f.clone(),
                    config: l.clone(),
                    route: route.clone(),
                    slots: (0..MAX_CALLER_LIMITS)
                        .map(|_| std::sync::OnceLock::new())
                        .collect(),
                })
            }),
        }
    }

    /// A copy of this limit for what outlives a request (a lease's return): the same key,
    /// policy and labels; its decision counters are fresh handles to the same series.
    pub fn twin(&self) -> CompiledLimit {
        CompiledLimit {
            core: self.core.clone(),
            route: self.route.clone(),
            plan: self.plan.clone(),
            subject: self.subject.clone(),
            on_missing: self.on_missing,
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
            prefixes: self.prefixes,
            exempt: self.exempt.clone(),
            refusal: self.refusal.clone(),
            // What outlives a request is never a caller's variant's table.
            callers: None,
            ban: self.ban.clone(),
        }
    }
}

impl Deref for CompiledLimit {
    type Target = Limit;

    fn deref(&self) -> &Limit {
        &self.core
    }
}

/// One limit to decide for one request: the crate's check, of a compiled limit (so the gateway
/// reads its metrics and headers through `check.limit`, and the stores its [`Limit`]).
pub type Check<'a> = tollgate_limit::Check<'a, CompiledLimit>;
