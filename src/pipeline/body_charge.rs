//! The charge of the limits whose cost is read from the response body or its trailers
//! (`cost_from`): a scan that follows the body as the front streams it to the client (nothing
//! is held back or buffered), and the charge made when the body ends.
//!
//! - The body ends in full: each limit is charged the weighted sum of its sources when every
//!   source held an integer, else its fallback (the `cost_header` value when the head carried
//!   one, else its `cost`); counted in `tollgate_ratelimit_cost_source_total{outcome}`. Like the
//!   head's charges, the front holds the body's last frame until the store has the charge, so a
//!   client that asks again at once is judged on its charged budget.
//! - The body is cut (the client left, the upstream failed or timed out): charged at once
//!   (not awaited) with what is known then — an event stream's complete events, a JSON body is
//!   malformed — so a client that leaves mid-stream still pays what the upstream reported so
//!   far, or the fallback when it reported nothing yet.
//!
//! Limits with `unit = "bytes"` are charged here too: the response body's bytes as the front
//! hands them to the client's connection ([`BodyCharge::sent`]) and the request body's bytes
//! forwarded to the upstream (known when the response head arrives), whole or cut: a client
//! that leaves mid-body pays what it was sent.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderMap;
use smallvec::SmallVec;

use super::settle::{settle_detached, settle_reserved, Deferred, Settle, WorkerCtx};
use crate::body_cost::{cost_of, BodyScan, Outcome};
use crate::limiter::charge::clamp;
use crate::limiter::{CostOutcome, Op};
use tollgate_limit::store::AnyStore;

/// What a response whose body names its cost owes; charged when the body ends or is dropped.
pub struct BodyCharge {
    store: Arc<AnyStore>,
    ctx: WorkerCtx,
    owed: SmallVec<[Deferred; 2]>,
    scan: BodyScan,
    charging: Option<tokio::task::JoinHandle<()>>,
    ended: bool,
    /// Response body bytes handed to the client so far (`unit = "bytes"`).
    sent: u64,
    /// Request body bytes sent upstream (`unit = "bytes"`).
    request: u64,
}

impl BodyCharge {
    /// The charge of `owed` (limits with `cost_from` or `unit = "bytes"`), for a response with
    /// `headers` to a request whose body sent upstream was `request` bytes.
    pub(super) fn new(
        store: &Arc<AnyStore>,
        ctx: &WorkerCtx,
        owed: SmallVec<[Deferred; 2]>,
        headers: &HeaderMap,
        request: u64,
    ) -> Option<BodyCharge> {
        if owed.is_empty() {
            return None;
        }
        let scan = BodyScan::new(
            owed.iter()
                .filter_map(|(l, _, _, _)| l.after.as_ref())
                .flat_map(|a| a.cost_from.iter()),
            headers,
        );
        Some(BodyCharge {
            store: store.clone(),
            ctx: ctx.clone(),
            owed,
            scan,
            charging: None,
            ended: false,
            sent: 0,
            request,
        })
    }

    /// The next bytes of the body, as the upstream sent them (before they go to the client).
    pub fn data(&mut self, bytes: &[u8]) {
        self.scan.data(bytes);
    }

    /// `n` more bytes of the body handed to the client's connection (what `unit = "bytes"`
    /// limits count).
    pub fn sent(&mut self, n: usize) {
        self.sent = self.sent.saturating_add(n as u64);
    }

    /// The body's trailers.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        self.scan.trailers(trailers);
    }

    /// The body's trailer fields as received (the fast front), name and value.
    pub fn trailer_fields<'a, I: Iterator<Item = (&'a [u8], &'a [u8])>>(
        &mut self,
        fields: impl Fn() -> I,
    ) {
        self.scan.trailer_fields(fields);
    }

    /// Whether a cost is read from a trailer.
    pub fn reads_trailers(&self) -> bool {
        self.scan.reads_trailers()
    }

    /// The body ended (or was cut): the charge starts; see [`BodyCharge::poll_charged`].
    pub fn end(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.scan.end();
        let mut list: SmallVec<[super::settle::Owed; 2]> = SmallVec::new();
        for (l, subject, fallback, reserved) in self.owed.drain(..) {
            let Some(after) = &l.after else { continue };
            if let Some(counted) = after.bytes {
                let bytes = (if counted.response() { self.sent } else { 0 })
                    .saturating_add(if counted.request() { self.request } else { 0 });
                // Above the capacity: the limit is spent (clamped, like any charge).
                let units = clamp(&l.policy, Some(bytes)).unwrap_or_else(|_| l.policy.quota());
                if units > 0 {
                    list.push((l, subject, Op::Charge(units)));
                }
                continue;
            }
            let (outcome, units) = match cost_of(&self.scan, &after.cost_from) {
                Outcome::Found(v) => (
                    CostOutcome::Found,
                    clamp(&l.policy, Some(v)).unwrap_or_else(|_| l.policy.quota()),
                ),
                Outcome::Missing => (CostOutcome::Missing, fallback),
                Outcome::Malformed => (CostOutcome::Malformed, fallback),
            };
            l.response_metrics.cost_source(outcome).increment(1);
            if let Some(r) = reserved {
                if let Some(op) = settle_reserved(r, units) {
                    list.push((l, subject, op));
                }
            } else if units > 0 {
                list.push((l, subject, Op::Charge(units)));
            }
        }
        self.charging = settle_detached(&self.store, &self.ctx, list, Settle::Charge);
    }

    /// Ready once the charge started by [`BodyCharge::end`] is applied (or failed: logged).
    pub fn poll_charged(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.charging.as_mut() {
            None => Poll::Ready(()),
            Some(task) => {
                let _ = std::task::ready!(std::future::Future::poll(std::pin::Pin::new(task), cx));
                self.charging = None;
                Poll::Ready(())
            }
        }
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        // Cut short (the client left, the body failed): charged with what is known; the task
        // outlives the request.
        self.end();
    }
}
