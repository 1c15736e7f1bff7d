//! The consumer phase of a route with `consumers = true`: who is calling (by the token's claim,
//! the key the request carries, or its connection's client certificate), and so which plan's
//! limits apply; and, on the way upstream, the key stripped and `X-Consumer` set by the gateway
//! alone.

use std::borrow::Cow;
use std::sync::Arc;

use http::header::HeaderValue;

use super::answer::ProxyError;
use super::edits::{Edits, X_CONSUMER};
use super::record::Trail;
use crate::config::{ConsumersConfig, KeySource, OnUnknown, PlanConfig};
use crate::consumers::{identify, strip_query_param, ConsumerRef, ConsumerTable, Identity};
use crate::http::head::RequestHead;
use crate::limiter::{CompiledLimit, SubjectDigest};
use crate::routing::Route;
use crate::subject::Consumer;
use crate::tls::peer::PeerCert;

/// A plan's limits and the subject they count: the consumer, or (`None`: an unknown key under
/// `on_unknown = "<plan>"`) the client address.
pub type Plan<'s> = (&'s [Arc<CompiledLimit>], Option<SubjectDigest>);

/// What the consumer step found.
#[derive(Default)]
pub struct Caller<'s> {
    pub plan: Option<Plan<'s>>,
    /// The key is unknown and `on_unknown = "reject"`: refused after the route's own limits.
    pub reject_unknown: bool,
}

/// Finds the request's consumer (recorded in `trail`) and its plan's limits on `route`: named by
/// the verified token's `jwt_claim` (its plan by `plan_claim`, or the consumers file's), else by
/// its API key, else (no key sent) by its connection's client certificate `cert`.
#[allow(clippy::too_many_arguments)]
pub fn identify_caller<'s>(
    cc: &ConsumersConfig,
    table: &'s ConsumerTable,
    plans: &[PlanConfig],
    route: &'s Route,
    head: &impl RequestHead,
    cert: Option<&PeerCert>,
    claims: Option<&serde_json::Value>,
    trail: &mut Trail<'s>,
) -> Result<Caller<'s>, ProxyError> {
    let from_token = match (&cc.jwt_claim, claims) {
        (Some(path), Some(claims)) => token_consumer(cc, table, plans, path, claims),
        _ => None,
    };
    let identity = match from_token {
        Some(c) => Some(c),
        None => match identify(&cc.source, table, head, cert)
            .map_err(|_| ProxyError::RepeatedSubject(cc.source.to_string()))?
        {
            Identity::Known(c) => Some(ConsumerRef::Table(c)),
            Identity::Unknown => None,
        },
    };
    Ok(match identity {
        Some(c) => {
            // `limits`: the plan's, or the variant of it with this consumer's overrides.
            let plan = route
                .plan_limits
                .get(c.limits)
                .map(|l| (l.as_slice(), Some(c.subject)));
            trail.plan_rate = plans.get(c.plan).and_then(|p| p.limit_rate);
            trail.consumer = Some(c);
            Caller {
                plan,
                reject_unknown: false,
            }
        }
        None => match cc.on_unknown {
            OnUnknown::Reject => Caller {
                plan: None,
                reject_unknown: true,
            },
            OnUnknown::Plan(p) => {
                trail.plan_rate = plans.get(p).and_then(|p| p.limit_rate);
                Caller {
                    plan: route.plan_limits.get(p).map(|l| (l.as_slice(), None)),
                    reject_unknown: false,
                }
            }
        },
    })
}

/// The consumer a verified token names: `None` when the claim is missing (or not a string or
/// number), or names no consumer of the file and carries no plan `plan_claim` knows.
fn token_consumer<'s>(
    cc: &ConsumersConfig,
    table: &'s ConsumerTable,
    plans: &[PlanConfig],
    path: &[Box<str>],
    claims: &serde_json::Value,
) -> Option<ConsumerRef<'s>> {
    let text = |path: &[Box<str>]| -> Option<String> {
        let bytes = crate::subject::claim_bytes(claims, path)?;
        let s = std::str::from_utf8(&bytes).ok()?;
        // A consumer's name rules (the consumers file's): 1–128 visible characters.
        (s.len() <= 128 && !s.chars().any(char::is_control)).then(|| s.to_owned())
    };
    let name = text(path)?;
    let plan = cc
        .plan_claim
        .as_deref()
        .and_then(text)
        .and_then(|p| plans.iter().position(|x| x.name == p));
    match (table.by_name(&name), plan) {
        (Some(c), None) => Some(ConsumerRef::Table(c)),
        (Some(c), Some(p)) if c.plan == p => Some(ConsumerRef::Table(c)),
        (_, Some(p)) => Some(ConsumerRef::Token(Arc::new(Consumer::named(&name, p)))),
        (None, None) => None,
    }
}

/// The query sent upstream: the client's, but for a query key stripped from it.
pub(super) fn upstream_query<'q>(
    consumers: Option<&ConsumersConfig>,
    query: Option<&'q str>,
) -> Option<Cow<'q, str>> {
    match (consumers, query) {
        (
            Some(ConsumersConfig {
                source: KeySource::Query(name),
                strip_key: true,
                ..
            }),
            Some(q),
        ) => strip_query_param(q, name).map(Cow::Owned),
        (_, q) => q.map(Cow::Borrowed),
    }
}

/// The headers sent upstream: only the gateway says who the consumer is (`X-Consumer`), and a
/// header key is removed under `strip_key`.
pub(super) fn rewrite_headers(
    cc: &ConsumersConfig,
    consumer: Option<&Consumer>,
    edits: &mut Edits,
) {
    edits.remove(&X_CONSUMER);
    if let Some(c) = consumer {
        if let Ok(v) = HeaderValue::from_str(&c.name) {
            edits.set(&X_CONSUMER, v);
        }
    }
    if let (true, KeySource::Header(h)) = (cc.strip_key, &cc.source) {
        edits.remove(h);
    }
}
