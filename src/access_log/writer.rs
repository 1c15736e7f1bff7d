//! The writer thread and the handle the request path sends records through.
//!
//! A std `sync_channel` (a fixed ring, no allocation per send) of [`CAPACITY`] records feeds one
//! thread, started when a configuration first turns the log on. The thread takes what is queued
//! in one go, formats it and writes it with one `write` call, so a busy gateway costs a few
//! syscalls a second. The target can change (reload) and the file be reopened (SIGUSR1, for
//! logrotate): both bump a generation the thread checks before each batch, and wake it so that
//! an idle log lets go of a rotated file at once. Opening happens on the thread too, so a FIFO
//! nobody reads blocks only the thread (its lines are dropped and counted), never a request or
//! the start-up.

use std::fs::File;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use metrics::Counter;

use super::Record;
use crate::config::{AccessTarget, LogConfig};
use tollgate_limit::log_throttle::Throttles;

/// Records queued for the writer at most; more are dropped (and counted).
pub const CAPACITY: usize = 8192;
/// Records formatted into one write at most.
const BATCH: usize = 1024;

enum Msg {
    Line(Box<Record>),
    /// Look at the generation (reopen, new target) or the stop flag now.
    Wake,
}

/// What the request path and the writer thread share.
struct Control {
    target: Mutex<AccessTarget>,
    generation: AtomicU64,
    stop: AtomicBool,
    dropped: Counter,
}

struct Running {
    tx: SyncSender<Msg>,
    done: Mutex<Receiver<()>>,
}

/// The access log of a gateway.
pub struct AccessLog {
    control: Arc<Control>,
    running: OnceLock<Running>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("running", &self.running.get().is_some())
            .finish()
    }
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog {
            control: Arc::new(Control {
                target: Mutex::new(AccessTarget::Off),
                generation: AtomicU64::new(0),
                stop: AtomicBool::new(false),
                dropped: metrics::counter!(crate::metrics::ACCESS_LOG_DROPPED),
            }),
            running: OnceLock::new(),
        }
    }
}

impl AccessLog {
    /// A log for `cfg` (the writer thread starts only if it is on).
    pub fn new(cfg: &LogConfig) -> AccessLog {
        let log = AccessLog::default();
        log.configure(cfg);
        log
    }

    /// Applies `[log]` (start-up and reload); call before the snapshot that turns it on is
    /// published, so the request path never sees it on without a writer.
    pub fn configure(&self, cfg: &LogConfig) {
        {
            let mut t = self
                .control
                .target
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *t == cfg.access {
                return;
            }
            *t = cfg.access.clone();
        }
        if cfg.access.is_on() && self.running.get().is_none() {
            self.start();
        }
        self.reopen();
    }

    /// Closes and reopens the file (SIGUSR1, after logrotate moved it).
    pub fn reopen(&self) {
        self.control.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(r) = self.running.get() {
            let _ = r.tx.try_send(Msg::Wake);
        }
    }

    fn start(&self) {
        let (tx, rx) = mpsc::sync_channel(CAPACITY);
        let (done_tx, done_rx) = mpsc::channel();
        let control = self.control.clone();
        let spawned = std::thread::Builder::new()
            .name("tollgate-access-log".into())
            .spawn(move || {
                write_loop(&rx, &control);
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => {
                let _ = self.running.set(Running {
                    tx,
                    done: Mutex::new(done_rx),
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start the access-log writer; no access log")
            }
        }
    }

    /// Queues a record without waiting; drops (and counts) it when the queue is full.
    pub fn send(&self, record: Box<Record>) {
        let Some(r) = self.running.get() else {
            return;
        };
        match r.tx.try_send(Msg::Line(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.control.dropped.increment(1)
            }
        }
    }

    /// Writes what is queued and stops the writer, waiting at most `timeout` (a sink that
    /// blocks is left behind: the process is exiting).
    pub fn finish(&self, timeout: Duration) {
        let Some(r) = self.running.get() else {
            return;
        };
        self.control.stop.store(true, Ordering::Release);
        let _ = r.tx.try_send(Msg::Wake);
        let done = r.done.lock().unwrap_or_else(|e| e.into_inner());
        match done.recv_timeout(timeout) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {}
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!("the access log did not finish writing in time")
            }
        }
    }
}

enum Sink {
    Stdout,
    File(File),
}

impl Sink {
    fn open(target: &AccessTarget) -> std::io::Result<Option<Sink>> {
        Ok(match target {
            AccessTarget::Off => None,
            AccessTarget::Stdout => Some(Sink::Stdout),
            AccessTarget::File(p) => Some(Sink::File(
                File::options().create(true).append(true).open(p)?,
            )),
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()
            }
            Sink::File(f) => f.write_all(bytes),
        }
    }
}

/// Warnings of the writer, at most one a second per kind: 0 open, 1 write.
static WRITE_FAILED: Throttles<2> = Throttles::new();

fn write_loop(rx: &Receiver<Msg>, control: &Control) {
    let mut sink: Option<Sink> = None;
    let mut generation = u64::MAX;
    let mut target = AccessTarget::Off;
    let mut buf = String::with_capacity(64 * 1024);
    let mut stopping = false;
    loop {
        let first = if stopping {
            match rx.try_recv() {
                Ok(m) => m,
                Err(_) => return,
            }
        } else {
            match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            }
        };
        let g = control.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            sink = None;
            target = control
                .target
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
        }
        buf.clear();
        let mut lines = 0u64;
        let (wall, now) = (SystemTime::now(), Instant::now());
        let mut take = |m: Msg, buf: &mut String| {
            if let Msg::Line(r) = m {
                r.write_json(buf, wall, now);
                lines += 1;
            }
        };
        take(first, &mut buf);
        for _ in 1..BATCH {
            match rx.try_recv() {
                Ok(m) => take(m, &mut buf),
                Err(_) => break,
            }
        }
        if lines > 0 && target.is_on() {
            if sink.is_none() {
                match Sink::open(&target) {
                    Ok(s) => sink = s,
                    Err(e) => {
                        if let Some(suppressed) = WRITE_FAILED.allow(0) {
                            tracing::warn!(error = %e, suppressed, "cannot open the access log; lines are dropped");
                        }
                    }
                }
            }
            let written = match &mut sink {
                Some(s) => match s.write_all(buf.as_bytes()) {
                    Ok(()) => true,
                    Err(e) => {
                        if let Some(suppressed) = WRITE_FAILED.allow(1) {
                            tracing::warn!(error = %e, suppressed, "cannot write the access log; lines are dropped");
                        }
                        // Reopened for the next batch.
                        sink = None;
                        false
                    }
                },
                None => false,
            };
            if !written {
                control.dropped.increment(lines);
            }
        }
        stopping = stopping || control.stop.load(Ordering::Acquire);
    }
}
