//! The consumer phase of a route with `consumers = true`: who is calling (by the key the request
//! carries), and so which plan's limits apply; and, on the way upstream, the key stripped and
//! `X-Consumer` set by the gateway alone.

use std::borrow::Cow;
use std::sync::Arc;

use http::header::HeaderValue;

use super::answer::ProxyError;
use super::edits::{Edits, X_CONSUMER};
use super::record::Trail;
use crate::config::{ConsumersConfig, KeySource, OnUnknown};
use crate::consumers::{identify, strip_query_param, Consumer, ConsumerTable, Identity};
use crate::head::RequestHead;
use crate::limiter::{CompiledLimit, SubjectDigest};
use crate::routing::Route;

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

/// Finds the request's consumer (recorded in `trail`) and its plan's limits on `route`.
pub fn identify_caller<'s>(
    cc: &ConsumersConfig,
    table: &'s ConsumerTable,
    route: &'s Route,
    head: &impl RequestHead,
    trail: &mut Trail<'s>,
) -> Result<Caller<'s>, ProxyError> {
    let identity = identify(&cc.source, table, head)
        .map_err(|_| ProxyError::RepeatedSubject(cc.source.to_string()))?;
    Ok(match identity {
        Identity::Known(c) => {
            trail.consumer = Some(c);
            Caller {
                plan: route
                    .plan_limits
                    .get(c.limits)
                    .map(|l| (l.as_slice(), Some(c.subject))),
                reject_unknown: false,
            }
        }
        Identity::Unknown => match cc.on_unknown {
            OnUnknown::Reject => Caller {
                plan: None,
                reject_unknown: true,
            },
            OnUnknown::Plan(p) => Caller {
                plan: route.plan_limits.get(p).map(|l| (l.as_slice(), None)),
                reject_unknown: false,
            },
        },
    })
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
