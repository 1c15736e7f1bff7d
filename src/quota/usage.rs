//! A consumer's usage: every limit that counts it, evaluated without charging; a plan's limit
//! with parts (`subject = ["json:model"]`) once per key it counts (see [`keys_of`]).

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::config::SubjectSpec;
use crate::limiter::Algorithm;
use crate::limiter::{Check, CompiledLimit, Decision, Op, Shown, ShownPart, SubjectDigest};
use crate::routing::RouteTable;
use crate::subject::{parts_digest, Consumer};
use tollgate_limit::store::{AnyStore, StoreError};
use tollgate_limit::worker::WorkerId;

/// One limit that counts a consumer: a plan's limit as compiled on a route, and the route
/// (`None` for a `scope = "global"` limit, one count across routes).
#[derive(Debug, Clone, Copy)]
pub struct Listed<'s> {
    pub limit: &'s Arc<CompiledLimit>,
    pub route: Option<&'s str>,
}

/// The limits that count a consumer whose compiled limits are `plan` (its
/// [`Consumer::limits`](crate::subject::Consumer::limits): a `[[plans]]` index, or past them
/// a plan with its overrides): its global limits once, then its per-route limits on each route
/// with `consumers = true` (config order). Usage routes charge none and are skipped.
pub fn limits_of(routes: &RouteTable, plan: usize) -> Vec<Listed<'_>> {
    let mut out = Vec::new();
    let mut globals = false;
    for r in routes.iter().filter(|r| r.consumers && !r.usage) {
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
    let order =
        |r: Option<&str>| r.map(|r| routes.iter().find(|c| &*c.name == r).map(|c| c.position));
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

/// A part value support names (`model=m1`, `json:model=m1`): the name as given, the value.
pub type Named = (String, String);

/// Whether `name` names `part`: its spelling (`json:model`, `header:x-tenant`, `path`) or what
/// follows the colon (`model`, `x-tenant`).
pub fn names(part: &SubjectSpec, name: &str) -> bool {
    let spelled = part.to_string();
    spelled == name
        || spelled
            .split_once(':')
            .is_some_and(|(_, short)| short == name)
}

/// The parts support can name on a limit (`None`: a limit without parts).
pub fn nameable(limit: &CompiledLimit) -> Option<Vec<String>> {
    match &limit.subject {
        SubjectSpec::Compound(parts) if limit.plan.is_some() => Some(
            parts
                .iter()
                .filter(|p| **p != SubjectSpec::Consumer)
                .map(|p| p.to_string())
                .collect(),
        ),
        _ => None,
    }
}

/// One key of a listed limit: the subject counted, and, for a limit with parts, the parts it
/// stands for (`None`: a limit without parts, or one that has counted none yet).
#[derive(Debug, Clone)]
pub struct Key {
    pub subject: SubjectDigest,
    pub parts: Option<Arc<[ShownPart]>>,
}

/// The keys of `l` for `consumer` (whose own subject is `subject`: a consumer's, or an unknown
/// key's address) given the parts `named`: a limit without parts, its one key; a limit with
/// parts, every part named, the key of those values; none named, the combinations this gateway
/// counted for the consumer (most recent first, at most
/// [`PER_CONSUMER`](crate::limiter::seen_keys::PER_CONSUMER); empty when none). An error says
/// which parts are left to name (or that an `ip` part cannot be).
pub fn keys_of(
    l: &Listed<'_>,
    consumer: Option<&Consumer>,
    subject: SubjectDigest,
    named: &[Named],
) -> Result<Vec<Key>, String> {
    let (Some(c), Some(_)) = (consumer, nameable(l.limit)) else {
        return Ok(vec![Key {
            subject,
            parts: None,
        }]);
    };
    let parts: Vec<&SubjectSpec> = l
        .limit
        .subject
        .parts()
        .iter()
        .filter(|p| **p != SubjectSpec::Consumer)
        .collect();
    let value = |p: &SubjectSpec| named.iter().find(|(n, _)| names(p, n)).map(|(_, v)| v);
    let given = parts.iter().filter(|p| value(p).is_some()).count();
    if given == 0 {
        return Ok(l
            .limit
            .seen
            .of(&c.subject)
            .into_iter()
            .map(|k| Key {
                subject: k.subject,
                parts: Some(k.parts),
            })
            .collect());
    }
    if parts.contains(&&SubjectSpec::Ip) {
        return Err(format!(
            "limit {:?} counts by client address (an `ip` part), which cannot be named; name no part to act on every key counted",
            &*l.limit.name
        ));
    }
    if given < parts.len() {
        let all: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        return Err(format!(
            "limit {:?} counts one key per {}: name every part, or none",
            &*l.limit.name,
            all.join(" and ")
        ));
    }
    let digest = parts_digest(&l.limit.subject, |p| match p {
        SubjectSpec::Consumer => Some(Cow::Owned(c.subject.0.to_vec())),
        p => value(p).map(|v| Cow::Owned(v.as_bytes().to_vec())),
    });
    let Some(digest) = digest else {
        return Err("a part value too long".to_owned());
    };
    let shown: Vec<ShownPart> = parts
        .iter()
        .filter_map(|p| {
            value(p).map(|v| ShownPart {
                part: p.to_string().into_boxed_str(),
                value: Shown::Plain(v.clone().into_boxed_str()),
            })
        })
        .collect();
    Ok(vec![Key {
        subject: digest,
        parts: Some(shown.into()),
    }])
}

/// Each listed limit with its keys (see [`keys_of`]); a limit with parts that has counted none
/// yet is listed once, as a fresh limit, with `"parts": null`.
pub fn rows<'s>(
    listed: &[Listed<'s>],
    consumer: Option<&Consumer>,
    subject: SubjectDigest,
    named: &[Named],
) -> Result<Vec<(Listed<'s>, Key)>, String> {
    let mut out = Vec::with_capacity(listed.len());
    for l in listed {
        let keys = keys_of(l, consumer, subject, named)?;
        if keys.is_empty() {
            out.push((
                *l,
                Key {
                    subject,
                    parts: None,
                },
            ));
        }
        out.extend(keys.into_iter().map(|k| (*l, k)));
    }
    Ok(out)
}

/// One limit's entry: what the rate-limit headers of a request now would say, before it.
fn entry(l: &Listed<'_>, key: &Key, d: &Decision) -> Value {
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
    if nameable(l.limit).is_some() {
        v["parts"] = match &key.parts {
            Some(parts) => parts.iter().map(ShownPart::json).collect(),
            None => Value::Null,
        };
    }
    v
}

/// Evaluates each row's key, charging nothing: one entry per row, in order.
pub async fn usage(store: &AnyStore, rows: &[(Listed<'_>, Key)]) -> Result<Vec<Value>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let checks: Vec<Check<'_>> = rows
        .iter()
        .map(|(l, k)| Check {
            limit: l.limit,
            subject: k.subject,
            op: Op::Decide,
        })
        .collect();
    let decisions = crate::limiter::zero_budget::peek(store, &checks, WorkerId::NONE).await?;
    Ok(rows
        .iter()
        .zip(&decisions)
        .map(|((l, k), d)| entry(l, k, d))
        .collect())
}

/// The body of a usage answer: `{"consumer": …, "plan": …, "limits": […]}`.
pub fn usage_body(consumer: Option<&str>, plan: &str, limits: Vec<Value>) -> String {
    json!({"consumer": consumer, "plan": plan, "limits": limits}).to_string()
}
