//! Deciding limits with the crate alone, on an injected clock: what a rate-limit service (the
//! Envoy RLS, issue #37) builds on. Two limits of one request, decided all-or-nothing by the
//! in-process store, with time moved by hand.
//!
//!     cargo run -p tollgate-limit --example decide

use std::sync::Arc;

use tollgate_limit::store::{AnyClock, ManualClock, MemoryStore, Store};
use tollgate_limit::worker::WorkerId;
use tollgate_limit::{Algorithm, Check, Limit, Op, Policy, SubjectDigest};

const SECOND: u64 = 1_000_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // 3 requests a second per caller, and 5 a minute for everyone.
    let per_caller = Arc::new(Limit::new(
        "api",
        "per-caller",
        Policy {
            algorithm: Algorithm::Gcra,
            limit: 3,
            period: SECOND,
            burst: 3,
            cost: 1,
            calendar: None,
        },
    ));
    let global = Arc::new(Limit::new(
        "api",
        "global",
        Policy {
            algorithm: Algorithm::FixedWindow,
            limit: 5,
            period: 60 * SECOND,
            burst: 0,
            cost: 1,
            calendar: None,
        },
    ));
    let clock = ManualClock::new(1_700_000_000 * SECOND);
    let store = MemoryStore::with_clock(10_000, AnyClock::Manual(clock.clone()));
    let alice = SubjectDigest::of(b'h', b"alice");
    let everyone = SubjectDigest::of(b'g', b"");

    for step in 0..6 {
        let checks = [
            Check {
                limit: &per_caller,
                subject: alice,
                op: Op::Decide,
            },
            Check {
                limit: &global,
                subject: everyone,
                op: Op::Decide,
            },
        ];
        let decisions = store
            .decide(&checks, WorkerId::NONE)
            .await
            .expect("the in-process store always decides");
        let admitted = decisions.iter().all(|d| d.allowed);
        println!(
            "request {step}: {} (per-caller remaining {}, global remaining {})",
            if admitted { "admitted" } else { "denied" },
            decisions[0].remaining,
            decisions[1].remaining,
        );
        clock.advance(SECOND / 10);
    }
}
