//! The Redis store: every request's limits decided by the `scripts/` library (`FCALL`), atomically, in one
//! round trip, batched and coalesced.
//!
//! - [`keys`]: the key layout; [`script`]: the script's calling convention (a batch names each
//!   key and limit definition once); [`resp`]: the wire protocol; [`conn`]: opening a connection.
//! - One Redis: one [`lane`] (connection and batcher) per proxy worker, so a batch never crosses
//!   threads; requests wait in allocation-free slots ([`waiters`]).
//! - Redis Cluster: [`cluster`], through the redis crate's cluster connection.
//! - Redis Sentinel: the lanes of one Redis, connected to the primary the sentinels name and
//!   following its failovers ([`sentinel`]).
//! - Time is Redis `TIME`, read inside the script (gateways with skewed clocks agree), unless the
//!   store was built on a manual clock (tests, the `test-clock` feature): its time
//!   ([`Clock::injected`]) is passed to the script instead.
//!
//! The circuit breaker, the health check and the deny cache are layers around this store
//! (`super::breaker`, `super::deny_cache`), not part of it.

mod cluster;
mod conn;
mod keys;
mod lane;
mod quota;
pub(crate) mod replay;
pub(crate) mod resp;
mod script;
mod sentinel;
mod waiters;

pub use self::keys::{algorithm_code, cluster_slot, key};
pub use self::lane::{MAX_BATCH, MAX_IN_FLIGHT};

use std::sync::Arc;

use self::cluster::ClusterStore;
use self::conn::{Endpoint, Target};
use self::lane::{Lane, LaneEnv};
use self::sentinel::Sentinel;
use self::waiters::Work;
use super::{AnyClock, Clock, StoreError};
use super::{Backend, StoreSettings};
use crate::adjust::Adjust;
use crate::metrics::StoreMetrics;
use crate::worker::WorkerId;
use crate::{AsLimit, Check, Decision, Micros, Op};

enum Backing {
    /// One lane per worker, then one for everything else.
    Single(Box<[Arc<Lane>]>),
    Cluster(ClusterStore),
    /// The URL could not be used (never after `tollgate check`): every decision fails with this.
    Broken(StoreError),
}

/// The Redis (or Redis Cluster) store.
pub struct RedisStore {
    backend: Backend,
    prefix: String,
    backing: Backing,
    /// One Redis: where support's corrections connect ([`quota`]); `None` on a Cluster.
    /// Where support's corrections go (one Redis, or the primary the sentinels name).
    admin: Option<Arc<LaneEnv>>,
    clock: AnyClock,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("backend", &self.backend)
            .finish()
    }
}

impl RedisStore {
    /// A store for `cfg` (backend `redis` or `redis_cluster`), with a lane for each of `workers`
    /// proxy workers. Connects in the background: the gateway starts even while Redis is down.
    /// Call within a tokio runtime.
    pub fn new(cfg: &StoreSettings, clock: AnyClock, workers: usize) -> RedisStore {
        let own_clock = clock.clone();
        let mut admin = None;
        let backing = match cfg.backend {
            Backend::RedisCluster => {
                Backing::Cluster(ClusterStore::new(cfg.urls.clone(), cfg.timeout, clock))
            }
            _ => {
                let url = cfg
                    .urls
                    .first()
                    .map(String::as_str)
                    .unwrap_or("redis://127.0.0.1:6379");
                match Target::parse(url, cfg.timeout) {
                    Ok(target) => {
                        let endpoint = match &cfg.sentinel {
                            Some(s) => Endpoint::Sentinel {
                                template: target,
                                sentinel: Sentinel::new(
                                    s.sentinels.clone(),
                                    s.master_name.clone(),
                                    cfg.timeout,
                                ),
                            },
                            None => Endpoint::Fixed(target),
                        };
                        let env = Arc::new(LaneEnv {
                            endpoint,
                            timeout: cfg.timeout,
                            sha: script::sha1_hex(),
                            clock,
                            metrics: StoreMetrics::new(cfg.backend.as_str()),
                            nodelay: false,
                        });
                        admin = Some(env.clone());
                        let lanes = (0..=workers.max(1))
                            .map(|_| Arc::new(Lane::new(env.clone())))
                            .collect();
                        Backing::Single(lanes)
                    }
                    Err(e) => Backing::Broken(e),
                }
            }
        };
        RedisStore {
            backend: cfg.backend,
            prefix: cfg.key_prefix.clone(),
            backing,
            admin,
            clock: own_clock,
        }
    }

    /// The `backend` metric label.
    pub fn backend(&self) -> &'static str {
        self.backend.as_str()
    }

    /// `worker`'s lane: its own, or the last one off the workers.
    fn lane(lanes: &[Arc<Lane>], worker: WorkerId) -> &Arc<Lane> {
        &lanes[worker.slot(lanes.len())]
    }

    /// Decides `checks` (see [`super::Store::decide`]).
    pub async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut scratch = Vec::with_capacity(128);
        let limits = script::job_limits(&self.prefix, checks, &mut scratch);
        let decided = match &self.backing {
            Backing::Single(lanes) => Self::lane(lanes, worker).call(Work::Decide(limits)).await,
            Backing::Cluster(c) => c.decide(&limits).await,
            Backing::Broken(e) => Err(e.clone()),
        };
        // A lease the script ran past the call's deadline was granted nothing and its request
        // charged nothing (decide.lua: a reply of zeros, limit 0): the call timed out.
        match decided {
            Ok(ds)
                if checks
                    .iter()
                    .zip(&ds)
                    .any(|(c, d)| matches!(c.op, Op::Lease(_)) && !d.allowed && d.limit == 0) =>
            {
                Err(StoreError::new(
                    super::StoreErrorKind::Timeout,
                    "Redis ran the lease call past its deadline: nothing was granted",
                ))
            }
            other => other,
        }
    }

    /// Evaluates `checks` without charging (one evaluate-only call; on a Cluster one per slot
    /// group).
    pub async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut scratch = Vec::with_capacity(128);
        let limits = script::job_limits(&self.prefix, checks, &mut scratch);
        match &self.backing {
            Backing::Single(lanes) => Self::lane(lanes, worker).call(Work::Peek(limits)).await,
            Backing::Cluster(c) => c.peek(&limits).await,
            Backing::Broken(e) => Err(e.clone()),
        }
    }

    /// Post-response charges and slot releases (see [`super::Store::settle`]): one call in the
    /// script's force mode, batched with other settles of the worker.
    pub async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), StoreError> {
        let mut scratch = Vec::with_capacity(128);
        let limits = script::job_limits(&self.prefix, checks, &mut scratch);
        match &self.backing {
            Backing::Single(lanes) => Self::lane(lanes, worker)
                .call(Work::Settle(limits))
                .await
                .map(drop),
            Backing::Cluster(c) => c.settle(&limits).await,
            Backing::Broken(e) => Err(e.clone()),
        }
    }

    /// Support's correction (see [`super::Store::adjust`]): `quota.lua`, atomically.
    pub async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> Result<(), StoreError> {
        let args = quota::args(&self.prefix, check, adjust, self.clock.injected());
        match (&self.backing, &self.admin) {
            (Backing::Cluster(c), _) => c.eval(quota::SOURCE, &args).await,
            (Backing::Broken(e), _) => Err(e.clone()),
            (_, Some(env)) => {
                let target = env.endpoint.primary_target().await?;
                quota::run_single(&target, &args).await
            }
            (_, None) => Err(StoreError::new(
                super::StoreErrorKind::Other,
                "no Redis URL to connect to",
            )),
        }
    }

    /// One call of the shared penalty box (quota.lua's `ban` modes) on the key in `args`.
    async fn ban_call(&self, args: &[Vec<u8>]) -> Result<resp::Reply, StoreError> {
        match (&self.backing, &self.admin) {
            (Backing::Cluster(c), _) => c.eval_reply(quota::SOURCE, args).await,
            (Backing::Broken(e), _) => Err(e.clone()),
            (_, Some(env)) => {
                let target = env.endpoint.primary_target().await?;
                quota::run_single_reply(&target, args).await
            }
            (_, None) => Err(StoreError::new(
                super::StoreErrorKind::Other,
                "no Redis URL to connect to",
            )),
        }
    }

    /// Shares a ban (see [`super::Store::ban`]): the subject's ban key, then the limit's index
    /// (two calls, two Cluster slots; a ban starts rarely).
    pub async fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: Micros,
    ) -> Result<(), StoreError> {
        let left = until.saturating_sub(self.clock.now());
        // Redis's TTL is real time, the ban's end the store's clock (injected in tests): the
        // decision compares the end with its `now`; the TTL only cleans up.
        let ttl = left.div_ceil(1000).max(1).to_string();
        let until = until.to_string();
        let key = quota::ban_key(&self.prefix, check);
        self.ban_call(&quota::ban_args(key, "ban", &[&until, &ttl]))
            .await?;
        let mut subject = String::with_capacity(32);
        check.subject.write_hex(&mut subject);
        let index = quota::index_key(&self.prefix, check.limit);
        self.ban_call(&quota::ban_args(
            index,
            "banlist",
            &[&subject, &until, &ttl],
        ))
        .await
        .map(drop)
    }

    /// Lifts every ban of `limit` (see [`super::Store::lift_bans`]): the index's subjects, then
    /// each one's ban.
    pub async fn lift_bans<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        let index = quota::index_key(&self.prefix, limit);
        let listed = match self
            .ban_call(&quota::ban_args(index, "banlift", &[]))
            .await?
        {
            resp::Reply::Text(t) => t,
            _ => String::new(),
        };
        let mut lifted = 0;
        for hex in listed.as_bytes().chunks_exact(32) {
            let Some(subject) = crate::SubjectDigest::from_hex(hex) else {
                continue;
            };
            let check = Check {
                limit,
                subject,
                op: Op::Decide,
            };
            let key = quota::ban_key(&self.prefix, &check);
            if let resp::Reply::Int(n) = self.ban_call(&quota::ban_args(key, "unban", &[])).await? {
                lifted += u64::try_from(n).unwrap_or(0);
            }
        }
        Ok(lifted)
    }

    /// How many times `limit`'s bans were lifted (see [`super::Store::ban_lifts`]).
    pub async fn ban_lifts<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        let index = quota::index_key(&self.prefix, limit);
        match self
            .ban_call(&quota::ban_args(index, "banlifts", &[]))
            .await?
        {
            resp::Reply::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            _ => Ok(0),
        }
    }

    /// PINGs the server (the health check).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.backing {
            Backing::Single(lanes) => Self::lane(lanes, WorkerId::NONE)
                .call(Work::Ping)
                .await
                .map(drop),
            Backing::Cluster(c) => c.ping().await,
            Backing::Broken(e) => Err(e.clone()),
        }
    }

    /// Whether the store is connected (the health check's lane, for one Redis).
    pub fn is_up(&self) -> bool {
        match &self.backing {
            Backing::Single(lanes) => lanes.last().is_some_and(|l| l.is_up()),
            Backing::Cluster(c) => c.is_up(),
            Backing::Broken(_) => false,
        }
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Backing::Single(lanes) = &self.backing {
            for l in lanes.iter() {
                l.close();
            }
        }
    }
}

impl super::Store for RedisStore {
    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        RedisStore::decide(self, checks, worker).await
    }

    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        RedisStore::peek(self, checks, worker).await
    }

    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), StoreError> {
        RedisStore::settle(self, checks, worker).await
    }

    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> Result<(), StoreError> {
        RedisStore::adjust(self, check, adjust).await
    }

    async fn ban<L: AsLimit>(&self, check: &Check<'_, L>, until: Micros) -> Result<(), StoreError> {
        RedisStore::ban(self, check, until).await
    }

    async fn lift_bans<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        RedisStore::lift_bans(self, limit).await
    }

    async fn ban_lifts<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        RedisStore::ban_lifts(self, limit).await
    }

    fn is_up(&self) -> bool {
        RedisStore::is_up(self)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        RedisStore::ping(self).await
    }
}
