//! The metrics of limits that look at the response: `decision="charged_after"` of
//! `tollgate_ratelimit_decisions_total` (post-response charges) and the
//! `tollgate_ratelimit_in_flight{route, limit}` gauge (slots of a concurrency limit held on this
//! gateway). Registered at first use, so other limits export neither.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge};

use crate::metrics::{COST_SOURCE, DECISIONS_TOTAL, IN_FLIGHT};

/// A limit's response metrics (labels: its route, name and plan, from the config).
#[derive(Debug)]
pub struct ResponseMetrics {
    route: Arc<str>,
    limit: Arc<str>,
    /// `""` for a route's own limit (the `plan` label of the decisions counter).
    plan: Arc<str>,
    charged_after: OnceLock<Counter>,
    in_flight: OnceLock<Gauge>,
    /// `tollgate_ratelimit_cost_source_total` by outcome: found, missing, malformed.
    cost_source: [OnceLock<Counter>; 3],
}

/// The outcomes of `tollgate_ratelimit_cost_source_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostOutcome {
    Found = 0,
    Missing = 1,
    Malformed = 2,
}

impl ResponseMetrics {
    pub fn new(route: &Arc<str>, limit: &Arc<str>, plan: &str) -> ResponseMetrics {
        ResponseMetrics {
            route: route.clone(),
            limit: limit.clone(),
            plan: Arc::from(plan),
            charged_after: OnceLock::new(),
            in_flight: OnceLock::new(),
            cost_source: Default::default(),
        }
    }

    /// `decision="charged_after"`: one post-response charge made.
    pub fn charged_after(&self) -> &Counter {
        self.charged_after.get_or_init(|| {
            metrics::counter!(DECISIONS_TOTAL, "route" => self.route.to_string(), "limit" => self.limit.to_string(), "plan" => self.plan.to_string(), "decision" => "charged_after")
        })
    }

    /// `tollgate_ratelimit_cost_source_total{outcome}`: where a `cost_from` charge came from.
    pub fn cost_source(&self, outcome: CostOutcome) -> &Counter {
        let label = match outcome {
            CostOutcome::Found => "found",
            CostOutcome::Missing => "missing",
            CostOutcome::Malformed => "malformed",
        };
        self.cost_source[outcome as usize].get_or_init(|| {
            metrics::counter!(COST_SOURCE, "route" => self.route.to_string(), "limit" => self.limit.to_string(), "outcome" => label)
        })
    }

    /// `tollgate_ratelimit_in_flight`.
    pub fn in_flight(&self) -> &Gauge {
        self.in_flight.get_or_init(|| {
            metrics::gauge!(IN_FLIGHT, "route" => self.route.to_string(), "limit" => self.limit.to_string())
        })
    }
}
