//! `/-/explain` for the rate limit service: what `ShouldRateLimit` would answer a call, charging
//! nothing. The call's descriptors are matched as the service matches them
//! ([`super::service::plan`]: the most specific descriptor, then `replaces`) and their limits
//! read with the store's evaluate path ([`tollgate_limit::store::Store::peek`]); the verdict is the
//! service's all-or-nothing one. Nothing is counted in the service's metrics.

use serde_json::{json, Value};

use super::message::{Call, Descriptor, Entry};
use super::service::{
    hits_of, plan, verdict, Planned, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_ENTRY_BYTES,
};
use super::Domains;
use tollgate_limit::store::{Store, StoreError};
use tollgate_limit::worker::WorkerId;

/// Why a call cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The call is not one the service would decide (the message says why).
    #[error("{0}")]
    Invalid(String),
    #[error("the store cannot decide: {0}")]
    Store(#[from] StoreError),
}

/// A call of `domain` with `descriptors` (each a list of key, value entries) and the call's
/// `hits_addend`.
pub fn request(domain: &str, descriptors: Vec<Vec<(String, String)>>, hits: u32) -> Call {
    Call {
        domain: domain.as_bytes().to_vec(),
        descriptors: descriptors
            .into_iter()
            .map(|entries| Descriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| Entry {
                        key: key.into_bytes(),
                        value: value.into_bytes(),
                    })
                    .collect(),
                ..Descriptor::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// The JSON `/-/explain` answers for the call `r`.
pub async fn explain(
    domains: &Domains,
    store: &impl Store,
    r: &Call,
) -> Result<Value, ExplainError> {
    let invalid = |m: &str| Err(ExplainError::Invalid(m.to_owned()));
    if r.domain.is_empty() {
        return invalid("rls_domain must not be empty");
    }
    if r.descriptors.is_empty() {
        return invalid("give at least one descriptor=key=value[,key2=value2]");
    }
    if r.descriptors.len() > MAX_DESCRIPTORS {
        return invalid("more than 64 descriptors");
    }
    for d in &r.descriptors {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return invalid("a descriptor has from 1 to 16 entries");
        }
        if d.entries.iter().any(|e| {
            e.key.is_empty() || e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES
        }) {
            return invalid("an entry's key is empty, or a key or value is longer than 4096 bytes");
        }
    }
    let name = String::from_utf8_lossy(&r.domain);
    let Some(domain) = domains.get(&name) else {
        return Ok(json!({
            "rls_domain": name,
            "would_admit": true,
            "descriptors": [],
            "reason": "no such domain: the service answers OK (under no limit)",
        }));
    };
    let planned = plan(domain, r, false);
    let decisions = if planned.checks.is_empty() {
        Vec::new()
    } else {
        store.peek(&planned.checks, WorkerId::NONE).await?
    };
    let over = verdict(r, &planned, &decisions).over;
    let Planned {
        rules, checks, at, ..
    } = planned;
    let mut out = Vec::with_capacity(r.descriptors.len());
    for ((d, rule), i) in r.descriptors.iter().zip(&rules).zip(&at) {
        let entries: Vec<Value> = d
            .entries
            .iter()
            .map(|e| {
                json!({
                    "key": String::from_utf8_lossy(&e.key),
                    "value": String::from_utf8_lossy(&e.value),
                })
            })
            .collect();
        let matched = domain.find(d.pairs());
        let Some(rule) = rule else {
            let why = match matched {
                None => "matches no configured descriptor: under no limit".to_owned(),
                Some(m) => format!(
                    "matches {:?}, replaced by another matched limit",
                    m.rule.label()
                ),
            };
            out.push(json!({ "entries": entries, "rule": Value::Null, "note": why }));
            continue;
        };
        let mut v = json!({
            "entries": entries,
            "rule": &*rule.path,
            "name": rule.name.as_deref(),
        });
        if rule.blocks {
            // `requests_per_unit: 0`.
            let denied = hits_of(r, d) > 0;
            v["limit"] = json!(0);
            v["mode"] = json!(mode(rule));
            v["remaining"] = json!(0);
            v["would_admit"] = json!(!denied);
            v["note"] = json!("requests_per_unit 0: refuses every hit");
            out.push(v);
            continue;
        }
        let (Some(i), Some(limit)) = (i, rule.limit.as_ref()) else {
            v["unlimited"] = json!(true);
            v["would_admit"] = json!(true);
            out.push(v);
            continue;
        };
        let (Some(c), Some(dec)) = (checks.get(*i), decisions.get(*i)) else {
            out.push(v);
            continue;
        };
        let units = match c.op {
            tollgate_limit::Op::Reserve(u) => u,
            _ => limit.policy.cost,
        };
        // An admitted call reports what is left after it: what is available now is its cost more.
        let remaining = if dec.allowed {
            dec.remaining.saturating_add(units)
        } else {
            dec.remaining
        };
        let reset = if dec.allowed {
            dec.reset_after
        } else {
            dec.retry_after
        };
        v["algorithm"] = json!(limit.policy.algorithm.as_str());
        v["mode"] = json!(mode(rule));
        v["key"] = json!(c.subject.short_hex());
        v["limit"] = json!(dec.limit);
        v["cost"] = json!(units);
        v["remaining"] = json!(remaining);
        v["reset_s"] = json!(reset.div_ceil(1_000_000));
        v["would_admit"] = json!(dec.allowed);
        out.push(v);
    }
    Ok(json!({
        "rls_domain": name,
        // The service's verdict: OVER_LIMIT when one enforced descriptor would refuse (then
        // none is charged).
        "would_admit": !over,
        "code": if over { "OVER_LIMIT" } else { "OK" },
        "descriptors": out,
    }))
}

/// A descriptor's `mode`: `shadow` (never refuses), `quota` (`quota_mode`: refuses only with
/// every quota descriptor of the call over), or `enforce`.
fn mode(rule: &super::Rule) -> &'static str {
    if rule.shadow {
        "shadow"
    } else if rule.quota {
        "quota"
    } else {
        "enforce"
    }
}
