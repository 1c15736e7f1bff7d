//! A lane: one connection to Redis and the batcher that drives it, one per proxy worker (and one
//! for everything off the workers: health checks, the admin API, tests).
//!
//! A request queues its job and waits in its slot ([`super::waiters`]). The lane's task, on the
//! worker's own runtime, takes what has queued (up to [`MAX_BATCH`] requests), encodes one script
//! call for all of it into a reused buffer and writes it; up to [`MAX_IN_FLIGHT`] calls are on
//! the wire at once, their replies read in order. So no batch crosses threads, and a busy worker
//! sends one call per turn of its event loop rather than one per request.
//!
//! Failure handling:
//! - while the connection is being opened, jobs queue (the first requests after start wait for
//!   it rather than fail); once an attempt failed, jobs fail at once with a `connect` error until
//!   the next attempt (50 ms back-off, doubling to 2 s);
//! - a call not answered within `[store] timeout` fails every job in flight and queued with a
//!   `timeout` error, and the connection is dropped and reopened (a late reply must never be
//!   taken for another call's);
//! - a write that fails (or does not finish within `timeout`) ends the connection the same way:
//!   the call being written is in flight already, so its jobs get the error with the others;
//! - the script is the library's function (`FCALL`, see [`script::library`]); when Redis does
//!   not have the library (never loaded there, `FUNCTION FLUSH`, a restart without persistence)
//!   the call is sent again as `EVAL` with the source, behind a `FUNCTION LOAD` of the library,
//!   so the next calls find it; calls behind it are retried the same way, in order. Where Redis
//!   has no functions (before 7.0, or an ACL refusing `FCALL` or `FUNCTION LOAD`) the connection
//!   calls the same source by `EVALSHA` from then on, and after `NOSCRIPT` as `EVAL`;
//! - a call the gateway gave up on may still run when Redis comes back (its bytes wait in
//!   Redis's socket): each call carries its deadline on Redis's clock, and the script grants no
//!   lease past it (decide.lua), so no leased unit is charged for nobody. The deadline is when
//!   the lane gives up (the oldest call in flight's send plus `timeout`) moved onto Redis's
//!   clock by the offset a `TIME` measured when the connection opened, taken after its reply:
//!   it can only fall early (by up to that round trip), never late, whatever the skew between
//!   the two clocks. A Redis refusing `TIME` gets no deadlines. A connection whose `TIME` is
//!   not answered within `timeout` (a stopped Redis: its kernel still accepts connections) or
//!   answered with a passing error (`LOADING`, `BUSY`) carries no call at all: it fails like a
//!   connection that could not be opened (jobs queued meanwhile fail, then the back-off).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::conn::{switched, Endpoint, Io};
use super::replay::{raw_state, replay};
use super::resp::{self, Command, Reply};
use super::script::{self, Encoded, Encoder, Mode};
use super::waiters::{Answer, Table, Wait, Work};
use crate::log_throttle::Throttle;
use crate::metrics::StoreMetrics;
use crate::store::{AnyClock, Clock, StoreError, StoreErrorKind};
use crate::Micros;

/// Requests decided by one script call at most.
pub const MAX_BATCH: usize = 64;

// runs.lua reads a batch's runs argument with one `string.byte(RS, 1, #RS)`, which pushes every
// byte on Lua's stack: the runs must stay well below its 8,000 slots (LUAI_MAXCSTACK). At most
// MAX_BATCH runs of a header and MAX_RUN_LIMITS (definition, key) pairs, 2 bytes a number.
const _: () = assert!(MAX_BATCH * 2 * (1 + 2 * super::script::MAX_RUN_LIMITS) <= 7_000);
/// Calls sent and not yet answered, at most.
pub const MAX_IN_FLIGHT: usize = 2;
/// Jobs queued at most; beyond, a request fails at once (the lane is far behind).
const MAX_QUEUE: usize = 65_536;

/// What every lane of a store shares.
#[derive(Debug)]
pub struct LaneEnv {
    pub endpoint: Endpoint,
    pub timeout: Duration,
    pub sha: String,
    pub clock: AnyClock,
    pub metrics: StoreMetrics,
    pub nodelay: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Opening the connection: jobs queue.
    Connecting,
    Up,
    /// The last attempt failed: jobs fail at once.
    Down,
}

/// One lane.
#[derive(Debug)]
pub struct Lane {
    env: Arc<LaneEnv>,
    table: Mutex<Table>,
    link: Mutex<(Link, Option<StoreError>)>,
    wake: Notify,
    started: AtomicBool,
    closed: AtomicBool,
}

impl Lane {
    pub fn new(env: Arc<LaneEnv>) -> Lane {
        Lane {
            env,
            table: Mutex::new(Table::default()),
            link: Mutex::new((Link::Connecting, None)),
            wake: Notify::new(),
            started: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Starts the lane's task on the current runtime (once).
    pub fn start(self: &Arc<Self>) {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().drive());
        }
    }

    /// Whether the lane's connection is open.
    pub fn is_up(&self) -> bool {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).0 == Link::Up
    }

    /// Stops the lane's task (the store is gone).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Queues `work` and waits for its answer.
    pub async fn call(self: &Arc<Self>, work: Work) -> Answer {
        self.start();
        let slot = {
            let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
            if link.0 == Link::Down {
                return Err(link.1.clone().unwrap_or_else(|| {
                    StoreError::new(StoreErrorKind::Connect, "not connected to the store")
                }));
            }
            drop(link);
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.pending.len() >= MAX_QUEUE {
                return Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    "too many requests waiting for the store",
                ));
            }
            t.push(work)
        };
        self.wake.notify_one();
        Wait {
            table: &self.table,
            slot: Some(slot),
        }
        .await
    }

    fn set_link(&self, link: Link, error: Option<StoreError>) {
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) = (link, error);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connects, serves until the connection fails, and again, until the lane is closed.
    async fn drive(self: Arc<Self>) {
        static FAILED: Throttle = Throttle::new();
        let mut backoff = Duration::from_millis(50);
        // Sentinel: a switch of the primary ends the connection and the back-off at once.
        let mut switches = self.env.endpoint.switches();
        if let Some(rx) = &mut switches {
            rx.mark_unchanged();
        }
        while !self.closed.load(Ordering::Acquire) {
            self.set_link(Link::Connecting, None);
            let connected = match self.env.endpoint.connect(self.env.nodelay).await {
                // A connection Redis does not answer on (stopped, paused, busy: the kernel
                // accepts connections for it meanwhile) carries no call: a call sent there
                // would run whenever Redis resumes, and without a deadline. The probe's own
                // `TIME` runs late harmlessly.
                Ok(mut io) => clock_offset(&mut io, self.env.timeout)
                    .await
                    .map(|offset| (io, offset)),
                Err(e) => Err(e),
            };
            let error = match connected {
                Ok((io, offset)) => {
                    backoff = Duration::from_millis(50);
                    self.set_link(Link::Up, None);
                    match self.serve(io, offset, &mut switches).await {
                        Ok(()) => return,
                        Err(e) => e,
                    }
                }
                Err(e) => e,
            };
            // Jobs queued meanwhile fail, and new ones fail at once until the next attempt.
            self.set_link(Link::Down, Some(error.clone()));
            self.table().fail_pending(&error);
            if let Some(suppressed) = FAILED.allow() {
                tracing::warn!(error = %error, suppressed, "store connection failed; reconnecting");
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.closed_signal() => {}
                _ = switched(&mut switches) => backoff = Duration::from_millis(25),
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn closed_signal(&self) {
        while !self.closed.load(Ordering::Acquire) {
            self.wake.notified().await;
        }
    }

    /// Serves one connection: `Ok` when the lane was closed, the error that ended it otherwise.
    /// Whatever was in flight or queued when it ends has been failed with that error.
    /// `offset` is the connection's [`clock_offset`] (`None`: Redis refuses `TIME`).
    async fn serve(
        &self,
        io: Box<dyn Io>,
        offset: Option<i64>,
        switches: &mut Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Result<(), StoreError> {
        if offset.is_none() {
            tracing::debug!("Redis refuses TIME: lease calls carry no deadline");
        }
        let mut conn = Connection {
            env: &self.env,
            offset,
            io,
            inflight: VecDeque::new(),
            spare: Vec::new(),
            encoder: Encoder::default(),
            out: Vec::with_capacity(16 << 10),
            read: Vec::with_capacity(16 << 10),
            ints: Vec::new(),
            batch: Vec::with_capacity(MAX_BATCH),
            legacy: false,
        };
        let result = conn.run(self, switches).await;
        if let Err(e) = &result {
            let mut t = self.table();
            for call in conn.inflight.drain(..) {
                for (slot, _) in call.jobs {
                    t.deliver(slot, Err(e.clone()));
                }
            }
            t.fail_pending(e);
        }
        result
    }
}

/// A script call (or PING) on the wire.
struct InFlight {
    /// Each job's slot and its number of limits (0 for a PING).
    jobs: SmallVec<[(u32, usize); MAX_BATCH]>,
    ping: bool,
    sent: Instant,
    /// The call's arguments, kept to send it again as `EVAL` after `NOSCRIPT`.
    args: Encoded,
    retried: bool,
    /// A `FUNCTION LOAD` of the library, with no jobs.
    load: bool,
}

struct Connection<'a> {
    env: &'a LaneEnv,
    /// Redis TIME minus this process's monotonic µs ([`clock_offset`]); `None`: unknown.
    offset: Option<i64>,
    io: Box<dyn Io>,
    inflight: VecDeque<InFlight>,
    spare: Vec<Encoded>,
    encoder: Encoder,
    out: Vec<u8>,
    read: Vec<u8>,
    ints: Vec<i64>,
    batch: Vec<super::waiters::Job>,
    /// This Redis has no functions: calls go by `EVALSHA`.
    legacy: bool,
}

fn io_err(e: &std::io::Error) -> StoreError {
    StoreError::new(StoreErrorKind::Connect, e.to_string())
}

impl Connection<'_> {
    async fn run(
        &mut self,
        lane: &Lane,
        switches: &mut Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Result<(), StoreError> {
        let timeout = self.env.timeout;
        let deadline = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(deadline);
        loop {
            if lane.closed.load(Ordering::Acquire) {
                return Ok(());
            }
            while self.inflight.len() < MAX_IN_FLIGHT && self.send_next(lane).await? {}
            if let Some(front) = self.inflight.front() {
                deadline.as_mut().reset(later(front.sent, timeout));
            }
            tokio::select! {
                read = self.io.read_buf(&mut self.read) => {
                    match read {
                        Ok(0) => return Err(StoreError::new(StoreErrorKind::Connect, "Redis closed the connection")),
                        Ok(_) => self.take_replies(lane).await?,
                        Err(e) => return Err(io_err(&e)),
                    }
                }
                _ = lane.wake.notified(), if self.inflight.len() < MAX_IN_FLIGHT => {}
                _ = &mut deadline, if !self.inflight.is_empty() => {
                    return Err(StoreError::new(StoreErrorKind::Timeout, format!("no answer within {timeout:?}")));
                }
                _ = switched(switches) => {
                    return Err(StoreError::new(StoreErrorKind::Connect, "the sentinels switched the primary"));
                }
            }
        }
    }

    /// Sends the queued jobs as one call (a PING or a peek alone); `false` when nothing was
    /// queued.
    async fn send_next(&mut self, lane: &Lane) -> Result<bool, StoreError> {
        {
            let mut t = lane.table();
            match t.pending.front() {
                None => return Ok(false),
                Some(j) if matches!(j.work, Work::Settle(_)) => {
                    while self.batch.len() < MAX_BATCH
                        && t.pending
                            .front()
                            .is_some_and(|j| matches!(j.work, Work::Settle(_)))
                    {
                        if let Some(j) = t.pending.pop_front() {
                            self.batch.push(j);
                        }
                    }
                }
                Some(j) if !matches!(j.work, Work::Decide(_)) => {
                    if let Some(j) = t.pending.pop_front() {
                        self.batch.push(j);
                    }
                }
                Some(_) => {
                    while self.batch.len() < MAX_BATCH
                        && t.pending
                            .front()
                            .is_some_and(|j| matches!(j.work, Work::Decide(_)))
                    {
                        if let Some(j) = t.pending.pop_front() {
                            self.batch.push(j);
                        }
                    }
                }
            }
        }
        let mut args = self.spare.pop().unwrap_or_default();
        let mut jobs = SmallVec::new();
        let ping = matches!(self.batch.first().map(|j| &j.work), Some(Work::Ping));
        self.out.clear();
        if ping {
            jobs.push((self.batch[0].slot, 0));
            self.out.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        } else {
            let mut mode = Mode::Charge;
            let requests = self.batch.iter().filter_map(|j| match &j.work {
                Work::Decide(l) => Some(l.as_slice()),
                Work::Peek(l) => {
                    mode = Mode::Evaluate;
                    Some(l.as_slice())
                }
                Work::Settle(l) => {
                    mode = Mode::Force;
                    Some(l.as_slice())
                }
                Work::Ping => None,
            });
            // A peek is alone in its batch, settles are only with settles: `mode` is set before
            // the encoder reads past the first job.
            let requests: SmallVec<[&[super::script::JobLimit]; MAX_BATCH]> = requests.collect();
            let at: Option<Micros> = self.env.clock.injected();
            // When this call is given up on: the oldest call in flight's timeout (which fails
            // every call behind it), on Redis's clock.
            let start = self.inflight.front().map_or_else(Instant::now, |f| f.sent);
            self.encoder.deadline = self
                .offset
                .and_then(|o| deadline_on_redis(start, self.env.timeout, o));
            // Decisions go as runs when they can (the script's replay mode), else one by one.
            let runs = mode == Mode::Charge
                && self
                    .encoder
                    .encode_runs(requests.iter().copied(), at, &mut args);
            if !runs {
                self.encoder
                    .encode(requests.iter().copied(), at, mode, &mut args);
            }
            for j in &self.batch {
                if let Work::Decide(l) | Work::Peek(l) | Work::Settle(l) = &j.work {
                    jobs.push((j.slot, l.len()));
                }
            }
            let how = if self.legacy {
                Call::Sha
            } else {
                Call::Function
            };
            write_call(&mut self.out, &self.env.sha, how, &args.args);
        }
        self.batch.clear();
        let sent = Instant::now();
        // In flight before it is written: a write that fails ends the connection, and its
        // error then reaches these jobs with the others in flight (never left waiting).
        self.inflight.push_back(InFlight {
            jobs,
            ping,
            sent,
            args,
            retried: false,
            load: false,
        });
        self.write(sent).await?;
        Ok(true)
    }

    /// Writes `self.out` within the timeout.
    async fn write(&mut self, sent: Instant) -> Result<(), StoreError> {
        let timeout = self.env.timeout;
        match tokio::time::timeout_at(later(sent, timeout), self.io.write_all(&self.out)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(io_err(&e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("could not send within {timeout:?}"),
            )),
        }
    }

    /// Parses every complete reply in the read buffer and answers its call's jobs.
    async fn take_replies(&mut self, lane: &Lane) -> Result<(), StoreError> {
        let mut used = 0;
        loop {
            self.ints.clear();
            // A runs reply's bulk strings are its keys' states (replay::raw_state).
            let parsed = resp::parse_with(&self.read[used..], &mut self.ints, raw_state)
                .map_err(|e| StoreError::new(StoreErrorKind::Other, e.to_string()))?;
            let Some((reply, n)) = parsed else { break };
            used += n;
            let Some(call) = self.inflight.pop_front() else {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    "a reply nobody asked for",
                ));
            };
            if call.load {
                // Refused (an ACL without FUNCTION LOAD, a library this Redis cannot load):
                // EVALSHA from now on. Out of memory is passing: the next call loads it again.
                match &reply {
                    Reply::Error(e) if !e.starts_with("OOM") => {
                        tracing::warn!(error = %e, "Redis refused to load the library; calling the script by EVALSHA");
                        self.legacy = true;
                    }
                    _ => {}
                }
                let mut args = call.args;
                args.args.clear();
                self.spare.push(args);
                continue;
            }
            let mut demoted = None;
            if let Reply::Error(e) = &reply {
                if !call.retried {
                    let resend = match script::Missing::of(e) {
                        Some(script::Missing::Library) => Some(!self.legacy),
                        Some(script::Missing::Functions) => {
                            self.legacy = true;
                            Some(false)
                        }
                        None => e.starts_with("NOSCRIPT").then_some(false),
                    };
                    if let Some(load) = resend {
                        self.resend_as_eval(call, load).await?;
                        continue;
                    }
                }
                // A primary demoted under us (Sentinel): answer the call, then ask again.
                if e.starts_with("READONLY") && self.env.endpoint.follows_failover() {
                    demoted = Some(StoreError::new(StoreErrorKind::Server, e.clone()));
                }
            }
            self.env
                .metrics
                .duration
                .record(call.sent.elapsed().as_secs_f64());
            self.answer(lane, call, reply);
            if let Some(e) = demoted {
                return Err(e);
            }
        }
        self.read.drain(..used);
        Ok(())
    }

    /// Sends `call` again as `EVAL` with the source; behind a `FUNCTION LOAD` of the library
    /// when `load`, so that the next calls find it.
    async fn resend_as_eval(&mut self, mut call: InFlight, load: bool) -> Result<(), StoreError> {
        self.out.clear();
        let sent = Instant::now();
        if load {
            let mut c = Command::default();
            c.arg(b"FUNCTION");
            c.arg(b"LOAD");
            c.arg(b"REPLACE");
            c.arg(script::library().source.as_bytes());
            c.write_with_head(&[], &mut self.out);
            self.inflight.push_back(InFlight {
                jobs: SmallVec::new(),
                ping: false,
                sent,
                args: self.spare.pop().unwrap_or_default(),
                retried: true,
                load: true,
            });
        }
        write_call(&mut self.out, &self.env.sha, Call::Eval, &call.args.args);
        call.sent = sent;
        call.retried = true;
        // In flight first, as in `send_next`: a failed write fails its jobs with the rest.
        self.inflight.push_back(call);
        self.write(sent).await
    }

    fn answer(&mut self, lane: &Lane, call: InFlight, reply: Reply) {
        let mut t = lane.table();
        let failed = |message: String, kind| StoreError::new(kind, message);
        let result: Result<Vec<crate::Decision>, StoreError> = match reply {
            Reply::Error(e) => Err(failed(e, StoreErrorKind::Server)),
            Reply::Text(_) if call.ping => Ok(Vec::new()),
            Reply::Ints(n) if !call.ping => {
                let expected: usize = call.jobs.iter().map(|(_, l)| l).sum();
                let decisions = if call.args.replay.is_empty() {
                    script::decisions(&self.ints)
                        .filter(|d| n == expected * 6 && d.len() == expected)
                } else {
                    // The runs reply ends with `now`, which the replay takes first.
                    self.ints.rotate_right(1);
                    replay(
                        &self.ints,
                        call.args.keys,
                        &call.args.replay,
                        call.jobs.iter().map(|&(_, l)| l),
                    )
                };
                decisions.ok_or_else(|| {
                    failed(
                        "malformed reply from the decide script".into(),
                        StoreErrorKind::Other,
                    )
                })
            }
            _ => Err(failed(
                "unexpected reply from Redis".into(),
                StoreErrorKind::Other,
            )),
        };
        match result {
            Ok(decisions) if !call.ping => {
                let mut rest = decisions.into_iter();
                for &(slot, n) in &call.jobs {
                    t.deliver(slot, Ok(rest.by_ref().take(n).collect()));
                }
            }
            Ok(_) => {
                for &(slot, _) in &call.jobs {
                    t.deliver(slot, Ok(Vec::new()));
                }
            }
            Err(e) => {
                for &(slot, _) in &call.jobs {
                    t.deliver(slot, Err(e.clone()));
                }
            }
        }
        drop(t);
        let mut args = call.args;
        args.args.clear();
        self.spare.push(args);
    }
}

/// `at + by`, or a day after `at` when that overflows (a huge timeout built in code).
/// µs on this process's monotonic clock (from its first use; earlier instants count as 0, which
/// only moves a deadline earlier).
pub(super) fn mono_micros(at: Instant) -> u64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    u64::try_from(at.into_std().saturating_duration_since(base).as_micros()).unwrap_or(u64::MAX)
}

/// `start + timeout` on Redis's clock (µs), given `offset` ([`clock_offset`]).
pub(super) fn deadline_on_redis(start: Instant, timeout: Duration, offset: i64) -> Option<u64> {
    let local = mono_micros(start).checked_add(u64::try_from(timeout.as_micros()).ok()?)?;
    let at = i64::try_from(local).ok()?.checked_add(offset)?;
    u64::try_from(at).ok().filter(|&t| t > 0)
}

/// Redis `TIME` minus this process's monotonic clock (µs), the local time read after the reply:
/// at most the true offset, by up to the round trip. `Ok(None)` when Redis refuses `TIME` (an
/// ACL without it, a renamed command: `NOPERM`/`ERR`) or answers something else: the
/// connection's lease calls carry no deadline. An error when Redis does not answer within
/// `timeout` (stopped, paused: the kernel still accepts the connection), closes the
/// connection, or answers another error (`LOADING`, `BUSY`…): the connection is not used.
async fn clock_offset(io: &mut Box<dyn Io>, timeout: Duration) -> Result<Option<i64>, StoreError> {
    let _ = mono_micros(Instant::now()); // the origin, before any call
    let probe = async {
        io.write_all(b"*1\r\n$4\r\nTIME\r\n")
            .await
            .map_err(|e| io_err(&e))?;
        let mut buf = Vec::with_capacity(64);
        loop {
            match parse_time(&buf) {
                Some(Some(redis)) => {
                    let local = i64::try_from(mono_micros(Instant::now())).ok();
                    let redis = i64::try_from(redis).ok();
                    return Ok(redis.zip(local).and_then(|(r, l)| r.checked_sub(l)));
                }
                Some(None) => return time_refused(&buf),
                None if buf.len() > 256 => return Ok(None),
                None => {}
            }
            if io.read_buf(&mut buf).await.map_err(|e| io_err(&e))? == 0 {
                return Err(StoreError::new(
                    StoreErrorKind::Connect,
                    "Redis closed the connection",
                ));
            }
        }
    };
    match tokio::time::timeout(timeout, probe).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::new(
            StoreErrorKind::Timeout,
            format!("no answer to TIME within {timeout:?}"),
        )),
    }
}

/// What an error reply (or anything but `TIME`'s array) to the `TIME` probe means: `Ok(None)`
/// for a refusal (`NOPERM`, `ERR`: an ACL, a renamed command) or a reply that is not an error;
/// a passing state of the server (`LOADING`, `BUSY`, `MASTERDOWN`…) is an error.
fn time_refused(reply: &[u8]) -> Result<Option<i64>, StoreError> {
    let Some(line) = reply.strip_prefix(b"-") else {
        return Ok(None);
    };
    if line.starts_with(b"NOPERM") || line.starts_with(b"ERR") {
        return Ok(None);
    }
    let end = line
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(line.len());
    Err(StoreError::new(
        StoreErrorKind::Server,
        format!("TIME: {}", String::from_utf8_lossy(&line[..end])),
    ))
}

/// `TIME`'s reply in µs: `None` while incomplete, `Some(None)` for anything else (an error).
fn parse_time(buf: &[u8]) -> Option<Option<u64>> {
    let complete = |n: usize| buf.windows(2).filter(|w| *w == b"\r\n").count() >= n;
    if buf.first().is_some_and(|&b| b != b'*') {
        return complete(1).then_some(None);
    }
    if !complete(5) {
        return None;
    }
    let Ok(text) = std::str::from_utf8(buf) else {
        return Some(None);
    };
    let lines: Vec<&str> = text.split("\r\n").collect();
    let (Some(&"*2"), Some(secs), Some(micros)) = (lines.first(), lines.get(2), lines.get(4))
    else {
        return Some(None);
    };
    let us = secs
        .parse::<u64>()
        .ok()
        .zip(micros.parse::<u64>().ok())
        .and_then(|(s, u)| s.checked_mul(1_000_000)?.checked_add(u));
    Some(us)
}

fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(86_400))
}

/// How a call names the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// `FCALL <library name>`: the library's function.
    Function,
    /// `EVALSHA <sha>`: the script Redis cached from an earlier `EVAL`.
    Sha,
    /// `EVAL <source>`: the whole source.
    Eval,
}

/// The call's command, then `args` (the key count, the keys, the arguments).
fn write_call(out: &mut Vec<u8>, sha: &str, how: Call, args: &Command) {
    match how {
        Call::Function => args.write_with_head(&[b"FCALL", script::library().name.as_bytes()], out),
        Call::Sha => args.write_with_head(&[b"EVALSHA", sha.as_bytes()], out),
        Call::Eval => args.write_with_head(&[b"EVAL", script::SOURCE.as_bytes()], out),
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    use super::*;
    use crate::store::redis::waiters::Wait;

    fn lane() -> Lane {
        Lane::new(Arc::new(LaneEnv {
            endpoint: Endpoint::Fixed(
                super::super::conn::Target::parse("redis://127.0.0.1:1", Duration::from_secs(1))
                    .unwrap(),
            ),
            timeout: Duration::from_secs(1),
            sha: script::sha1_hex(),
            clock: AnyClock::System,
            metrics: StoreMetrics::new("redis"),
            nodelay: false,
        }))
    }

    /// Whether the job in `slot` has its answer (an error is one) within a second.
    async fn answered(lane: &Lane, slot: u32) -> Option<Answer> {
        let wait = Wait {
            table: &lane.table,
            slot: Some(slot),
        };
        tokio::time::timeout(Duration::from_secs(1), wait)
            .await
            .ok()
    }

    /// The first write succeeds (and makes `reply` readable), every later one fails.
    struct Scripted {
        writes: usize,
        reply: &'static [u8],
        reader: Option<Waker>,
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes += 1;
            if self.writes > 1 {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            if let Some(w) = self.reader.take() {
                w.wake();
            }
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if self.writes == 0 || self.reply.is_empty() {
                self.reader = Some(cx.waker().clone());
                return Poll::Pending;
            }
            buf.put_slice(self.reply);
            self.reply = &[];
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_call_that_cannot_be_written_fails_its_jobs() {
        let lane = lane();
        let slot = lane.table().push(Work::Ping);
        // The connection is gone: the first write fails (a partition cut the connection while
        // jobs were queued).
        let (io, peer) = tokio::io::duplex(1024);
        drop(peer);
        assert!(lane.serve(Box::new(io), None, &mut None).await.is_err());
        let answer = answered(&lane, slot).await;
        assert!(
            matches!(answer, Some(Err(_))),
            "the job was answered with the error, not left waiting forever: {answer:?}"
        );
    }

    #[tokio::test]
    async fn a_call_resent_after_noscript_that_cannot_be_written_fails_its_jobs() {
        let lane = lane();
        let slot = lane.table().push(Work::Ping);
        // Redis restarted (NOSCRIPT), and the connection broke before the resend was written.
        let io = Scripted {
            writes: 0,
            reply: b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            reader: None,
        };
        assert!(lane.serve(Box::new(io), None, &mut None).await.is_err());
        let answer = answered(&lane, slot).await;
        assert!(
            matches!(answer, Some(Err(_))),
            "the job was answered with the error, not left waiting forever: {answer:?}"
        );
    }

    /// The `TIME` probe of a connection: a refusal is no deadlines, no answer (a stopped Redis
    /// whose kernel accepted the connection) or a passing error is a connection not to use.
    #[tokio::test]
    async fn a_connection_whose_time_is_unanswered_is_not_used() {
        use tokio::io::AsyncWriteExt as _;
        let timeout = Duration::from_millis(50);
        let answer = |reply: &'static [u8]| async move {
            let (io, mut peer) = tokio::io::duplex(1024);
            if !reply.is_empty() {
                peer.write_all(reply).await.unwrap();
            }
            let mut io: Box<dyn Io> = Box::new(io);
            let r = clock_offset(&mut io, timeout).await;
            drop(peer);
            r
        };
        let r = answer(b"").await;
        assert!(
            matches!(&r, Err(e) if e.kind == StoreErrorKind::Timeout),
            "{r:?}"
        );
        assert!(
            matches!(answer(b"-LOADING loading\r\n").await, Err(e) if e.kind == StoreErrorKind::Server)
        );
        assert!(answer(b"-BUSY busy\r\n").await.is_err());
        assert_eq!(answer(b"-NOPERM no\r\n").await.ok(), Some(None));
        assert_eq!(
            answer(b"-ERR unknown command 'TIME'\r\n").await.ok(),
            Some(None)
        );
        assert!(matches!(
            answer(b"*2\r\n$10\r\n1700000000\r\n$6\r\n000042\r\n").await,
            Ok(Some(_))
        ));
    }

    /// Issue #50 item 16: a lane whose server accepts connections and never answers (a Redis
    /// stopped with SIGSTOP: its kernel still completes the handshake) writes nothing but its
    /// `TIME` probes there. A call written on such a connection would run when Redis resumes,
    /// long after the gateway gave up on it, and without a deadline (none was measured): its
    /// lease's units would be charged for nobody.
    #[tokio::test]
    async fn no_call_is_written_to_a_server_that_does_not_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = received.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let sink = sink.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        sink.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        let lane = Arc::new(Lane::new(Arc::new(LaneEnv {
            endpoint: Endpoint::Fixed(
                super::super::conn::Target::parse(
                    &format!("redis://127.0.0.1:{port}"),
                    Duration::from_secs(1),
                )
                .unwrap(),
            ),
            timeout: Duration::from_millis(50),
            sha: script::sha1_hex(),
            clock: AnyClock::System,
            metrics: StoreMetrics::new("redis"),
            nodelay: true,
        })));
        // A steady flow of calls for half a second, each failing (never answered).
        for _ in 0..25 {
            let r = tokio::time::timeout(Duration::from_secs(2), lane.call(Work::Ping)).await;
            assert!(matches!(r, Ok(Err(_))), "{r:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        lane.close();
        let got = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
        server.abort();
        assert!(got.contains("TIME"), "the lane connected: {got:?}");
        assert!(
            !got.contains("PING"),
            "a call was written on a connection Redis never answered: {got:?}"
        );
    }

    #[test]
    fn time_replies_are_read_whole_or_refused() {
        assert_eq!(
            parse_time(b"*2\r\n$10\r\n1700000000\r\n$6\r\n000042\r\n"),
            Some(Some(1_700_000_000_000_042))
        );
        // Incomplete: wait for more.
        assert_eq!(parse_time(b"*2\r\n$10\r\n1700000000\r\n$6\r\n0000"), None);
        assert_eq!(parse_time(b""), None);
        // An ACL refusing it, or anything else: no deadlines.
        assert_eq!(parse_time(b"-NOPERM no\r\n"), Some(None));
        assert_eq!(parse_time(b"*2\r\n$1\r\nx\r\n$1\r\n0\r\n"), Some(None));
    }

    #[test]
    fn a_deadline_is_the_give_up_moved_onto_redis_time() {
        let start = Instant::now();
        let local = mono_micros(start);
        let offset = 1_000_000_000_000_000i64 - i64::try_from(local).unwrap();
        assert_eq!(
            deadline_on_redis(start, Duration::from_millis(250), offset),
            Some(1_000_000_000_250_000)
        );
        assert_eq!(
            deadline_on_redis(start, Duration::from_secs(1), i64::MIN / 2),
            None
        );
    }
}
