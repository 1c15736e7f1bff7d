//! A byte limit of 0 (`limit = 0` with `unit = "bytes"`): a budget of no byte. The gateway
//! decides it without the store: its count could never change (nothing it admits sends a
//! counted byte), and the store's algorithms are written for quotas of at least 1.
//!
//! A request whose exchange cannot carry a counted body is not checked against it at all (a
//! `HEAD` for response bytes; a request that declares no body for request bytes); any other is
//! refused by it, before the upstream and with nothing charged to the route's other limits.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{Method, Version};

use super::{Check, CompiledLimit, Decision};
use crate::config::CountedBytes;
use crate::http::head::RequestHead;
use tollgate_limit::store::{AnyStore, Store, StoreError};
use tollgate_limit::worker::WorkerId;

impl CompiledLimit {
    /// Whether this is a byte budget of nothing (only a byte limit may have `limit = 0`).
    pub fn zero_budget(&self) -> bool {
        self.policy.limit == 0
    }
}

/// Whether a request's exchange may carry the bytes `l` (a byte budget of 0) counts: a response
/// body (any request but a `HEAD`), a request body (a request that declares one: a
/// `Transfer-Encoding`, a `Content-Length` other than 0, or HTTP/2 and later without a length,
/// whose body the head does not say).
pub fn may_count(l: &CompiledLimit, head: &impl RequestHead) -> bool {
    let response = || head.method() != Method::HEAD;
    let request = || {
        if head.header_value(&TRANSFER_ENCODING).is_some() {
            return true;
        }
        match head.header_value(&CONTENT_LENGTH) {
            Some(v) => v != b"0",
            None => head.version() >= Version::HTTP_2,
        }
    };
    match l.after.as_ref().and_then(|a| a.bytes) {
        Some(CountedBytes::Request) => request(),
        Some(CountedBytes::Both) => response() || request(),
        Some(CountedBytes::Response) | None => response(),
    }
}

/// What a budget of no byte says: refused. Its state never changes, so no wait would admit the
/// same request; the client is told to come back in one period (`Retry-After`), the time a
/// spent budget of the same limit would take to have room again at most.
pub fn decision(l: &CompiledLimit) -> Decision {
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        retry_after: l.policy.period,
        reset_after: l.policy.period,
        delay: 0,
        kind: Default::default(),
    }
}

/// `checks` evaluated by `store` without charging, a budget of no byte answered here.
pub async fn peek(
    store: &AnyStore,
    checks: &[Check<'_>],
    worker: WorkerId,
) -> Result<Vec<Decision>, StoreError> {
    if !checks.iter().any(|c| c.limit.zero_budget()) {
        return store.peek(checks, worker).await;
    }
    let asked: Vec<Check<'_>> = checks
        .iter()
        .filter(|c| !c.limit.zero_budget())
        .copied()
        .collect();
    let mut answers = if asked.is_empty() {
        Vec::new()
    } else {
        store.peek(&asked, worker).await?
    }
    .into_iter();
    Ok(checks
        .iter()
        .map(|c| {
            if c.limit.zero_budget() {
                decision(c.limit)
            } else {
                answers.next().unwrap_or_else(Decision::unasked)
            }
        })
        .collect())
}
