//! API consumers: who is calling, found by the SHA-256 of their key (or of their client
//! certificate), and their plan.
//!
//! `key` holds the hashing shared by the request path, the consumers file and `tollgate key`;
//! `table` loads the consumers file into hash maps probed once per request (no file access,
//! no scan); `request` reads a request's key (or its connection's certificate) and finds its
//! consumer.

mod key;
mod request;
mod table;

pub use self::key::{hash_key, new_key, parse_hex, KeyHash};
pub use self::request::{identify, Identity};
pub use self::table::{
    parse_fingerprint, ConsumerRef, ConsumerTable, ConsumersFileError, Plans, Variant,
};
/// [`crate::hex::encode`] under the path the integration tests name.
pub use crate::hex::encode as hex;
pub use crate::subject::strip_query_param;

use std::sync::Arc;

use crate::config::{PlanConfig, PlanLimit, Scope};
use crate::limiter::CompiledLimit;
use crate::routing::RouteTable;

/// Compiles every plan's limits for every route with `consumers = true`: per route, one list
/// per plan (by plan index), then one per variant of `consumers` (a plan with a consumer's
/// overrides; see [`Consumer::limits`](crate::subject::Consumer::limits)). A `scope = "global"`
/// limit is counted under `@<plan>` on every route — one count per consumer for the whole API —
/// and a `scope = "route"` one under `<route>@<plan>`, overridden or not (an override changes a
/// consumer's numbers, not its count); each route still gets its own metric handles (the
/// `route` label).
pub fn compile_plan_limits(
    routes: &mut RouteTable,
    plans: &[PlanConfig],
    consumers: &ConsumerTable,
) {
    let names: Vec<Arc<str>> = plans.iter().map(|p| Arc::from(p.name.as_str())).collect();
    let lists = plans
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.limits.as_slice()))
        .chain(
            consumers
                .variants()
                .iter()
                .map(|v| (v.plan, v.limits.as_slice())),
        );
    let lists: Vec<(usize, &[PlanLimit])> = lists.collect();
    // A usage route charges no plan limit: it answers what the others have charged.
    for r in routes.iter_mut().filter(|r| r.consumers && !r.usage) {
        r.plan_limits = lists
            .iter()
            .filter_map(|&(p, limits)| Some((names.get(p)?, limits)))
            .map(|(plan, limits)| {
                limits
                    .iter()
                    .map(|pl| {
                        let scope: Arc<str> = match pl.scope {
                            Scope::Global => Arc::from(format!("@{plan}")),
                            Scope::Route => Arc::from(format!("{}@{plan}", r.name)),
                        };
                        Arc::new(CompiledLimit::compile_in(
                            &r.name,
                            &scope,
                            Some(plan),
                            &pl.limit,
                        ))
                    })
                    .collect()
            })
            .collect();
    }
}
