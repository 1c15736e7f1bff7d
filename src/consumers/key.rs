//! API keys: their SHA-256 (what the consumers file stores, so no raw key sits on disk) and new
//! random keys for `tollgate key new`.

use std::io::Read as _;

use sha2::{Digest, Sha256};

/// The SHA-256 of a key: the consumers table's key.
pub type KeyHash = [u8; 32];

/// The SHA-256 of `key` (its bytes as sent: no trimming, no decoding beyond the query's
/// percent-decoding).
pub fn hash_key(key: &[u8]) -> KeyHash {
    Sha256::digest(key).into()
}

/// 64 hex digits (either case) as a hash; `None` for anything else.
pub fn parse_hex(s: &str) -> Option<KeyHash> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// A fresh key: `tg_` and 32 bytes from the operating system's random source, base64url
/// without padding (46 characters, 256 bits).
pub fn new_key() -> std::io::Result<String> {
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut s = String::with_capacity(46);
    s.push_str("tg_");
    for chunk in raw.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            s.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    #[test]
    fn hashes_are_sha256_in_lower_case_hex() {
        assert_eq!(
            hex::encode(&hash_key(b"password")),
            "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
        );
        let h = hash_key(b"k");
        assert_eq!(parse_hex(&hex::encode(&h)), Some(h));
        assert_eq!(parse_hex(&hex::encode(&h).to_uppercase()), Some(h));
        assert_eq!(parse_hex("abc"), None);
        assert_eq!(parse_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn new_keys_are_random_and_url_safe() {
        let a = new_key().unwrap();
        let b = new_key().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 46);
        assert!(a[3..]
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
    }
}
