//! The gateway: the immutable snapshot requests read, the state shared by all connections, and
//! the build → bind → serve life cycle (with reload and graceful drain).
//!
//! Routes, limits, static header values and metric handles are compiled into a [`Snapshot`]
//! shared as an `Arc`; a reload builds a new snapshot off the hot path and swaps it in with
//! `arc_swap`, so in-flight requests finish on the snapshot they started with.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::{Backend, Config, ConfigError, OnError};
use crate::metrics::RouteMetrics;
use crate::proxy::{upstream_client, UpstreamClient};
use crate::routing::RouteTable;
use crate::store::{system_now, AnyStore, MemoryStore, RedisStore};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
}

/// Everything a request reads of the configuration, compiled once.
#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    pub routes: RouteTable,
}

impl Snapshot {
    pub fn build(config: Config) -> Snapshot {
        let routes = RouteTable::new(&config.routes, &config.store.key_prefix);
        Snapshot { config, routes }
    }
}

/// State shared by every connection.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub store: AnyStore,
    pub client: UpstreamClient,
    pub on_error: OnError,
    pub unmatched: RouteMetrics,
    pub metrics: Option<PrometheusHandle>,
    pub config_path: Option<PathBuf>,
    pub tls: Option<crate::tls::TlsReloader>,
}

impl Shared {
    /// Re-reads the config file and swaps in a new snapshot; on error the old one keeps serving.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let result = self.try_reload();
        let label = if result.is_ok() { "success" } else { "failure" };
        metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => label).increment(1);
        match &result {
            Ok(()) => tracing::info!("configuration reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "configuration reload failed; the previous configuration keeps serving")
            }
        }
        result
    }

    fn try_reload(&self) -> Result<(), ConfigError> {
        let Some(path) = &self.config_path else {
            return Err(ConfigError::Invalid {
                field: "-".into(),
                message: "this gateway was not started from a file".into(),
            });
        };
        // Exactly `tollgate check`'s validation, files included: a reload never accepts what
        // `check` (and so the next restart) would refuse.
        let config = Config::load_and_check(path)?;
        let old = self.snapshot.load();
        if config.server.listen != old.config.server.listen
            || config.admin.listen != old.config.admin.listen
        {
            tracing::warn!("listener addresses changed; they take effect only after a restart");
        }
        if config.store != old.config.store {
            tracing::warn!("[store] changed; store settings take effect only after a restart");
        }
        if let Some(tls) = &self.tls {
            match &config.server.tls {
                Some(t) => tls.reload(t).map_err(|e| ConfigError::Invalid {
                    field: "server.tls".into(),
                    message: e,
                })?,
                None => tracing::warn!("[server.tls] removed; TLS stays on until a restart"),
            }
        } else if config.server.tls.is_some() {
            tracing::warn!("[server.tls] added; TLS takes effect only after a restart");
        }
        self.snapshot.store(Arc::new(Snapshot::build(config)));
        Ok(())
    }
}

/// A gateway bound to its listeners, ready to serve.
pub struct Gateway {
    shared: Arc<Shared>,
    proxy: TcpListener,
    admin: TcpListener,
    /// SIGHUP, registered while binding so a reload signal that arrives as soon as the listeners
    /// are up is never taken for the default action (terminate).
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Gateway {
    /// Builds the store and snapshot and binds both listeners. `metrics` is the installed
    /// Prometheus recorder's handle (`None`: `/metrics` answers 404).
    pub async fn bind(
        config: Config,
        config_path: Option<PathBuf>,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Gateway, GatewayError> {
        let store = match config.store.backend {
            Backend::Memory => AnyStore::Memory(MemoryStore::new(config.store.max_subjects)),
            Backend::Redis | Backend::RedisCluster => {
                AnyStore::Redis(RedisStore::new(&config.store))
            }
        };
        if store.backend() == "memory" {
            metrics::gauge!(crate::metrics::STORE_UP).set(1.0);
        }
        let tls = match &config.server.tls {
            Some(t) => Some(crate::tls::TlsReloader::new(t).map_err(GatewayError::Tls)?),
            None => None,
        };
        let bind = |what: &'static str, addr: std::net::SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| GatewayError::Bind { what, addr, source })
        };
        let proxy = bind("proxy listener", config.server.listen).await?;
        let admin = bind("admin listener", config.admin.listen).await?;
        let shared = Arc::new(Shared {
            on_error: config.store.on_error,
            snapshot: ArcSwap::from_pointee(Snapshot::build(config)),
            store,
            client: upstream_client(),
            unmatched: RouteMetrics::new(&Arc::from(crate::metrics::UNMATCHED_ROUTE)),
            metrics,
            config_path,
            tls,
        });
        #[cfg(unix)]
        let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reload only through POST /-/reload");
                None
            }
        };
        Ok(Gateway {
            shared,
            proxy,
            admin,
            #[cfg(unix)]
            hangup,
        })
    }

    /// The proxy listener's address (useful with port 0).
    pub fn proxy_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.proxy.local_addr()
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.admin.local_addr()
    }

    /// The shared state (for reload triggers).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Serves until `shutdown` resolves, then drains: stops accepting at once, lets in-flight
    /// requests finish for up to `[server] grace_period`, closes idle connections, returns.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()> + Send) {
        let shared = self.shared;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        #[allow(unused_mut)]
        let mut background = vec![tokio::spawn(housekeeping(shared.clone(), stop_rx.clone()))];
        #[cfg(unix)]
        if let Some(hup) = self.hangup {
            background.push(tokio::spawn(reload_on_sighup(
                hup,
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        let admin = tokio::spawn(crate::admin::serve(
            self.admin,
            shared.clone(),
            stop_rx.clone(),
        ));
        let proxy = tokio::spawn(crate::server::serve(self.proxy, shared.clone(), stop_rx));
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
        let _ = proxy.await;
        admin.abort();
        for b in background {
            b.abort();
        }
        tracing::info!("stopped");
    }
}

async fn housekeeping(shared: Arc<Shared>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if let AnyStore::Memory(m) = &shared.store {
            m.sweep(system_now());
        }
        if let Some(h) = &shared.metrics {
            h.run_upkeep();
        }
    }
}

#[cfg(unix)]
async fn reload_on_sighup(
    mut hup: tokio::signal::unix::Signal,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            got = hup.recv() => if got.is_none() { return },
            _ = stop.changed() => return,
        }
        let s = shared.clone();
        // Reading and compiling the file is blocking work: keep it off the async workers.
        let _ = tokio::task::spawn_blocking(move || s.reload()).await;
    }
}
