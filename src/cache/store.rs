//! The memory tier: stored responses by key in a `quick_cache` (CLOCK-Pro eviction: scan
//! resistant, no background thread, lock-striped shards), bounded by bytes and by entries at
//! once — each entry weighs its size, and never less than `max_bytes / max_entries`, so the
//! byte bound holds and no more than `max_entries` fit. Chosen over moka for its size (two
//! dependencies, no housekeeping thread) and its synchronous, lock-striped API: a hit is one
//! shard read lock and an `Arc` clone.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};
use http::StatusCode;

use super::control::Directives;
use super::freshness::Times;
use crate::config::CacheConfig;

/// A stored response.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    /// Its fields as stored ([`super::key::stored_fields`]).
    pub headers: HeaderMap,
    /// The whole body, as the upstream sent it (its own `Content-Encoding`, if any).
    pub body: Bytes,
    pub times: Times,
    /// Its freshness lifetime in seconds, worked out when stored (or freshened).
    pub lifetime: u64,
    /// Its `Cache-Control`.
    pub directives: Directives,
    /// The request's values of the fields it varies on.
    pub vary: Vec<(HeaderName, Option<Box<str>>)>,
    /// Its tags (`[cache] tag_header`'s values), for a purge by tag: set when it is stored.
    pub tags: Box<[Box<str>]>,
}

impl Entry {
    /// What the entry takes in memory, roughly: its body, fields and key.
    fn size(&self, key: &str) -> u64 {
        let fields: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 32)
            .sum();
        let tags: usize = self.tags.iter().map(|t| t.len() + 16).sum();
        (self.body.len() + fields + tags + key.len() + 256) as u64
    }

    /// Whether `tag` is one of its tags.
    pub fn tagged(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| &**t == tag)
    }
}

/// The tags a response's `name` fields list: separated by commas or spaces (Cloudflare's
/// `Cache-Tag` takes commas, Fastly's `Surrogate-Key` spaces), each once.
pub fn tags_of(headers: &HeaderMap, name: &HeaderName) -> Box<[Box<str>]> {
    let mut tags: Vec<Box<str>> = Vec::new();
    for value in headers.get_all(name) {
        let Ok(text) = value.to_str() else { continue };
        for t in text.split([',', ' ', '\t']).filter(|t| !t.is_empty()) {
            if !tags.iter().any(|have| &**have == t) {
                tags.push(t.into());
            }
        }
    }
    tags.into_boxed_slice()
}

#[derive(Clone)]
struct Weigh {
    floor: u64,
}

impl quick_cache::Weighter<Box<str>, Arc<Entry>> for Weigh {
    fn weight(&self, key: &Box<str>, e: &Arc<Entry>) -> u64 {
        e.size(key).max(self.floor)
    }
}

/// The stored responses of every route.
pub struct Store {
    map: quick_cache::sync::Cache<Box<str>, Arc<Entry>, Weigh>,
    /// `[cache]` as the store was built for (a reload with other bounds builds another).
    pub config: CacheConfig,
}

impl Store {
    pub fn new(config: &CacheConfig) -> Store {
        let floor = (config.max_bytes / config.max_entries).max(1);
        // Shards of at least 4 objects of the largest size a route may store.
        let largest = config.defaults.max_object_size.max(1);
        let mut shards = 1usize;
        while shards < 16 && config.max_bytes / (shards as u64 * 2) >= largest.saturating_mul(4) {
            shards *= 2;
        }
        let items = usize::try_from(config.max_entries.min(1 << 20)).unwrap_or(1 << 20);
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(items)
            .weight_capacity(config.max_bytes)
            .shards(shards)
            .build()
            .unwrap_or_else(|_| {
                quick_cache::OptionsBuilder::new()
                    .estimated_items_capacity(1024)
                    .weight_capacity(config.max_bytes)
                    .build()
                    .expect("a capacity alone is valid options")
            });
        Store {
            map: quick_cache::sync::Cache::with_options(
                options,
                Weigh { floor },
                Default::default(),
                Default::default(),
            ),
            config: config.clone(),
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        self.map.get(key)
    }

    /// The entry under `key`, its place in the eviction order untouched (`/-/explain`).
    pub fn peek(&self, key: &str) -> Option<Arc<Entry>> {
        self.map.peek(key)
    }

    /// Stores `entry` under `key` (replacing what was there), with the tags its fields list;
    /// an entry larger than a shard holds is not stored. The entry as stored.
    pub fn insert(&self, key: Box<str>, mut entry: Entry) -> Arc<Entry> {
        entry.tags = tags_of(&entry.headers, &self.config.tag_header);
        let entry = Arc::new(entry);
        self.promote(key, Arc::clone(&entry));
        entry
    }

    /// Stores an entry read from the disk tier (its tags as they were stored).
    pub fn promote(&self, key: Box<str>, entry: Arc<Entry>) {
        self.map.insert(key, entry);
        self.gauges();
    }

    pub fn remove(&self, key: &str) -> bool {
        let gone = self.map.remove(key).is_some();
        if gone {
            self.gauges();
        }
        gone
    }

    /// Removes every entry whose key `matches`; how many went.
    pub fn remove_if(&self, matches: impl Fn(&str) -> bool) -> usize {
        self.remove_where(|k, _| matches(k)).len()
    }

    /// Removes every entry tagged `tag`; how many went.
    pub fn remove_tagged(&self, tag: &str) -> usize {
        self.remove_where(|_, e| e.tagged(tag)).len()
    }

    /// Removes every entry for which `matches` holds; their keys.
    pub fn remove_where(&self, matches: impl Fn(&str, &Entry) -> bool) -> Vec<Box<str>> {
        let gone = std::sync::Mutex::new(Vec::new());
        self.map.retain(|k, e| {
            let m = matches(k, e);
            if m {
                if let Ok(mut g) = gone.lock() {
                    g.push(k.clone());
                }
            }
            !m
        });
        self.gauges();
        gone.into_inner().unwrap_or_default()
    }

    /// (Entries, bytes as weighed.)
    pub fn usage(&self) -> (usize, u64) {
        (self.map.len(), self.map.weight())
    }

    fn gauges(&self) {
        let (entries, bytes) = self.usage();
        crate::metrics::cache_stored(entries, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: usize) -> Entry {
        Entry {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from(vec![b'x'; body]),
            times: Times {
                request: 0,
                response: 0,
            },
            lifetime: 60,
            directives: Directives::default(),
            vary: Vec::new(),
            tags: Box::default(),
        }
    }

    #[test]
    fn the_store_stays_within_its_bytes_and_its_entries() {
        let config = CacheConfig {
            max_bytes: 1 << 20,
            max_entries: 100,
            ..CacheConfig::default()
        };
        let store = Store::new(&config);
        // Ten times the bytes: never more than the bound.
        for i in 0..200 {
            store.insert(format!("k{i}").into(), entry(50_000));
            assert!(store.usage().1 <= config.max_bytes);
        }
        // Many small ones: never more than the entries.
        for i in 0..1000 {
            store.insert(format!("s{i}").into(), entry(10));
            assert!(store.usage().0 <= 100, "{:?}", store.usage());
        }
        store.insert("http://a/x?1".into(), entry(10));
        store.insert("http://a/y".into(), entry(10));
        assert!(store.get("http://a/y").is_some());
        assert_eq!(store.remove_if(|k| k.starts_with("http://a/")), 2);
        assert!(store.get("http://a/y").is_none());
    }
}
