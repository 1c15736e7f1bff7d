//! The penalty box of a limit with `ban_after` and `ban_for`: a subject refused `ban_after`
//! times within the limit's period is refused outright for `ban_for`, answered from this
//! gateway's memory without asking the store (fail2ban's jail, Cloudflare's mitigation timeout).
//! On a shared store the ban this gateway starts is written there ([`Store::ban`]) and read by
//! every gateway's decision of the limit; a ban read so is held here too ([`Bans::hold`]), and a
//! task watches for bans lifted elsewhere ([`Bans::watch`]).
//!
//! Pure bookkeeping over injected time (`now` in µs is the caller's: the store's clock, so tests
//! move it): per subject, the start of its current count of refusals, the count, and the end of
//! its ban. Bounded: at most [`MAX_SUBJECTS`] subjects are tracked per limit (expired entries
//! are dropped first; past that a new subject is not tracked, so it is never banned — failing
//! open rather than growing). Sharded so that two workers rarely meet on one lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_limit::store::{AnyStore, Store};

use super::{Micros, SubjectDigest};

/// The most subjects one limit tracks.
pub const MAX_SUBJECTS: usize = 100_000;

const SHARDS: usize = 16;

/// One shard: subjects (their digests) to their entries.
type Shard = Mutex<HashMap<[u8; 16], Entry>>;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// When the current count of refusals started.
    since: Micros,
    refusals: u32,
    /// The ban's end (0: not banned).
    until: Micros,
    /// When the limit itself stops refusing the subject, as the refusal that started the ban
    /// said (0: not known): a ban shorter than the limit's own refusal answers with the later
    /// of the two, so that a client retrying when told is not refused again.
    refused_until: Micros,
}

/// One limit's penalty box.
#[derive(Debug)]
pub struct Bans {
    shards: Box<[Shard]>,
    /// Whether a task watches the store for fleet-wide lifts ([`Bans::watch`]).
    watching: AtomicBool,
}

impl Default for Bans {
    fn default() -> Bans {
        Bans {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            watching: AtomicBool::new(false),
        }
    }
}

/// How often a gateway holding bans asks a shared store whether they were lifted elsewhere.
pub const LIFT_POLL: Duration = Duration::from_secs(1);

/// The rule: `after` refusals within `window` µs ban for `ban` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub after: u32,
    pub window: Micros,
    pub ban: Micros,
}

impl Bans {
    fn shard(&self, s: &SubjectDigest) -> &Shard {
        &self.shards[usize::from(s.0[0]) % SHARDS]
    }

    /// When `subject` is banned at `now`: the ban's end.
    pub fn banned(&self, subject: &SubjectDigest, now: Micros) -> Option<Micros> {
        self.refusing(subject, now).map(|(until, _)| until)
    }

    /// When `subject` is banned at `now`: the ban's end, and when a retry is admitted — the
    /// later of the ban's end and the end of the limit's own refusal that started it.
    pub fn refusing(&self, subject: &SubjectDigest, now: Micros) -> Option<(Micros, Micros)> {
        let map = self.shard(subject).lock().ok()?;
        map.get(&subject.0)
            .filter(|e| e.until > now)
            .map(|e| (e.until, e.until.max(e.refused_until)))
    }

    /// Records a refusal of `subject` at `now` by a limit that refuses it until
    /// `refused_until`; `Some(end)` when it starts a ban.
    pub fn refused(
        &self,
        subject: &SubjectDigest,
        now: Micros,
        rule: Rule,
        refused_until: Micros,
    ) -> Option<Micros> {
        let mut map = self.shard(subject).lock().ok()?;
        if !map.contains_key(&subject.0) && map.len() >= MAX_SUBJECTS / SHARDS {
            map.retain(|_, e| e.until > now || now.saturating_sub(e.since) < rule.window);
            if map.len() >= MAX_SUBJECTS / SHARDS {
                return None;
            }
        }
        let e = map.entry(subject.0).or_default();
        if e.until > now {
            return None;
        }
        if e.refusals == 0 || now.saturating_sub(e.since) >= rule.window {
            e.since = now;
            e.refusals = 0;
        }
        e.refusals = e.refusals.saturating_add(1);
        if e.refusals < rule.after {
            return None;
        }
        e.refusals = 0;
        e.until = now.saturating_add(rule.ban);
        e.refused_until = refused_until;
        Some(e.until)
    }

    /// Holds a ban of `subject` until `until` that this gateway did not start (read from the
    /// store: another gateway started it), answered from memory from now on; `false` when the
    /// box is full.
    pub fn hold(&self, subject: &SubjectDigest, now: Micros, until: Micros) -> bool {
        let Ok(mut map) = self.shard(subject).lock() else {
            return false;
        };
        if !map.contains_key(&subject.0) && map.len() >= MAX_SUBJECTS / SHARDS {
            map.retain(|_, e| e.until > now);
            if map.len() >= MAX_SUBJECTS / SHARDS {
                return false;
            }
        }
        let e = map.entry(subject.0).or_default();
        e.refusals = 0;
        e.until = e.until.max(until);
        e.refused_until = 0;
        true
    }

    /// Starts (unless one runs) the task that lifts this box's bans when they are lifted
    /// fleet-wide (`POST /-/quota/reset` on any gateway: [`Store::ban_lifts`] changes), asking
    /// the store every [`LIFT_POLL`] while the box holds a ban, never on a request's path. In
    /// process (a memory store) there is nothing to watch.
    pub fn watch(self: &Arc<Bans>, store: &Arc<AnyStore>, limit: &tollgate_limit::Limit) {
        if matches!(**store, AnyStore::Memory(_)) || limit.local {
            return;
        }
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let (bans, store) = (Arc::downgrade(self), Arc::clone(store));
        let limit = Arc::new(limit.clone());
        tokio::spawn(async move {
            let mut seen: Option<u64> = None;
            loop {
                let Some(b) = bans.upgrade() else { return };
                if b.list(store.local().now(), 1).is_empty() {
                    b.watching.store(false, Ordering::Release);
                    // A ban held since: watch on (unless another task took over).
                    if b.list(store.local().now(), 1).is_empty()
                        || b.watching.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                }
                if let Ok(n) = store.ban_lifts(&limit).await {
                    if seen.is_some_and(|s| s != n) {
                        let lifted = b.lift(None);
                        tracing::info!(
                            limit = &*limit.name,
                            lifted,
                            "bans lifted by another gateway"
                        );
                    }
                    seen = Some(n);
                }
                drop(b);
                tokio::time::sleep(LIFT_POLL).await;
            }
        });
    }

    /// The subjects banned at `now`, with their bans' ends (for `/-/top`), longest first, at
    /// most `n`.
    pub fn list(&self, now: Micros, n: usize) -> Vec<(SubjectDigest, Micros)> {
        let mut out: Vec<(SubjectDigest, Micros)> = self
            .shards
            .iter()
            .filter_map(|s| s.lock().ok())
            .flat_map(|m| {
                m.iter()
                    .filter(|(_, e)| e.until > now)
                    .map(|(k, e)| (SubjectDigest(*k), e.until))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0 .0.cmp(&b.0 .0)));
        out.truncate(n);
        out
    }

    /// Lifts every ban and forgets every count (`subject`: only its own).
    pub fn lift(&self, subject: Option<&SubjectDigest>) -> usize {
        let mut lifted = 0;
        for s in self.shards.iter() {
            let Ok(mut m) = s.lock() else { continue };
            match subject {
                Some(sub) => lifted += usize::from(m.remove(&sub.0).is_some()),
                None => {
                    lifted += m.len();
                    m.clear();
                }
            }
        }
        lifted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        after: 3,
        window: 1_000_000,
        ban: 60_000_000,
    };

    #[test]
    fn n_refusals_within_the_window_ban() {
        let b = Bans::default();
        let s = SubjectDigest([7; 16]);
        assert_eq!(b.refused(&s, 0, RULE, 0), None);
        assert_eq!(b.refused(&s, 500_000, RULE, 0), None);
        // The window passed: the count starts again.
        assert_eq!(b.refused(&s, 1_200_000, RULE, 0), None);
        assert_eq!(b.refused(&s, 1_300_000, RULE, 0), None);
        assert_eq!(b.banned(&s, 1_300_000), None);
        assert_eq!(b.refused(&s, 1_400_000, RULE, 2_000_000), Some(61_400_000));
        assert_eq!(b.banned(&s, 1_400_001), Some(61_400_000));
        // The limit's refusal ends before the ban: the ban's end.
        assert_eq!(b.refusing(&s, 1_400_001), Some((61_400_000, 61_400_000)));
        assert_eq!(b.banned(&s, 61_400_000), None);
        assert_eq!(b.list(2_000_000, 10), vec![(s, 61_400_000)]);
        let other = SubjectDigest([8; 16]);
        assert_eq!(b.banned(&other, 2_000_000), None);
        assert_eq!(b.lift(None), 1);
        assert_eq!(b.banned(&s, 2_000_000), None);
    }

    /// A ban shorter than the limit's own refusal that started it: a retry is admitted at the
    /// later of the two ends.
    #[test]
    fn a_short_ban_answers_with_the_limits_longer_refusal() {
        let b = Bans::default();
        let s = SubjectDigest([9; 16]);
        let rule = Rule {
            ban: 2_000_000,
            ..RULE
        };
        assert_eq!(b.refused(&s, 0, rule, 3_600_000_000), None);
        assert_eq!(b.refused(&s, 1, rule, 3_600_000_000), None);
        assert_eq!(b.refused(&s, 2, rule, 3_600_000_000), Some(2_000_002));
        assert_eq!(b.refusing(&s, 10), Some((2_000_002, 3_600_000_000)));
        assert_eq!(b.refusing(&s, 2_000_002), None);
    }
}
