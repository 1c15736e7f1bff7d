//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas` (RLQS) on
//! leases.
//!
//! Envoy's `rate_limit_quota` filter decides every request itself, from the assignment it holds
//! for the request's bucket, and reports each bucket's usage (`num_requests_allowed`/`denied`)
//! on one stream: at once when a bucket appears, then every `reporting_interval` (Envoy 1.40:
//! every 5 s, whatever it says). Tollgate answers every report of a bucket with a new
//! assignment, which is a **lease**: the units are
//! charged in the store first ([`Op::Lease`], the limiter crate's grant), then handed to Envoy
//! as a token bucket ([`lease_bucket`]). A fleet of Envoys therefore never admits more than
//! the limit (less what Envoy admits with no assignment: its `no_assignment_behavior`).
//!
//! - **Shape** ([`lease_bucket`]), for what Envoy 1.40 does with a token bucket: it reads the
//!   refill rate as `tokens_per_fill` ÷ the *whole seconds* of `fill_interval`; it starts a
//!   bucket that *replaces* one at the ratio of tokens the old one had left (drained under
//!   load); and it starts one only when its tokens ÷ rate is under the host's uptime. So an
//!   assignment of N units is mostly refill: k = N ÷ (TTL + 2 s) tokens a second (for fewer
//!   units than seconds, one token every ⌈(TTL + 1) ÷ N⌉ s), and `max_tokens` =
//!   N − k × (TTL + 1) + 1, about a second's worth. Started full, it admits exactly N before TTL + 1 s (Envoy's
//!   expiry timer fires at the TTL; the second is that timer's margin); started drained it
//!   still admits k a second. Its window (tokens ÷ rate) is a few seconds on any N.
//! - **Size** ([`ask_for`]): the demand the report shows (allowed + denied since the bucket's
//!   previous report) as a rate, twice over, for TTL + 2 s — the refill is what Envoy spends —
//!   at least half the last assignment (a quiet report halves it: Envoy reports a bucket only
//!   every 5 s, so one dropped to 1 unit would refuse a tenant coming back for up to 5 s), at
//!   least 1, at most `lease_max`; and `lease_max` for a bucket's first report (Envoy's, sent
//!   when the bucket appears, knows one request and is next followed by Envoy's 5-second timer);
//!   the store grants what it has, up to that. Nothing left:
//!   `DENY_ALL` until the limit frees units (`retry_after`, whole seconds, at most the TTL).
//! - **Life**: every assignment, deny or allow, lives at least until the Envoy's next report
//!   and [`LIFE_MARGIN`]: the reporting interval is learnt per bucket from its reports (the
//!   longer of its last two intervals, its first excepted — Envoy reports a bucket the moment
//!   it appears), else the stream's, else [`DEFAULT_INTERVAL`] (Envoy 1.40's 5 s). So while
//!   Tollgate answers, Envoy's `no_assignment_behavior` and `expired_assignment_behavior`
//!   decide nothing but a new bucket's requests before its first assignment (issue 56: a spent
//!   bucket's 1-second `DENY_ALL` left Envoy on its fallback for 4 s of every 5).
//! - **TTL**: `assignment_ttl`, cut to the grant's validity (the window's end, the time the
//!   bucket refills what was taken: units spent later would come on top of a fresh budget),
//!   in whole seconds as Envoy reads it — but never under the life above: with less validity
//!   than that, a share of the units may be spent past it (in a fixed window's last seconds,
//!   in the next window's first). Every unit admitted was still charged first.
//! - **Fresh buckets**: Envoy keeps its token bucket when an assignment repeats the previous
//!   one; successive assignments differ in the refill interval's nanoseconds (odd, even), so
//!   each one is a new bucket of exactly its units.
//! - **Returns**: an assignment is replaced by the next report's; the report after that holds
//!   all it admitted. Then its unused units go back ([`Op::LeaseReturn`], into the state they
//!   were charged to, while it holds them): cumulatively, units of closed assignments less all
//!   the requests reported allowed (which also count those of the live one, so a return is
//!   never too large). When the stream ends the live assignments stay charged: Envoy may
//!   spend them until their TTL. They lapse with their grant's state.
//! - **Bounds**: at most [`MAX_BUCKETS`] buckets per stream and [`MAX_REPORT_BUCKETS`] per
//!   report; a bucket_id of at most 16 entries of 4096 bytes; reported counts of at most
//!   [`MAX_REPORTED`]; streams, buckets and unread replies per connection and per process
//!   ([`super::rlqs_budget`]); each refusal counted by reason. An outbound queue of [`QUEUE`]
//!   replies: a stream that does not read them is not read either (HTTP/2 flow control does
//!   the rest), and one whose reply does not fit its connection's or the process's bound ends.
//! - **Failures**: a call whose reports cannot be read (not protobuf, over the message size, a
//!   compressed flag, a broken transport) ends with tonic's status for it — never OK — counted
//!   by reason.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;

use super::pb::bucket_action::{BucketAction as Action, QuotaAssignmentAction};
use super::pb::rate_limit_strategy::{BlanketRule, Strategy};
use super::pb::{Duration as PbDuration, RateLimitStrategy, TokenBucket, UInt32Value};
use super::rlqs_message::{
    BucketAction, BucketId, Reports as RateLimitQuotaUsageReports,
    Response as RateLimitQuotaResponse, Usage as BucketQuotaUsage,
};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::{Request, Status, Streaming};

use super::metrics::rlqs as m;
use super::quota::Quota;
use super::rlqs_budget::{Budget, Charge, ConnectionBudget, Pool, What};
use super::service::{MAX_ENTRIES, MAX_ENTRY_BYTES};
use super::Source;
use crate::limiter::{lease::granted, Limit, Micros, Op, SubjectDigest};
use tollgate_limit::store::{Clock, Store};
use tollgate_limit::worker::WorkerId;
use tollgate_limit::Check;

/// The most buckets one stream keeps (one Envoy's distinct bucket_ids).
pub const MAX_BUCKETS: usize = 1024;
/// The most buckets one report may carry (the rest are refused, counted).
pub const MAX_REPORT_BUCKETS: usize = 1024;
/// Replies queued for a stream that is slow to read them.
pub const QUEUE: usize = 4;
/// The most requests one usage may report allowed (or denied): more than one Envoy decides for
/// one bucket between two reports; a usage over it is refused as malformed (`count_too_large`),
/// so the reported-requests counters would need 2³² such reports to wrap.
pub const MAX_REPORTED: u64 = u32::MAX as u64;
/// Envoy's reporting interval until a bucket's reports show it: Envoy 1.40 reports every 5 s,
/// whatever `reporting_interval` says.
pub const DEFAULT_INTERVAL: Micros = 5 * SECOND;
/// An assignment lives this long past the Envoy's next report (its round trip to the store and
/// back, and timer lateness).
pub const LIFE_MARGIN: Micros = 2 * SECOND;
/// The longest reporting interval learnt (an assignment's TTL is at most this and the margin).
const MAX_INTERVAL: Micros = 3600 * SECOND;
/// An assignment's units are spent only this long before its grant stops holding them.
const MARGIN: Micros = 200_000;
/// The TTL of the `ALLOW_ALL` a bucket no quota maps gets.
const UNMAPPED_TTL_SECS: i64 = 60;
const SECOND: Micros = 1_000_000;

/// The quota service over the snapshot that serves.
#[derive(Clone)]
pub struct QuotaService {
    source: Arc<dyn Source>,
    /// What every stream of the process holds between them.
    process: Arc<Pool>,
}

impl QuotaService {
    pub fn new(source: Arc<dyn Source>) -> QuotaService {
        QuotaService {
            source,
            process: Pool::new(super::rlqs_budget::Bounds::PROCESS),
        }
    }
}

/// Why a call failed while its reports were read (each counted).
fn failure(e: &Status) -> m::Refused {
    match e.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => m::Refused::ReportTooLarge,
        tonic::Code::Internal if e.message().contains("compress") => m::Refused::CompressedReport,
        tonic::Code::Internal if e.message().contains("decode") || e.message().contains("EOF") => {
            m::Refused::MalformedReport
        }
        _ => m::Refused::BrokenStream,
    }
}

/// The replies of one stream as tonic takes them: queued ones, then the status the stream
/// ended with (none: OK). The last reply handed on stays charged until the next one is (HTTP/2
/// holds it while the client does not read).
struct Outbox {
    rx: mpsc::Receiver<(RateLimitQuotaResponse, Charge)>,
    end: oneshot::Receiver<Status>,
    held: Option<Charge>,
    done: bool,
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

/// The one method of the service.
const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

impl QuotaService {
    /// Answers one HTTP/2 request of the listener under the service's path: a stream of
    /// reports decoded as [`RateLimitQuotaUsageReports`] (its strings as bytes, so any valid
    /// protobuf decodes: [`super::rlqs_message`]), each message at most `max_message`.
    pub async fn serve<B>(
        &self,
        req: http::Request<B>,
        max_message: usize,
    ) -> http::Response<tonic::body::Body>
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    {
        if req.uri().path() != STREAM_RATE_LIMIT_QUOTAS {
            return Status::unimplemented("no such method of the quota service").into_http();
        }
        let codec =
            tonic_prost::ProstCodec::<RateLimitQuotaResponse, RateLimitQuotaUsageReports>::default(
            );
        let mut grpc =
            tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max_message), None);
        grpc.streaming(Streamer(self.clone()), req).await
    }

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<ReplyStream>, Status> {
        if self.source.domains().is_none() {
            return Err(Status::unavailable("the quota service is not configured"));
        }
        let connection = request
            .extensions()
            .get::<ConnectionBudget>()
            .cloned()
            .unwrap_or_default();
        let budget = Budget::new(connection.0, self.process.clone());
        let open = budget.take(What::Streams, 1).map_err(|r| {
            m::refused(r, 1);
            Status::resource_exhausted("too many quota streams on this connection or process")
        })?;
        let mut reports = request.into_inner();
        let (tx, rx) = mpsc::channel(QUEUE);
        let (end_tx, end_rx) = oneshot::channel();
        let source = self.source.clone();
        tokio::spawn(async move {
            let _open = (m::StreamGuard::open(), open);
            let mut stream = QuotaStream::new(budget.clone());
            let end = loop {
                let report = tokio::select! {
                    r = reports.message() => r,
                    // Envoy went away: stop reading its reports.
                    () = tx.closed() => break None,
                };
                match report {
                    Ok(Some(report)) => {
                        let Some((domains, store)) = source.domains() else {
                            break Some(Status::unavailable("the quota service is not configured"));
                        };
                        let reply = stream
                            .on_report(&report, &domains.quotas, &*store, source.clock())
                            .await;
                        if reply.bucket_action.is_empty() {
                            continue;
                        }
                        let charge = match budget.take(What::ReplyBytes, reply.encoded_len()) {
                            Ok(c) => c,
                            Err(r) => {
                                m::refused(r, 1);
                                break Some(Status::resource_exhausted(
                                    "replies not read: over the connection's or the process's bound",
                                ));
                            }
                        };
                        if tx.send((reply, charge)).await.is_err() {
                            break None;
                        }
                    }
                    Ok(None) => break None,
                    Err(e) => {
                        // A failed call never ends OK: the client gets tonic's status (what
                        // `ShouldRateLimit` answers the same bytes with).
                        m::refused(failure(&e), 1);
                        tracing::debug!(error = %e, "rlqs: stream failed");
                        break Some(e);
                    }
                }
            };
            // The buckets' charges go back now, not when the client has read the end.
            drop(stream);
            if let Some(status) = end {
                let _ = end_tx.send(status);
            }
            drop(tx);
        });
        let out = Outbox {
            rx,
            end: end_rx,
            held: None,
            done: false,
        };
        let out = futures_util::stream::unfold(out, |mut o| async move {
            if o.done {
                return None;
            }
            match o.rx.recv().await {
                Some((reply, charge)) => {
                    o.held = Some(charge);
                    Some((Ok(reply), o))
                }
                None => {
                    o.held = None;
                    o.done = true;
                    o.end.try_recv().ok().map(|status| (Err(status), o))
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(out)))
    }
}

/// `StreamRateLimitQuotas` as tonic's streaming plumbing calls it.
struct Streamer(QuotaService);

type Opening =
    Pin<Box<dyn std::future::Future<Output = Result<tonic::Response<ReplyStream>, Status>> + Send>>;

impl tonic::server::StreamingService<RateLimitQuotaUsageReports> for Streamer {
    type Response = RateLimitQuotaResponse;
    type ResponseStream = ReplyStream;
    type Future = Opening;

    fn call(&mut self, request: Request<Streaming<RateLimitQuotaUsageReports>>) -> Opening {
        let service = self.0.clone();
        Box::pin(async move { service.stream_rate_limit_quotas(request).await })
    }
}

/// One assignment sent (a token bucket of `units`, or a `DENY_ALL` of none).
#[derive(Debug, Clone, Copy)]
struct Grant {
    units: u64,
    generation: u64,
    /// Its units are given back only before this (the store's monotonic clock).
    valid_until: Micros,
    /// The bucket's report it answered.
    report: u64,
}

/// What one stream knows of one bucket.
#[derive(Debug)]
struct Bucket {
    quota: Arc<Quota>,
    subject: SubjectDigest,
    /// Reports of this bucket received.
    reports: u64,
    /// Assignments not yet closed, oldest first (at most three).
    open: VecDeque<Grant>,
    /// Units of the closed assignments, the requests reported allowed, and the units of closed
    /// assignments returned or lapsed (all since the stream began).
    closed: u64,
    used: u64,
    settled: u64,
    /// Assignments sent (the refill interval's nanoseconds alternate with it).
    sent: u64,
    /// When the previous report of this bucket came (the stream's clock, µs).
    last_report: Micros,
    /// The units of the last assignment (0 for a DENY_ALL).
    last_units: u64,
    /// The last two intervals between its reports (µs; 0: not seen). The first interval is
    /// not one: Envoy reports a bucket the moment it appears, then at its reporting timer.
    gaps: [Micros; 2],
    /// Its place in the connection's and the process's bucket bounds.
    _held: Charge,
}

/// One stream's buckets, by the digest of their whole bucket_id.
#[derive(Debug, Default)]
pub struct QuotaStream {
    domain: Vec<u8>,
    buckets: HashMap<SubjectDigest, Bucket>,
    /// The reporting interval the stream's buckets showed last (0: none yet).
    interval: Micros,
    budget: Budget,
}

/// Why a bucket of a report got no assignment.
fn bucket_id_ok(id: Option<&BucketId>) -> Result<&BucketId, m::Refused> {
    let id = id
        .filter(|b| !b.entries.is_empty())
        .ok_or(m::Refused::NoBucketId)?;
    if id.entries.len() > MAX_ENTRIES
        || id
            .entries
            .iter()
            .any(|e| e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES)
    {
        return Err(m::Refused::BucketIdTooLarge);
    }
    Ok(id)
}

/// Gives unused units back into the state they were charged to (before the next grant is
/// asked, so that grant can have them). A failure is counted; the units lapse.
async fn give_back(
    store: &impl Store,
    limit: &Arc<Limit>,
    subject: SubjectDigest,
    units: u64,
    generation: u64,
) {
    let check = Check {
        limit,
        subject,
        op: Op::LeaseReturn(units, generation),
    };
    if let Err(e) = store.settle(&[check], WorkerId::NONE).await {
        tracing::debug!(error = %e, "rlqs: returning unused units failed");
        m::refused(m::Refused::StoreError, 1);
    }
}

/// The digest of a whole bucket_id (entries sorted), the stream's key for it.
fn bucket_key(id: &BucketId) -> SubjectDigest {
    let mut bytes = Vec::new();
    // The map's entries, by key (a repeated key: its last value).
    for (k, v) in id.map() {
        for part in [k, v] {
            bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
            bytes.extend_from_slice(part);
        }
    }
    SubjectDigest::of(b'b', &bytes)
}

fn seconds(s: i64) -> PbDuration {
    PbDuration {
        seconds: s,
        nanos: 0,
    }
}

/// The token bucket that hands Envoy `units` for `ttl_secs` (module docs, "Shape"): a refill
/// of `tokens_per_fill` every whole `fill_interval` second(s), and `max_tokens` held at most,
/// such that a bucket that starts full and spends every token as soon as it exists admits at
/// most `units` before TTL + 1 s — and exactly `units` by then. `odd` sets the interval's
/// nanosecond (Envoy reads whole seconds for the rate, and tells assignments apart by it), so
/// two successive assignments always differ.
fn lease_bucket(units: u64, ttl_secs: u64, odd: bool) -> TokenBucket {
    let n = units.clamp(1, u64::from(u32::MAX));
    // L: the seconds the bucket may be spent from, TTL + 1 s (Envoy's expiry timer fires at
    // the TTL; the second is the margin for that timer's lateness).
    let l = ttl_secs.clamp(1, 1 << 20).saturating_add(1);
    // From a start at m tokens, a refill of k per F seconds has admitted m + ⌈k·L/F⌉ − 1 by
    // any time before L (the refill's tokens come at F/k, 2F/k, …; the one at exactly L does
    // not count).
    let per_second = n / l.saturating_add(1);
    let (max_tokens, per_fill, fill_secs) = if per_second >= 1 {
        // k a second: m = N − k·L + 1, between k + 1 and k + L + 1.
        (n - per_second * l + 1, per_second, 1)
    } else {
        // Fewer units than seconds: one token every F = ⌈L/N⌉ seconds, m = N − ⌈L/F⌉ + 1 ≥ 1.
        let f = l.div_ceil(n);
        (n - l.div_ceil(f) + 1, 1, f)
    };
    TokenBucket {
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        tokens_per_fill: Some(UInt32Value {
            value: u32::try_from(per_fill).unwrap_or(u32::MAX),
        }),
        fill_interval: Some(PbDuration {
            seconds: i64::try_from(fill_secs).unwrap_or(i64::MAX),
            nanos: i32::from(odd),
        }),
    }
}

/// What a bucket is asked to hold for its next assignment: the demand the report shows
/// (allowed and denied, over `elapsed` µs since the bucket's previous report) as a rate, twice over, for
/// the seconds an assignment may be spent from (TTL + 2 s: [`lease_bucket`]'s refill is
/// units ÷ (TTL + 2 s) a second, and is all Envoy spends when it starts the bucket drained);
/// at least 1, at most `lease_max`.
fn ask_for(demand: u64, elapsed: Micros, ttl_secs: u64, lease_max: u64) -> u64 {
    let elapsed = u128::from(elapsed.max(SECOND));
    let life = u128::from(ttl_secs.saturating_add(2));
    let want = u128::from(demand)
        .saturating_mul(2)
        .saturating_mul(life)
        .saturating_mul(u128::from(SECOND))
        .div_ceil(elapsed);
    u64::try_from(want)
        .unwrap_or(u64::MAX)
        .clamp(1, lease_max.max(1))
}

fn assignment(id: &BucketId, ttl_secs: u64, strategy: Strategy) -> BucketAction {
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(i64::try_from(ttl_secs).unwrap_or(i64::MAX))),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// What an assignment must live: the Envoy's next report — its reporting interval, as the
/// bucket's reports show it (else the stream's, else [`DEFAULT_INTERVAL`]) — and
/// [`LIFE_MARGIN`], in whole seconds (Envoy reads only those).
fn min_life_secs(interval: Micros) -> u64 {
    interval
        .clamp(SECOND, MAX_INTERVAL)
        .saturating_add(LIFE_MARGIN)
        .div_ceil(SECOND)
}

impl QuotaStream {
    /// A stream whose buckets count in `budget` (its connection's and the process's bounds).
    pub fn new(budget: Budget) -> QuotaStream {
        QuotaStream {
            budget,
            ..QuotaStream::default()
        }
    }

    /// Answers one report: the assignments of its buckets (none for a bucket refused or whose
    /// store could not decide).
    pub async fn on_report(
        &mut self,
        report: &RateLimitQuotaUsageReports,
        quotas: &[Arc<Quota>],
        store: &impl Store,
        clock: &impl Clock,
    ) -> RateLimitQuotaResponse {
        if self.domain.is_empty() {
            self.domain.clone_from(&report.domain);
        }
        let mut actions = Vec::new();
        if report.bucket_quota_usages.len() > MAX_REPORT_BUCKETS {
            m::refused(
                m::Refused::TooManyBuckets,
                report.bucket_quota_usages.len() - MAX_REPORT_BUCKETS,
            );
        }
        for usage in report.bucket_quota_usages.iter().take(MAX_REPORT_BUCKETS) {
            match self.on_usage(usage, quotas, store, clock).await {
                Ok(Some(a)) => actions.push(a),
                Ok(None) => {}
                Err(r) => m::refused(r, 1),
            }
        }
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    async fn on_usage(
        &mut self,
        usage: &BucketQuotaUsage,
        quotas: &[Arc<Quota>],
        store: &impl Store,
        clock: &impl Clock,
    ) -> Result<Option<BucketAction>, m::Refused> {
        let id = bucket_id_ok(usage.bucket_id.as_ref())?;
        if usage.num_requests_allowed > MAX_REPORTED || usage.num_requests_denied > MAX_REPORTED {
            return Err(m::Refused::CountTooLarge);
        }
        let key = bucket_key(id);
        self.rematch(key, id, quotas);
        if !self.buckets.contains_key(&key) {
            let Some(quota) = quotas.iter().find(|q| q.matches(&self.domain, &id.map())) else {
                // As for an unknown domain of `ShouldRateLimit`: under no limit.
                m::refused(m::Refused::NoMatch, 1);
                return Ok(Some(assignment(
                    id,
                    UNMAPPED_TTL_SECS as u64,
                    Strategy::BlanketRule(BlanketRule::AllowAll as i32),
                )));
            };
            if self.buckets.len() >= MAX_BUCKETS {
                return Err(m::Refused::TooManyBuckets);
            }
            let held = self.budget.take(What::Buckets, 1)?;
            self.buckets.insert(
                key,
                Bucket {
                    quota: quota.clone(),
                    subject: quota.subject_of(&id.map()),
                    reports: 0,
                    open: VecDeque::new(),
                    closed: 0,
                    used: 0,
                    settled: 0,
                    sent: 0,
                    last_report: 0,
                    last_units: 0,
                    gaps: [0; 2],
                    _held: held,
                },
            );
        }
        let Some(b) = self.buckets.get_mut(&key) else {
            return Err(m::Refused::NoBucketId);
        };
        let metrics = m::QuotaMetrics::of(&b.quota.name);
        metrics.reported(usage.num_requests_allowed, usage.num_requests_denied);
        b.reports += 1;
        b.used = b.used.saturating_add(usage.num_requests_allowed);
        let now = clock.monotonic();
        // Close what this report completes: an assignment replaced by the previous report's.
        while b.open.front().is_some_and(|g| g.report + 2 <= b.reports) {
            let Some(g) = b.open.pop_front() else { break };
            b.closed = b.closed.saturating_add(g.units);
            let unused = b
                .closed
                .saturating_sub(b.used)
                .saturating_sub(b.settled)
                .min(g.units);
            if unused == 0 {
                continue;
            }
            b.settled += unused;
            if now < g.valid_until {
                give_back(store, &b.quota.limit, b.subject, unused, g.generation).await;
                metrics.returned.increment(unused);
            } else {
                metrics.lapsed.increment(unused);
            }
        }
        let demand = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        // A bucket's first report is the one Envoy sends the moment the bucket appears, with
        // the one request that made it; the next comes with Envoy's reporting timer (5 s in
        // Envoy 1.40), so the first assignment is as large as one may be, not 2 units.
        let elapsed = now.saturating_sub(b.last_report);
        b.last_report = now;
        // The reporting interval: the longer of the bucket's last two (past its first), else
        // the stream's, else Envoy 1.40's 5 s. An assignment lives until the next report and a
        // margin, deny or allow, so Envoy's fallbacks (`no_assignment_behavior`,
        // `expired_assignment_behavior`) never decide while Tollgate answers.
        if b.reports >= 3 {
            b.gaps = [b.gaps[1], elapsed];
        }
        let interval = match b.gaps.iter().max() {
            Some(&g) if g > 0 => {
                self.interval = g;
                g
            }
            _ if self.interval > 0 => self.interval,
            _ => DEFAULT_INTERVAL,
        };
        let min_life = min_life_secs(interval);
        let life = b.quota.ttl_secs.max(min_life);
        let ask = if b.reports == 1 {
            b.quota.lease_max
        } else {
            // A quiet report halves the size rather than dropping it to 1: Envoy reports a
            // bucket only every 5 s, so a tenant pausing for a report would otherwise be
            // refused for up to 5 s when it comes back.
            ask_for(demand, elapsed, life, b.quota.lease_max)
                .max(b.last_units / 2)
                .min(b.quota.lease_max.max(1))
        };
        let check = Check {
            limit: &b.quota.limit,
            subject: b.subject,
            op: Op::Lease(ask),
        };
        let decision = match store.decide(&[check], WorkerId::NONE).await {
            Ok(d) => d.into_iter().next(),
            Err(e) => {
                tracing::debug!(error = %e, "rlqs: the store cannot decide");
                None
            }
        };
        let Some(decision) = decision else {
            return Err(m::Refused::StoreError);
        };
        let (units, generation, d) = granted(&decision);
        b.last_units = units;
        let ttl = b.quota.ttl_secs;
        let action = if units == 0 {
            // Until a unit frees (at most the TTL), and past the next report whatever that.
            let wait = d.retry_after.div_ceil(SECOND).clamp(1, ttl).max(min_life);
            metrics.denied.increment(1);
            assignment(id, wait, Strategy::BlanketRule(BlanketRule::DenyAll as i32))
        } else {
            let valid_until = now.saturating_add(d.reset_after.saturating_sub(MARGIN));
            // The grant's validity cuts the TTL, but not below the next report and a margin:
            // a bucket with no assignment would be left to Envoy's fallbacks until then. Units
            // spent past the validity are still units charged (module docs, "TTL").
            let ttl = ttl
                .min(valid_until.saturating_sub(now) / SECOND)
                .max(min_life);
            metrics.granted.increment(units);
            metrics.assigned.increment(1);
            b.open.push_back(Grant {
                units,
                generation,
                valid_until,
                report: b.reports,
            });
            b.sent += 1;
            assignment(
                id,
                ttl,
                Strategy::TokenBucket(lease_bucket(units, ttl, b.sent % 2 == 1)),
            )
        };
        if units == 0 {
            b.open.push_back(Grant {
                units: 0,
                generation: 0,
                valid_until: now,
                report: b.reports,
            });
            b.sent += 1;
        }
        Ok(Some(action))
    }

    /// After a reload: a bucket whose quota is not one of the serving config's is matched
    /// again. Under a quota of the same name, limit (the limit's `uid`: scope, name, algorithm
    /// and numbers) and `subject` it keeps its assignments and counts, taking the new quota's
    /// `assignment_ttl` and `lease_max`. Otherwise it starts over under what it now matches
    /// (nothing: it is dropped, and answered as an unmapped bucket is); the units of its live
    /// assignments stay charged under the old limit and lapse with it, so a reload never
    /// admits more than either limit.
    fn rematch(&mut self, key: SubjectDigest, id: &BucketId, quotas: &[Arc<Quota>]) {
        let Some(b) = self.buckets.get_mut(&key) else {
            return;
        };
        if quotas.iter().any(|q| Arc::ptr_eq(q, &b.quota)) {
            return;
        }
        let now = quotas.iter().find(|q| q.matches(&self.domain, &id.map()));
        match now {
            Some(q)
                if q.name == b.quota.name
                    && q.limit.uid == b.quota.limit.uid
                    && q.subject == b.quota.subject =>
            {
                b.quota = q.clone();
            }
            _ => {
                self.buckets.remove(&key);
            }
        }
    }

    /// The buckets this stream keeps.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limit::store::{AnyClock, ManualClock, MemoryStore};

    /// A token bucket of 5 refilling one unit a second (60 a minute), the default TTL (10 s).
    fn refilling_quota() -> Vec<Arc<Quota>> {
        #[derive(serde::Deserialize)]
        struct W {
            quota: Vec<crate::config::rls_model::RawQuota>,
        }
        let w: W = toml::from_str(
            "[[quota]]\nname = \"api\"\nlimit = 60\nperiod = \"1m\"\nburst = 5\n\
             algorithm = \"token_bucket\"\n",
        )
        .expect("parses");
        super::super::quota::compile(&w.quota).expect("compiles")
    }

    fn report(allowed: u64, denied: u64) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId::of([("tenant", "acme")])),
                time_elapsed: None,
                num_requests_allowed: allowed,
                num_requests_denied: denied,
            }],
        }
    }

    /// Whether a reply's one assignment is a `DENY_ALL`, and its TTL in seconds.
    fn lifetime(r: &RateLimitQuotaResponse) -> (bool, i64) {
        assert_eq!(r.bucket_action.len(), 1, "{r:?}");
        let Some(Action::QuotaAssignmentAction(q)) = &r.bucket_action[0].bucket_action else {
            panic!("not an assignment: {r:?}");
        };
        let deny = matches!(
            q.rate_limit_strategy.as_ref().and_then(|s| s.strategy),
            Some(Strategy::BlanketRule(b)) if b == BlanketRule::DenyAll as i32
        );
        (deny, q.assignment_time_to_live.map_or(0, |d| d.seconds))
    }

    /// Two Envoys (two streams) report one busy bucket every `every` seconds, `reports` times;
    /// the lifetimes of the second's assignments (the first takes what refilled, so the second
    /// is mostly denied).
    async fn lifetimes(every: u64, reports: usize) -> Vec<(bool, i64)> {
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let store = MemoryStore::with_clock(1_000, AnyClock::Manual(clock.clone()));
        let quotas = refilling_quota();
        let (mut a, mut b) = (QuotaStream::default(), QuotaStream::default());
        let mut seen = Vec::new();
        for _ in 0..reports {
            a.on_report(&report(0, 50), &quotas, &store, &clock).await;
            let r = b.on_report(&report(0, 50), &quotas, &store, &clock).await;
            seen.push(lifetime(&r));
            clock.advance(every * SECOND);
        }
        seen
    }

    /// Issue 56: a spent bucket's `DENY_ALL` lived for its `retry_after` (1 s here) while Envoy
    /// 1.40 reports every 5 s: for 4 s of 5 its `no_assignment_behavior` decided. Every
    /// assignment lives until the Envoy's next report and a margin: the reporting interval
    /// learnt from the bucket's reports (5 s until two have shown it), plus 2 s.
    #[tokio::test]
    async fn an_assignment_lives_past_the_envoys_next_report() {
        // Envoy 1.40: every 5 s. The first two reports have not shown the interval yet: 5 s.
        let seen = lifetimes(5, 6).await;
        assert!(seen.iter().any(|(deny, _)| *deny), "{seen:?}");
        for (i, (deny, ttl)) in seen.iter().enumerate() {
            assert!(
                *ttl >= 7,
                "report {i}: {} lives {ttl} s, the next report is 5 s away: {seen:?}",
                if *deny { "DENY_ALL" } else { "a token bucket" }
            );
        }
        // An Envoy reporting every 2 s (one that reads `reporting_interval`): once learnt,
        // DENY_ALL lives 2 s + 2 s.
        let seen = lifetimes(2, 6).await;
        assert_eq!(seen.last(), Some(&(true, 4)), "{seen:?}");
        assert!(seen.iter().all(|(_, ttl)| *ttl >= 4), "{seen:?}");
        // Every 20 s: past the quota's 10 s TTL.
        let seen = lifetimes(20, 4).await;
        assert!(seen.iter().all(|(_, ttl)| *ttl >= 7), "{seen:?}");
        assert_eq!(seen.last().map(|s| s.1), Some(22), "{seen:?}");
    }

    const NANOS: u128 = 1_000_000_000;

    /// (m, k, F in whole seconds, as Envoy reads them for the rate).
    fn shape(b: &TokenBucket) -> (u128, u128, u128) {
        let f = b.fill_interval.expect("an interval");
        assert!((0..=1).contains(&f.nanos), "{b:?}");
        let secs = u128::try_from(f.seconds).unwrap();
        assert!(secs >= 1, "Envoy divides by the whole seconds: {b:?}");
        let k = u128::from(b.tokens_per_fill.expect("a fill").value);
        assert!(k >= 1 && b.max_tokens >= 1, "{b:?}");
        (u128::from(b.max_tokens), k, secs)
    }

    /// What Envoy's token bucket (`AtomicTokenBucketImpl`) admits in its first `t` ns when it
    /// starts with `start` tokens and every token is spent as soon as it exists.
    fn admitted_by(b: &TokenBucket, start: u128, t: u128) -> u128 {
        let (_, k, f) = shape(b);
        start + k * t / (f * NANOS)
    }

    #[test]
    fn a_lease_admits_its_units_before_ttl_and_a_second_and_not_one_more() {
        for ttl in [1u64, 2, 5, 10, 60, 3600] {
            for units in (1u64..=300).chain([999, 1000, 1001, 65_535, 1_000_000]) {
                for odd in [false, true] {
                    let b = lease_bucket(units, ttl, odd);
                    let (m, k, f) = shape(&b);
                    let life = u128::from(ttl + 1) * NANOS;
                    // Started full (a new bucket), strictly before TTL + 1 s: exactly N.
                    assert_eq!(
                        admitted_by(&b, m, life - 1),
                        u128::from(units),
                        "{units} {ttl} {b:?}"
                    );
                    // Started drained (Envoy starts a replacing bucket at the ratio the old
                    // one had left): the refill is at least N ÷ (TTL + 2 s) a second, or one
                    // token per ⌈(TTL + 1) ÷ N⌉ s for fewer units than seconds.
                    let rate_floor = u128::from(units) / u128::from(ttl + 2);
                    if rate_floor >= 1 {
                        assert!(k * NANOS / (f * NANOS) >= rate_floor, "{units} {ttl} {b:?}");
                    }
                    // Envoy starts a bucket at all only when its tokens ÷ rate is under its
                    // host's uptime: a few TTLs at most, whatever N.
                    assert!(m * f / k <= 3 * u128::from(ttl + 1), "{units} {ttl}: {b:?}");
                }
            }
        }
    }

    #[test]
    fn successive_assignments_of_the_same_units_differ() {
        assert_ne!(lease_bucket(10, 5, false), lease_bucket(10, 5, true));
        assert_ne!(lease_bucket(1, 5, false), lease_bucket(1, 5, true));
    }

    #[test]
    fn a_bucket_is_asked_twice_its_rate_for_the_assignments_life() {
        // 50 requests in 5 s: 10 a second, × 2, × (10 s + 2 s).
        assert_eq!(ask_for(50, 5 * SECOND, 10, 1_000_000), 240);
        // Capped by lease_max; at least 1; a report less than a second after the last one
        // counts as a second.
        assert_eq!(ask_for(50, 5 * SECOND, 10, 100), 100);
        assert_eq!(ask_for(0, 5 * SECOND, 10, 100), 1);
        assert_eq!(ask_for(10, 1, 3, 1_000), 100);
        assert_eq!(ask_for(u64::MAX, 1, u64::MAX, u64::MAX), u64::MAX);
    }
}
