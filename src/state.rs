//! The state every worker reads: the immutable, hot-swappable [`Snapshot`] of the configuration
//! and what is shared by all connections ([`Shared`]: the TLS acceptor, metrics, the access log).
//!
//! Routes, limits, static header values, metric handles and the store are compiled into a
//! `Snapshot` shared as an `Arc`; a reload builds a new snapshot off the hot path and swaps it in
//! with `arc_swap`, so in-flight requests finish on the snapshot (and the store) they started
//! with. A reload that keeps `[store]` keeps the same store; one that changes it builds and
//! connects the new store before the swap, and the old one closes when its last request ends. What is per worker (the
//! upstream connection pool) is not here: each worker builds its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::access_log::AccessLog;
use crate::config::{Config, ConfigError, StoreConfig};
use crate::consumers::ConsumerTable;
use crate::load::Loaded;
use crate::metrics::RouteMetrics;
use crate::routing::RouteTable;
use crate::store::{AnyStore, Clock, Store};
use crate::top::DeniedTop;
use crate::upstream::{Carried, Group};

/// Everything a request reads of the configuration, compiled once.
#[derive(Debug)]
pub struct Snapshot {
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
        let Loaded { config, consumers } = loaded;
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
        let mut routes = RouteTable::new(&config.routes, &by_name, workers)?;
        crate::consumers::compile_plan_limits(&mut routes, &config.plans);
        if let Some(p) = previous {
            let tops: HashMap<(&str, Option<&str>, &str), &Arc<DeniedTop>> = p
                .routes
                .iter()
                .flat_map(|r| r.limits.iter().chain(r.plan_limits.iter().flatten()))
                .map(|l| ((&*l.route, l.plan.as_deref(), &*l.name), &l.top))
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
                if let Some(t) = tops.get(&(&*l.route, l.plan.as_deref(), &*l.name)) {
                    l.top = Arc::clone(t);
                }
            }
        }
        Ok(Snapshot {
            config,
            routes,
            groups,
            workers,
            store,
            consumers,
        })
    }

    /// Puts a freshly built snapshot in service: retires what `previous` had and this one
    /// does not keep, publishes the servers' health, starts the active health checks (on the
    /// current runtime) and logs the configuration's warnings.
    pub fn activate(&self, previous: Option<&Snapshot>) {
        if let Some(p) = previous {
            let mut kept = Carried::new();
            for g in &self.groups {
                g.carry(&mut kept);
            }
            for g in &p.groups {
                g.retire(&kept);
            }
        }
        for g in &self.groups {
            g.publish_all();
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
    /// Held by the reload under way: reloads run one at a time, so the last one asked for reads
    /// the file last and is the last swapped in.
    pub reloading: std::sync::Mutex<()>,
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

impl Shared {
    /// Re-reads the config file and swaps in a new snapshot; on error the old one keeps serving.
    /// Waits for a reload under way to finish first.
    /// Returns the warnings of a successful reload: what changed but needs a restart, and the
    /// new configuration's own [`Config::warnings`] (all also logged).
    pub fn reload(&self) -> Result<Vec<String>, ConfigError> {
        // One at a time (`SIGHUP` and `POST /-/reload` alike): overlapping reloads would each
        // swap in what they had read when they finish, and one held up (a new store's PING)
        // could put an older file back over a later one.
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let result = self.try_reload();
        let label = if result.is_ok() { "success" } else { "failure" };
        metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => label).increment(1);
        match &result {
            Ok(_) => tracing::info!("configuration reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "configuration reload failed; the previous configuration keeps serving")
            }
        }
        result
    }

    fn try_reload(&self) -> Result<Vec<String>, ConfigError> {
        let Some(path) = &self.config_path else {
            return Err(ConfigError::Invalid {
                field: "-".into(),
                message: "this gateway was not started from a file".into(),
            });
        };
        // Exactly `tollgate check`'s validation, files included: a reload never accepts what
        // `check` (and so the next restart) would refuse.
        let loaded = crate::load::load_and_check(path)?;
        let config = &loaded.config;
        let old = self.snapshot.load();
        let mut warnings = Vec::new();
        if config.server.listen != old.config.server.listen
            || config.admin.listen != old.config.admin.listen
        {
            warnings.push(
                "listener addresses changed; they take effect only after a restart".to_owned(),
            );
        }
        if config.server.workers != old.config.server.workers {
            warnings
                .push("[server] workers changed; it takes effect only after a restart".to_owned());
        }
        if let Some(tls) = &self.tls {
            match &config.server.tls {
                Some(t) => tls.reload(t).map_err(|e| ConfigError::Invalid {
                    field: "server.tls".into(),
                    message: e,
                })?,
                None => {
                    warnings.push("[server.tls] removed; TLS stays on until a restart".to_owned())
                }
            }
        } else if config.server.tls.is_some() {
            warnings.push("[server.tls] added; TLS takes effect only after a restart".to_owned());
        }
        for w in &warnings {
            tracing::warn!("{w}");
        }
        warnings.extend(config.warnings());
        let store = if config.store.same_store(&old.config.store) {
            Arc::clone(&old.store)
        } else {
            self.connect_store(&config.store, old.workers)?
        };
        let snapshot = Arc::new(Snapshot::build(loaded, old.workers, store, Some(&**old))?);
        // Before the swap: a snapshot that turns the access log on never runs without a writer.
        self.access_log.configure(&snapshot.config.log);
        // Checkers run on the main runtime; a reload runs on its blocking pool.
        match &self.runtime {
            Some(rt) => {
                let _guard = rt.enter();
                snapshot.activate(Some(&**old));
            }
            None => snapshot.activate(Some(&old)),
        }
        self.snapshot.store(snapshot);
        Ok(warnings)
    }

    /// Builds the store `cfg` names and, for Redis, waits (up to its `timeout`) until it
    /// answers a PING: a reload never switches to a store that cannot decide. Runs off the
    /// async workers (a reload runs on the blocking pool); the store's tasks start on the main
    /// runtime.
    fn connect_store(
        &self,
        cfg: &StoreConfig,
        workers: usize,
    ) -> Result<Arc<AnyStore>, ConfigError> {
        let failed = |message: String| ConfigError::Invalid {
            field: "store".into(),
            message,
        };
        let Some(rt) = &self.runtime else {
            return Err(failed("the store cannot change without a runtime".into()));
        };
        let store = {
            let _guard = rt.enter();
            Arc::new(AnyStore::build(cfg, Clock::Store, workers))
        };
        let pinged = rt.block_on(tokio::time::timeout(cfg.timeout, store.ping()));
        match pinged {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(failed(format!(
                    "cannot reach the new {} store: {e}; the previous store keeps deciding",
                    store.backend()
                )))
            }
            Err(_) => {
                return Err(failed(format!(
                    "the new {} store did not answer within {}; the previous store keeps deciding",
                    store.backend(),
                    humantime::format_duration(cfg.timeout)
                )))
            }
        }
        tracing::info!(
            backend = store.backend(),
            "[store] changed; the new store decides from now on"
        );
        if store.backend() == "memory" {
            metrics::gauge!(crate::metrics::STORE_UP).set(1.0);
        }
        Ok(store)
    }
}
