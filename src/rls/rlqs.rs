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
//! - **Shape**: of N units, `max_tokens` = the larger half, held from the start; the other half
//!   (`tokens_per_fill`) refills over a `fill_interval` of (TTL + 1 s) × half ÷ (half + 1), so
//!   the last unit arrives before TTL + 1 s and the next would come only at it, after Envoy's
//!   expiry timer. One unit: one token, refilled at TTL + 1 s. Why not all N at once: Envoy's
//!   token bucket starts full only when `max_tokens` ÷ fill rate is less than its monotonic
//!   clock (the host's uptime), and a bucket that must not refill in its life needs a window of
//!   N × TTL — hours for a large N, so on a host booted less than that ago every assignment
//!   started empty and Envoy admitted a fraction of what it was given (BENCHMARKS.md, stop 39).
//!   This shape's window is at most 2 × (TTL + 1 s). The cost: the units that would refill
//!   between TTL and TTL + 1 s (at most half ÷ (TTL + 1 s) of them) are not spent in the
//!   assignment's life; they go back with the next return.
//!
//! - **Size**: twice the bucket's demand in the report just received (allowed + denied), at
//!   least 1, at most `lease_max` — and `lease_max` for a bucket's first report (Envoy's, sent
//!   when the bucket appears, knows one request and is next followed by Envoy's 5-second
//!   timer); the store grants what it has, up to that. Nothing left:
//!   `DENY_ALL` until the limit frees units (`retry_after`, whole seconds, at most the TTL).
//! - **TTL**: `assignment_ttl`, cut to the grant's validity (the window's end, the time the
//!   bucket refills what was taken: units spent later would come on top of a fresh budget),
//!   in whole seconds as Envoy reads it. Less than a second of validity: the grant goes back
//!   at once and the bucket keeps its assignment until the next report.
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
//!   report; a bucket_id of at most 16 entries of 4096 bytes; each refusal counted by reason.
//!   An outbound queue of [`QUEUE`] replies: a stream that does not read them is not read
//!   either (HTTP/2 flow control does the rest).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::metrics::rlqs as m;
use super::quota::Quota;
use super::service::{MAX_ENTRIES, MAX_ENTRY_BYTES};
use crate::limiter::{lease::granted, Limit, Micros, Op, SubjectDigest};
use crate::state::Shared;
use crate::store::{Clock, Store};
use crate::worker::WorkerId;
use tollgate_limit::Check;

/// The most buckets one stream keeps (one Envoy's distinct bucket_ids).
pub const MAX_BUCKETS: usize = 1024;
/// The most buckets one report may carry (the rest are refused, counted).
pub const MAX_REPORT_BUCKETS: usize = 1024;
/// Replies queued for a stream that is slow to read them.
pub const QUEUE: usize = 4;
/// An assignment's units are spent only this long before its grant stops holding them.
const MARGIN: Micros = 200_000;
/// The TTL of the `ALLOW_ALL` a bucket no quota maps gets.
const UNMAPPED_TTL_SECS: i64 = 60;
const SECOND: Micros = 1_000_000;

/// The quota service over the snapshot that serves.
#[derive(Clone)]
pub struct QuotaService {
    shared: Arc<Shared>,
}

impl QuotaService {
    pub fn new(shared: Arc<Shared>) -> QuotaService {
        QuotaService { shared }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ReplyStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<ReplyStream>, Status> {
        if self.shared.snapshot.load().rls.is_none() {
            return Err(Status::unavailable("the quota service is not configured"));
        }
        let mut reports = request.into_inner();
        let (tx, rx) = mpsc::channel(QUEUE);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let _open = m::StreamGuard::open();
            let mut stream = QuotaStream::default();
            loop {
                let report = tokio::select! {
                    r = reports.message() => r,
                    // Envoy went away: stop reading its reports.
                    () = tx.closed() => return,
                };
                match report {
                    Ok(Some(report)) => {
                        let snap = shared.snapshot.load_full();
                        let Some(domains) = snap.rls.clone() else {
                            return;
                        };
                        let reply = stream
                            .on_report(&report, &domains.quotas, &*snap.store, &shared.clock)
                            .await;
                        if !reply.bucket_action.is_empty() && tx.send(Ok(reply)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, "rlqs: stream ended");
                        return;
                    }
                }
            }
        });
        let out = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(out)))
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
}

/// One stream's buckets, by the digest of their whole bucket_id.
#[derive(Debug, Default)]
pub struct QuotaStream {
    domain: String,
    buckets: HashMap<SubjectDigest, Bucket>,
}

/// Why a bucket of a report got no assignment.
fn bucket_id_ok(id: Option<&BucketId>) -> Result<&BucketId, m::Refused> {
    let id = id
        .filter(|b| !b.bucket.is_empty())
        .ok_or(m::Refused::NoBucketId)?;
    if id.bucket.len() > MAX_ENTRIES
        || id
            .bucket
            .iter()
            .any(|(k, v)| k.len() > MAX_ENTRY_BYTES || v.len() > MAX_ENTRY_BYTES)
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
    let mut entries: Vec<(&String, &String)> = id.bucket.iter().collect();
    entries.sort_unstable();
    let mut bytes = Vec::new();
    for (k, v) in entries {
        for part in [k, v] {
            bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
            bytes.extend_from_slice(part.as_bytes());
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

/// The token bucket that hands Envoy `units` for `ttl_secs` (module docs, "Shape"): half the
/// units at once (`max_tokens`, the larger half), the other half refilled so that the last of
/// them arrives by TTL + 1 s and not one more before it. `odd` moves the interval by a
/// nanosecond (slower), so two successive assignments always differ.
fn lease_bucket(units: u64, ttl_secs: u64, odd: bool) -> TokenBucket {
    const NANOS: u128 = 1_000_000_000;
    let units = units.clamp(1, u64::from(u32::MAX));
    let refill = units / 2;
    let (max_tokens, per_fill, interval) = if refill == 0 {
        // One unit: held at once, the next token only at TTL + 1 s.
        (
            1,
            1,
            u128::from(ttl_secs).saturating_add(1).saturating_mul(NANOS),
        )
    } else {
        // Token `refill + 1` of the refill would arrive at exactly TTL + 1 s: the interval is
        // (TTL + 1 s) × refill / (refill + 1), rounded up (slower, never faster).
        let life = u128::from(ttl_secs).saturating_add(1).saturating_mul(NANOS);
        let r = u128::from(refill);
        let interval = life.saturating_mul(r).div_ceil(r + 1);
        (units - refill, refill, interval)
    };
    let interval = interval.saturating_add(u128::from(odd));
    let secs = interval / NANOS;
    TokenBucket {
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        tokens_per_fill: Some(UInt32Value {
            value: u32::try_from(per_fill).unwrap_or(u32::MAX),
        }),
        fill_interval: Some(PbDuration {
            seconds: i64::try_from(secs).unwrap_or(i64::MAX),
            // Below 10⁹: fits.
            nanos: i32::try_from(interval % NANOS).unwrap_or(0),
        }),
    }
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

impl QuotaStream {
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
        let key = bucket_key(id);
        self.rematch(key, id, quotas);
        if !self.buckets.contains_key(&key) {
            let Some(quota) = quotas.iter().find(|q| q.matches(&self.domain, &id.bucket)) else {
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
            self.buckets.insert(
                key,
                Bucket {
                    quota: quota.clone(),
                    subject: quota.subject_of(&id.bucket),
                    reports: 0,
                    open: VecDeque::new(),
                    closed: 0,
                    used: 0,
                    settled: 0,
                    sent: 0,
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
        let ask = if b.reports == 1 {
            b.quota.lease_max
        } else {
            demand.saturating_mul(2).clamp(1, b.quota.lease_max)
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
        let ttl = b.quota.ttl_secs;
        let action = if units == 0 {
            let wait = d.retry_after.div_ceil(SECOND).clamp(1, ttl);
            metrics.denied.increment(1);
            assignment(id, wait, Strategy::BlanketRule(BlanketRule::DenyAll as i32))
        } else {
            let valid_until = now.saturating_add(d.reset_after.saturating_sub(MARGIN));
            let ttl = ttl.min(valid_until.saturating_sub(now) / SECOND);
            if ttl == 0 {
                // Too close to the grant's end for Envoy's whole seconds: given back now.
                give_back(store, &b.quota.limit, b.subject, units, generation).await;
                metrics.returned.increment(units);
                return Ok(None);
            }
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
        let now = quotas.iter().find(|q| q.matches(&self.domain, &id.bucket));
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
    use super::lease_bucket;

    const NANOS: u128 = 1_000_000_000;

    /// What Envoy's token bucket (`AtomicTokenBucketImpl`, started full) can admit in the first
    /// `t` nanoseconds, spending every token as soon as it exists.
    fn admitted_by(b: &super::TokenBucket, t: u128) -> u128 {
        let f = b.fill_interval.expect("an interval");
        let interval =
            u128::try_from(f.seconds).unwrap() * NANOS + u128::try_from(f.nanos).unwrap();
        let per_fill = u128::from(b.tokens_per_fill.expect("a fill").value);
        u128::from(b.max_tokens) + per_fill * t / interval
    }

    #[test]
    fn a_lease_admits_its_units_in_its_life_and_not_one_more_before_ttl_and_a_second() {
        for ttl in [1u64, 2, 5, 10, 60, 3600] {
            for units in (1u64..=300).chain([999, 1000, 1001, 65_535, 1_000_000]) {
                for odd in [false, true] {
                    let b = lease_bucket(units, ttl, odd);
                    let life = u128::from(ttl + 1) * NANOS;
                    // Strictly before TTL + 1 s (Envoy's expiry timer fires at TTL): ≤ N.
                    assert_eq!(
                        admitted_by(&b, life - 1),
                        u128::from(units),
                        "{units} {ttl} {b:?}"
                    );
                    // By the TTL itself, at most half ÷ (TTL + 1 s) of them are still to come.
                    let short = u128::from(units / 2) / u128::from(ttl + 1) + 1;
                    assert!(admitted_by(&b, u128::from(ttl) * NANOS) + short >= u128::from(units));
                    // Envoy starts the bucket full when max_tokens ÷ rate < its uptime: at most
                    // 2 × (TTL + 1 s), whatever N.
                    let f = b.fill_interval.unwrap();
                    let interval = u128::try_from(f.seconds).unwrap() * NANOS
                        + u128::try_from(f.nanos).unwrap();
                    let window = u128::from(b.max_tokens) * interval
                        / u128::from(b.tokens_per_fill.unwrap().value);
                    assert!(window <= 2 * life, "{units} {ttl}: window {window}");
                }
            }
        }
    }

    #[test]
    fn successive_assignments_of_the_same_units_differ() {
        assert_ne!(lease_bucket(10, 5, false), lease_bucket(10, 5, true));
        assert_ne!(lease_bucket(1, 5, false), lease_bucket(1, 5, true));
    }
}
