//! `GET /-/top`: the subjects each limit denies most, from the limits' sketches.
//!
//! `?route=R&limit=L` answers one limit's object; without both, `{"limits": [...]}` with one
//! object per limit (only route R's with `route`, only limits named L with `limit`). A route or
//! limit name that matches nothing is 404, with or without the other parameter. Subjects
//! are shown as their address (`ip`) or the first 8 hex digits of their digest (`key`): a raw
//! API key never leaves the gateway.

use http::StatusCode;
use serde_json::{json, Value};

use super::params;
use crate::limiter::CompiledLimit;
use crate::runtime::state::Snapshot;
use crate::top::{Who, WINDOW_SECS};

fn limit_json(l: &CompiledLimit, now: crate::limiter::Micros) -> Value {
    let top: Vec<Value> = l
        .top
        .top()
        .iter()
        .map(|d| match &d.who {
            Who::Ip(net) => {
                // A whole address as itself, a network (an `ipv6_prefix` of 64) as a CIDR.
                let ip = if net.prefix_len() == net.max_prefix_len() {
                    net.addr().to_string()
                } else {
                    net.to_string()
                };
                json!({"subject": "ip", "ip": ip, "denied": d.count})
            }
            Who::Header | Who::Query => {
                json!({"subject": d.who.kind(), "key": d.subject.short_hex(), "denied": d.count})
            }
            Who::Global => json!({"subject": "global", "denied": d.count}),
            Who::Parts(parts) => json!({
                "subject": "parts",
                "key": d.subject.short_hex(),
                "parts": parts.iter().map(|p| p.json()).collect::<Vec<_>>(),
                "denied": d.count,
            }),
        })
        .collect();
    let mut v = json!({"route": &*l.route, "limit": &*l.name, "window_s": WINDOW_SECS, "top": top});
    if let Some(p) = &l.plan {
        v["plan"] = json!(&**p);
    }
    if let Some((_, bans)) = &l.ban {
        // The subjects in its penalty box (`ban_after`), by their digest, longest ban first.
        let banned: Vec<Value> = bans
            .list(now, 100)
            .iter()
            .map(|(s, until)| {
                json!({"key": s.short_hex(), "ends_in_s": until.saturating_sub(now).div_ceil(1_000_000)})
            })
            .collect();
        v["banned"] = json!(banned);
    }
    v
}

/// The status and JSON body of `GET /-/top?query`.
pub fn top(snap: &Snapshot, query: Option<&str>) -> (StatusCode, String) {
    let bad = |m: String| (StatusCode::BAD_REQUEST, json!({ "error": m }).to_string());
    let (mut route, mut limit) = (None, None);
    match params(query) {
        Ok(ps) => {
            for p in ps {
                let v = String::from_utf8_lossy(&p.value).into_owned();
                match p.name.as_str() {
                    "route" => route = Some(v),
                    "limit" => limit = Some(v),
                    other => {
                        return bad(format!(
                            "unknown parameter {other:?}; expected route, limit"
                        ))
                    }
                }
            }
        }
        Err(e) => return bad(e),
    }
    let now = snap.store.local().now();
    let limits = snap
        .routes
        .iter()
        .flat_map(|r| {
            // The plans' limits (a consumer's overrides record into the same sketches).
            let plans = r.plan_limits.iter().take(snap.config.plans.len());
            r.limits.iter().chain(plans.flatten())
        })
        .map(|l| &**l)
        .filter(|l| route.as_deref().is_none_or(|r| *l.route == *r))
        .filter(|l| limit.as_deref().is_none_or(|n| *l.name == *n));
    match (&route, &limit) {
        (Some(r), Some(n)) if !r.starts_with("rls:") => {
            return match limits.map(|l| limit_json(l, now)).next() {
                Some(v) => (StatusCode::OK, v.to_string()),
                None => (
                    StatusCode::NOT_FOUND,
                    json!({ "error": format!("route {r:?} has no limit {n:?}") }).to_string(),
                ),
            };
        }
        _ => {}
    }
    let mut all: Vec<Value> = limits.map(|l| limit_json(l, now)).collect();
    // Envoy's rate limit service (`[rls]`): each descriptor limit as route `rls:<domain>`.
    if let Some(domains) = &snap.rls {
        let rules = domains.rules();
        let rls = rules
            .iter()
            .filter(|r| r.limit.is_some())
            .filter(|r| {
                route
                    .as_deref()
                    .is_none_or(|n| n.strip_prefix("rls:") == Some(&*r.domain))
            })
            .filter(|r| limit.as_deref().is_none_or(|n| n == r.label()));
        for r in rls {
            let top: Vec<Value> = r
                .top
                .top()
                .iter()
                .map(|d| json!({"subject": "descriptor", "key": d.subject.short_hex(), "denied": d.count}))
                .collect();
            let v = json!({"route": format!("rls:{}", r.domain), "limit": r.label(), "window_s": WINDOW_SECS, "top": top});
            if route.is_some() && limit.is_some() {
                return (StatusCode::OK, v.to_string());
            }
            all.push(v);
        }
    }
    if all.is_empty() {
        // Nothing listed: say which name is unknown (a known route may have no limits).
        let not_found = |m: String| (StatusCode::NOT_FOUND, json!({ "error": m }).to_string());
        if let Some(r) = &route {
            if !snap.routes.iter().any(|x| *x.name == **r) && !r.starts_with("rls:") {
                return not_found(format!("no route {r:?}"));
            }
        }
        if let Some(n) = &limit {
            return not_found(format!("no limit {n:?}"));
        }
    }
    (StatusCode::OK, json!({ "limits": all }).to_string())
}
