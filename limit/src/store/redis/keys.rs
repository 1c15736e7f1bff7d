//! The Redis key layout: `<prefix>:{<scope>:<limit>:<subject-hash>}:<alg>`, the scope being the
//! route (or, for a plan's limit, `@<plan>` or `<route>@<plan>`).
//!
//! - The hash tag `{…}` puts every key of one (route, limit, subject) in one Cluster slot.
//! - The subject is its SHA-256 digest in hex (never a raw API key or address in a key name).
//! - The algorithm code ends the key, so a limit whose algorithm changes on reload never reads
//!   state of another type; it is also the script's name for the algorithm.

use crate::Algorithm;
use crate::{Limit, Policy, SubjectDigest};

/// An algorithm as the scripts and the keys know it: the policy's algorithm, except that a
/// fixed window aligned to the calendar is an algorithm of its own (`cw`: its definition
/// carries the calendar unit, and the script computes the window on Redis's clock). Its
/// [`code`](Self::code) is the only place a name is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptAlgorithm {
    FixedWindow,
    CalendarWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    Gcra,
    LeakyBucket,
    Concurrency,
}

impl ScriptAlgorithm {
    /// The policy's algorithm in the scripts.
    pub fn of(policy: &Policy) -> Self {
        if policy.calendar.is_some() {
            return Self::CalendarWindow;
        }
        Self::from(policy.algorithm)
    }

    /// Its code in keys and script arguments.
    pub fn code(self) -> &'static str {
        match self {
            Self::FixedWindow => "fw",
            Self::CalendarWindow => "cw",
            Self::SlidingWindow => "sw",
            Self::SlidingLog => "sl",
            Self::TokenBucket => "tb",
            Self::Gcra => "gcra",
            Self::LeakyBucket => "lb",
            Self::Concurrency => "cc",
        }
    }
}

impl From<Algorithm> for ScriptAlgorithm {
    fn from(a: Algorithm) -> Self {
        match a {
            Algorithm::FixedWindow => Self::FixedWindow,
            Algorithm::SlidingWindow => Self::SlidingWindow,
            Algorithm::SlidingLog => Self::SlidingLog,
            Algorithm::TokenBucket => Self::TokenBucket,
            Algorithm::Gcra => Self::Gcra,
            Algorithm::LeakyBucket => Self::LeakyBucket,
            Algorithm::Concurrency => Self::Concurrency,
        }
    }
}

/// The algorithm's code in keys and script arguments.
pub fn algorithm_code(a: Algorithm) -> &'static str {
    ScriptAlgorithm::from(a).code()
}

/// Appends the key of `limit` for `subject` under `prefix` to `out`.
pub fn write_key(out: &mut Vec<u8>, prefix: &str, limit: &Limit, subject: &SubjectDigest) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(b":{");
    out.extend_from_slice(limit.scope.as_bytes());
    out.push(b':');
    out.extend_from_slice(limit.name.as_bytes());
    out.push(b':');
    // Formatted on the stack and appended once (a push per digit was ≈ 500 instructions a key).
    let mut hex = [0u8; 32];
    for (pair, b) in hex.chunks_exact_mut(2).zip(subject.0) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    out.extend_from_slice(&hex);
    out.extend_from_slice(b"}:");
    out.extend_from_slice(ScriptAlgorithm::of(&limit.policy).code().as_bytes());
}

/// The key of `limit` for `subject` under `prefix`, as a string.
pub fn key(prefix: &str, limit: &Limit, subject: &SubjectDigest) -> String {
    let mut out = Vec::with_capacity(prefix.len() + limit.scope.len() + limit.name.len() + 44);
    write_key(&mut out, prefix, limit, subject);
    // Every piece is UTF-8 (config strings, hex, ASCII punctuation).
    String::from_utf8_lossy(&out).into_owned()
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag (or the whole key) mod 16384.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn cluster_slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(cluster_slot(b"123456789"), 0x31C3);
        assert_eq!(cluster_slot(b"foo"), 12182);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        assert_eq!(cluster_slot(b"foo{}{bar}"), cluster_slot(b"foo{}{bar}"));
    }

    #[test]
    fn a_key_names_prefix_route_limit_subject_hash_and_algorithm() {
        let policy = Policy {
            algorithm: Algorithm::SlidingWindow,
            limit: 5,
            period: Duration::from_secs(1).as_micros() as u64,
            burst: 0,
            cost: 1,
            calendar: None,
        };
        let limit = Limit::new("api", "per-ip", policy);
        let subject = SubjectDigest([0xab; 16]);
        let k = key("tg", &limit, &subject);
        assert_eq!(k, format!("tg:{{api:per-ip:{}}}:sw", "ab".repeat(16)));
        // One slot per (route, limit, subject), whatever the algorithm suffix.
        assert_eq!(
            cluster_slot(k.as_bytes()),
            cluster_slot(format!("x:{{api:per-ip:{}}}:fw", "ab".repeat(16)).as_bytes())
        );
    }
}
