//! The answer of a `usage = true` route: the calling consumer's usage of every limit that
//! counts it ([`crate::quota`]), read through the store's evaluate path, charging nothing.
//! An unknown key under `on_unknown = "<plan>"` gets that plan's limits as counted for its
//! client address, with `"consumer": null`.

use std::net::IpAddr;

use super::answer::ProxyError;
use crate::config::{ConsumersConfig, OnUnknown};
use crate::quota::{limits_of, rows, usage, usage_body};
use crate::runtime::state::Snapshot;
use crate::subject::{ip_digest, Consumer};

/// The usage answer for `consumer` (found by the consumer phase) calling from `client`.
pub async fn answer(
    snap: &Snapshot,
    cc: &ConsumersConfig,
    consumer: Option<&Consumer>,
    client: IpAddr,
) -> ProxyError {
    let (plan, limits, subject) = match (consumer, cc.on_unknown) {
        (Some(c), _) => (c.plan, c.limits, c.subject),
        (None, OnUnknown::Plan(p)) => (p, p, ip_digest(client)),
        // Refused before (401) by the consumer phase.
        (None, OnUnknown::Reject) => return ProxyError::UnknownConsumer(cc.source.to_string()),
    };
    let Some(plan_name) = snap.config.plans.get(plan).map(|p| p.name.as_str()) else {
        return ProxyError::StoreUnavailable;
    };
    let listed = limits_of(&snap.routes, limits);
    // Naming no part cannot fail.
    let rows = rows(&listed, consumer, subject, &[]).unwrap_or_default();
    match usage(&snap.store, &rows).await {
        Ok(limits) => ProxyError::Usage(usage_body(consumer.map(|c| &*c.name), plan_name, limits)),
        Err(e) => {
            tracing::warn!(error = %e, "the store cannot answer a usage request");
            ProxyError::StoreUnavailable
        }
    }
}
