//! The gateway's life cycle: build the store and the first [`Snapshot`], bind the listeners,
//! serve (the proxy on `[server] workers` thread-per-core workers, the admin listener and
//! housekeeping on the small main runtime, reloads on their own thread), drain on shutdown.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::ConfigError;
use crate::front::hyper::Proxy;
use crate::front::server::Listeners;
use crate::metrics::RouteMetrics;
use crate::runtime::load::Loaded;
use crate::runtime::reload::Reloader;
use crate::runtime::state::{Shared, Snapshot};
use tollgate_limit::store::AnyStore;

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
    #[error(transparent)]
    Http3(#[from] crate::front::h3::H3Error),
    #[error("cannot start the reload thread: {0}")]
    ReloadThread(#[source] std::io::Error),
    /// `TOLLGATE_TEST_CLOCK` is set but not a time (`test-clock` builds only).
    #[cfg(feature = "test-clock")]
    #[error("{0}")]
    TestClock(String),
}

/// A gateway bound to its listeners, ready to serve.
pub struct Gateway {
    shared: Arc<Shared>,
    /// Asks the reload thread for reloads (`SIGHUP`, `POST /-/reload`).
    reloader: Reloader,
    proxy: Listeners,
    admin: TcpListener,
    /// `[server] http_redirect_listen`, when set.
    redirect: Option<TcpListener>,
    /// `[rls] listen` (Envoy's rate limit service), when `[rls]` is on.
    rls: Option<TcpListener>,
    /// `[server.http3]`'s UDP listener, when enabled.
    h3: Option<crate::front::h3::Bound>,
    /// SIGHUP, registered while binding so a reload signal that arrives as soon as the listeners
    /// are up is never taken for the default action (terminate).
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
    /// SIGUSR1 (reopen the access log), registered early for the same reason.
    #[cfg(unix)]
    reopen: Option<tokio::signal::unix::Signal>,
}

impl Gateway {
    /// Builds the store and snapshot and binds both listeners. `metrics` is the installed
    /// Prometheus recorder's handle (`None`: `/metrics` answers 404).
    pub async fn bind(
        loaded: Loaded,
        config_path: Option<PathBuf>,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Gateway, GatewayError> {
        let config = &loaded.config;
        // Production: the system clock. A `test-clock` build runs on the test's time when
        // `TOLLGATE_TEST_CLOCK` is set (README, "Tests on injected time").
        #[cfg(not(feature = "test-clock"))]
        let clock = tollgate_limit::store::AnyClock::System;
        #[cfg(feature = "test-clock")]
        let clock = {
            let clock = crate::runtime::test_clock::from_env().map_err(GatewayError::TestClock)?;
            // Said at start: a test build that reached a deployment should be noticed (WARN
            // when it actually runs on injected time; INFO otherwise, so the tests that want a
            // start without warnings still have one).
            const WHAT: &str = "built with the test-only `test-clock` feature (cargo test, or an \
                                example built in the same cargo command): not a production build";
            match &clock {
                tollgate_limit::store::AnyClock::Manual(m) => {
                    tracing::warn!(injected_now_us = m.now(), "{WHAT}; on an injected clock")
                }
                tollgate_limit::store::AnyClock::System => tracing::info!("{WHAT}"),
            }
            clock
        };
        let store = Arc::new(AnyStore::build(
            &config.store,
            clock.clone(),
            config.server.workers,
        ));
        if store.backend() == "memory" {
            metrics::gauge!(crate::metrics::STORE_UP).set(1.0);
        }
        let tls = match &config.server.tls {
            Some(t) => Some(
                crate::tls::TlsReloader::new(t).map_err(|e| GatewayError::Tls(e.to_string()))?,
            ),
            None => None,
        };
        let addr = config.server.listen;
        let proxy = crate::front::server::bind(addr, config.server.workers).map_err(|source| {
            GatewayError::Bind {
                what: "proxy listener",
                addr,
                source,
            }
        })?;
        let addr = config.admin.listen;
        let admin = TcpListener::bind(addr)
            .await
            .map_err(|source| GatewayError::Bind {
                what: "admin listener",
                addr,
                source,
            })?;
        let redirect = match config.server.http_redirect_listen {
            Some(addr) => {
                Some(
                    TcpListener::bind(addr)
                        .await
                        .map_err(|source| GatewayError::Bind {
                            what: "http_redirect_listen",
                            addr,
                            source,
                        })?,
                )
            }
            None => None,
        };
        let rls =
            match &config.rls {
                Some(r) => Some(TcpListener::bind(r.listen).await.map_err(|source| {
                    GatewayError::Bind {
                        what: "rls listener",
                        addr: r.listen,
                        source,
                    }
                })?),
                None => None,
            };
        // HTTP/3 on the TLS listener's bound address (its port, when it asked for port 0),
        // over UDP, with the same certificates.
        let h3 = match (&config.server.http3, &config.server.tls, &tls) {
            (Some(h3), Some(t), Some(reloader)) => {
                let bound =
                    crate::front::h3::bind(h3, proxy.local_addr(), t, reloader.acme().cloned())?;
                reloader.set_alt_svc(bound.alt_svc());
                Some(bound)
            }
            _ => None,
        };
        let workers = config.server.workers;
        let mut snapshot = Snapshot::build(loaded, workers, store, None)?;
        snapshot.carry_traces(None)?;
        snapshot.activate(None);
        let shared = Arc::new(Shared {
            serving: crate::runtime::state::Serving::new(workers),
            access_log: crate::access_log::AccessLog::new(&snapshot.config.log),
            runtime: tokio::runtime::Handle::try_current().ok(),
            snapshot: ArcSwap::from_pointee(snapshot),
            unmatched: RouteMetrics::new(&Arc::from(crate::metrics::UNMATCHED_ROUTE)),
            metrics,
            config_path,
            tls,
            clock,
        });
        let reloader =
            Reloader::start(Arc::downgrade(&shared)).map_err(GatewayError::ReloadThread)?;
        #[cfg(unix)]
        let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reload only through POST /-/reload");
                None
            }
        };
        #[cfg(unix)]
        let reopen = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::user_defined1(),
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGUSR1; the access log is not reopened on it");
                None
            }
        };
        Ok(Gateway {
            shared,
            reloader,
            proxy,
            admin,
            redirect,
            rls,
            h3,
            #[cfg(unix)]
            hangup,
            #[cfg(unix)]
            reopen,
        })
    }

    /// The proxy listener's address (useful with port 0).
    pub fn proxy_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        Ok(self.proxy.local_addr())
    }

    /// The address of `[server] http_redirect_listen`, when set.
    pub fn redirect_addr(&self) -> Option<std::net::SocketAddr> {
        self.redirect.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The address of `[rls] listen`, when `[rls]` is on.
    pub fn rls_addr(&self) -> Option<std::net::SocketAddr> {
        self.rls.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The HTTP/3 listener's UDP address, with `[server.http3]`.
    pub fn h3_addr(&self) -> Option<std::net::SocketAddr> {
        self.h3.as_ref().map(crate::front::h3::Bound::local_addr)
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.admin.local_addr()
    }

    /// The shared state: the snapshot that serves and what every connection shares.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// [`Gateway::bind`] as a boxed future, boxed here. A binary that awaits `bind` or `serve`
    /// directly compiles their whole tree of futures again in its own crate (a release build
    /// shares no instantiation between crates, and an async body is one); awaiting these it
    /// compiles a call through a vtable (BENCHMARKS.md, stop 59: the binary's unit).
    pub fn bind_boxed(
        loaded: Loaded,
        config_path: Option<PathBuf>,
        metrics: Option<PrometheusHandle>,
    ) -> Pin<Box<dyn Future<Output = Result<Gateway, GatewayError>> + Send>> {
        Box::pin(Gateway::bind(loaded, config_path, metrics))
    }

    /// [`Gateway::serve`] as a boxed future, boxed here (see [`Gateway::bind_boxed`]).
    pub fn serve_boxed(
        self,
        shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.serve(shutdown))
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
                self.reloader.clone(),
                stop_rx.clone(),
            )));
        }
        #[cfg(unix)]
        if let Some(usr1) = self.reopen {
            background.push(tokio::spawn(reopen_on_sigusr1(
                usr1,
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        background.push(tokio::spawn(crate::runtime::watch::run(
            shared.clone(),
            self.reloader.clone(),
            stop_rx.clone(),
        )));
        let admin = tokio::spawn(crate::admin::serve(
            self.admin,
            shared.clone(),
            self.reloader,
        ));
        if let (Some(state), Some(cfg)) = (
            shared.tls.as_ref().and_then(|t| t.acme()),
            shared
                .snapshot
                .load()
                .config
                .server
                .tls
                .as_ref()
                .and_then(|t| t.acme.clone()),
        ) {
            background.push(tokio::spawn(crate::tls::acme::manager::run(
                cfg,
                state.clone(),
                stop_rx.clone(),
            )));
        }
        if let Some(l) = self.redirect {
            let tls_port = self.proxy.local_addr().port();
            background.push(tokio::spawn(crate::front::hyper::https_redirect::serve(
                l,
                shared.clone(),
                tls_port,
            )));
        }
        if let Some(l) = self.rls {
            background.push(tokio::spawn(crate::rls::server::serve(
                l,
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        let make = {
            let shared = shared.clone();
            // Called on each worker's thread, which knows its index.
            move |i| Proxy::new(shared.clone(), i)
        };
        let h3 = match self.h3 {
            Some(bound) => {
                let (done, finished) = tokio::sync::oneshot::channel();
                match crate::front::h3::spawn(bound, shared.clone(), stop_rx.clone(), done) {
                    Ok(()) => Some(finished),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the HTTP/3 thread");
                        None
                    }
                }
            }
            None => None,
        };
        let proxy = tokio::spawn(crate::front::server::serve(
            self.proxy,
            shared.clone(),
            make,
            stop_rx,
        ));
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
        let _ = proxy.await;
        if let Some(finished) = h3 {
            let _ = finished.await;
        }
        shared.access_log.finish(Duration::from_secs(2));
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
        {
            let snap = shared.snapshot.load();
            let m = snap.store.local();
            m.sweep(m.now());
        }
        if let Some(h) = &shared.metrics {
            h.run_upkeep();
        }
    }
}

#[cfg(unix)]
async fn reload_on_sighup(
    mut hup: tokio::signal::unix::Signal,
    reloader: Reloader,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            got = hup.recv() => if got.is_none() { return },
            _ = stop.changed() => return,
        }
        // Asked, not awaited: the reload thread builds (and logs) it, and the next SIGHUP is
        // queued at once behind it.
        drop(reloader.request());
    }
}

#[cfg(unix)]
async fn reopen_on_sigusr1(
    mut usr1: tokio::signal::unix::Signal,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            got = usr1.recv() => if got.is_none() { return },
            _ = stop.changed() => return,
        }
        tracing::info!("reopening the access log");
        shared.access_log.reopen();
    }
}
