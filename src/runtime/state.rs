//! The state every worker reads: the immutable, hot-swappable [`Snapshot`] of the configuration
//! and what is shared by all connections ([`Shared`]: the TLS acceptor, metrics, the access log).
//!
//! Routes, limits, static header values, metric handles and the store are compiled into a
//! `Snapshot` shared as an `Arc`; a reload (built by [`crate::runtime::reload`], one at a time) builds a
//! new snapshot off the hot path and swaps it in with `arc_swap`, so in-flight requests finish
//! on the snapshot (and the store) they started with. A reload that keeps `[store]` keeps the
//! same store; one that changes it builds and connects the new store before the swap, and the
//! old one closes when its last request ends. What is per worker (the upstream connection pool)
//! is not here: each worker builds its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::access_log::AccessLog;
use crate::config::{Config, ConfigError};
use crate::consumers::ConsumerTable;
use crate::metrics::RouteMetrics;
use crate::routing::RouteTable;
use crate::runtime::load::Loaded;
use crate::top::DeniedTop;
use crate::upstream::{Carried, Group};
use tollgate_limit::store::{AnyClock, AnyStore};

/// Everything a request reads of the configuration, compiled once.
#[derive(Debug)]
pub struct Snapshot {
    /// The configuration it was built from, but for `routes`: those are compiled into `routes`
    /// and not kept (`config.routes` is empty).
    pub config: Config,
    pub routes: RouteTable,
    /// The compiled `[[upstreams]]` groups.
    pub groups: Vec<Arc<Group>>,
    /// The proxy workers the groups keep a pool slot for (fixed at start-up).
    pub workers: usize,
    /// The store that decides this snapshot's limits (`config.store`).
    pub store: Arc<AnyStore>,
    /// The consumers of `[consumers] file` (empty without `[consumers]`).
    pub consumers: Arc<ConsumerTable>,
    /// Which snapshot this is: 1 at start-up, one more for each reload applied.
    pub generation: u64,
    /// `[admin] token_file`'s tokens (`None`: the admin endpoints are open).
    pub admin_tokens: Option<Arc<crate::admin::tokens::AdminTokens>>,
    /// Verifies bearer tokens with `[jwt]`'s keys (its caches are this snapshot's).
    pub jwt: Option<Arc<crate::jwt::Verifier>>,
    /// OpenTelemetry traces (`[tracing]`), set by whoever puts the snapshot in service (they
    /// need the runtime): started at start-up, kept by a reload that leaves `[tracing]` as it
    /// was (see [`Snapshot::carry_traces`]).
    pub traces: Option<Arc<crate::traces::Traces>>,
    /// Some route is served by the hyper front only ([`crate::routing::Route::hyper_only`]):
    /// the fast HTTP/1 front then looks a request's route up before serving it.
    pub hyper_routes: bool,
    /// Some route's limits read the request's JSON body ([`crate::routing::Route::json_paths`]):
    /// the fast front then admits with a body it can read.
    pub json_routes: bool,
    /// `[rls]`'s domains, decided on [`Snapshot::store`] (`None`: the service is off).
    pub rls: Option<Arc<crate::rls::Domains>>,
    /// The HTTP cache (`None`: no route caches). A reload keeps the stored responses while
    /// `[cache]`'s bounds stay the same.
    pub cache: Option<Arc<crate::cache::Cache>>,
}

impl Snapshot {
    /// Compiles `config` for `workers` proxy workers. What `previous` (the snapshot a reload
    /// replaces) knew carries over: the servers that stay in a group of the same name keep their
    /// health (and requests in flight), and every limit that keeps its route and name keeps its
    /// `/-/top` sketch (in-flight requests of `previous` keep recording into the same one).
    pub fn build(
        loaded: Loaded,
        workers: usize,
        store: Arc<AnyStore>,
        previous: Option<&Snapshot>,
    ) -> Result<Snapshot, ConfigError> {
        let Loaded {
            config,
            consumers,
            admin_tokens,
            jwt,
        } = loaded;
        let rls = match &config.rls {
            Some(r) => Some(Arc::new(crate::rls::Domains::load(r)?)),
            None => None,
        };
        let jwt = config.jwt.as_ref().map(|j| {
            let keys = jwt.unwrap_or_else(|| Arc::new(crate::jwt::JwtKeys::none()));
            Arc::new(crate::jwt::Verifier::new(j, keys, workers))
        });
        let mut carried = Carried::new();
        if let Some(p) = previous {
            for g in &p.groups {
                g.carry(&mut carried);
            }
        }
        let mut groups = Vec::with_capacity(config.upstreams.len());
        let mut by_name = HashMap::with_capacity(config.upstreams.len());
        for (i, u) in config.upstreams.iter().enumerate() {
            let g = Arc::new(Group::build(u, workers, &carried).map_err(|message| {
                ConfigError::Invalid {
                    field: format!("upstreams[{i}].tls"),
                    message,
                }
            })?);
            by_name.insert(u.name.clone(), g.clone());
            groups.push(g);
        }
        // The routes live on compiled (`routes`); their config is not kept (10,000 routes:
        // 11 MB), so the snapshot's `config.routes` is empty.
        let mut config = config;
        let mut routes = RouteTable::new(&std::mem::take(&mut config.routes), &by_name, workers)?;
        crate::consumers::compile_plan_limits(&mut routes, &config.plans, &consumers);
        if let Some(p) = previous {
            #[allow(clippy::type_complexity)]
            let tops: HashMap<(&str, Option<&str>, &str), (&Arc<DeniedTop>, _)> = p
                .routes
                .iter()
                .flat_map(|r| r.limits.iter().chain(r.plan_limits.iter().flatten()))
                .map(|l| {
                    (
                        (&*l.route, l.plan.as_deref(), &*l.name),
                        (&l.top, l.ban.as_ref().map(|b| &b.1)),
                    )
                })
                .collect();
            for l in routes
                .iter_mut()
                .flat_map(|r| {
                    r.limits
                        .iter_mut()
                        .chain(r.plan_limits.iter_mut().flatten())
                })
                .filter_map(Arc::get_mut)
            {
                let kept = tops
                    .get(&(&*l.route, l.plan.as_deref(), &*l.name))
                    .map(|(t, bans)| (Arc::clone(t), bans.cloned()));
                if let Some((t, bans)) = kept {
                    l.top = t;
                    // A reload does not let the banned out (the rule may change; the bans stay).
                    if let (Some(b), Some(old)) = (l.ban.as_mut(), bans) {
                        b.1 = old;
                    }
                }
            }
        }
        // A plan's limit remembers the combinations it counted once for all routes and
        // overrides (one count per scope), across a reload too.
        // (A limit whose parts changed starts afresh: its keys are other hashes.)
        type Seen = (
            crate::config::SubjectSpec,
            Arc<crate::limiter::seen_keys::SeenKeys>,
        );
        let mut seen: HashMap<(Arc<str>, Arc<str>), Seen> = previous
            .iter()
            .flat_map(|p| p.routes.iter())
            .flat_map(|r| r.plan_limits.iter().flatten())
            .map(|l| {
                let k = (l.scope.clone(), l.name.clone());
                (k, (l.subject.clone(), l.seen.clone()))
            })
            .collect();
        for l in routes
            .iter_mut()
            .flat_map(|r| r.plan_limits.iter_mut().flatten())
            .filter_map(Arc::get_mut)
        {
            let shared = seen
                .entry((l.scope.clone(), l.name.clone()))
                .or_insert_with(|| (l.subject.clone(), l.seen.clone()));
            if shared.0 != l.subject {
                *shared = (l.subject.clone(), l.seen.clone());
            }
            l.seen = Arc::clone(&shared.1);
        }
        let (mut hyper_routes, mut json_routes) = (false, false);
        for r in routes.iter_mut() {
            r.json_paths = r.request_json_paths();
            r.hyper_only = !r.needs().within(crate::routing::Needs::HTTP1);
            hyper_routes |= r.hyper_only;
            json_routes |= !r.json_paths.is_empty();
        }
        // A consumer's overridden limits record their denials in the plan's sketch: `/-/top`
        // lists a plan's limit once per route, whoever denied.
        let plans = config.plans.len();
        for r in routes.iter_mut() {
            let at = plans.min(r.plan_limits.len());
            let (own, variants) = r.plan_limits.split_at_mut(at);
            for (v, list) in consumers.variants().iter().zip(variants.iter_mut()) {
                let Some(base) = own.get(v.plan) else {
                    continue;
                };
                for (l, b) in list.iter_mut().zip(base) {
                    if let Some(l) = Arc::get_mut(l) {
                        l.top = Arc::clone(&b.top);
                    }
                }
            }
        }
        // The cache: kept across a reload that leaves `[cache]` as it was; its disk tier across
        // one that keeps `disk_path`.
        let cache = match routes.iter().any(|r| r.cache.is_some()) {
            false => None,
            true => {
                let old = previous.and_then(|p| p.cache.as_ref());
                match old.filter(|c| c.store.config == config.cache) {
                    Some(c) => Some(Arc::clone(c)),
                    None => Some(Arc::new(
                        crate::cache::Cache::open(&config.cache, old.map(|c| &**c)).map_err(
                            |e| ConfigError::Invalid {
                                field: "cache.disk_path".into(),
                                message: e.to_string(),
                            },
                        )?,
                    )),
                }
            }
        };
        Ok(Snapshot {
            config,
            routes,
            groups,
            workers,
            store,
            consumers,
            admin_tokens,
            generation: previous.map_or(1, |p| p.generation.saturating_add(1)),
            jwt,
            traces: None,
            hyper_routes,
            json_routes,
            rls,
            cache,
        })
    }

    /// Sets up this snapshot's traces: `previous`'s when `[tracing]` did not change, else a new
    /// exporter (started on the current runtime); none without `[tracing]`.
    pub fn carry_traces(&mut self, previous: Option<&Snapshot>) -> Result<(), ConfigError> {
        let Some(cfg) = &self.config.tracing else {
            self.traces = None;
            return Ok(());
        };
        if let Some(t) = previous.and_then(|p| p.traces.as_ref()) {
            if &t.config == cfg {
                self.traces = Some(t.clone());
                return Ok(());
            }
        }
        let t = crate::traces::Traces::start(cfg).map_err(|message| ConfigError::Invalid {
            field: "tracing.otlp_endpoint".into(),
            message,
        })?;
        self.traces = Some(Arc::new(t));
        Ok(())
    }

    /// Puts a freshly built snapshot in service: retires `previous`'s groups (their health
    /// checkers stop), starts the active health checks (on the current runtime) and logs the
    /// configuration's warnings. The upstream series follow the snapshot that serves (see
    /// [`crate::upstream::write_metrics`]): nothing to retire there.
    pub fn activate(&self, previous: Option<&Snapshot>) {
        if let Some(p) = previous {
            for g in &p.groups {
                g.retire();
            }
        }
        for g in &self.groups {
            crate::upstream::checker::spawn(g);
        }
        for w in self.config.warnings() {
            tracing::warn!("{w}");
        }
        let consumers = self.consumers.len();
        metrics::gauge!(crate::metrics::CONSUMERS).set(consumers as f64);
        if let Some(c) = &self.config.consumers {
            tracing::info!(consumers, file = %c.file.display(), "consumers loaded");
        }
    }
}

/// State shared by every connection.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub unmatched: RouteMetrics,
    pub metrics: Option<PrometheusHandle>,
    pub config_path: Option<PathBuf>,
    pub tls: Option<crate::tls::TlsReloader>,
    /// How many proxy workers accept connections right now (for `/readyz`).
    pub serving: Serving,
    /// The access log's writer (configured from `[log]`, reconfigured on reload).
    pub access_log: AccessLog,
    /// The main runtime, where active health checks run.
    pub runtime: Option<tokio::runtime::Handle>,
    /// The clock every store is built on, the first and those a reload builds (the system
    /// clock; a manual one only in a `test-clock` build started with `TOLLGATE_TEST_CLOCK`).
    pub clock: AnyClock,
}

impl crate::rls::Source for Shared {
    fn domains(&self) -> Option<(Arc<crate::rls::Domains>, Arc<AnyStore>)> {
        let snap = self.snapshot.load();
        Some((snap.rls.clone()?, snap.store.clone()))
    }

    fn clock(&self) -> &AnyClock {
        &self.clock
    }

    fn timers(&self) -> crate::rls::Timers {
        let server = &self.snapshot.load().config.server;
        crate::rls::Timers {
            first_call: server.header_read_timeout.min(crate::config::MAX_TIMEOUT),
            idle: server.idle_timeout.min(crate::config::MAX_TIMEOUT),
        }
    }
}

/// Counts the proxy workers that accept connections: the gateway is ready only once every
/// worker's accept loop runs, and stops being ready as soon as the drain starts.
#[derive(Debug)]
pub struct Serving {
    workers: usize,
    accepting: AtomicUsize,
}

impl Serving {
    pub fn new(workers: usize) -> Serving {
        Serving {
            workers: workers.max(1),
            accepting: AtomicUsize::new(0),
        }
    }

    /// Holds one worker's place among the accepting ones until dropped.
    pub fn accepting(&self) -> AcceptingGuard<'_> {
        self.accepting.fetch_add(1, Ordering::AcqRel);
        AcceptingGuard(self)
    }

    /// Every worker accepts.
    pub fn all(&self) -> bool {
        self.accepting.load(Ordering::Acquire) >= self.workers
    }
}

/// One worker's accept loop, counted while it lives.
#[derive(Debug)]
pub struct AcceptingGuard<'a>(&'a Serving);

impl Drop for AcceptingGuard<'_> {
    fn drop(&mut self) {
        self.0.accepting.fetch_sub(1, Ordering::AcqRel);
    }
}
