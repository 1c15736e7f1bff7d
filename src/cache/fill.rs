//! The copy of a response body made while the front streams it (the cache's observer of the
//! body, as [`crate::pipeline::BodyCharge`] is the charge's): fed the upstream's bytes as they
//! pass, stored when the body ends in full, dropped — and nothing stored — when it is cut or
//! outgrows `max_object_size` (what was copied is released at once; never more is held).

use std::sync::Arc;

use bytes::BytesMut;

use super::collapse::Lock;
use super::phase::Cache;
use super::store::Entry;

/// A response being copied into the cache.
pub struct Fill {
    cache: Arc<Cache>,
    key: Box<str>,
    /// The entry but for its body (`None` once stored or abandoned).
    entry: Option<Entry>,
    body: BytesMut,
    max: usize,
    /// The key's collapsing lock, released once the entry is stored (or abandoned).
    _lock: Option<Lock>,
}

impl Fill {
    pub(super) fn new(
        cache: Arc<Cache>,
        key: Box<str>,
        entry: Entry,
        max: u64,
        lock: Option<Lock>,
    ) -> Fill {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        Fill {
            cache,
            key,
            entry: Some(entry),
            body: BytesMut::new(),
            max,
            _lock: lock,
        }
    }

    /// The next bytes of the body as the upstream sent them.
    pub fn data(&mut self, bytes: &[u8]) {
        if self.entry.is_none() {
            return;
        }
        if self.body.len().saturating_add(bytes.len()) > self.max {
            // Outgrown: abandoned, its copy released now.
            self.entry = None;
            self.body = BytesMut::new();
            self._lock = None;
            return;
        }
        self.body.extend_from_slice(bytes);
    }

    /// The body ended in full: the response is stored.
    pub fn end(&mut self) {
        if let Some(mut entry) = self.entry.take() {
            entry.body = std::mem::take(&mut self.body).freeze();
            self.cache.insert(std::mem::take(&mut self.key), entry);
        }
        self._lock = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;

    fn fill(cache: &Arc<Cache>, key: &str, max: u64) -> Fill {
        let entry = Entry {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::new(),
            times: super::super::freshness::Times {
                request: 0,
                response: 0,
            },
            lifetime: 10,
            directives: Default::default(),
            vary: Vec::new(),
            tags: Box::default(),
        };
        Fill::new(Arc::clone(cache), key.into(), entry, max, None)
    }

    #[test]
    fn a_body_is_stored_at_its_end_only_and_within_its_bound() {
        let cache = Arc::new(Cache::new(&CacheConfig::default()));
        let mut f = fill(&cache, "a", 10);
        f.data(b"hello");
        assert!(cache.store.get("a").is_none(), "stored before its end");
        f.data(b"there");
        f.end();
        assert_eq!(&cache.store.get("a").unwrap().body[..], b"hellothere");
        // Outgrown: nothing stored, nothing held.
        let mut f = fill(&cache, "b", 10);
        f.data(b"hello");
        f.data(b"there!");
        assert_eq!(f.body.capacity(), 0);
        f.end();
        assert!(cache.store.get("b").is_none());
        // Cut (dropped before its end): nothing stored.
        let mut f = fill(&cache, "c", 10);
        f.data(b"x");
        drop(f);
        assert!(cache.store.get("c").is_none());
    }
}
