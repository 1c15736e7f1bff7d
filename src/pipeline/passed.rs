//! What passed the limits: what an admitted request carries on (the decisions for the
//! rate-limit headers, the slots it holds) and owes as the front reaches each point of the
//! exchange (an abandoned exchange's charge, the response's charge).

use std::sync::Arc;

use http::header::HeaderMap;
use http::StatusCode;
use smallvec::SmallVec;

use super::body_charge::BodyCharge;
use super::settle::{charge_after, owed_after, Abandoned, Leases, WorkerCtx};
use crate::http::fields::FieldSink;
use crate::limiter::{Check, CompiledLimit, Decision, Outcome};
use crate::routing::Route;
use tollgate_limit::store::AnyStore;

/// What a request that passed its limits carries on.
#[derive(Default)]
pub struct Passed<'s> {
    /// The limits applied, in the order of the checks: the route's, then the plan's.
    pub applied: SmallVec<[&'s Arc<CompiledLimit>; 4]>,
    /// The checks, one per limit applied (still charged after the response when the store
    /// failed open).
    pub checks: SmallVec<[Check<'s>; 4]>,
    /// The store's decisions on them; `None` when it failed open.
    pub decided: Option<(Vec<Decision>, Outcome)>,
    /// Concurrency slots the request holds (released when dropped, on every path).
    pub leases: Option<Leases>,
}

impl<'s> Passed<'s> {
    /// What passed in two phases (the limits decided before the request body was read, then
    /// those decided after): one list of checks, decisions and slots held.
    pub fn merge(mut self, later: Passed<'s>) -> Passed<'s> {
        if later.applied.is_empty() {
            return self;
        }
        if self.applied.is_empty() {
            return later;
        }
        let Passed {
            applied,
            checks,
            decided,
            leases,
        } = later;
        // One phase failed open: decided as a whole like a store that failed open.
        let decisions = match (self.decided.take(), decided) {
            (Some((mut first, _)), Some((then, _))) => {
                first.extend(then);
                Some(first)
            }
            _ => None,
        };
        self.applied.extend(applied);
        self.checks.extend(checks);
        self.decided = decisions.map(|d| {
            let outcome = crate::limiter::Outcome::of(&self.checks, &d);
            (d, outcome)
        });
        self.leases = Leases::merge(self.leases.take(), leases);
        self
    }
}

impl Passed<'_> {
    /// Writes the rate-limit headers of the decisions (when the route sends them) to `headers`.
    pub fn write_headers(&self, route: &Route, headers: &mut impl FieldSink) {
        if let (Some((decisions, outcome)), true) = (&self.decided, route.rate_limit_headers) {
            outcome.write_headers(headers, &self.checks, decisions);
        }
    }
}

/// What an admitted request owes after its response, as the front reaches each point of the
/// exchange.
impl<'s> Passed<'s> {
    /// The checks (and decisions, unless the store failed open) of the limits charged after the
    /// response; `None` when no limit applied is.
    #[allow(clippy::type_complexity)]
    fn after(&self) -> Option<(&[Check<'s>], Option<&[Decision]>)> {
        if !self.applied.iter().any(|l| l.after.is_some()) {
            return None;
        }
        let decisions = self.decided.as_ref().map(|(d, _)| d.as_slice());
        Some((self.checks.as_slice(), decisions))
    }

    /// Whether some limit applied is charged after the response (so the response head must
    /// be read for it: [`Passed::charge_response`]).
    pub fn charges_after(&self) -> bool {
        self.after().is_some()
    }

    /// Armed when the request is sent upstream: from then on a client that leaves before the
    /// head is charged (see [`Abandoned`]).
    pub fn arm_abandoned(&self, store: &Arc<AnyStore>, ctx: &WorkerCtx) -> Option<Abandoned> {
        let (checks, decisions) = self.after()?;
        Abandoned::arm(store, ctx, &self.applied, checks, decisions)
    }

    /// The upstream's head arrived: charges what it costs (strips the cost headers that say):
    /// in process at once, else in a task, returned, which the response waits for before it
    /// is written (the next request sees the charge). Limits whose cost is in the body
    /// (`cost_from`) are charged by the returned [`BodyCharge`], which the front feeds the
    /// body and ends with it.
    pub fn charge_response(
        &self,
        store: &Arc<AnyStore>,
        ctx: &WorkerCtx,
        status: StatusCode,
        headers: &mut HeaderMap,
        request_bytes: u64,
    ) -> (Option<BodyCharge>, Option<tokio::task::JoinHandle<()>>) {
        let Some((checks, decisions)) = self.after() else {
            return (None, None);
        };
        let (owed, deferred) = owed_after(&self.applied, checks, decisions, status, headers);
        let charging = charge_after(store, ctx, owed);
        (
            BodyCharge::new(store, ctx, deferred, headers, request_bytes),
            charging,
        )
    }

    /// Whether a limit applied reads its cost from a JSON body (the upstream is then asked for
    /// an unencoded body: `Accept-Encoding` removed) and from a trailer (the upstream is told
    /// the gateway takes trailers: `TE: trailers`).
    pub fn reads_body(&self) -> (bool, bool) {
        let mut json = false;
        let mut trailer = false;
        for s in self
            .applied
            .iter()
            .filter_map(|l| l.after.as_ref())
            .flat_map(|a| a.cost_from.iter())
        {
            match s.source {
                crate::config::CostSourceKind::Json(_) => json = true,
                crate::config::CostSourceKind::Trailer(_) => trailer = true,
            }
        }
        (json, trailer)
    }
}
