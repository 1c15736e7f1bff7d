//! Support's quota endpoints (see [`crate::quota`]): `GET /-/usage?consumer=NAME`, a
//! consumer's usage (the body a `usage = true` route answers the consumer itself), and
//! `POST /-/quota/reset` and `POST /-/quota/grant`, corrections applied atomically by the store
//! ([`crate::limiter::adjust`]), logged and counted (`tollgate_quota_admin_total{action}`).

use http::StatusCode;
use serde_json::json;

use super::params;
use crate::config::SubjectSpec;
use crate::limiter::adjust::Adjust;
use crate::limiter::{Check, Op};
use crate::quota::{keys_of, limits_of, nameable, names, rows, usage, usage_body, Named};
use crate::runtime::state::Snapshot;
use crate::subject::Consumer;
use tollgate_limit::store::Store;

fn error(status: StatusCode, message: impl Into<String>) -> (StatusCode, String) {
    (status, json!({ "error": message.into() }).to_string())
}

/// The consumer named `name`, or the 404 saying there is none.
pub(super) fn consumer<'s>(
    snap: &'s Snapshot,
    name: &str,
) -> Result<&'s Consumer, (StatusCode, String)> {
    if snap.config.consumers.is_none() {
        return Err(error(
            StatusCode::NOT_FOUND,
            "no [consumers] section: this gateway knows no consumers",
        ));
    }
    snap.consumers.by_name(name).ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            format!(
                "no consumer named {name:?} in the consumers file ({} consumers)",
                snap.consumers.len()
            ),
        )
    })
}

/// The status and JSON body of `GET /-/usage?query`.
pub async fn usage_of(snap: &Snapshot, query: Option<&str>) -> (StatusCode, String) {
    let mut name = None;
    let mut named: Vec<Named> = Vec::new();
    match params(query) {
        Ok(ps) => {
            for p in ps {
                let value = String::from_utf8_lossy(&p.value).into_owned();
                match p.name.as_str() {
                    "consumer" => name = Some(value),
                    // A part of a limit with parts (`model=m1`), checked below.
                    _ => named.push((p.name, value)),
                }
            }
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    }
    let Some(name) = name else {
        return error(
            StatusCode::BAD_REQUEST,
            "consumer is required (e.g. ?consumer=acme)",
        );
    };
    let c = match consumer(snap, &name) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let plan = snap
        .config
        .plans
        .get(c.plan)
        .map_or("", |p| p.name.as_str());
    let listed = limits_of(&snap.routes, c.limits);
    let parts: Vec<String> = listed
        .iter()
        .filter_map(|l| nameable(l.limit))
        .flatten()
        .collect();
    if let Some((other, _)) = named
        .iter()
        .find(|(n, _)| !listed.iter().any(|l| names_a_part(l.limit, n)))
    {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown parameter {other:?}; expected consumer{}",
                if parts.is_empty() {
                    String::new()
                } else {
                    format!(" or a part of a limit with parts ({})", parts.join(", "))
                }
            ),
        );
    }
    // A part named narrows the limits that have it to that key; the others are listed as
    // always.
    let mut rows_ = Vec::new();
    for l in &listed {
        let mine: Vec<Named> = named
            .iter()
            .filter(|(n, _)| names_a_part(l.limit, n))
            .cloned()
            .collect();
        match rows(std::slice::from_ref(l), Some(c), c.subject, &mine) {
            Ok(r) => rows_.extend(r),
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        }
    }
    match usage(&snap.store, &rows_).await {
        Ok(limits) => (StatusCode::OK, usage_body(Some(&c.name), plan, limits)),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store cannot answer: {e}"),
        ),
    }
}

/// Whether `name` names a part of `limit` (a plan's limit with parts).
fn names_a_part(limit: &crate::limiter::CompiledLimit, name: &str) -> bool {
    nameable(limit).is_some()
        && limit
            .subject
            .parts()
            .iter()
            .any(|p| *p != SubjectSpec::Consumer && names(p, name))
}

/// The body of `POST /-/quota/reset` and `POST /-/quota/grant` (besides the parts named of a
/// limit with parts, `"model": "m1"`, taken out before).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AdjustBody {
    consumer: String,
    limit: String,
    /// A `scope = "route"` limit's route; absent for a global one.
    #[serde(default)]
    route: Option<String>,
    /// Grant only: the units added in the current window.
    #[serde(default)]
    units: Option<serde_json::Number>,
}

/// `POST /-/quota/reset` with `{"route": R, "limit": L}` and no consumer: lifts every ban of
/// route R's own limit L (`ban_after`), here and in a shared store (every gateway on it lets
/// them out within a second, `bans::LIFT_POLL`); `None` when the body names a consumer (a quota
/// reset).
async fn lift_route_bans(snap: &Snapshot, body: &[u8]) -> Option<(StatusCode, String)> {
    let o = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body).ok()?;
    if o.contains_key("consumer") {
        return None;
    }
    let (Some(route), Some(limit)) = (
        o.get("route").and_then(|v| v.as_str()),
        o.get("limit").and_then(|v| v.as_str()),
    ) else {
        return None;
    };
    let Some(l) = snap
        .routes
        .iter()
        .filter(|r| *r.name == *route)
        .flat_map(|r| r.limits.iter())
        .find(|l| *l.name == *limit)
    else {
        return Some(error(
            StatusCode::NOT_FOUND,
            format!("route {route:?} has no limit {limit:?}"),
        ));
    };
    let Some((_, bans)) = &l.ban else {
        return Some(error(
            StatusCode::CONFLICT,
            format!("limit {limit:?} of route {route:?} has no ban_after: nothing to lift"),
        ));
    };
    let lifted = bans.lift(None);
    let shared = match snap.store.lift_bans(&**l).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(route, limit, lifted, error = %e, "bans lifted here, not in the store");
            return Some(error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{lifted} bans lifted on this gateway; the store cannot lift the fleet's: {e}"
                ),
            ));
        }
    };
    // Lifted again: a request racing the store's lift may have held a ban read before it.
    let lifted = lifted + bans.lift(None);
    tracing::info!(route, limit, lifted, shared, "bans lifted on the admin API");
    metrics::counter!(crate::metrics::QUOTA_ADMIN, "action" => "reset").increment(1);
    Some((
        StatusCode::OK,
        json!({"action": "reset", "route": route, "limit": limit, "bans_lifted": lifted,
            "store_bans_lifted": shared})
        .to_string(),
    ))
}

/// Which correction an endpoint makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Reset,
    Grant,
}

/// The status and JSON body of `POST /-/quota/reset` (`Action::Reset`) or `/-/quota/grant`.
pub async fn adjust(snap: &Snapshot, action: Action, body: &[u8]) -> (StatusCode, String) {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, m);
    if action == Action::Reset {
        if let Some(answer) = lift_route_bans(snap, body).await {
            return answer;
        }
    }
    // The fields, and apart from them the parts named (string values).
    let mut named: Vec<Named> = Vec::new();
    let parsed = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
        .and_then(|mut o| {
            let parts: Vec<String> = o
                .keys()
                .filter(|k| !matches!(k.as_str(), "consumer" | "limit" | "route" | "units"))
                .cloned()
                .collect();
            for k in parts {
                match o.remove(&k) {
                    Some(serde_json::Value::String(v)) => named.push((k, v)),
                    _ => {
                        return Err(serde::de::Error::custom(format!(
                            "unknown field {k:?}, or not a string"
                        )))
                    }
                }
            }
            serde_json::from_value::<AdjustBody>(serde_json::Value::Object(o))
        });
    let b: AdjustBody = match parsed {
        Ok(b) => b,
        Err(e) => {
            return bad(format!(
                "expected a JSON object {{\"consumer\": …, \"limit\": …{}}}: {e}",
                if action == Action::Grant {
                    ", \"units\": N"
                } else {
                    ""
                }
            ))
        }
    };
    let c = match consumer(snap, &b.consumer) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let plan = snap
        .config
        .plans
        .get(c.plan)
        .map_or("", |p| p.name.as_str());
    let listed = limits_of(&snap.routes, c.limits);
    let Some(found) = crate::quota::find(&listed, &b.limit, b.route.as_deref()) else {
        let exists: Vec<serde_json::Value> = listed
            .iter()
            .map(|l| match l.route {
                Some(r) => json!({"limit": &*l.limit.name, "route": r}),
                None => json!({"limit": &*l.limit.name}),
            })
            .collect();
        let what = match &b.route {
            Some(r) => format!("limit {:?} on route {r:?}", b.limit),
            None => format!("global limit {:?}", b.limit),
        };
        return (
            StatusCode::NOT_FOUND,
            json!({
                "error": format!("consumer {:?} (plan {plan:?}) has no {what}", b.consumer),
                "limits": exists,
            })
            .to_string(),
        );
    };
    if let Some((other, _)) = named.iter().find(|(n, _)| !names_a_part(found.limit, n)) {
        return bad(match nameable(found.limit) {
            Some(parts) => format!(
                "unknown field {other:?}: limit {:?} counts by {}",
                b.limit,
                parts.join(", ")
            ),
            None => format!("unknown field {other:?}: limit {:?} has no parts", b.limit),
        });
    }
    let keys = match keys_of(&found, Some(c), c.subject, &named) {
        Ok(k) => k,
        Err(e) => return bad(e),
    };
    let with_parts = nameable(found.limit);
    let policy = &found.limit.policy;
    let adjust = match (action, &b.units) {
        (Action::Reset, None) => Adjust::Reset,
        (Action::Reset, Some(_)) => {
            return bad("a reset takes no units (POST /-/quota/grant adds units)".into())
        }
        (Action::Grant, None) => return bad("units is required (a whole number ≥ 1)".into()),
        (Action::Grant, Some(n)) => {
            // At most the quota per grant (the credit a subject can hold is bounded too:
            // `adjust::credit_max`), which keeps the store's arithmetic exact.
            let max = policy.quota();
            match n.as_u64() {
                Some(u) if (1..=max).contains(&u) => Adjust::Grant(u),
                _ => {
                    return bad(format!(
                        "units must be a whole number from 1 to {max} (the limit's quota), got {n}"
                    ))
                }
            }
        }
    };
    if let Err(e) = crate::limiter::adjust::check(policy.algorithm, adjust) {
        return error(StatusCode::CONFLICT, e.to_string());
    }
    if let (Some(parts), Adjust::Grant(_), true) = (&with_parts, adjust, named.is_empty()) {
        return bad(format!(
            "limit {:?} counts one key per {}: a grant names the key's parts",
            b.limit,
            parts.join(" and ")
        ));
    }
    for key in &keys {
        let check = Check {
            limit: found.limit,
            subject: key.subject,
            op: Op::Decide,
        };
        if let Err(e) = snap.store.adjust(&check, adjust).await {
            tracing::warn!(action = adjust.action(), consumer = &*c.name, limit = &*found.limit.name, error = %e, "quota correction failed");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store cannot apply it: {e}"),
            );
        }
    }
    let units = match adjust {
        Adjust::Grant(u) => Some(u),
        Adjust::Reset => None,
    };
    tracing::info!(
        action = adjust.action(),
        consumer = &*c.name,
        plan,
        limit = &*found.limit.name,
        route = found.route,
        units,
        keys = keys.len(),
        "quota adjusted on the admin API"
    );
    metrics::counter!(crate::metrics::QUOTA_ADMIN, "action" => adjust.action()).increment(1);
    let mut out = json!({
        "action": adjust.action(),
        "consumer": &*c.name,
        "plan": plan,
    });
    if let Some(u) = units {
        out["units"] = json!(u);
    }
    // The limit as it stands now (what a usage request would list): for a limit with parts,
    // each key corrected (`limits`), and `limit` when there is one.
    let rows: Vec<_> = keys.iter().map(|k| (found, k.clone())).collect();
    if let Ok(mut v) = usage(&snap.store, &rows).await {
        if with_parts.is_some() {
            out["keys"] = json!(keys.len());
            out["limits"] = json!(v.clone());
        }
        if v.len() == 1 {
            out["limit"] = v.pop().unwrap_or(serde_json::Value::Null);
        }
    }
    (StatusCode::OK, out.to_string())
}
