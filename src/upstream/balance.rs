//! The three ways a group picks a server, as pure functions of the servers' weights and an
//! `eligible` filter (health, and the servers a request already tried):
//!
//! - `round_robin`: nginx's smooth weighted round robin. Its sequence depends only on the
//!   weights, so it is computed once per group ([`smooth_schedule`]) and a request reads it at a
//!   counter: lock-free, and weights 5:1:1 give `a a b a c a a`, not `a a a a a b c`. A server
//!   that is out gives its turns to the servers after it in the sequence.
//! - `least_requests`: the fewest requests in flight relative to weight (`in_flight / weight`,
//!   compared by cross-multiplying); ties go round the servers from a moving start.
//! - `ip_hash`: weighted rendezvous hashing of the client IP: every server scores the IP, the
//!   highest score wins. Taking a server out moves only the clients it had; the others keep
//!   their server. Stable across workers, replicas and restarts (no random seed).

use std::net::IpAddr;

/// nginx's smooth weighted round robin, run for one full cycle: each server appears
/// `weight / gcd` times. Indices are `u16` (at most 256 servers).
pub fn smooth_schedule(weights: &[u32]) -> Vec<u16> {
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let weights: Vec<i64> = weights.iter().map(|w| i64::from(*w / g)).collect();
    let total: i64 = weights.iter().sum();
    let mut current = vec![0i64; weights.len()];
    let mut out = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for _ in 0..total {
        let mut best = 0;
        for (i, w) in weights.iter().enumerate() {
            current[i] += w;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(u16::try_from(best).unwrap_or(u16::MAX));
    }
    out
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The first eligible server in `schedule` from position `start`.
pub fn round_robin(
    schedule: &[u16],
    start: usize,
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    let n = schedule.len();
    (0..n)
        .map(|k| usize::from(schedule[(start.wrapping_add(k)) % n]))
        .find(|&i| eligible(i))
}

/// The eligible server with the fewest requests in flight per unit of weight.
pub fn least_requests(
    weights: &[u32],
    in_flight: impl Fn(usize) -> usize,
    start: usize,
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    let n = weights.len();
    let mut best: Option<(usize, u128)> = None;
    for k in 0..n {
        let i = start.wrapping_add(k) % n;
        if !eligible(i) {
            continue;
        }
        let load = in_flight(i) as u128;
        let w = u128::from(weights[i]);
        best = match best {
            // load_i / w_i < load_b / w_b  ⇔  load_i * w_b < load_b * w_i
            Some((b, bload)) if load * u128::from(weights[b]) >= bload * w => Some((b, bload)),
            _ => Some((i, load)),
        };
    }
    best.map(|(i, _)| i)
}

/// A 64-bit hash of a client IP (FNV-1a over its bytes, then a finaliser).
pub fn hash_ip(ip: IpAddr) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    match ip {
        IpAddr::V4(v4) => feed(&v4.octets()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => feed(&v4.octets()),
            None => feed(&v6.octets()),
        },
    }
    mix(h)
}

/// A server's seed for rendezvous hashing (of its authority).
pub fn hash_name(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// splitmix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Weighted rendezvous hashing: the eligible server with the highest `weight / -ln(u)`, where
/// `u` in (0, 1) is the hash of (client, server).
pub fn ip_hash(
    seeds: &[u64],
    weights: &[u32],
    client: u64,
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, seed) in seeds.iter().enumerate() {
        if !eligible(i) {
            continue;
        }
        let h = mix(client ^ seed);
        // 53 random bits, shifted off 0 and 1.
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let score = f64::from(weights[i]) / -u.ln();
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_round_robin_interleaves_by_weight() {
        let s = smooth_schedule(&[5, 1, 1]);
        assert_eq!(s, [0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(smooth_schedule(&[100, 300]), [1, 0, 1, 1]);
        assert_eq!(smooth_schedule(&[1, 1, 1]), [0, 1, 2]);
    }

    #[test]
    fn round_robin_skips_ineligible_servers() {
        let s = smooth_schedule(&[1, 1, 1]);
        let picks: Vec<usize> = (0..6)
            .filter_map(|k| round_robin(&s, k, |i| i != 1))
            .collect();
        assert_eq!(picks, [0, 2, 2, 0, 2, 2]);
        assert_eq!(round_robin(&s, 0, |_| false), None);
    }

    #[test]
    fn least_requests_weighs_load_and_rotates_ties() {
        let w = [1, 2, 1];
        let load = [2usize, 3, 2];
        // 2/1, 3/2, 2/1: server 1 has the least per weight.
        assert_eq!(least_requests(&w, |i| load[i], 0, |_| true), Some(1));
        assert_eq!(least_requests(&[1, 1], |_| 0, 0, |_| true), Some(0));
        assert_eq!(least_requests(&[1, 1], |_| 0, 1, |_| true), Some(1));
        assert_eq!(least_requests(&w, |i| load[i], 0, |i| i != 1), Some(0));
    }

    #[test]
    fn ip_hash_moves_only_the_clients_of_a_server_taken_out() {
        let seeds: Vec<u64> = ["a:1", "b:1", "c:1"].iter().map(|n| hash_name(n)).collect();
        let w = [1, 1, 1];
        let mut counts = [0usize; 3];
        for n in 0..3000u32 {
            let ip = IpAddr::from(n.wrapping_mul(2_654_435_761).to_be_bytes());
            let key = hash_ip(ip);
            let all = ip_hash(&seeds, &w, key, |_| true).unwrap();
            counts[all] += 1;
            let without_b = ip_hash(&seeds, &w, key, |i| i != 1).unwrap();
            if all != 1 {
                assert_eq!(all, without_b, "a client of a live server moved");
            } else {
                assert_ne!(without_b, 1);
            }
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread {counts:?}");
        }
    }
}
