//! Redis Cluster: the redis crate's async cluster connection (slot map, redirections,
//! reconnects), one script call per slot group.
//!
//! Keys carry the hash tag `{route:limit:subject-hash}`. When a request's limits land in one slot
//! they are decided by one call, as on one Redis. When they land in several, each slot group is
//! first evaluated without writing (a request denied anywhere is denied with nothing written),
//! then charged group by group; only a request racing another for the last units between the
//! phases can be charged in an earlier group and then denied in a later one (see the README).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Value};
use smallvec::SmallVec;

use super::keys::cluster_slot;
use super::script::{self, Encoded, Encoder, JobLimit, Mode};
use crate::store::{AnyClock, Clock, StoreError, StoreErrorKind};
use crate::Decision;

/// The cluster backend.
pub struct ClusterStore {
    urls: Vec<String>,
    timeout: Duration,
    sha: String,
    /// The cluster has no functions (before 7.0, or an ACL refusing them): `EVALSHA`.
    legacy: AtomicBool,
    clock: AnyClock,
    conn: Arc<ArcSwapOption<ClusterConnection>>,
    connecting: Arc<AtomicBool>,
    /// Redis TIME minus this process's monotonic µs, measured when connected (as a lane does:
    /// see `lane.rs`), for the deadline lease calls carry; `i64::MIN`: unknown. One probe, on a
    /// node the client picks: the cluster's nodes are taken to keep one time (NTP).
    offset: Arc<AtomicI64>,
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

impl ClusterStore {
    /// Connects in the background (the gateway starts while the cluster is down).
    pub fn new(urls: Vec<String>, timeout: Duration, clock: AnyClock) -> ClusterStore {
        let store = ClusterStore {
            urls,
            timeout,
            sha: script::sha1_hex(),
            legacy: AtomicBool::new(false),
            clock,
            conn: Arc::new(ArcSwapOption::empty()),
            connecting: Arc::new(AtomicBool::new(false)),
            offset: Arc::new(AtomicI64::new(i64::MIN)),
        };
        store.spawn_connect();
        store
    }

    fn spawn_connect(&self) {
        if self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let (urls, timeout) = (self.urls.clone(), self.timeout);
        let (slot, connecting) = (self.conn.clone(), self.connecting.clone());
        let offset = self.offset.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                let client = redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .connection_timeout(timeout.max(Duration::from_millis(500)))
                    .response_timeout(timeout)
                    .build();
                let conn = match client {
                    Ok(c) => c.get_async_connection().await,
                    Err(e) => Err(e),
                };
                match conn {
                    Ok(mut c) => {
                        let _ = super::lane::mono_micros(tokio::time::Instant::now());
                        let time = tokio::time::timeout(
                            timeout,
                            redis::cmd("TIME").query_async::<(u64, u64)>(&mut c),
                        )
                        .await;
                        let local = super::lane::mono_micros(tokio::time::Instant::now());
                        let measured = match time {
                            Ok(Ok((s, us))) => s
                                .checked_mul(1_000_000)
                                .and_then(|t| t.checked_add(us))
                                .and_then(|t| i64::try_from(t).ok())
                                .zip(i64::try_from(local).ok())
                                .and_then(|(r, l)| r.checked_sub(l)),
                            _ => None,
                        };
                        offset.store(measured.unwrap_or(i64::MIN), Ordering::Release);
                        slot.store(Some(Arc::new(c)));
                        tracing::info!(backend = "redis_cluster", "connected to the store");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(backend = "redis_cluster", error = %e, "cannot connect to the store; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
            connecting.store(false, Ordering::Release);
        });
    }

    fn connection(&self) -> Result<ClusterConnection, StoreError> {
        match self.conn.load_full() {
            Some(c) => Ok((*c).clone()),
            None => {
                self.spawn_connect();
                Err(StoreError::new(
                    StoreErrorKind::Connect,
                    "not connected to the store yet",
                ))
            }
        }
    }

    pub fn is_up(&self) -> bool {
        self.conn.load().is_some()
    }

    /// PING within the timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        match tokio::time::timeout(self.timeout, redis::cmd("PING").query_async::<()>(&mut c)).await
        {
            Ok(r) => r.map_err(|e| store_err(&e)),
            Err(_) => Err(StoreError::new(StoreErrorKind::Timeout, "PING timed out")),
        }
    }

    /// Decides one request's limits (see the module's comment for several slots).
    pub async fn decide(&self, limits: &[JobLimit]) -> Result<Vec<Decision>, StoreError> {
        let mut c = self.connection()?;
        // Given up on at `timeout` from now: the leases' deadline on Redis's clock.
        let offset = self.offset.load(Ordering::Acquire);
        let deadline = (offset != i64::MIN)
            .then(|| {
                super::lane::deadline_on_redis(tokio::time::Instant::now(), self.timeout, offset)
            })
            .flatten();
        let slots: SmallVec<[u16; 4]> = limits.iter().map(|l| cluster_slot(&l.key)).collect();
        let call = async {
            if slots.windows(2).all(|w| w[0] == w[1]) {
                return self.invoke(&mut c, limits, Mode::Charge, deadline).await;
            }
            let mut groups: SmallVec<[SmallVec<[usize; 4]>; 4]> = SmallVec::new();
            for (i, s) in slots.iter().enumerate() {
                match groups.iter_mut().find(|g| slots[g[0]] == *s) {
                    Some(g) => g.push(i),
                    None => groups.push(smallvec::smallvec![i]),
                }
            }
            let mut out = vec![Decision::default(); limits.len()];
            for mode in [Mode::Evaluate, Mode::Charge] {
                for g in &groups {
                    let group: SmallVec<[JobLimit; 2]> =
                        g.iter().map(|&j| limits[j].clone()).collect();
                    let ds = self.invoke(&mut c, &group, mode, deadline).await?;
                    for (&j, d) in g.iter().zip(ds) {
                        out[j] = d;
                    }
                }
                let denied = !crate::batch::admitted(limits.iter().zip(&out).map(|(l, d)| {
                    crate::batch::Part {
                        allowed: d.allowed,
                        shadow: l.def.shadow,
                        charged_on_admission: !l.def.after,
                    }
                }));
                if denied {
                    break;
                }
            }
            Ok(out)
        };
        self.within(call).await
    }

    /// `call`, or a timeout error after `[store] timeout`.
    async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer within {:?}", self.timeout),
            )),
        }
    }

    /// Evaluates without charging, one limit per call (each limit is its own slot group).
    pub async fn peek(&self, limits: &[JobLimit]) -> Result<Vec<Decision>, StoreError> {
        let mut c = self.connection()?;
        let call = async {
            let mut out = Vec::with_capacity(limits.len());
            for l in limits {
                let d = self
                    .invoke(&mut c, std::slice::from_ref(l), Mode::Evaluate, None)
                    .await?;
                out.extend(d);
            }
            Ok(out)
        };
        self.within(call).await
    }

    /// Charges and releases, one call per limit (each is its own; nothing is all-or-nothing).
    pub async fn settle(&self, limits: &[JobLimit]) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        let call = async {
            for l in limits {
                self.invoke(&mut c, std::slice::from_ref(l), Mode::Force, None)
                    .await?;
            }
            Ok(())
        };
        self.within(call).await
    }

    /// `EVAL source` with `args`, routed by its first key: its reply, an integer or a string
    /// (the shared penalty box's calls, quota.lua).
    pub async fn eval_reply(
        &self,
        source: &str,
        args: &[Vec<u8>],
    ) -> Result<super::resp::Reply, StoreError> {
        use super::resp::Reply;
        let mut c = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(source);
        for a in args {
            cmd.arg(a.as_slice());
        }
        let call = async {
            match cmd.query_async::<Value>(&mut c).await {
                Ok(Value::Int(n)) => Ok(Reply::Int(n)),
                Ok(Value::BulkString(b)) => {
                    Ok(Reply::Text(String::from_utf8_lossy(&b).into_owned()))
                }
                Ok(Value::Nil) => Ok(Reply::Nil),
                Ok(_) => Err(StoreError::new(
                    StoreErrorKind::Other,
                    "malformed reply from the bans script",
                )),
                Err(e) => Err(store_err(&e)),
            }
        };
        self.within(call).await
    }

    /// `EVAL source` with `args` (the key count, the keys, ARGV), routed by its first key;
    /// expects an integer reply.
    pub async fn eval(&self, source: &str, args: &[Vec<u8>]) -> Result<(), StoreError> {
        let mut c = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(source);
        for a in args {
            cmd.arg(a.as_slice());
        }
        let call = async {
            match cmd.query_async::<Value>(&mut c).await {
                Ok(Value::Int(_)) => Ok(()),
                Ok(_) => Err(StoreError::new(
                    StoreErrorKind::Other,
                    "malformed reply from the quota script",
                )),
                Err(e) => Err(store_err(&e)),
            }
        };
        self.within(call).await
    }

    /// One script call for limits in one slot.
    async fn invoke(
        &self,
        c: &mut ClusterConnection,
        limits: &[JobLimit],
        mode: Mode,
        deadline: Option<u64>,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut encoded = Encoded::default();
        let mut encoder = Encoder::default();
        encoder.deadline = deadline;
        encoder.encode(
            std::iter::once(limits),
            self.clock.injected(),
            mode,
            &mut encoded,
        );
        let build = |name: &str, first: &[u8]| {
            let mut cmd = redis::cmd(name);
            cmd.arg(first);
            for a in encoded.args.iter() {
                cmd.arg(a);
            }
            cmd
        };
        let eval = || build("EVAL", script::SOURCE.as_bytes());
        let first = if self.legacy.load(Ordering::Relaxed) {
            build("EVALSHA", self.sha.as_bytes())
        } else {
            build("FCALL", script::library().name.as_bytes())
        };
        let reply = match first.query_async::<Value>(c).await {
            Err(e) if e.code() == Some("NOSCRIPT") => eval().query_async::<Value>(c).await,
            Err(e) => match script::Missing::of(&format!(
                "{} {}",
                e.code().unwrap_or_default(),
                e.detail().unwrap_or_default()
            )) {
                // Loaded on every primary (the redis crate sends FUNCTION LOAD to all of them),
                // this call sent as EVAL.
                Some(script::Missing::Library) => {
                    let mut load = redis::cmd("FUNCTION");
                    load.arg("LOAD")
                        .arg("REPLACE")
                        .arg(script::library().source.as_str());
                    // Refused (an ACL, a library this Redis cannot load): EVALSHA from now
                    // on. Out of memory is passing: the next call loads it again.
                    match load.query_async::<Value>(c).await {
                        Err(e) if e.code() != Some("OOM") => {
                            tracing::warn!(backend = "redis_cluster", error = %e, "Redis refused to load the library; calling the script by EVALSHA");
                            self.legacy.store(true, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                    eval().query_async::<Value>(c).await
                }
                Some(script::Missing::Functions) => {
                    self.legacy.store(true, Ordering::Relaxed);
                    eval().query_async::<Value>(c).await
                }
                None => Err(e),
            },
            ok => ok,
        }
        .map_err(|e| store_err(&e))?;
        let bad = || {
            StoreError::new(
                StoreErrorKind::Other,
                "malformed reply from the decide script",
            )
        };
        let Value::Array(items) = reply else {
            return Err(bad());
        };
        let ints: Vec<i64> = items
            .iter()
            .map(|v| match v {
                Value::Int(i) => Some(*i),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        match script::decisions(&ints) {
            Some(d) if d.len() == encoded.limits => Ok(d),
            _ => Err(bad()),
        }
    }
}
