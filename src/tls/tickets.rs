//! Session tickets sealed with keys from a file a fleet shares (`ticket_key_file`), so a client
//! resumes on any gateway of the fleet, as nginx's `ssl_session_ticket_key` allows.
//!
//! The file holds one key a line, 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`);
//! blank lines and `#` comments are skipped. The first key seals new tickets; every key opens
//! them, so rotation is: add a new line at the top, drop the oldest, reload (or let
//! `watch_config` see it) — every gateway keeps opening the tickets the others sealed with the
//! keys still listed. A ticket is `id (4) | nonce (12) | AES-256-GCM(state) | tag (16)`, the id
//! (a hash of the key) choosing the key to open it with and bound as associated data.

use std::fmt;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

use super::TlsError;

/// How long a client may keep a ticket (the hint sent with it): six hours, as rustls's own
/// ticketer. Forward secrecy comes from rotating the file's keys at least that often.
pub const TICKET_LIFETIME_SECS: u32 = 6 * 3600;
/// Keys in one file at most.
const MAX_KEYS: usize = 16;
const ID_LEN: usize = 4;

struct TicketKey {
    id: [u8; ID_LEN],
    key: LessSafeKey,
}

/// Seals and opens tickets with a key file's keys.
pub struct KeyFileTicketer {
    keys: Vec<TicketKey>,
    rng: SystemRandom,
}

impl fmt::Debug for KeyFileTicketer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the keys.
        f.debug_struct("KeyFileTicketer")
            .field("keys", &self.keys.len())
            .finish()
    }
}

fn hex_key(line: &str) -> Option<[u8; 32]> {
    let bytes = line.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        *out.get_mut(i)? = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

impl KeyFileTicketer {
    /// Parses the key file's text; errors name the line (never its content).
    pub fn parse(text: &str) -> Result<KeyFileTicketer, String> {
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let raw = hex_key(line).ok_or_else(|| {
                format!(
                    "line {}: a key is 64 hex digits (e.g. `openssl rand -hex 32`)",
                    n + 1
                )
            })?;
            if keys.len() == MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
            let digest = ring::digest::digest(&ring::digest::SHA256, &raw);
            let mut id = [0u8; ID_LEN];
            id.copy_from_slice(&digest.as_ref()[..ID_LEN]);
            let key = UnboundKey::new(&AES_256_GCM, &raw)
                .map_err(|_| format!("line {}: unusable key", n + 1))?;
            keys.push(TicketKey {
                id,
                key: LessSafeKey::new(key),
            });
        }
        if keys.is_empty() {
            return Err("no key".to_owned());
        }
        Ok(KeyFileTicketer {
            keys,
            rng: SystemRandom::new(),
        })
    }

    /// Reads the key file.
    pub fn load(path: &std::path::Path) -> Result<KeyFileTicketer, TlsError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| TlsError::File(file.clone(), e.to_string()))?;
        KeyFileTicketer::parse(&text).map_err(|e| TlsError::File(file, e))
    }
}

impl ProducesTickets for KeyFileTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        TICKET_LIFETIME_SECS
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let k = self.keys.first()?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(ID_LEN + NONCE_LEN + plain.len() + 16);
        out.extend_from_slice(&k.id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let mut sealed = out.split_off(ID_LEN + NONCE_LEN);
        k.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(k.id),
                &mut sealed,
            )
            .ok()?;
        out.extend_from_slice(&sealed);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let id = cipher.get(..ID_LEN)?;
        let nonce = cipher.get(ID_LEN..ID_LEN + NONCE_LEN)?;
        let sealed = cipher.get(ID_LEN + NONCE_LEN..)?;
        let k = self.keys.iter().find(|k| k.id == id)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = k.key.open_in_place(nonce, Aad::from(k.id), &mut buf).ok()?;
        let len = plain.len();
        buf.truncate(len);
        Some(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0000000000000000000000000000000000000000000000000000000000000001";
    const B: &str = "00000000000000000000000000000000000000000000000000000000000000b2";

    #[test]
    fn a_rotated_file_still_opens_the_previous_keys_tickets() {
        let old = KeyFileTicketer::parse(A).unwrap();
        let ticket = old.encrypt(b"session state").unwrap();
        assert_eq!(old.decrypt(&ticket).unwrap(), b"session state");
        let rotated = KeyFileTicketer::parse(&format!("# new first\n{B}\n{A}\n")).unwrap();
        assert_eq!(rotated.decrypt(&ticket).unwrap(), b"session state");
        let fresh = rotated.encrypt(b"x").unwrap();
        assert!(
            old.decrypt(&fresh).is_none(),
            "the old file knows no new key"
        );
        let dropped = KeyFileTicketer::parse(B).unwrap();
        assert!(dropped.decrypt(&ticket).is_none());
    }

    #[test]
    fn tampered_or_short_tickets_are_refused() {
        let t = KeyFileTicketer::parse(A).unwrap();
        let mut ticket = t.encrypt(b"state").unwrap();
        for cut in 0..ticket.len() {
            assert!(t.decrypt(&ticket[..cut]).is_none());
        }
        let last = ticket.len() - 1;
        ticket[last] ^= 1;
        assert!(t.decrypt(&ticket).is_none());
    }

    #[test]
    fn bad_files_are_refused_without_echoing_keys() {
        for bad in [
            "",
            "# only a comment\n",
            "abc",
            &A[1..],
            &A.replace('0', "g"),
        ] {
            let e = KeyFileTicketer::parse(bad).unwrap_err();
            assert!(!e.contains("000000"), "{e}");
        }
    }
}
