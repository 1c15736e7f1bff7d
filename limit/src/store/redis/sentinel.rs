//! Redis Sentinel: finding the primary, and following it through a failover.
//!
//! - Every connection a lane opens first asks the sentinels, in order, which server is the
//!   primary (`SENTINEL get-master-addr-by-name`), connects to it and checks that it really is one
//!   (`INFO replication`, [`check_primary`](super::conn::check_primary)): a sentinel's answer can
//!   be a moment old around a switch.
//! - A watcher subscribes to `+switch-master` on one sentinel (the next one when it fails). When
//!   the sentinels switch the primary, every lane drops its connection and reconnects at once —
//!   to the new primary — instead of waiting for its old connection to fail.
//! - A lane whose script call gets `READONLY` (it is talking to a primary demoted to a replica)
//!   drops its connection too, and asks again.
//!
//! The sentinels are asked with the redis crate's client (short-lived connections and its
//! pub/sub); the primary is reached by the lanes' own connections.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;

use crate::store::{StoreError, StoreErrorKind};

/// Where the primary is found, and the signal of a switch.
pub struct Sentinel {
    sentinels: Vec<String>,
    master: String,
    timeout: Duration,
    /// Counts the switches seen (`+switch-master` for our primary).
    switched: watch::Sender<u64>,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel")
            .field("master", &self.master)
            .field("sentinels", &self.sentinels.len())
            .finish()
    }
}

fn err(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
    StoreError::new(kind, message)
}

fn classify(e: &redis::RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.code().is_some() {
        StoreErrorKind::Server
    } else {
        StoreErrorKind::Connect
    }
}

impl Sentinel {
    /// Asks `sentinels` (URLs) for the primary named `master`, each question within `timeout`
    /// (at least 500 ms); starts the `+switch-master` watcher on the current runtime for as long
    /// as the returned value exists.
    pub fn new(sentinels: Vec<String>, master: String, timeout: Duration) -> Arc<Sentinel> {
        let (switched, _) = watch::channel(0);
        let s = Arc::new(Sentinel {
            sentinels,
            master,
            timeout: timeout.max(Duration::from_millis(500)),
            switched,
        });
        tokio::spawn(watch_switches(Arc::downgrade(&s)));
        s
    }

    /// A receiver that changes at every switch of the primary.
    pub fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }

    /// The primary's host and port, from the first sentinel that knows it.
    pub async fn primary(&self) -> Result<(String, u16), StoreError> {
        let mut last = err(StoreErrorKind::Connect, "no sentinel configured");
        for url in &self.sentinels {
            match tokio::time::timeout(self.timeout, self.ask(url)).await {
                Ok(Ok(addr)) => return Ok(addr),
                Ok(Err(e)) => last = e,
                Err(_) => last = err(StoreErrorKind::Timeout, "a sentinel did not answer"),
            }
        }
        Err(last)
    }

    async fn ask(&self, url: &str) -> Result<(String, u16), StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| err(StoreErrorKind::Other, format!("sentinel URL: {e}")))?;
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| err(classify(&e), format!("sentinel: {e}")))?;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(&mut c)
            .await
            .map_err(|e| err(classify(&e), format!("sentinel: {e}")))?;
        let Some((host, port)) = addr else {
            return Err(err(
                StoreErrorKind::Server,
                format!("the sentinel monitors no primary named {:?}", self.master),
            ));
        };
        let port = port
            .parse()
            .map_err(|_| err(StoreErrorKind::Other, "sentinel: a port that is no port"))?;
        Ok((host, port))
    }

    /// Whether a `+switch-master` payload (`<name> <old-ip> <old-port> <new-ip> <new-port>`)
    /// is about our primary.
    fn is_ours(&self, payload: &str) -> bool {
        payload.split_whitespace().next() == Some(self.master.as_str())
    }
}

/// Subscribes to `+switch-master` on the sentinels, one at a time, for as long as the
/// [`Sentinel`] exists; each switch of our primary bumps its counter.
async fn watch_switches(sentinel: Weak<Sentinel>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(urls) = sentinel.upgrade().map(|s| s.sentinels.clone()) else {
            return;
        };
        for url in urls {
            let subscribed = async {
                let client = redis::Client::open(url.as_str())?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe("+switch-master").await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let Ok(Ok(mut pubsub)) = tokio::time::timeout(Duration::from_secs(2), subscribed).await
            else {
                continue;
            };
            backoff = Duration::from_millis(100);
            let mut messages = pubsub.on_message();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    m = messages.next() => {
                        let Some(m) = m else { break };
                        let Some(s) = sentinel.upgrade() else { return };
                        let payload: String = m.get_payload().unwrap_or_default();
                        if s.is_ours(&payload) {
                            tracing::warn!(master = %s.master, switch = %payload, "the sentinels switched the Redis primary");
                            s.switched.send_modify(|n| *n += 1);
                        }
                    }
                    _ = tick.tick() => {
                        if sentinel.strong_count() == 0 {
                            return;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
