//! The cache's eviction policy on a Zipf workload (#54): a stream of keys drawn from a Zipf
//! distribution replayed into caches of one capacity — quick_cache (the gateway's memory tier:
//! CLOCK-Pro), moka (TinyLFU admission over LRU) and a plain LRU — reporting each one's hit
//! ratio and the time per request (a `get`, and an `insert` on a miss), single-threaded.
//!
//!   cache-zipf [REQUESTS] [KEYS] [SEED]     (defaults: 1000000 100000 1)
//!
//! For each exponent s in 0.9, 1.0, 1.1 and each capacity of 1 %, 5 % and 10 % of the keys,
//! prints one line per cache:
//!   ZIPF s=0.9 capacity=1000 cache=quick_cache hit_ratio=0.4123 ns_per_op=85
//! and, per (s, capacity), the hit ratio of the optimal offline policy (Bélády's) as a bound.
//! Keys are u64 (a key's hash in the gateway) and values an `Arc` of 1 KiB (a stored response's
//! handle), every entry weighing 1: capacities are in entries.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// xorshift64*: a seeded, reproducible stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` keys drawn from Zipf(s) over `keys` ranks, each rank mapped to a scattered key (so
/// popularity is not key order).
fn zipf_stream(n: usize, keys: usize, s: f64, seed: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(keys);
    let mut total = 0.0;
    for rank in 1..=keys {
        total += 1.0 / (rank as f64).powf(s);
        cdf.push(total);
    }
    let mut rng = Rng(seed.max(1));
    (0..n)
        .map(|_| {
            let u = rng.unit() * total;
            let rank = cdf.partition_point(|&c| c < u) as u64;
            rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555
        })
        .collect()
}

/// A plain LRU: a map to slots of an array-backed doubly linked list.
struct Lru {
    cap: usize,
    map: HashMap<u64, usize>,
    keys: Vec<u64>,
    vals: Vec<Arc<[u8]>>,
    prev: Vec<usize>,
    next: Vec<usize>,
    head: usize,
    tail: usize,
}

const NIL: usize = usize::MAX;

impl Lru {
    fn new(cap: usize) -> Lru {
        Lru {
            cap,
            map: HashMap::with_capacity(cap),
            keys: Vec::with_capacity(cap),
            vals: Vec::with_capacity(cap),
            prev: Vec::with_capacity(cap),
            next: Vec::with_capacity(cap),
            head: NIL,
            tail: NIL,
        }
    }
    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n] = p
        }
    }
    fn push_front(&mut self, i: usize) {
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head] = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }
    fn get(&mut self, k: u64) -> Option<Arc<[u8]>> {
        let i = *self.map.get(&k)?;
        self.unlink(i);
        self.push_front(i);
        Some(self.vals[i].clone())
    }
    fn insert(&mut self, k: u64, v: Arc<[u8]>) {
        if self.keys.len() < self.cap {
            let i = self.keys.len();
            self.keys.push(k);
            self.vals.push(v);
            self.prev.push(NIL);
            self.next.push(NIL);
            self.map.insert(k, i);
            self.push_front(i);
            return;
        }
        let i = self.tail;
        self.unlink(i);
        self.map.remove(&self.keys[i]);
        self.keys[i] = k;
        self.vals[i] = v;
        self.map.insert(k, i);
        self.push_front(i);
    }
}

/// Bélády's optimal offline hit ratio (counted past `warm`, as the caches are): on a miss
/// with the cache full, evict the key used furthest in the future.
fn belady(stream: &[u64], cap: usize, warm: usize) -> f64 {
    let mut next_use = vec![usize::MAX; stream.len()];
    let mut last: HashMap<u64, usize> = HashMap::new();
    for (i, k) in stream.iter().enumerate().rev() {
        next_use[i] = last.get(k).copied().unwrap_or(usize::MAX - i);
        last.insert(*k, i);
    }
    let mut held: HashMap<u64, usize> = HashMap::new();
    let mut order: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut hits = 0usize;
    for (i, k) in stream.iter().enumerate() {
        let nu = next_use[i];
        if let Some(old) = held.insert(*k, nu) {
            if i >= warm {
                hits += 1;
            }
            order.remove(&(old, *k));
        } else if held.len() > cap {
            if let Some(&(far, victim)) = order.iter().next_back() {
                if far > nu {
                    order.remove(&(far, victim));
                    held.remove(&victim);
                } else {
                    // The new key is the furthest: not kept.
                    held.remove(k);
                    continue;
                }
            }
        }
        order.insert((nu, *k));
    }
    hits as f64 / (stream.len() - warm) as f64
}

/// The first tenth of a stream warms the caches up and is not counted (they start empty).
fn warm_up(stream: &[u64]) -> usize {
    stream.len() / 10
}

fn run(stream: &[u64], mut access: impl FnMut(u64) -> bool) -> (f64, f64) {
    let warm = warm_up(stream);
    for k in &stream[..warm] {
        access(*k);
    }
    let start = Instant::now();
    let mut hits = 0usize;
    for k in &stream[warm..] {
        if access(*k) {
            hits += 1;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / (stream.len() - warm) as f64;
    (hits as f64 / (stream.len() - warm) as f64, ns)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let keys: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let seed: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1);
    let value: Arc<[u8]> = Arc::from(vec![0u8; 1024]);
    for s in [0.9, 1.0, 1.1] {
        let stream = zipf_stream(n, keys, s, seed);
        for pct in [1, 5, 10] {
            let cap = keys * pct / 100;
            let mut results = Vec::new();

            // quick_cache as the gateway builds it: the sync (sharded) cache, weight 1 each.
            let qc: quick_cache::sync::Cache<u64, Arc<[u8]>> = quick_cache::sync::Cache::new(cap);
            results.push((
                "quick_cache",
                run(&stream, |k| {
                    if qc.get(&k).is_some() {
                        true
                    } else {
                        qc.insert(k, value.clone());
                        false
                    }
                }),
            ));

            let mk: moka::sync::Cache<u64, Arc<[u8]>> = moka::sync::Cache::new(cap as u64);
            results.push((
                "moka",
                run(&stream, |k| {
                    if mk.get(&k).is_some() {
                        true
                    } else {
                        mk.insert(k, value.clone());
                        false
                    }
                }),
            ));

            let mut lru = Lru::new(cap);
            results.push((
                "lru",
                run(&stream, |k| {
                    if lru.get(k).is_some() {
                        true
                    } else {
                        lru.insert(k, value.clone());
                        false
                    }
                }),
            ));

            for (name, (ratio, ns)) in results {
                println!(
                    "ZIPF s={s} capacity={cap} cache={name} hit_ratio={ratio:.4} ns_per_op={ns:.0}"
                );
            }
            let optimal = belady(&stream, cap, warm_up(&stream));
            println!("ZIPF s={s} capacity={cap} cache=optimal hit_ratio={optimal:.4}");
        }
    }
}
