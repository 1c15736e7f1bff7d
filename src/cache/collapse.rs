//! Request collapsing (nginx's `proxy_cache_lock`): of concurrent misses of one key, the first
//! goes upstream and holds the key's lock while its response is stored; the others wait for
//! the lock's release (bounded by the route's `lock_timeout`), then look again — a hit, or
//! upstream themselves. The lock is a guard: however the first request ends (stored, not
//! storable, cut, cancelled), its drop wakes the waiters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// The keys being fetched, each with the channel its waiters watch (one entry per request in
/// flight that holds a lock: bounded by the requests in flight).
#[derive(Default)]
pub struct Locks {
    held: Mutex<HashMap<Box<str>, watch::Sender<()>>>,
}

/// A request's turn for a key.
pub enum Turn {
    /// It fetches: the others wait for this guard's drop.
    Lead(Lock),
    /// Another request fetches it: wait ([`wait`]).
    Wait(watch::Receiver<()>),
}

/// The lock of one key, released (its waiters woken) when dropped.
pub struct Lock {
    locks: Arc<Locks>,
    key: Box<str>,
}

impl Drop for Lock {
    fn drop(&mut self) {
        if let Ok(mut held) = self.locks.held.lock() {
            // Dropping the sender wakes every receiver.
            held.remove(&self.key);
        }
    }
}

impl Locks {
    /// The turn of a request for `key`.
    pub fn turn(self: &Arc<Self>, key: &str) -> Turn {
        let Ok(mut held) = self.held.lock() else {
            // A poisoned lock collapses nothing: every request leads.
            return Turn::Lead(Lock {
                locks: Arc::clone(self),
                key: Box::from(""),
            });
        };
        if let Some(tx) = held.get(key) {
            return Turn::Wait(tx.subscribe());
        }
        let (tx, _) = watch::channel(());
        held.insert(Box::from(key), tx);
        Turn::Lead(Lock {
            locks: Arc::clone(self),
            key: Box::from(key),
        })
    }
}

/// Waits for the leader's lock to be released, at most `timeout`: `true` when it was.
pub async fn wait(mut rx: watch::Receiver<()>, timeout: Duration) -> bool {
    // `changed` fails once the sender is gone: the release.
    matches!(
        tokio::time::timeout(timeout, rx.changed()).await,
        Ok(Err(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_leads_the_others_wait_for_its_guard() {
        let locks = Arc::new(Locks::default());
        let Turn::Lead(lock) = locks.turn("k") else {
            panic!("the first leads")
        };
        let Turn::Wait(rx) = locks.turn("k") else {
            panic!("the second waits")
        };
        // Another key is free.
        assert!(matches!(locks.turn("other"), Turn::Lead(_)));
        // Not released yet: the wait times out.
        assert!(!wait(rx.clone(), Duration::from_millis(10)).await);
        let waiter = tokio::spawn(wait(rx, Duration::from_secs(5)));
        drop(lock);
        assert!(waiter.await.unwrap());
        // Released: the next leads.
        assert!(matches!(locks.turn("k"), Turn::Lead(_)));
    }
}
