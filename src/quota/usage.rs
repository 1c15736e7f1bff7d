//! A consumer's usage: every limit that counts it, evaluated without charging.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::config::Algorithm;
use crate::limiter::{Check, CompiledLimit, Decision, Op, SubjectDigest};
use crate::state::Snapshot;
use crate::store::{Store, StoreError};
use crate::worker::WorkerId;

/// One limit that counts a consumer: a plan's limit as compiled on a route, and the route
/// (`None` for a `scope = "global"` limit, one count across routes).
#[derive(Debug, Clone, Copy)]
pub struct Listed<'s> {
    pub limit: &'s Arc<CompiledLimit>,
    pub route: Option<&'s str>,
}

/// The limits that count a consumer whose compiled limits are `plan` (its
/// [`Consumer::limits`](crate::consumers::Consumer::limits): a `[[plans]]` index, or past them
/// a plan with its overrides): its global limits once, then its per-route limits on each route
/// with `consumers = true` (config order). Usage routes charge none and are skipped.
pub fn limits_of(snap: &Snapshot, plan: usize) -> Vec<Listed<'_>> {
    let mut out = Vec::new();
    let mut globals = false;
    for r in snap.routes.iter().filter(|r| r.consumers && !r.usage) {
        let Some(limits) = r.plan_limits.get(plan) else {
            continue;
        };
        for l in limits {
            if l.scope.starts_with('@') {
                // The same count on every route: listed from the first.
                if !globals {
                    out.push(Listed {
                        limit: l,
                        route: None,
                    });
                }
            } else {
                out.push(Listed {
                    limit: l,
                    route: Some(&r.name),
                });
            }
        }
        globals = true;
    }
    // Globals first, then per route in config order (the route table has its own order).
    let order = |r: Option<&str>| r.map(|r| snap.config.routes.iter().position(|c| c.name == r));
    out.sort_by_key(|l| order(l.route));
    out
}

/// The listed limit named `name` on `route` (`None`: a global one).
pub fn find<'s>(listed: &[Listed<'s>], name: &str, route: Option<&str>) -> Option<Listed<'s>> {
    listed
        .iter()
        .find(|l| &*l.limit.name == name && l.route == route)
        .copied()
}

/// One limit's entry: what the rate-limit headers of a request now would say, before it.
fn entry(l: &Listed<'_>, d: &Decision) -> Value {
    let p = &l.limit.policy;
    // The decision is for a request of cost C: an admitted one reports what is left after
    // it, so what is available now is C more (as `/-/explain`) — above the quota while the
    // subject holds granted credit.
    let remaining = if d.allowed {
        d.remaining.saturating_add(p.cost)
    } else {
        d.remaining
    };
    let reset = if d.allowed {
        d.reset_after
    } else {
        d.retry_after
    };
    let window = match (p.algorithm, p.calendar) {
        (Algorithm::Concurrency, _) => Value::Null,
        (_, Some(c)) => json!(c.nominal_secs()),
        _ if p.period % 1_000_000 == 0 => json!(p.period / 1_000_000),
        _ => json!(p.period as f64 / 1e6),
    };
    let mut v = json!({
        "name": &*l.limit.name,
        "limit": d.limit,
        "remaining": remaining,
        "reset_seconds": reset.div_ceil(1_000_000),
        "window_seconds": window,
    });
    if let Some(r) = l.route {
        v["route"] = json!(r);
    }
    v
}

/// Evaluates `listed` for `subject` (the consumer's, or an unknown key's address), charging
/// nothing: one entry per limit, in order.
pub async fn usage(
    snap: &Snapshot,
    listed: &[Listed<'_>],
    subject: SubjectDigest,
) -> Result<Vec<Value>, StoreError> {
    if listed.is_empty() {
        return Ok(Vec::new());
    }
    let checks: Vec<Check<'_>> = listed
        .iter()
        .map(|l| Check {
            limit: l.limit,
            subject,
            op: Op::Decide,
        })
        .collect();
    let decisions = snap.store.peek(&checks, WorkerId::NONE).await?;
    Ok(listed
        .iter()
        .zip(&decisions)
        .map(|(l, d)| entry(l, d))
        .collect())
}

/// The body of a usage answer: `{"consumer": …, "plan": …, "limits": […]}`.
pub fn usage_body(consumer: Option<&str>, plan: &str, limits: Vec<Value>) -> String {
    json!({"consumer": consumer, "plan": plan, "limits": limits}).to_string()
}
