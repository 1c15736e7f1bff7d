//! Request ids: the client's own when it sends a usable one, else a fresh UUID v7.
//!
//! An id is kept when the request carries exactly one value of the configured header (default
//! `X-Request-Id`) of 1–128 visible ASCII characters; otherwise one is generated. The id goes
//! upstream, back to the client, into the access log and into every problem+json body.
//!
//! Generation is cheap and lock-free: a UUID v7 (RFC 9562) whose millisecond timestamp is derived
//! from the request's start `Instant` (already read by the handler) and a per-thread wall-clock
//! anchor, so no extra clock read; its 74 random bits come from a per-thread SplitMix64 stream
//! seeded from the standard library's per-process random hash keys. Ids are unique, not secret.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The longest id kept from a client.
pub const MAX_LEN: usize = 128;

/// Whether `v` is a usable client-sent id: 1–128 visible ASCII characters.
pub fn is_valid(v: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&v.len()) && v.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The request's id: the client's (one valid value of `name`) or a new UUID v7.
pub fn of(headers: &HeaderMap, name: &HeaderName, started: Instant) -> HeaderValue {
    let mut values = headers.get_all(name).iter();
    if let (Some(v), None) = (values.next(), values.next()) {
        if is_valid(v.as_bytes()) {
            return v.clone();
        }
    }
    generate(started)
}

/// The same, from a request head as any front parsed it.
pub fn of_head(
    head: &impl crate::http::head::RequestHead,
    name: &HeaderName,
    started: Instant,
) -> HeaderValue {
    let mut values = head.header_values(name);
    if let (Some(v), None) = (values.next(), values.next()) {
        if is_valid(v) {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                return v;
            }
        }
    }
    generate(started)
}

struct ThreadState {
    anchor: Instant,
    anchor_unix_ms: u64,
    rng: Cell<u64>,
}

thread_local! {
    static STATE: ThreadState = {
        let anchor = Instant::now();
        let anchor_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(anchor_unix_ms);
        ThreadState { anchor, anchor_unix_ms, rng: Cell::new(h.finish()) }
    };
}

/// SplitMix64: one step of a stream whose outputs are well mixed.
fn splitmix(state: &Cell<u64>) -> u64 {
    let s = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
    state.set(s);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A new UUID v7 for a request that started at `started`.
pub fn generate(started: Instant) -> HeaderValue {
    let (ms, r1, r2) = STATE.with(|s| {
        let since =
            u64::try_from(started.saturating_duration_since(s.anchor).as_millis()).unwrap_or(0);
        (
            s.anchor_unix_ms.saturating_add(since),
            splitmix(&s.rng),
            splitmix(&s.rng),
        )
    });
    let hi: u64 = (ms << 16) | 0x7000 | (r1 & 0x0fff);
    let lo: u64 = (r2 & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    let bytes = (u128::from(hi) << 64 | u128::from(lo)).to_be_bytes();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 36];
    let mut o = 0;
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[o] = b'-';
            o += 1;
        }
        out[o] = HEX[usize::from(b >> 4)];
        out[o + 1] = HEX[usize::from(b & 0xf)];
        o += 2;
    }
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// Writes `id` as a JSON string (quotes included) to `out`. Visible ASCII needs escaping only
/// for `"` and `\`.
pub fn write_json(out: &mut String, id: &HeaderValue) {
    out.push('"');
    for &b in id.as_bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {}
        }
    }
    out.push('"');
}

/// [`write_json`], into bytes.
pub fn write_json_bytes(out: &mut Vec<u8>, id: &HeaderValue) {
    out.push(b'"');
    for &b in id.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e => out.push(b),
            _ => {}
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_when_valid() {
        let name = HeaderName::from_static("x-request-id");
        let now = Instant::now();
        let mut h = HeaderMap::new();
        h.insert(&name, HeaderValue::from_static("abc-123"));
        assert_eq!(of(&h, &name, now), "abc-123");
        for bad in ["", "has space", &"x".repeat(129)] {
            h.insert(&name, HeaderValue::from_str(bad).unwrap());
            let id = of(&h, &name, now);
            assert_ne!(id.as_bytes(), bad.as_bytes());
            assert_eq!(id.len(), 36);
        }
        h.insert(&name, HeaderValue::from_static("one"));
        h.append(&name, HeaderValue::from_static("two"));
        assert_eq!(of(&h, &name, now).len(), 36, "two values: a new id");
        assert!(is_valid("x".repeat(128).as_bytes()));
    }

    #[test]
    fn generated_ids_are_uuid_v7_and_distinct() {
        let now = Instant::now();
        let a = generate(now);
        let b = generate(now);
        assert_ne!(a, b);
        let s = a.to_str().unwrap();
        let parts: Vec<&str> = s.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('7'), "version 7: {s}");
        assert!(
            matches!(&parts[3][..1], "8" | "9" | "a" | "b"),
            "variant: {s}"
        );
        let ms = u64::from_str_radix(&s[..8], 16).unwrap() << 16
            | u64::from_str_radix(&parts[1][..4], 16).unwrap();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(ms.abs_diff(wall) < 5_000, "timestamp {ms} vs {wall}");
    }

    #[test]
    fn json_escaping() {
        let mut s = String::new();
        write_json(&mut s, &HeaderValue::from_static(r#"a"b\c"#));
        assert_eq!(s, r#""a\"b\\c""#);
        assert_eq!(serde_json::from_str::<String>(&s).unwrap(), r#"a"b\c"#);
    }
}
