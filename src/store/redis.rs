//! The Redis store: every request's limits decided by one `EVALSHA` of `scripts/decide.lua`.
//!
//! - One round trip: the script evaluates all limits of the request and charges them only when
//!   every enforcing limit admits it. Concurrent requests share round trips: a batcher puts up
//!   to [`MAX_BATCH`] waiting requests into one `EVALSHA`, which decides them one after another
//!   (each still all-or-nothing), with at most [`MAX_IN_FLIGHT`] batches unanswered. `redis::Script` sends `EVALSHA` and re-loads the script by
//!   itself on `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//! - Time is Redis `TIME`, read inside the script, so gateways with skewed clocks agree.
//! - The connection is the redis crate's `ConnectionManager` (one multiplexed connection that
//!   pipelines concurrent requests and reconnects by itself) or its async cluster connection.
//! - No request waits longer than `[store] timeout`. After [`BREAKER_THRESHOLD`](super::BREAKER_THRESHOLD) failures in a
//!   row the circuit opens (see [`super::breaker`]): requests skip Redis (a `circuit_open` store
//!   error, handled by `on_error`) for [`BREAKER_BACKOFF`](super::BREAKER_BACKOFF), then one request probes and closes it
//!   on success.
//! - A health check PINGs Redis every [`HEALTH_INTERVAL`], busy or idle, so `tollgate_store_up`
//!   and `/readyz` tell the same from the start, and an idle gateway notices an outage and a
//!   recovery without traffic (a successful PING closes the circuit too).
//! - Redis Cluster: keys carry the hash tag `{route:limit:subject-hash}`. When a route's limits
//!   land in several slots, each slot group is first evaluated without writing, then charged
//!   (see `run` and the README).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script, Value};
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::breaker::{Breaker, Transition};
use super::{DenyCache, StoreError, StoreErrorKind};
use crate::config::{Backend, StoreConfig};
use crate::limiter::{Check, Decision, Micros};
use crate::metrics::StoreMetrics;

/// How often the health check PINGs Redis.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

static SCRIPT_SOURCE: &str = include_str!("scripts/decide.lua");

/// Repeated store log lines, at most one a second each: 0 connect retries, 1 circuit opened and
/// 2 closed (a flapping Redis). Decision failures are logged per request by the proxy, throttled
/// too.
static STORE_WARNINGS: crate::log_throttle::Throttles<3> = crate::log_throttle::Throttles::new();

/// Requests decided by one `EVALSHA` at most.
const MAX_BATCH: usize = 32;
/// Batches sent to Redis and not yet answered, at most.
const MAX_IN_FLIGHT: usize = 2;

/// One limit's script arguments.
#[derive(Debug, Clone, Copy)]
struct LimitArgs {
    algorithm: &'static str,
    limit: u64,
    period: u64,
    burst: u64,
    cost: u64,
    shadow: bool,
}

impl LimitArgs {
    fn of(c: &Check<'_>) -> LimitArgs {
        let p = &c.limit.policy;
        LimitArgs {
            algorithm: c.limit.key_tail.trim_start_matches("}:"),
            limit: p.limit,
            period: p.period,
            burst: p.burst,
            cost: p.cost,
            shadow: c.limit.shadow,
        }
    }
}

/// One request waiting for the batcher.
struct Job {
    keys: SmallVec<[String; 4]>,
    args: SmallVec<[LimitArgs; 4]>,
    reply: oneshot::Sender<Result<Vec<Decision>, StoreError>>,
}

/// Whether the script charges admitted requests or only evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Charge,
    Evaluate,
}

enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis (or Redis Cluster) store.
pub struct RedisStore {
    backend: Backend,
    urls: Vec<String>,
    timeout: Duration,
    script: Script,
    conn: ArcSwapOption<Conn>,
    connecting: AtomicBool,
    breaker: Breaker,
    /// What `tollgate_store_up` last said (the gauge is written only when this changes).
    up: AtomicBool,
    metrics: StoreMetrics,
    deny_cache: Option<DenyCache>,
    /// Requests for the batcher (single Redis only).
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("backend", &self.backend)
            .field("urls", &self.urls)
            .finish()
    }
}

fn classify(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        StoreErrorKind::Connect
    } else if e.code().is_some() {
        StoreErrorKind::Server
    } else {
        StoreErrorKind::Other
    }
}

fn store_err(e: &RedisError) -> StoreError {
    StoreError::new(classify(e), e.to_string())
}

impl RedisStore {
    /// A store for `cfg` (backend `redis` or `redis_cluster`). Connects in the background: the
    /// gateway starts even while Redis is down, and decides by `on_error` until it is up.
    pub fn new(cfg: &StoreConfig) -> Arc<RedisStore> {
        let (jobs, job_queue) = mpsc::channel(4096);
        let store = Arc::new(RedisStore {
            backend: cfg.backend,
            urls: cfg.urls.clone(),
            timeout: cfg.timeout,
            script: Script::new(SCRIPT_SOURCE),
            conn: ArcSwapOption::empty(),
            connecting: AtomicBool::new(false),
            breaker: Breaker::default(),
            up: AtomicBool::new(false),
            metrics: StoreMetrics::new(cfg.backend.as_str()),
            deny_cache: cfg.deny_cache.then(DenyCache::default),
            jobs,
        });
        if store.backend == Backend::Redis {
            tokio::spawn(store.clone().batcher(job_queue));
        }
        store.metrics.set_up(false);
        store.clone().spawn_connect();
        tokio::spawn(health_check(Arc::downgrade(&store)));
        store
    }

    /// The `backend` metric label.
    pub fn backend(&self) -> &'static str {
        self.backend.as_str()
    }

    fn spawn_connect(self: Arc<Self>) {
        if self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                match self.connect().await {
                    Ok(conn) => {
                        self.conn.store(Some(Arc::new(conn)));
                        tracing::info!(backend = self.backend.as_str(), "connected to the store");
                        self.on_success();
                        break;
                    }
                    Err(e) => {
                        if let Some(suppressed) = STORE_WARNINGS.allow(0) {
                            tracing::warn!(backend = self.backend.as_str(), error = %e, suppressed, "cannot connect to the store; retrying");
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
            self.connecting.store(false, Ordering::Release);
        });
    }

    async fn connect(&self) -> Result<Conn, RedisError> {
        match self.backend {
            Backend::RedisCluster => {
                let client = redis::cluster::ClusterClientBuilder::new(self.urls.clone())
                    .connection_timeout(self.timeout.max(Duration::from_millis(500)))
                    .response_timeout(self.timeout)
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
            _ => {
                let url = self
                    .urls
                    .first()
                    .map(String::as_str)
                    .unwrap_or("redis://127.0.0.1:6379");
                let client = redis::Client::open(url)?;
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(500))))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let conn = tokio::time::timeout(
                    self.timeout
                        .max(Duration::from_millis(500))
                        .saturating_mul(2),
                    ConnectionManager::new_with_config(client, cfg),
                )
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connect timed out",
                    ))
                })??;
                Ok(Conn::Single(conn))
            }
        }
    }

    /// Records a success (decision, connect or health check): closes the circuit.
    fn on_success(&self) {
        if self.breaker.success() == Transition::Closed {
            if let Some(suppressed) = STORE_WARNINGS.allow(2) {
                tracing::info!(
                    backend = self.backend.as_str(),
                    suppressed,
                    "store recovered; circuit closed"
                );
            }
        }
        self.refresh_up();
    }

    /// Records a failure: opens the circuit after [`BREAKER_THRESHOLD`](super::BREAKER_THRESHOLD) in a row.
    fn on_failure(&self) {
        if let Transition::Opened { failures } = self.breaker.failure() {
            if let Some(suppressed) = STORE_WARNINGS.allow(1) {
                tracing::warn!(
                    backend = self.backend.as_str(),
                    failures,
                    suppressed,
                    "store failing; circuit open"
                );
            }
        }
        self.refresh_up();
    }

    /// Brings `tollgate_store_up` in line with [`Self::is_up`] (what `/readyz` reports).
    fn refresh_up(&self) {
        let up = self.is_up();
        if self.up.swap(up, Ordering::AcqRel) != up {
            self.metrics.set_up(up);
        }
    }

    /// One health check: PING within `[store] timeout`.
    async fn ping(&self) {
        let Some(conn) = self.conn.load_full() else {
            return; // the connect task reports its own outcome
        };
        let cmd = redis::cmd("PING");
        let answer = match &*conn {
            Conn::Single(c) => {
                tokio::time::timeout(self.timeout, cmd.query_async::<()>(&mut c.clone())).await
            }
            Conn::Cluster(c) => {
                tokio::time::timeout(self.timeout, cmd.query_async::<()>(&mut c.clone())).await
            }
        };
        match answer {
            Ok(Ok(())) => self.on_success(),
            Ok(Err(e)) => {
                tracing::debug!(backend = self.backend.as_str(), error = %e, "store health check failed");
                self.on_failure();
            }
            Err(_) => {
                tracing::debug!(
                    backend = self.backend.as_str(),
                    "store health check timed out"
                );
                self.on_failure();
            }
        }
    }

    /// Decides `checks` (see [`super::Store::decide`]).
    pub async fn decide(
        self: &Arc<Self>,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        // Injected time (tests) bypasses the cache, which runs on the local clock.
        let cache = self.deny_cache.as_ref().filter(|_| at.is_none());
        if let Some(hit) = cache.and_then(|c| c.lookup(checks)) {
            return Ok(hit);
        }
        // Held across the store call: dropping this future (a client gone) frees a probe slot.
        let Some(_permit) = self.breaker.admit() else {
            self.metrics.error(StoreErrorKind::CircuitOpen.as_str());
            return Err(StoreError::new(
                StoreErrorKind::CircuitOpen,
                "circuit open after repeated store failures",
            ));
        };
        let Some(conn) = self.conn.load_full() else {
            self.clone().spawn_connect();
            self.on_failure();
            self.metrics.error(StoreErrorKind::Connect.as_str());
            return Err(StoreError::new(
                StoreErrorKind::Connect,
                "not connected to the store yet",
            ));
        };
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.run(&conn, checks, at)).await;
        self.metrics
            .duration
            .record(started.elapsed().as_secs_f64());
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer within {:?}", self.timeout),
            )),
        };
        match &result {
            Ok(decisions) => {
                self.on_success();
                if let Some(c) = cache {
                    c.remember(checks, decisions, started, Instant::now());
                }
            }
            Err(e) => {
                self.metrics.error(e.kind.as_str());
                self.on_failure();
            }
        }
        result
    }

    async fn run(
        &self,
        conn: &Conn,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        match conn {
            // Injected time (tests) cannot share a batch with Redis time.
            Conn::Single(c) if at.is_some() => {
                self.invoke(&mut c.clone(), checks, at, Mode::Charge).await
            }
            Conn::Single(_) => self.batched(checks).await,
            Conn::Cluster(c) => {
                let mut c = c.clone();
                let slots: SmallVec<[u16; 4]> = checks
                    .iter()
                    .map(|ch| cluster_slot(ch.limit.redis_key(&ch.subject).as_bytes()))
                    .collect();
                if slots.windows(2).all(|w| w[0] == w[1]) {
                    return self.invoke(&mut c, checks, at, Mode::Charge).await;
                }
                // Limits in several slots cannot share one script. Phase 1 evaluates every slot
                // group without writing: a request denied anywhere is denied with nothing
                // written, as on one Redis. Phase 2 charges each group (re-deciding it); only a
                // request racing another for the last units between the phases can be charged
                // in an earlier group and then denied in a later one.
                let mut groups: SmallVec<[SmallVec<[usize; 4]>; 4]> = SmallVec::new();
                for (i, s) in slots.iter().enumerate() {
                    match groups.iter_mut().find(|g| slots[g[0]] == *s) {
                        Some(g) => g.push(i),
                        None => groups.push(smallvec::smallvec![i]),
                    }
                }
                let mut out = vec![Decision::default(); checks.len()];
                for mode in [Mode::Evaluate, Mode::Charge] {
                    for g in &groups {
                        let group: SmallVec<[Check<'_>; 4]> =
                            g.iter().map(|&j| checks[j]).collect();
                        let ds = self.invoke(&mut c, &group, at, mode).await?;
                        for (&j, d) in g.iter().zip(ds) {
                            out[j] = d;
                        }
                    }
                    let denied = checks
                        .iter()
                        .zip(&out)
                        .any(|(ch, d)| !ch.limit.shadow && !d.allowed);
                    if denied {
                        break;
                    }
                }
                Ok(out)
            }
        }
    }

    async fn invoke<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        checks: &[Check<'_>],
        at: Option<Micros>,
        mode: Mode,
    ) -> Result<Vec<Decision>, StoreError> {
        let keys: SmallVec<[String; 4]> = checks
            .iter()
            .map(|c| c.limit.redis_key(&c.subject))
            .collect();
        let args: SmallVec<[LimitArgs; 4]> = checks.iter().map(LimitArgs::of).collect();
        self.invoke_many(conn, &[(&keys, &args)], at, mode).await
    }

    /// One `EVALSHA` deciding several requests in order; the decisions of all their limits, in
    /// order.
    async fn invoke_many<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        requests: &[(&[String], &[LimitArgs])],
        at: Option<Micros>,
        mode: Mode,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut inv = self.script.prepare_invoke();
        let mut n = 0;
        for (keys, _) in requests {
            for k in keys.iter() {
                inv.key(k.as_str());
            }
            n += keys.len();
        }
        match at {
            Some(t) => inv.arg(t),
            None => inv.arg(""),
        };
        inv.arg(match mode {
            Mode::Charge => "c",
            Mode::Evaluate => "e",
        });
        inv.arg(requests.len());
        for (_, args) in requests {
            inv.arg(args.len());
            for a in args.iter() {
                inv.arg(a.algorithm)
                    .arg(a.limit)
                    .arg(a.period)
                    .arg(a.burst)
                    .arg(a.cost)
                    .arg(if a.shadow { "1" } else { "0" });
            }
        }
        let reply: Value = inv.invoke_async(conn).await.map_err(|e| store_err(&e))?;
        parse_reply(&reply, n)
    }

    /// Sends one request's checks to the batcher and waits for its decisions.
    async fn batched(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            keys: checks
                .iter()
                .map(|c| c.limit.redis_key(&c.subject))
                .collect(),
            args: checks.iter().map(LimitArgs::of).collect(),
            reply,
        };
        let gone = || StoreError::new(StoreErrorKind::Other, "the store's batcher has stopped");
        self.jobs.send(job).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Collects waiting requests into batches: at most [`MAX_BATCH`] requests per `EVALSHA` and
    /// [`MAX_IN_FLIGHT`] batches on the wire, so under load requests queue here (cheaply) rather
    /// than one by one in Redis.
    async fn batcher(self: Arc<Self>, mut jobs: mpsc::Receiver<Job>) {
        let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let Some(first) = jobs.recv().await else {
                return;
            };
            let mut batch = Vec::with_capacity(MAX_BATCH);
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            let this = self.clone();
            tokio::spawn(async move {
                this.run_batch(batch).await;
                drop(permit);
            });
        }
    }

    async fn run_batch(&self, batch: Vec<Job>) {
        let conn = self.conn.load_full();
        let result = match conn.as_deref() {
            Some(Conn::Single(c)) => {
                let requests: Vec<(&[String], &[LimitArgs])> = batch
                    .iter()
                    .map(|j| (j.keys.as_slice(), j.args.as_slice()))
                    .collect();
                self.invoke_many(&mut c.clone(), &requests, None, Mode::Charge)
                    .await
            }
            _ => Err(StoreError::new(
                StoreErrorKind::Connect,
                "not connected to the store",
            )),
        };
        match result {
            Ok(decisions) => {
                let mut rest = decisions.into_iter();
                for job in batch {
                    let mine: Vec<Decision> = rest.by_ref().take(job.keys.len()).collect();
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                for job in batch {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Evaluates `checks` without charging (see [`super::Store::peek`]): the decide script in
    /// its evaluate-only mode, which writes nothing — one call on a single Redis, one per limit
    /// on a Cluster (each limit's answer is independent of the others when nothing is charged,
    /// and one key per call fits any slot layout). Neither the deny cache nor the circuit
    /// breaker is involved: this is an operator's question, answered by Redis or not at all.
    pub async fn peek(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        let conn = self.conn.load_full().ok_or_else(|| {
            StoreError::new(StoreErrorKind::Connect, "not connected to the store")
        })?;
        let evaluate = async {
            match &*conn {
                Conn::Single(m) => {
                    self.invoke(&mut m.clone(), checks, at, Mode::Evaluate)
                        .await
                }
                Conn::Cluster(m) => {
                    let mut out = Vec::with_capacity(checks.len());
                    for c in checks {
                        let one = std::slice::from_ref(c);
                        out.extend(self.invoke(&mut m.clone(), one, at, Mode::Evaluate).await?);
                    }
                    Ok(out)
                }
            }
        };
        tokio::time::timeout(self.timeout, evaluate)
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Timeout, "no answer in time"))?
    }

    /// Whether the store is connected and its last decision or health check succeeded.
    pub fn is_up(&self) -> bool {
        self.conn.load().is_some() && self.breaker.is_closed()
    }
}

impl super::Store for Arc<RedisStore> {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        RedisStore::decide(self, checks, at).await
    }

    async fn peek(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        RedisStore::peek(self, checks, at).await
    }

    fn is_up(&self) -> bool {
        RedisStore::is_up(self)
    }
}

/// PINGs the store every [`HEALTH_INTERVAL`] for as long as it exists.
async fn health_check(store: Weak<RedisStore>) {
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else {
            return;
        };
        store.ping().await;
    }
}

fn parse_reply(reply: &Value, n: usize) -> Result<Vec<Decision>, StoreError> {
    let bad = || {
        StoreError::new(
            StoreErrorKind::Other,
            "malformed reply from the decide script",
        )
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.len() != n * 6 {
        return Err(bad());
    }
    let num = |v: &Value| -> Result<u64, StoreError> {
        match v {
            Value::Int(i) => u64::try_from(*i).map_err(|_| bad()),
            _ => Err(bad()),
        }
    };
    items
        .chunks_exact(6)
        .map(|c| {
            Ok(Decision {
                allowed: num(&c[0])? == 1,
                limit: num(&c[1])?,
                remaining: num(&c[2])?,
                retry_after: num(&c[3])?,
                reset_after: num(&c[4])?,
                delay: num(&c[5])?,
            })
        })
        .collect()
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag (or the whole key) mod 16384.
fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(cluster_slot(b"123456789"), 0x31C3);
        assert_eq!(cluster_slot(b"foo"), 12182);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        assert_eq!(cluster_slot(b"foo{}{bar}"), cluster_slot(b"foo{}{bar}"));
    }
}
