//! The cache phase of the life cycle (`pipeline::cycle`), for every front: after admission a
//! request is looked up ([`lookup`]) — a stored response that may answer it is a [`Hit`]
//! (rendered by `pipeline::drive::cached`), else it is forwarded ([`Forward`]): with the
//! conditions that revalidate a stored response, holding its key's collapsing lock, and with
//! what decides, once the upstream's head arrives ([`Forward::respond`]), whether its body is
//! copied into the store ([`Fill`]), a `304` freshens the stored response, a failure is
//! answered stale (`stale-if-error`), or an unsafe method invalidates the URL (§4.4).

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{
    HeaderMap, HeaderName, AUTHORIZATION, CACHE_CONTROL, CONTENT_LOCATION, ETAG, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, LAST_MODIFIED, LOCATION, RANGE,
};
use http::{Method, StatusCode};

use super::collapse::{self, Lock, Locks, Turn};
use super::control::Directives;
use super::disk::{Disk, DiskError};
use super::fill::Fill;
use super::freshness::{self, Times, Use};
use super::key;
use super::store::{Entry, Store};
use crate::config::{CacheConfig, RouteCacheConfig};
use crate::http::head::{header_str, RequestHead};
use crate::metrics::{CacheCounters, CacheStatus};
use crate::pipeline::{Edit, Edits, Trail};

/// The HTTP cache of a gateway: the stored responses (in memory, and on disk behind it) and
/// the keys being fetched.
pub struct Cache {
    pub store: Store,
    /// The disk tier (`[cache] disk_path`).
    pub disk: Option<Arc<Disk>>,
    pub locks: Arc<Locks>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (entries, bytes) = self.store.usage();
        f.debug_struct("Cache")
            .field("entries", &entries)
            .field("bytes", &bytes)
            .finish()
    }
}

impl Cache {
    /// A cache of the memory tier alone.
    pub fn new(config: &CacheConfig) -> Cache {
        Cache {
            store: Store::new(config),
            disk: None,
            locks: Arc::new(Locks::default()),
        }
    }

    /// A cache with the disk tier `config` asks for: `previous`'s (another cache's, kept
    /// across a reload) when it is of the same directory, its bound updated, else opened.
    pub fn open(config: &CacheConfig, previous: Option<&Cache>) -> Result<Cache, DiskError> {
        let disk = match &config.disk {
            None => None,
            Some(d) => match previous.and_then(|p| p.disk.as_ref()) {
                Some(old) if old.dir() == d.path => {
                    old.set_max_bytes(d.max_bytes);
                    Some(Arc::clone(old))
                }
                _ => Some(Disk::open(d)?),
            },
        };
        Ok(Cache {
            store: Store::new(config),
            disk,
            locks: Arc::new(Locks::default()),
        })
    }

    /// Stores `entry` under `key`: in memory, and queued for the disk tier.
    pub fn insert(&self, key: Box<str>, entry: Entry) -> Arc<Entry> {
        let entry = self.store.insert(key.clone(), entry);
        if let Some(disk) = &self.disk {
            disk.store(&key, Arc::clone(&entry));
        }
        entry
    }

    /// The entry stored under `key`: from memory, else from disk (then promoted to memory);
    /// whether it came from disk.
    pub async fn get(&self, key: &str) -> Option<(Arc<Entry>, bool)> {
        if let Some(e) = self.store.get(key) {
            return Some((e, false));
        }
        let entry = Arc::new(self.disk.as_ref()?.get(key).await?);
        self.store.promote(key.into(), Arc::clone(&entry));
        Some((entry, true))
    }

    /// Removes `key`'s entry from both tiers.
    pub fn remove(&self, key: &str) {
        self.store.remove(key);
        if let Some(disk) = &self.disk {
            disk.remove(key);
        }
    }

    /// Waits until the disk tier knows every file of its directory (see [`Disk::loaded`]).
    pub async fn loaded(&self) {
        if let Some(disk) = &self.disk {
            disk.loaded().await;
        }
    }

    /// Removes from both tiers every entry whose key and tags `matches`; how many keys went.
    pub fn remove_where(&self, matches: impl Fn(&str, &[Box<str>]) -> bool) -> usize {
        let mut gone = self.store.remove_where(|k, e| matches(k, &e.tags));
        if let Some(disk) = &self.disk {
            gone.extend(disk.remove_matching(&matches));
            gone.sort_unstable();
            gone.dedup();
        }
        gone.len()
    }
}

/// A route's use of the cache: its rules and its counters.
#[derive(Debug)]
pub struct RouteCache {
    pub config: Arc<RouteCacheConfig>,
    pub counts: CacheCounters,
}

/// The time the cache reads, in seconds since the epoch: the gateway's clock (the injected
/// one in tests).
pub fn now(clock: &tollgate_limit::store::AnyClock) -> u64 {
    use tollgate_limit::store::Clock as _;
    clock.now() / 1_000_000
}

/// What the request's own conditions ask (`If-None-Match`, `If-Modified-Since`), for a
/// response served from the cache.
#[derive(Debug, Default)]
pub struct Conditions {
    if_none_match: Option<Box<str>>,
    if_modified_since: Option<u64>,
}

impl Conditions {
    fn of(head: &impl RequestHead) -> Conditions {
        let text = |n| {
            let v: Vec<&str> = head.header_values(n).filter_map(header_str).collect();
            (!v.is_empty()).then(|| v.join(",").into_boxed_str())
        };
        Conditions {
            if_none_match: text(&IF_NONE_MATCH),
            if_modified_since: head
                .header_value(&IF_MODIFIED_SINCE)
                .and_then(header_str)
                .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
        }
    }

    /// Whether a stored response with `headers` answers the request `304` (RFC 9110 §13.1.2,
    /// §13.1.3: `If-None-Match` by weak comparison, else `If-Modified-Since`).
    fn not_modified(&self, headers: &HeaderMap) -> bool {
        if let Some(inm) = &self.if_none_match {
            let Some(etag) = headers.get(ETAG).and_then(|v| v.to_str().ok()) else {
                return false;
            };
            let weak = |t: &str| t.trim().trim_start_matches("W/").to_owned();
            return inm
                .split(',')
                .any(|t| t.trim() == "*" || weak(t) == weak(etag));
        }
        match (
            self.if_modified_since,
            freshness::http_date(headers, &LAST_MODIFIED),
        ) {
            (Some(since), Some(lm)) => lm <= since,
            _ => false,
        }
    }
}

/// A stored response answering a request.
pub struct Hit {
    pub entry: Arc<Entry>,
    /// Its current age (seconds).
    pub age: u64,
    /// Answered `304` (the request's conditions hold for it).
    pub not_modified: bool,
    /// The `Cache-Status` field's value.
    pub cache_status: String,
    /// How it was served (the metric's label, the access log's field).
    pub status: CacheStatus,
}

/// What the cache phase made of a request.
pub enum Looked<'s> {
    /// Answered from the store.
    Hit(Hit),
    /// `only-if-cached` and nothing stored may answer: 504.
    NotCached,
    /// Forwarded upstream.
    /// (Boxed: a request that is forwarded holds it across its attempts, and one on a route
    /// without a cache holds a pointer's worth of nothing.)
    Forward(Box<Forward<'s>>),
}

/// Whether `method` may change the resource (RFC 9110 §9.2.1's unsafe methods).
fn unsafe_method(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// The cache phase of a request admitted on a route that caches ([`RouteCache`]): a hit, a
/// refusal (`only-if-cached`), or the request forwarded with what its response will do.
#[allow(clippy::too_many_arguments)]
pub async fn lookup<'s>(
    cache: &Arc<Cache>,
    route: &'s RouteCache,
    head: &impl RequestHead,
    tls: bool,
    trail: &Trail<'_>,
    client: IpAddr,
    now: u64,
) -> Looked<'s> {
    let rc = &*route.config;
    let method = head.method();
    let key = key::key(head, tls, &rc.key, trail, client);
    let mut forward = Forward {
        cache: Arc::clone(cache),
        route,
        key: key.clone().map(String::into_boxed_str),
        store: false,
        invalidate: false,
        stored: None,
        lock: None,
        request: Directives::default(),
        authorized: false,
        varied: None,
        request_time: now,
        fwd: "bypass",
        status: CacheStatus::Bypass,
        conditions: Conditions::default(),
        head_request: *method == Method::HEAD,
    };
    let cached_method = (*method == Method::GET && rc.get) || (*method == Method::HEAD && rc.head);
    let Some(key) = key.filter(|_| cached_method) else {
        forward.invalidate = unsafe_method(method);
        route.counts.count(CacheStatus::Bypass);
        return Looked::Forward(Box::new(forward));
    };
    // A range is forwarded as it is (ranges are neither stored nor served from the store).
    if head.header_value(&RANGE).is_some() {
        route.counts.count(CacheStatus::Bypass);
        return Looked::Forward(Box::new(forward));
    }
    let request = Directives::parse(head.header_values(&CACHE_CONTROL));
    forward.conditions = Conditions::of(head);
    forward.authorized = head.header_value(&AUTHORIZATION).is_some();
    forward.store = *method == Method::GET && !request.no_store;
    if forward.store {
        forward.varied = key::request_fields(head);
    }
    let mut waited = false;
    loop {
        let stored = cache.get(&key).await.filter(|(e, _)| {
            e.vary
                .iter()
                .all(|(n, v)| key::request_value(head, n) == *v)
        });
        let mut fwd = "miss";
        if let Some((entry, from_disk)) = stored {
            let age = freshness::current_age(&entry.headers, entry.times, now);
            let used = freshness::usable(&request, &entry.directives, entry.lifetime, age);
            let serve = match used {
                Use::Fresh => Some((CacheStatus::Hit, "hit")),
                Use::Stale => Some((CacheStatus::Stale, "hit")),
                // Served stale while one request revalidates it (the one that takes the
                // key's lock); the others get it stale.
                Use::StaleRevalidating => match cache.locks.turn(&key) {
                    Turn::Wait(_) => Some((CacheStatus::Stale, "hit")),
                    Turn::Lead(lock) => {
                        forward.lock = Some(lock);
                        None
                    }
                },
                Use::Revalidate => None,
            };
            if let Some((status, _)) = serve {
                let status = if waited && status == CacheStatus::Hit {
                    CacheStatus::Collapsed
                } else {
                    status
                };
                route.counts.count(status);
                let mut hit = hit(entry, age, &forward.conditions, status);
                if from_disk {
                    hit.cache_status.push_str("; detail=disk");
                }
                return Looked::Hit(hit);
            }
            if request.only_if_cached {
                route.counts.count(CacheStatus::Bypass);
                return Looked::NotCached;
            }
            fwd = "stale";
            // Revalidated with its validators (if it has any), or answering a failure.
            forward.stored = Some(entry);
        } else if request.only_if_cached {
            route.counts.count(CacheStatus::Bypass);
            return Looked::NotCached;
        }
        if request.no_cache {
            fwd = "request";
        }
        // Collapsing: a GET miss takes the key's lock, or waits for its holder once.
        if forward.lock.is_none() && forward.store && !waited && !rc.rules.lock_timeout.is_zero() {
            match cache.locks.turn(&key) {
                Turn::Lead(lock) => forward.lock = Some(lock),
                Turn::Wait(rx) => {
                    collapse::wait(rx, rc.rules.lock_timeout).await;
                    waited = true;
                    continue;
                }
            }
        }
        forward.fwd = fwd;
        forward.status = if forward.stored.is_some() {
            CacheStatus::Stale
        } else {
            CacheStatus::Miss
        };
        forward.request = request;
        return Looked::Forward(Box::new(forward));
    }
}

/// What the cache would make of a request (`/-/explain`), read without changing anything: no
/// entry promoted or moved in an eviction order, no lock taken, nothing counted or fetched.
#[derive(Debug)]
pub struct Peek {
    /// The request's key (`None`: it names no host).
    pub key: Option<String>,
    /// `hit` (a fresh stored response answers), `stale` (a stale one answers, or is
    /// revalidated first: [`Peek::revalidate`]), `miss` (nothing stored may answer it: it goes
    /// upstream), `bypass` (not looked up: another method, a range, no host).
    pub status: &'static str,
    /// Whether the stored response is revalidated with the upstream before it answers.
    pub revalidate: bool,
    /// The stored response's age and the seconds it stays fresh (negative: stale for so long).
    pub age: Option<u64>,
    pub ttl: Option<i128>,
    /// Where it is stored: `memory` or `disk`.
    pub tier: Option<&'static str>,
}

/// [`Peek`]s the request `head` on a caching route at `now`.
pub async fn peek(
    cache: &Cache,
    route: &RouteCache,
    head: &impl RequestHead,
    tls: bool,
    trail: &Trail<'_>,
    client: IpAddr,
    now: u64,
) -> Peek {
    let rc = &*route.config;
    let method = head.method();
    let key = key::key(head, tls, &rc.key, trail, client);
    let mut peek = Peek {
        key: key.clone(),
        status: "bypass",
        revalidate: false,
        age: None,
        ttl: None,
        tier: None,
    };
    let cached_method = (*method == Method::GET && rc.get) || (*method == Method::HEAD && rc.head);
    let Some(key) = key.filter(|_| cached_method) else {
        return peek;
    };
    if head.header_value(&RANGE).is_some() {
        return peek;
    }
    peek.status = "miss";
    let stored = match cache.store.peek(&key) {
        Some(e) => Some((e, "memory")),
        None => match &cache.disk {
            Some(disk) => disk.peek(&key).await.map(|e| (Arc::new(e), "disk")),
            None => None,
        },
    };
    let Some((entry, tier)) = stored else {
        return peek;
    };
    if !entry
        .vary
        .iter()
        .all(|(n, v)| key::request_value(head, n) == *v)
    {
        // Another variant: a miss that would replace it.
        return peek;
    }
    let request = Directives::parse(head.header_values(&CACHE_CONTROL));
    let age = freshness::current_age(&entry.headers, entry.times, now);
    peek.age = Some(age);
    peek.ttl = Some(i128::from(entry.lifetime) - i128::from(age));
    peek.tier = Some(tier);
    match freshness::usable(&request, &entry.directives, entry.lifetime, age) {
        Use::Fresh => peek.status = "hit",
        Use::Stale | Use::StaleRevalidating => peek.status = "stale",
        Use::Revalidate => {
            peek.status = "stale";
            peek.revalidate = true;
        }
    }
    peek
}

/// `entry` as the answer to a request with `conditions`.
fn hit(entry: Arc<Entry>, age: u64, conditions: &Conditions, status: CacheStatus) -> Hit {
    let ttl = i128::from(entry.lifetime) - i128::from(age);
    let mut cache_status = format!("tollgate; hit; ttl={ttl}");
    if status == CacheStatus::Collapsed {
        cache_status.push_str("; collapsed");
    }
    Hit {
        not_modified: conditions.not_modified(&entry.headers),
        entry,
        age,
        cache_status,
        status,
    }
}

/// A request forwarded by the cache phase, and what its response will do there.
pub struct Forward<'s> {
    cache: Arc<Cache>,
    route: &'s RouteCache,
    key: Option<Box<str>>,
    /// The response may be stored (a `GET` without `no-store` on a caching route).
    store: bool,
    /// An unsafe method: a non-error response invalidates the URL (§4.4).
    invalidate: bool,
    /// The stored response being revalidated (it has a validator).
    stored: Option<Arc<Entry>>,
    lock: Option<Lock>,
    request: Directives,
    authorized: bool,
    /// The request's fields, for the values of those the response varies on (`None`: the
    /// front cannot list them).
    varied: Option<Vec<(HeaderName, Box<str>)>>,
    request_time: u64,
    /// `Cache-Status`'s `fwd` parameter.
    fwd: &'static str,
    status: CacheStatus,
    conditions: Conditions,
    head_request: bool,
}

/// What the upstream's response head made of a forwarded request.
pub enum Outcome {
    /// Relayed, its body copied into the store as it streams; the `Cache-Status` value.
    Fill(Box<Fill>, String),
    /// Relayed, not stored; the `Cache-Status` value (`None`: the request bypassed the cache).
    Relay(Option<String>),
    /// Answered from the store in its place (a `304` freshened it, or a failure is answered
    /// stale).
    Serve(Hit),
}

impl Forward<'_> {
    /// The request's upstream head, for the cache: a revalidation's conditions from the stored
    /// response's validators, in place of the client's (which are answered from the stored
    /// response). A plain miss forwards the client's own (a `304` is relayed, not stored).
    pub fn edit(&self, edits: &mut Edits) {
        if !self.store {
            return;
        }
        if let Some(stored) = &self.stored {
            edits.headers.push(Edit::Remove(IF_NONE_MATCH));
            edits.headers.push(Edit::Remove(IF_MODIFIED_SINCE));
            if let Some(etag) = stored.headers.get(ETAG) {
                edits.headers.push(Edit::Set(IF_NONE_MATCH, etag.clone()));
            }
            if let Some(lm) = stored.headers.get(LAST_MODIFIED) {
                edits.headers.push(Edit::Set(IF_MODIFIED_SINCE, lm.clone()));
            }
        }
    }

    /// The upstream failed (no response): the stored response, when it may answer a failure
    /// (`stale-if-error`, RFC 5861 §4).
    pub fn failed(self, now: u64) -> Option<Hit> {
        let stored = self.stored.as_ref()?;
        let age = freshness::current_age(&stored.headers, stored.times, now);
        if !freshness::stale_if_error(&self.request, &stored.directives, stored.lifetime, age) {
            return None;
        }
        self.route.counts.count(CacheStatus::Stale);
        let mut hit = hit(
            Arc::clone(stored),
            age,
            &self.conditions,
            CacheStatus::Stale,
        );
        hit.cache_status = "tollgate; hit; fwd=stale".to_owned();
        Some(hit)
    }

    /// How the request is counted when its response is relayed (`miss`, `stale`, `bypass`).
    pub fn status(&self) -> CacheStatus {
        self.status
    }

    /// What the upstream's response head (`status`, `headers`, its body's length if known)
    /// makes of the request at `now`.
    pub fn respond(
        self,
        status: StatusCode,
        headers: &HeaderMap,
        length: Option<u64>,
        now: u64,
    ) -> Outcome {
        let cache_status = |extra: &str| {
            let mut s = format!("tollgate; fwd={}; fwd-status={}", self.fwd, status.as_u16());
            s.push_str(extra);
            s
        };
        if self.invalidate {
            if status.is_success() || status.is_redirection() {
                if let Some(key) = &self.key {
                    self.cache.remove(key);
                    // The URLs its `Location` and `Content-Location` name, of the same
                    // origin, with the same extra key parts.
                    let url = key::url_of(key);
                    let parts = &key[url.len()..];
                    for name in [LOCATION, CONTENT_LOCATION] {
                        let named = headers.get(name).and_then(|v| v.to_str().ok());
                        if let Some(target) = named.and_then(|l| key::same_origin(url, l)) {
                            self.cache.remove(&format!("{target}{parts}"));
                        }
                    }
                }
            }
            return Outcome::Relay(None);
        }
        if self.head_request {
            self.route.counts.count(self.status);
            return Outcome::Relay(Some(cache_status("")));
        }
        if let Some(stored) = &self.stored {
            if status == StatusCode::NOT_MODIFIED {
                let mut headers_now = stored.headers.clone();
                freshness::freshen(&mut headers_now, headers);
                let directives = Directives::parse(
                    headers_now
                        .get_all(CACHE_CONTROL)
                        .iter()
                        .map(|v| v.as_bytes()),
                );
                let times = Times {
                    request: self.request_time,
                    response: now,
                };
                let rules = &self.route.config.rules;
                let entry = Entry {
                    status: stored.status,
                    lifetime: freshness::lifetime(&directives, &headers_now, now, rules),
                    headers: headers_now,
                    body: stored.body.clone(),
                    times,
                    directives,
                    vary: stored.vary.clone(),
                    tags: Box::default(),
                };
                let entry = Arc::new(entry);
                if let Some(key) = &self.key {
                    self.cache.insert(key.clone(), Entry::clone_of(&entry));
                }
                self.route.counts.count(CacheStatus::Revalidated);
                let age = freshness::current_age(&entry.headers, entry.times, now);
                let mut hit = hit(entry, age, &self.conditions, CacheStatus::Revalidated);
                hit.cache_status = cache_status("; stored");
                return Outcome::Serve(hit);
            }
            if status.is_server_error() {
                let age = freshness::current_age(&stored.headers, stored.times, now);
                if freshness::stale_if_error(
                    &self.request,
                    &stored.directives,
                    stored.lifetime,
                    age,
                ) {
                    self.route.counts.count(CacheStatus::Stale);
                    let mut hit = hit(
                        Arc::clone(stored),
                        age,
                        &self.conditions,
                        CacheStatus::Stale,
                    );
                    hit.cache_status =
                        format!("tollgate; hit; fwd=stale; fwd-status={}", status.as_u16());
                    return Outcome::Serve(hit);
                }
            }
        }
        self.route.counts.count(self.status);
        let Some(key) = self.key.clone().filter(|_| self.store) else {
            return Outcome::Relay(Some(cache_status("")));
        };
        let rules = &self.route.config.rules;
        let directives =
            Directives::parse(headers.get_all(CACHE_CONTROL).iter().map(|v| v.as_bytes()));
        let lifetime = freshness::lifetime(&directives, headers, now, rules);
        let fits = length.is_none_or(|n| n <= rules.max_object_size);
        let storable = fits
            && freshness::storable(
                status,
                &self.request,
                self.authorized,
                &directives,
                headers,
                lifetime,
                rules,
            );
        if !storable {
            return Outcome::Relay(Some(cache_status("")));
        }
        let mut vary = Vec::new();
        for n in freshness::vary_names(headers) {
            let (Ok(name), Some(fields)) = (HeaderName::from_bytes(n.as_bytes()), &self.varied)
            else {
                // A name that is no field name, or no request fields to compare: not stored.
                return Outcome::Relay(Some(cache_status("")));
            };
            let value = fields
                .iter()
                .find(|(h, _)| *h == name)
                .map(|(_, v)| v.clone());
            vary.push((name, value));
        }
        let entry = Entry {
            status,
            headers: key::stored_fields(headers),
            body: bytes::Bytes::new(),
            times: Times {
                request: self.request_time,
                response: now,
            },
            lifetime,
            directives,
            vary,
            tags: Box::default(),
        };
        let fill = Box::new(Fill::new(
            Arc::clone(&self.cache),
            key,
            entry,
            rules.max_object_size,
            self.lock,
        ));
        Outcome::Fill(fill, cache_status("; stored"))
    }
}

impl Entry {
    /// A copy of `e` (its body shared).
    fn clone_of(e: &Entry) -> Entry {
        Entry {
            status: e.status,
            headers: e.headers.clone(),
            body: e.body.clone(),
            times: e.times,
            lifetime: e.lifetime,
            directives: e.directives.clone(),
            vary: e.vary.clone(),
            tags: e.tags.clone(),
        }
    }
}
