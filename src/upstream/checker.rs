//! Active health checks: one background task per group with `[upstreams.health_check]`, on the
//! main runtime (never on a proxy worker). Every `interval` it sends `GET path` to each server
//! at once, with `timeout`; a 2xx or 3xx is a success. `unhealthy_threshold` failures in a row
//! take a server out, `healthy_threshold` successes in a row bring it back. Servers start in
//! rotation. Only the status counts: a check takes at most 4 KiB of the body, then drops the
//! connection. The task holds the group weakly and ends when a reload replaces it (or the
//! group is dropped).

use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::header::{HOST, USER_AGENT};
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Empty};

use super::connect::GroupClient;
use super::group::{Group, Server};
use crate::config::upstream::HealthCheckConfig;

/// Starts the checker of `group` on the current runtime, once; no-op without checks or
/// outside a runtime.
pub fn spawn(group: &Arc<Group>) {
    let Some(hc) = group.health_check().cloned() else {
        return;
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if !group.start_checks_once() {
        return;
    }
    let client = GroupClient::new(&group.connect);
    handle.spawn(run(Arc::downgrade(group), hc, client));
}

async fn run(group: Weak<Group>, hc: HealthCheckConfig, client: GroupClient<Empty<Bytes>>) {
    let mut tick = tokio::time::interval(hc.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Consecutive successes and failures per server.
    let mut streaks: Vec<(u32, u32)> = Vec::new();
    loop {
        tick.tick().await;
        let Some(group) = group.upgrade() else {
            return;
        };
        if group.is_retired() {
            return;
        }
        streaks.resize(group.servers.len(), (0, 0));
        let probes = group.servers.iter().map(|s| probe(&client, s, &hc));
        let results = futures_util::future::join_all(probes).await;
        for ((server, ok), streak) in group.servers.iter().zip(results).zip(streaks.iter_mut()) {
            let health = &server.state.health;
            if ok {
                *streak = (streak.0.saturating_add(1), 0);
                if health.active_down()
                    && streak.0 >= hc.healthy_threshold
                    && health.set_active_down(false)
                {
                    tracing::info!(upstream = &*group.name, server = %server.authority, "health check passed: server back in rotation");
                }
            } else {
                *streak = (0, streak.1.saturating_add(1));
                if !health.active_down()
                    && streak.1 >= hc.unhealthy_threshold
                    && health.set_active_down(true)
                {
                    tracing::warn!(upstream = &*group.name, server = %server.authority, "health check failed: server out of rotation");
                }
            }
        }
    }
}

/// How much of a health response's body a check reads at most. Only the status matters; a
/// short body (the usual `OK`) is read to its end, so the connection goes back to the pool.
const BODY_READ_LIMIT: usize = 4096;

/// One check: true on a 2xx or 3xx within the timeout. At most [`BODY_READ_LIMIT`] bytes of
/// the body are read: a longer body (a status page that dumps everything, a download) is
/// dropped unread with its connection, never gathered in memory.
async fn probe(client: &GroupClient<Empty<Bytes>>, s: &Server, hc: &HealthCheckConfig) -> bool {
    let uri = Uri::builder()
        .scheme(s.scheme.clone())
        .authority(s.authority.clone())
        .path_and_query(hc.path.clone())
        .build();
    let Ok(uri) = uri else {
        return false;
    };
    let mut req = Request::new(Empty::<Bytes>::new());
    *req.uri_mut() = uri;
    req.headers_mut().insert(HOST, s.host.clone());
    req.headers_mut().insert(
        USER_AGENT,
        HeaderValue::from_static("tollgate-health-check"),
    );
    let check = async {
        let res = client.request(req).await.ok()?;
        let ok = res.status().is_success() || res.status().is_redirection();
        let mut body = res.into_body();
        let mut read = 0usize;
        while read < BODY_READ_LIMIT {
            match body.frame().await {
                Some(frame) => read += frame.ok()?.data_ref().map_or(0, Bytes::len),
                None => break,
            }
        }
        // Dropping a body that has not ended closes its connection (it cannot be reused).
        drop(body);
        Some(ok)
    };
    matches!(
        tokio::time::timeout(hc.timeout, check).await,
        Ok(Some(true))
    )
}
