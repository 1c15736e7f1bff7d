//! `GET /-/explain`: what the gateway would do with a request, charging nothing.
//!
//! `?method=GET&path=/api/x&host=H&ip=1.2.3.4&header.X-Api-Key=K&query.key=K`: the route that
//! matches (or why none does), and for each of its limits the subject derived and the state in
//! the store, read with the store's evaluate path ([`Store::peek`]). `remaining` is what is
//! available now: a next request of cost C, if admitted, reports `remaining − C` in its headers.
//! `ip` is the client address as the gateway would derive it (after `trusted_proxies`).

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use serde_json::{json, Value};

use super::params;
use crate::config::{OnMissing, OnUnknown, SubjectSpec};
use crate::consumers::{identify, Identity};
use crate::limiter::{Check, Op};
use crate::state::Shared;
use crate::store::Store;
use crate::subject::{ip_digest, subject_of};

/// The request an operator asks about.
struct Asked {
    method: Method,
    path: String,
    host: Option<String>,
    ip: Option<IpAddr>,
    headers: HeaderMap,
    /// `query.NAME=VALUE` pairs as a query string (values still percent-encoded).
    query: String,
}

fn parse(query: Option<&str>) -> Result<Asked, String> {
    let mut a = Asked {
        method: Method::GET,
        path: String::new(),
        host: None,
        ip: None,
        headers: HeaderMap::new(),
        query: String::new(),
    };
    let mut path = None;
    for p in params(query)? {
        let text =
            || String::from_utf8(p.value.clone()).map_err(|_| format!("{} is not UTF-8", p.name));
        match p.name.as_str() {
            "method" => {
                a.method = Method::from_bytes(&p.value)
                    .map_err(|_| format!("invalid method {:?}", text().unwrap_or_default()))?
            }
            "path" => path = Some(text()?),
            "host" => {
                let h = text()?;
                a.host = Some(
                    crate::routing::route_host(&h).ok_or_else(|| format!("invalid host {h:?}"))?,
                );
            }
            "ip" => {
                let ip = text()?;
                a.ip = Some(
                    ip.parse::<IpAddr>()
                        .map_err(|_| format!("invalid ip {ip:?}"))?
                        .to_canonical(),
                );
            }
            name => {
                if let Some(h) = name.strip_prefix("header.") {
                    let n = HeaderName::from_bytes(h.as_bytes())
                        .map_err(|_| format!("invalid header name {h:?}"))?;
                    let v = HeaderValue::from_bytes(&p.value)
                        .map_err(|_| format!("invalid value for header {h}"))?;
                    a.headers.append(n, v);
                } else if let Some(q) = name.strip_prefix("query.") {
                    if !a.query.is_empty() {
                        a.query.push('&');
                    }
                    a.query.push_str(q);
                    a.query.push('=');
                    a.query.push_str(p.raw_value);
                } else {
                    return Err(format!(
                        "unknown parameter {name:?}; expected method, path, host, ip, header.NAME, query.NAME"
                    ));
                }
            }
        }
    }
    a.path = path.ok_or("path is required (e.g. path=/api/x)")?;
    Ok(a)
}

fn error(status: StatusCode, message: impl Into<String>) -> (StatusCode, String) {
    (status, json!({ "error": message.into() }).to_string())
}

/// The status and JSON body of `GET /-/explain?query`.
pub async fn explain(shared: &Shared, query: Option<&str>) -> (StatusCode, String) {
    let asked = match parse(query) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let none = |reason: String| {
        (
            StatusCode::OK,
            json!({"route": null, "reason": reason, "limits": []}).to_string(),
        )
    };
    let params = shared.snapshot.load().config.server.path_params;
    let path = match crate::path::normalize_with(&asked.path, params) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            return none(format!(
                "the path {:?} is refused with 400 ({e:?})",
                asked.path
            ))
        }
    };
    let snap = shared.snapshot.load_full();
    let Some(route) = snap
        .routes
        .find(asked.host.as_deref(), &asked.method, &path)
    else {
        return none(format!(
            "no route matches {} {}{path} (the gateway answers 404)",
            asked.method,
            asked.host.as_deref().unwrap_or("(any host)"),
        ));
    };
    let refused = |reason: String| {
        (
            StatusCode::OK,
            json!({"route": &*route.name, "reason": reason, "limits": []}).to_string(),
        )
    };
    let query = (!asked.query.is_empty()).then_some(asked.query.as_str());
    // Without `ip`, an address that cannot be anyone's: needed only when a limit counts by
    // address, which is then an error.
    let client = asked.ip.unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let mut checks = Vec::with_capacity(route.limits.len());
    // Per check: what its subject is (`ip`, `header`, `query`, `global`, `consumer`).
    let mut kinds: Vec<&'static str> = Vec::with_capacity(route.limits.len());
    for l in &route.limits {
        let subject = match subject_of(&l.subject, &asked.headers, query, client) {
            Ok(s) => s,
            Err(_) => {
                return refused(format!(
                    "{} appears more than once: the gateway answers 400",
                    l.subject
                ))
            }
        };
        let (subject, ip) = match subject {
            Some(s) => (s, l.subject == SubjectSpec::Ip),
            None if l.on_missing == OnMissing::Reject => {
                return refused(format!(
                    "the request has no {} (limit {:?}): the gateway answers 401",
                    l.subject, l.name
                ))
            }
            None => (ip_digest(client), true),
        };
        if ip && asked.ip.is_none() {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "limit {:?} counts this request by client address: pass ip=",
                    l.name
                ),
            );
        }
        checks.push(Check {
            limit: l,
            subject,
            op: Op::Decide,
        });
        kinds.push(match (&l.subject, ip) {
            (_, true) => "ip",
            (SubjectSpec::Header(_), false) => "header",
            (SubjectSpec::Query(_), false) => "query",
            _ => "global",
        });
    }
    // The consumer's plan (routes with `consumers = true`), as the request path finds it.
    let mut consumer = Value::Null;
    let mut reason = None;
    if let Some(cc) = snap.config.consumers.as_ref().filter(|_| route.consumers) {
        let Ok(identity) = identify(&cc.source, &snap.consumers, &asked.headers, query) else {
            return refused(format!(
                "the {} appears more than once: the gateway answers 400",
                cc.source
            ));
        };
        let plan = match identity {
            Identity::Known(c) => {
                consumer = json!(&*c.name);
                Some((c.plan, c.subject, "consumer"))
            }
            Identity::Unknown => match cc.on_unknown {
                OnUnknown::Reject => {
                    reason = Some(format!(
                        "no known key in the {}: the gateway charges the route's limits, then answers 401",
                        cc.source
                    ));
                    None
                }
                OnUnknown::Plan(p) => {
                    if asked.ip.is_none() {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "an unknown key counts by client address: pass ip=",
                        );
                    }
                    Some((p, ip_digest(client), "ip"))
                }
            },
        };
        if let Some((p, subject, kind)) = plan {
            for l in route.plan_limits.get(p).into_iter().flatten() {
                checks.push(Check {
                    limit: l,
                    subject,
                    op: Op::Decide,
                });
                kinds.push(kind);
            }
        }
    }
    let decisions = match snap.store.peek(&checks).await {
        Ok(d) => d,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store cannot answer: {e}"),
            )
        }
    };
    let limits: Vec<Value> = checks
        .iter()
        .zip(&decisions)
        .zip(&kinds)
        .map(|((c, d), &kind)| {
            let l = c.limit;
            // The decision is for a request of cost C: an admitted one reports what is left
            // after it, so what is available now is C more.
            let remaining = if d.allowed {
                d.remaining.saturating_add(l.policy.cost)
            } else {
                d.remaining
            };
            let reset = if d.allowed {
                d.reset_after
            } else {
                d.retry_after
            };
            let mut v = json!({
                "name": &*l.name,
                "algorithm": l.policy.algorithm.as_str(),
                "mode": if l.shadow { "shadow" } else { "enforce" },
                "subject": kind,
                "key": c.subject.short_hex(),
                "limit": d.limit,
                "remaining": remaining,
                "reset_s": reset.div_ceil(1_000_000),
                "would_admit": d.allowed,
            });
            if kind == "ip" {
                v["ip"] = json!(client.to_string());
            }
            if let Some(p) = &l.plan {
                v["plan"] = json!(&**p);
            }
            v
        })
        .collect();
    let mut body = json!({"route": &*route.name, "limits": limits});
    if route.consumers {
        body["consumer"] = consumer;
    }
    if let Some(r) = reason {
        body["reason"] = json!(r);
    }
    (StatusCode::OK, body.to_string())
}
