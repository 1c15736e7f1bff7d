//! Reloads, one at a time. `SIGHUP` and `POST /-/reload` only ask for one: a single long-lived
//! `tollgate-reload` thread builds the snapshots, one after another. The requests that arrive
//! while a build runs are served together by the next build, which reads the files afresh
//! after all of them asked (they are coalesced). So the reload requested last is built last,
//! and what serves is the configuration on disk when it was asked for — run side by side, a
//! reload that started first could finish last and bring back what a later one removed (a
//! revoked consumer). And however many reloads are asked at once, one snapshot at most is being
//! built: side by side, each held its own copy of a large consumers file (40 reloads of 100,000
//! consumers took RSS from 19 MB to 1.3 GB). Each requester gets the outcome of the build that
//! covered it, with the generation then serving.

use std::sync::{mpsc, Arc, Weak};

use tokio::sync::oneshot;

use crate::config::{ConfigError, StoreConfig};
use crate::runtime::state::{Shared, Snapshot};
use tollgate_limit::store::{AnyStore, Store};

/// What one build did, shared by every request it covered.
#[derive(Debug)]
pub struct Outcome {
    /// The warnings of an applied reload, or why the reload was rejected.
    pub result: Result<Vec<String>, ConfigError>,
    /// The generation of the snapshot serving once the build was over: the new one when
    /// applied, the one that keeps serving when rejected.
    pub generation: u64,
}

/// Asks the reload thread for reloads. Cloned for each place that may ask (the admin listener,
/// the `SIGHUP` task); the thread ends when every clone is gone.
#[derive(Debug, Clone)]
pub struct Reloader {
    queue: mpsc::Sender<oneshot::Sender<Arc<Outcome>>>,
}

impl Reloader {
    /// Starts the `tollgate-reload` thread for `shared`. The thread holds it weakly: a
    /// gateway that is dropped is not kept alive by its reload thread.
    pub fn start(shared: Weak<Shared>) -> std::io::Result<Reloader> {
        let (queue, requests) = mpsc::channel();
        std::thread::Builder::new()
            .name("tollgate-reload".into())
            .spawn(move || run(&shared, &requests))?;
        Ok(Reloader { queue })
    }

    /// Asks for a reload. The answer is the outcome of the build that covers this request: the
    /// first build to start after it. An error means the reload thread is gone.
    pub fn request(&self) -> oneshot::Receiver<Arc<Outcome>> {
        let (answer, outcome) = oneshot::channel();
        // A send fails only when the thread is gone; `answer` is then dropped with the message,
        // and the receiver says so.
        let _ = self.queue.send(answer);
        outcome
    }
}

/// The reload thread: waits for a request, takes every request waiting with it, builds once,
/// answers them all; again.
fn run(shared: &Weak<Shared>, requests: &mpsc::Receiver<oneshot::Sender<Arc<Outcome>>>) {
    while let Ok(first) = requests.recv() {
        // Every request queued now asked before this build reads the files: it covers them.
        let mut covered = vec![first];
        covered.extend(requests.try_iter());
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // In the main runtime's context, as its blocking pool would be: the build starts
        // tasks (a new store's, health checkers) and timers there.
        let entered = shared.runtime.as_ref().map(|rt| rt.enter());
        let result = reload(&shared);
        drop(entered);
        let generation = shared.snapshot.load().generation;
        drop(shared);
        let outcome = Arc::new(Outcome { result, generation });
        for answer in covered {
            // The requester may have left (a client that hung up, a signal): nothing to do.
            let _ = answer.send(Arc::clone(&outcome));
        }
    }
}

/// One build: re-reads the config file and swaps in a new snapshot; on error the old one keeps
/// serving. Returns the warnings of a successful reload: what changed but needs a restart, and
/// the new configuration's own [`crate::config::Config::warnings`] (all also logged). Run only
/// by the reload thread.
fn reload(shared: &Shared) -> Result<Vec<String>, ConfigError> {
    // A bug that panics in one build must not end the thread, and with it every later reload:
    // that build is rejected (the panic is logged), the next one runs.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| try_reload(shared)))
        .unwrap_or_else(|_| {
            Err(ConfigError::Invalid {
                field: "-".into(),
                message: "the reload failed unexpectedly (a bug: see the log)".into(),
            })
        });
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

fn try_reload(shared: &Shared) -> Result<Vec<String>, ConfigError> {
    let Some(path) = &shared.config_path else {
        return Err(ConfigError::Invalid {
            field: "-".into(),
            message: "this gateway was not started from a file".into(),
        });
    };
    // Exactly `tollgate check`'s validation, files included: a reload never accepts what
    // `check` (and so the next restart) would refuse.
    let loaded = crate::runtime::load::load_and_check(path)?;
    let config = &loaded.config;
    let old = shared.snapshot.load();
    let mut warnings = Vec::new();
    if config.server.listen != old.config.server.listen
        || config.admin.listen != old.config.admin.listen
        || config.server.http_redirect_listen != old.config.server.http_redirect_listen
    {
        warnings
            .push("listener addresses changed; they take effect only after a restart".to_owned());
    }
    if config.server.workers != old.config.server.workers {
        warnings.push("[server] workers changed; it takes effect only after a restart".to_owned());
    }
    if let Some(tls) = &shared.tls {
        match &config.server.tls {
            Some(t) => tls.reload(t).map_err(|e| {
                let (field, message) = e.field_and_message();
                ConfigError::Invalid { field, message }
            })?,
            None => warnings.push("[server.tls] removed; TLS stays on until a restart".to_owned()),
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
        connect_store(shared, &config.store, old.workers)?
    };
    let mut snapshot = Snapshot::build(loaded, old.workers, store, Some(&**old))?;
    // A new exporter's task runs on the main runtime; a reload runs on its own thread.
    match &shared.runtime {
        Some(rt) => {
            let _guard = rt.enter();
            snapshot.carry_traces(Some(&**old))?;
        }
        None => snapshot.carry_traces(Some(&**old))?,
    }
    let snapshot = Arc::new(snapshot);
    // Before the swap: a snapshot that turns the access log on never runs without a writer.
    shared.access_log.configure(&snapshot.config.log);
    // Checkers run on the main runtime; a reload runs on its own thread.
    match &shared.runtime {
        Some(rt) => {
            let _guard = rt.enter();
            snapshot.activate(Some(&**old));
        }
        None => snapshot.activate(Some(&old)),
    }
    shared.snapshot.store(snapshot);
    Ok(warnings)
}

/// Builds the store `cfg` names and, for Redis, waits (up to its `timeout`) until it
/// answers a PING: a reload never switches to a store that cannot decide. Runs off the
/// async workers (on the reload thread); the store's tasks start on the main
/// runtime.
fn connect_store(
    shared: &Shared,
    cfg: &StoreConfig,
    workers: usize,
) -> Result<Arc<AnyStore>, ConfigError> {
    let failed = |message: String| ConfigError::Invalid {
        field: "store".into(),
        message,
    };
    let Some(rt) = &shared.runtime else {
        return Err(failed("the store cannot change without a runtime".into()));
    };
    let store = {
        let _guard = rt.enter();
        Arc::new(AnyStore::build(cfg, shared.clock.clone(), workers))
    };
    let pinged = rt.block_on(async { tokio::time::timeout(cfg.timeout, store.ping()).await });
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
