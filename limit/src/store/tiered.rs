//! The local tier: limits with `store = "local"` kept in this process while the request's other
//! limits go to the remote store (Redis), decided all-or-nothing across both.
//!
//! The local limits are decided first, in process: a request they refuse never costs a round
//! trip (a per-address burst guard in front of a fleet-wide quota keeps a flood off Redis). When
//! they admit, they are charged at once and the remote limits are asked; a request the remote
//! store refuses gives its local units back ([`refund`](crate::refund::refund)), also
//! when its future is dropped while waiting (a client gone: the refund is a guard's `Drop`).
//!
//! A remote *error* keeps the local charges: with `on_error = "allow"` the request goes on, and
//! the local limits keep limiting through an outage. Limits not asked because a local limit
//! refused first are reported as [`Decision::unasked`] (left out of the headers).
//!
//! A request without local limits goes straight to the remote store (one scan of its checks).

use smallvec::SmallVec;

use super::memory::MemoryStore;
use super::{Store, StoreError, StoreErrorKind};
use crate::worker::WorkerId;
use crate::{AsLimit, Check, Decision, Micros};

/// A remote store with a local tier in front.
pub struct Tiered<R> {
    local: MemoryStore,
    remote: R,
}

type Idx = SmallVec<[usize; 4]>;

/// Splits `checks` by tier: (local indices, remote indices).
fn split<L: AsLimit>(checks: &[Check<'_, L>]) -> (Idx, Idx) {
    (0..checks.len()).partition(|&i| checks[i].limit.local)
}

fn pick<'a, L: AsLimit>(checks: &[Check<'a, L>], idx: &[usize]) -> SmallVec<[Check<'a, L>; 4]> {
    idx.iter().map(|&i| checks[i]).collect()
}

/// Whether every enforcing limit admitted (the batch rule, [`crate::batch`]).
fn admitted<L: AsLimit>(checks: &[Check<'_, L>], decisions: &[Decision]) -> bool {
    crate::batch::admitted(
        checks
            .iter()
            .zip(decisions)
            .map(|(c, d)| crate::batch::Part {
                allowed: d.allowed,
                shadow: c.limit.shadow,
                charged_on_admission: true,
            }),
    )
}

/// Local charges given back when dropped armed.
struct Refund<'a, 'c, L: AsLimit> {
    local: &'a MemoryStore,
    checks: &'a [Check<'c, L>],
    decisions: &'a [Decision],
    charged_at: Micros,
    armed: bool,
}

impl<L: AsLimit> Drop for Refund<'_, '_, L> {
    fn drop(&mut self) {
        if self.armed {
            self.local.refund_now(
                self.checks,
                self.decisions,
                self.charged_at,
                self.local.now(),
            );
        }
    }
}

impl<R> Tiered<R> {
    /// `remote` with an in-process tier of at most `max_subjects` entries.
    pub fn new(local: MemoryStore, remote: R) -> Tiered<R> {
        Tiered { local, remote }
    }

    /// The remote store.
    pub fn remote(&self) -> &R {
        &self.remote
    }

    /// The in-process tier.
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }
}

/// What the local tier decided of a request: final (no remote limit, or a local refusal), or
/// charged, the remote limits still to ask.
#[allow(clippy::large_enum_variant)] // built and taken apart on the stack, never stored
enum LocalFirst<'c, L: AsLimit> {
    Done(Vec<Decision>),
    /// The decisions so far (the remote ones unasked), and what to ask.
    Ask(Vec<Decision>, Asking<'c, L>),
}

/// A request the local tier admitted and charged, its remote limits to ask.
struct Asking<'c, L: AsLimit> {
    /// The indices of the remote limits.
    remote: Idx,
    local_checks: SmallVec<[Check<'c, L>; 4]>,
    local: Vec<Decision>,
    charged_at: Micros,
}

impl<'c, L: AsLimit> Asking<'c, L> {
    /// The guard that gives the local charges back unless disarmed.
    fn refund<'a>(&'a self, local: &'a MemoryStore) -> Refund<'a, 'c, L> {
        Refund {
            local,
            checks: &self.local_checks,
            decisions: &self.local,
            charged_at: self.charged_at,
            armed: true,
        }
    }

    /// The remote store's answer merged in, all-or-nothing: a refusal refunds the local
    /// charges; an error keeps them (the local limits go on limiting through an outage).
    fn combine(
        &self,
        mut out: Vec<Decision>,
        refund: &mut Refund<'_, 'c, L>,
        remote_checks: &[Check<'c, L>],
        remote: Result<Vec<Decision>, StoreError>,
    ) -> Result<Vec<Decision>, StoreError> {
        let remote = match remote {
            Ok(d) if d.len() == remote_checks.len() => d,
            Ok(_) => {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    "the store answered a different number of limits",
                ))
            }
            Err(e) => {
                refund.armed = false;
                return Err(e);
            }
        };
        refund.armed = !admitted(remote_checks, &remote);
        for (&i, d) in self.remote.iter().zip(&remote) {
            out[i] = *d;
        }
        Ok(out)
    }
}

impl<R> Tiered<R> {
    /// The local limits of `checks` decided (and charged) first.
    fn local_first<'c, L: AsLimit>(&self, checks: &[Check<'c, L>]) -> LocalFirst<'c, L> {
        let (li, ri) = split(checks);
        let local_checks = pick(checks, &li);
        let charged_at = self.local.now();
        let local = self.local.decide_now(&local_checks, charged_at);
        let mut out = vec![Decision::unasked(); checks.len()];
        for (&i, d) in li.iter().zip(&local) {
            out[i] = *d;
        }
        if ri.is_empty() || !admitted(&local_checks, &local) {
            return LocalFirst::Done(out);
        }
        LocalFirst::Ask(
            out,
            Asking {
                remote: ri,
                local_checks,
                local,
                charged_at,
            },
        )
    }
}

impl<R: Store> Store for Tiered<R> {
    /// The local limits decided here, and the remote ones when the remote store decides them
    /// here too (leases, the deny cache); a local refusal is final. When the remote store
    /// must be asked, the local charges are given back and `None` says so.
    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Option<Result<Vec<Decision>, StoreError>> {
        if !checks.iter().any(|c| c.limit.local) {
            return self.remote.decide_here(checks, worker);
        }
        let (out, asking) = match self.local_first(checks) {
            LocalFirst::Done(out) => return Some(Ok(out)),
            LocalFirst::Ask(out, a) => (out, a),
        };
        let mut refund = asking.refund(&self.local);
        let remote_checks = pick(checks, &asking.remote);
        // `None`: the armed refund gives the local charges back as it drops.
        let remote = self.remote.decide_here(&remote_checks, worker)?;
        Some(asking.combine(out, &mut refund, &remote_checks, remote))
    }

    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        if !checks.iter().any(|c| c.limit.local) {
            return self.remote.decide(checks, worker).await;
        }
        let (out, asking) = match self.local_first(checks) {
            LocalFirst::Done(out) => return Ok(out),
            LocalFirst::Ask(out, a) => (out, a),
        };
        // Held across the call: a dropped decision (a client gone) refunds.
        let mut refund = asking.refund(&self.local);
        let remote_checks = pick(checks, &asking.remote);
        let remote = self.remote.decide(&remote_checks, worker).await;
        asking.combine(out, &mut refund, &remote_checks, remote)
    }

    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        if !checks.iter().any(|c| c.limit.local) {
            return self.remote.peek(checks, worker).await;
        }
        let (li, ri) = split(checks);
        let local = self.local.peek_now(&pick(checks, &li), self.local.now());
        let mut out = vec![Decision::unasked(); checks.len()];
        for (&i, d) in li.iter().zip(&local) {
            out[i] = *d;
        }
        if !ri.is_empty() {
            let remote = self.remote.peek(&pick(checks, &ri), worker).await?;
            for (&i, d) in ri.iter().zip(&remote) {
                out[i] = *d;
            }
        }
        Ok(out)
    }

    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), StoreError> {
        if !checks.iter().any(|c| c.limit.local) {
            return self.remote.settle(checks, worker).await;
        }
        let (li, ri) = split(checks);
        self.local.settle_now(&pick(checks, &li), self.local.now());
        if ri.is_empty() {
            return Ok(());
        }
        self.remote.settle(&pick(checks, &ri), worker).await
    }

    /// A local limit is corrected in this gateway's memory (each gateway keeps its own), a
    /// shared one in the remote store.
    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: crate::adjust::Adjust,
    ) -> Result<(), StoreError> {
        if check.limit.local {
            self.local.adjust_now(check, adjust, self.local.now());
            return Ok(());
        }
        self.remote.adjust(check, adjust).await
    }

    async fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: crate::Micros,
    ) -> Result<(), StoreError> {
        // A limit kept in this process shares nothing, its bans neither.
        if check.limit.local {
            return Ok(());
        }
        self.remote.ban(check, until).await
    }

    async fn lift_bans<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        if limit.local {
            return Ok(0);
        }
        self.remote.lift_bans(limit).await
    }

    async fn ban_lifts<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        if limit.local {
            return Ok(0);
        }
        self.remote.ban_lifts(limit).await
    }

    fn is_up(&self) -> bool {
        self.remote.is_up()
    }

    fn ping(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.remote.ping()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::store::{AnyClock, ManualClock};
    use crate::{Algorithm, Limit, Op, Policy, SubjectDigest};

    fn limit(name: &str, algorithm: Algorithm, n: u64, local: bool) -> Arc<Limit> {
        let policy = Policy {
            algorithm,
            limit: n,
            period: Duration::from_secs(60).as_micros() as u64,
            burst: if algorithm == Algorithm::Gcra { n } else { 0 },
            cost: 1,
            calendar: None,
        };
        Arc::new(Limit {
            local,
            ..Limit::new("r", name, policy)
        })
    }

    fn check(l: &Arc<Limit>) -> Check<'_> {
        Check {
            limit: l,
            subject: SubjectDigest::of(b'g', b""),
            op: Op::Decide,
        }
    }

    #[tokio::test]
    async fn a_request_the_remote_tier_refuses_gives_its_local_units_back() {
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra,
        ] {
            let clock = AnyClock::Manual(ManualClock::new(1_700_000_000_000_000));
            let tiered = Tiered::new(
                MemoryStore::with_clock(100, clock.clone()),
                MemoryStore::with_clock(100, clock),
            );
            let guard = limit("guard", alg, 3, true);
            let quota = limit("quota", Algorithm::FixedWindow, 1, false);
            let w = WorkerId::NONE;
            let both = [check(&guard), check(&quota)];
            let d = tiered.decide(&both, w).await.unwrap();
            assert!(d[0].allowed && d[1].allowed, "{alg:?}");
            // The quota refuses: the guard's unit goes back, every time.
            for _ in 0..5 {
                let d = tiered.decide(&both, w).await.unwrap();
                assert!(d[0].allowed && !d[1].allowed, "{alg:?}");
            }
            let d = tiered.decide(&both[..1], w).await.unwrap();
            assert_eq!(
                d[0].remaining, 1,
                "{alg:?}: one charge kept, the refused ones refunded"
            );
            // The guard refuses: the remote tier is not asked (its limit is unasked).
            tiered.decide(&both[..1], w).await.unwrap();
            let d = tiered.decide(&both, w).await.unwrap();
            assert!(!d[0].allowed && d[1].is_unasked(), "{alg:?}");
            assert_eq!(
                tiered.remote().len(),
                1,
                "the remote store holds only the quota"
            );
        }
    }

    /// A remote store that never answers (and decides nothing here).
    struct Never;
    impl Store for Never {
        async fn decide<L: AsLimit>(
            &self,
            _: &[Check<'_, L>],
            _: WorkerId,
        ) -> Result<Vec<Decision>, StoreError> {
            std::future::pending().await
        }
        async fn peek<L: AsLimit>(
            &self,
            _: &[Check<'_, L>],
            _: WorkerId,
        ) -> Result<Vec<Decision>, StoreError> {
            std::future::pending().await
        }
        async fn settle<L: AsLimit>(
            &self,
            _: &[Check<'_, L>],
            _: WorkerId,
        ) -> Result<(), StoreError> {
            Ok(())
        }
        async fn adjust<L: AsLimit>(
            &self,
            _: &Check<'_, L>,
            _: crate::adjust::Adjust,
        ) -> Result<(), StoreError> {
            Ok(())
        }
        fn is_up(&self) -> bool {
            true
        }
    }
    /// A client gone while the remote tier decides: its local charge goes back.
    #[tokio::test]
    async fn a_dropped_decision_gives_its_local_units_back() {
        let tiered = Tiered::new(MemoryStore::new(100), Never);
        let guard = limit("guard", Algorithm::FixedWindow, 3, true);
        let quota = limit("quota", Algorithm::FixedWindow, 3, false);
        let both = [check(&guard), check(&quota)];
        let gone = tokio::time::timeout(
            Duration::from_millis(10),
            tiered.decide(&both, WorkerId::NONE),
        )
        .await;
        assert!(gone.is_err());
        let local = tiered.local();
        let d = local.peek_now(&both[..1], local.now());
        assert_eq!(
            d[0].remaining, 2,
            "the charge was refunded on drop (3 − this request)"
        );
    }

    /// Decided without a future when it can be: the local limits alone, a local refusal, or a
    /// remote store that decides here too; when the remote store must be asked, nothing was
    /// charged (the local unit goes back) and `None` says so.
    #[test]
    fn decided_here_when_no_round_trip_is_needed() {
        let w = WorkerId::NONE;
        let guard = limit("guard", Algorithm::FixedWindow, 2, true);
        let quota = limit("quota", Algorithm::FixedWindow, 5, false);
        let both = [check(&guard), check(&quota)];
        let tiered = Tiered::new(MemoryStore::new(100), Never);
        assert!(
            tiered.decide_here(&both, w).is_none(),
            "the remote must be asked"
        );
        assert!(tiered.decide_here(&both[1..], w).is_none());
        let local = tiered.local();
        assert_eq!(
            local.peek_now(&both[..1], local.now())[0].remaining,
            1,
            "nothing kept of a decision that was not made here (2 − this request)"
        );
        let d = tiered.decide_here(&both[..1], w).unwrap().unwrap();
        assert!(d[0].allowed);
        tiered.decide_here(&both[..1], w).unwrap().unwrap();
        // The guard refuses: final here, the remote unasked.
        let d = tiered.decide_here(&both, w).unwrap().unwrap();
        assert!(!d[0].allowed && d[1].is_unasked());
        // A remote store that decides here: both tiers decided at once.
        let tiered = Tiered::new(MemoryStore::new(100), MemoryStore::new(100));
        let d = tiered.decide_here(&both, w).unwrap().unwrap();
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!(d[1].remaining, 4);
    }
}
