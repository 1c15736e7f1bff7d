//! One worker's accept loop: accepts on the worker's own listener socket, runs each connection in
//! a task of the worker's runtime, and drains when told to stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::connection::{Connection, Settings};
use super::Handler;
use crate::runtime::state::Shared;

/// Accepts until `stop` turns true (or its sender is gone), then waits for in-flight requests
/// (up to the grace period). Returns whether every connection finished in time.
pub(super) async fn serve<H: Handler>(
    listener: TcpListener,
    shared: Arc<Shared>,
    handler: H,
    mut stop: watch::Receiver<bool>,
) -> bool {
    // Every connection task holds a clone of `live`; the drain is over when all are dropped.
    let (live, mut drained) = mpsc::channel::<()>(1);
    // Connection settings, rebuilt only when a reload swapped the snapshot. Kept with the
    // snapshot's generation, not the snapshot: a worker that accepts nothing for a while must
    // not keep a replaced snapshot (and its consumers table) alive.
    let mut current: Option<(u64, Arc<Settings>)> = None;
    let accepting = shared.serving.accepting();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin, and log at most
                    // one line a second (every worker fails alike).
                    static ACCEPT_FAILED: tollgate_limit::log_throttle::Throttle =
                        tollgate_limit::log_throttle::Throttle::new();
                    if let Some(suppressed) = ACCEPT_FAILED.allow() {
                        tracing::warn!(error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let settings = {
            let snap = shared.snapshot.load();
            match &current {
                Some((generation, settings)) if *generation == snap.generation => settings.clone(),
                _ => {
                    let settings = Arc::new(Settings::of(&snap.config.server));
                    current = Some((snap.generation, settings.clone()));
                    settings
                }
            }
        };
        let conn = Connection {
            shared: shared.clone(),
            handler: handler.clone(),
            peer,
            settings,
            stop: stop.clone(),
            _live: live.clone(),
            client_cert: None,
        };
        tokio::spawn(conn.run(stream));
    }
    // Stop accepting at once: new connections are refused from here on.
    drop(accepting);
    drop(listener);
    drop(live);
    let grace = shared.snapshot.load().config.server.grace_period;
    tokio::select! {
        _ = drained.recv() => true,
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(grace_period = ?grace, "grace period over; closing remaining connections");
            false
        }
    }
}
