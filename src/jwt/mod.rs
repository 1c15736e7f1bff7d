//! Bearer tokens (JWT, RFC 7519) verified with the keys of `[jwt]`: a JWKS file's public keys or
//! a shared secret from the environment, loaded at start-up and on every reload (a file that
//! does not parse is refused, and the running configuration keeps serving). The signature,
//! `exp`/`nbf` (with `leeway`), `iss` and `aud` are checked by the `jsonwebtoken` crate against
//! the `algorithms` allow-list; `none` can never be on it.
//!
//! A verified token's claims are kept per worker in a bounded cache keyed by the whole token,
//! so a client repeating its token costs one hash lookup, not a signature check; an entry is
//! used only while its `exp` (plus leeway) has not passed. A reload builds a new verifier, so
//! tokens verified with keys since removed are not served from a cache.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::config::{JwtConfig, JwtKeySource};
use tollgate_limit::worker::WorkerId;

/// The longest token accepted (bytes); a longer one is malformed.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The longest token kept in a cache: a longer one is verified every time, so a cache's memory
/// stays near `cache_size` × 4 KiB however large the tokens clients send.
const MAX_CACHED_TOKEN_BYTES: usize = 4 * 1024;
/// The most keys taken from a JWKS file.
const MAX_KEYS: usize = 64;

/// The keys tokens are verified with.
pub struct JwtKeys {
    keys: Vec<Key>,
}

struct Key {
    kid: Option<String>,
    /// The algorithm the JWK names (`alg`), if any: only tokens of that algorithm use it.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKeys")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl JwtKeys {
    /// Loads the keys `[jwt]` names: reads and parses the JWKS file, or reads the secret's
    /// variable. The error says what is wrong (for a config error naming `jwt.jwks_file` or
    /// `jwt.secret_env`).
    pub fn load(cfg: &JwtConfig) -> Result<JwtKeys, String> {
        match &cfg.keys {
            JwtKeySource::SecretEnv(var) => {
                let secret = std::env::var(var).map_err(|_| {
                    format!("the environment variable {var:?} is not set (or not UTF-8)")
                })?;
                if secret.len() < 16 {
                    return Err(format!(
                        "the secret in {var:?} is shorter than 16 bytes; use at least 32 random bytes"
                    ));
                }
                Ok(JwtKeys {
                    keys: vec![Key {
                        kid: None,
                        alg: None,
                        key: DecodingKey::from_secret(secret.as_bytes()),
                    }],
                })
            }
            JwtKeySource::JwksFile(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                JwtKeys::from_jwks(&text).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }

    /// Parses a JWKS document. Keys for encryption (`"use": "enc"`) and of kinds this gateway
    /// cannot verify with are skipped; at least one key must remain.
    pub fn from_jwks(text: &str) -> Result<JwtKeys, String> {
        let set: JwkSet =
            serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            let alg = jwk
                .common
                .key_algorithm
                .and_then(|a| a.to_string().parse::<Algorithm>().ok());
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
            });
            if keys.len() > MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
        }
        if keys.is_empty() {
            return Err("no signature-verification key in the set".to_owned());
        }
        Ok(JwtKeys { keys })
    }

    /// No keys: every token is refused (`unknown_key`).
    pub fn none() -> JwtKeys {
        JwtKeys { keys: Vec::new() }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Why a token was refused: the bounded `reason` label of `tollgate_jwt_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No token (a required route).
    Missing,
    /// Not a JWT (shape, base64, JSON, too long), sent twice, or without a required claim.
    Malformed,
    /// Signed with an algorithm not on the allow-list (or `none`).
    Algorithm,
    /// No key of the set has the token's `kid`.
    UnknownKey,
    BadSignature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// Not verified: the client's address caused more than `[jwt] max_bad_tokens` failed
    /// verifications this second (answered 429, not 401).
    Throttled,
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Missing => "missing",
            Rejection::Malformed => "malformed",
            Rejection::Algorithm => "algorithm",
            Rejection::UnknownKey => "unknown_key",
            Rejection::BadSignature => "bad_signature",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::Issuer => "issuer",
            Rejection::Audience => "audience",
            Rejection::Throttled => "throttled",
        }
    }

    /// The `error_description` of the `WWW-Authenticate` challenge and the problem's detail.
    pub fn description(self) -> &'static str {
        match self {
            Rejection::Missing => "this route needs a bearer token",
            Rejection::Malformed => "the token is malformed",
            Rejection::Algorithm => "the token's signature algorithm is not accepted",
            Rejection::UnknownKey => "the token names an unknown key",
            Rejection::BadSignature => "the token's signature is invalid",
            Rejection::Expired => "the token has expired",
            Rejection::NotYetValid => "the token is not valid yet",
            Rejection::Issuer => "the token's issuer is not accepted",
            Rejection::Audience => "the token's audience is not accepted",
            Rejection::Throttled => "too many refused tokens from this address; retry in a second",
        }
    }

    fn of(e: &jsonwebtoken::errors::Error) -> Rejection {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidRsaKey(_) | K::Crypto(_) => {
                Rejection::BadSignature
            }
            K::ExpiredSignature => Rejection::Expired,
            K::ImmatureSignature => Rejection::NotYetValid,
            K::InvalidIssuer => Rejection::Issuer,
            K::MissingRequiredClaim(c) if c == "iss" => Rejection::Issuer,
            K::InvalidAudience => Rejection::Audience,
            K::MissingRequiredClaim(c) if c == "aud" => Rejection::Audience,
            K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => {
                Rejection::Algorithm
            }
            _ => Rejection::Malformed,
        }
    }
}

/// A verified token's claims.
#[derive(Debug)]
pub struct Verified {
    pub claims: serde_json::Value,
    /// `exp` (seconds since the epoch), checked again on every cache hit.
    exp: u64,
}

/// Verified tokens of one worker, by the whole token; and the failed verifications of this
/// second, by client address.
#[derive(Default)]
struct TokenCache {
    tokens: HashMap<Box<str>, Arc<Verified>, foldhash::fast::RandomState>,
    failures: HashMap<IpAddr, (u64, u32), foldhash::fast::RandomState>,
}

/// The addresses whose failures one worker tracks; past it, the table starts over (memory
/// stays bounded whatever a flood of addresses does; the cost is a fresh budget for each).
const MAX_TRACKED_ADDRESSES: usize = 4096;

impl TokenCache {
    /// Counts a failed verification of `client`'s at second `now`.
    fn failed(&mut self, client: IpAddr, now: u64) {
        if self.failures.len() >= MAX_TRACKED_ADDRESSES && !self.failures.contains_key(&client) {
            // Full: keep this second's, and if that frees nothing, start over.
            self.failures.retain(|_, (second, _)| *second == now);
            if self.failures.len() >= MAX_TRACKED_ADDRESSES {
                self.failures.clear();
            }
        }
        let e = self.failures.entry(client).or_insert((now, 0));
        if e.0 != now {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
    }
}

/// Verifies tokens with one configuration's keys; one cache per worker.
pub struct Verifier {
    keys: Arc<JwtKeys>,
    /// One validation per allowed algorithm (the crate wants a key's family to match every
    /// algorithm of the validation it is used with).
    validations: Vec<(Algorithm, Validation)>,
    leeway: u64,
    capacity: usize,
    /// `[jwt] max_bad_tokens` (0: never throttle).
    max_bad_tokens: u32,
    caches: Box<[Mutex<TokenCache>]>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys)
            .field("capacity", &self.capacity)
            .finish()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Verifier {
    /// A verifier for `cfg` with `keys`, with a cache for each of `workers` workers (and one
    /// for everything off the workers).
    pub fn new(cfg: &JwtConfig, keys: Arc<JwtKeys>, workers: usize) -> Verifier {
        let first = cfg.algorithms.first().copied().unwrap_or(Algorithm::RS256);
        let mut validation = Validation::new(first);
        validation.algorithms = cfg.algorithms.clone();
        validation.leeway = cfg.leeway.as_secs();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        if let Some(iss) = &cfg.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".to_owned());
        }
        match &cfg.audience {
            Some(aud) => {
                validation.set_audience(aud);
                validation.required_spec_claims.insert("aud".to_owned());
            }
            // Without an `audience`, a token's `aud` is not checked (rather than refused).
            None => validation.validate_aud = false,
        }
        let validations = cfg
            .algorithms
            .iter()
            .map(|a| {
                let mut v = validation.clone();
                v.algorithms = vec![*a];
                (*a, v)
            })
            .collect();
        Verifier {
            keys,
            leeway: validation.leeway,
            validations,
            capacity: cfg.cache_size,
            max_bad_tokens: cfg.max_bad_tokens,
            caches: (0..workers.saturating_add(1))
                .map(|_| Mutex::new(TokenCache::default()))
                .collect(),
        }
    }

    /// Verifies `token` for `worker`: from its cache when this worker verified it before and it
    /// has not expired since, else by its signature and claims — unless `client` caused
    /// `max_bad_tokens` failed verifications on this worker this second already
    /// ([`Rejection::Throttled`], no signature checked).
    pub fn verify(
        &self,
        token: &str,
        client: IpAddr,
        worker: WorkerId,
    ) -> Result<Arc<Verified>, Rejection> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Err(Rejection::Malformed);
        }
        let now = now_secs();
        let slot = &self.caches[worker.slot(self.caches.len())];
        if self.capacity > 0 || self.max_bad_tokens > 0 {
            let mut cache = slot.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = cache.tokens.get(token) {
                if v.exp.saturating_add(self.leeway) >= now {
                    return Ok(v.clone());
                }
                cache.tokens.remove(token);
                return Err(Rejection::Expired);
            }
            if self.max_bad_tokens > 0
                && cache
                    .failures
                    .get(&client)
                    .is_some_and(|&(second, n)| second == now && n >= self.max_bad_tokens)
            {
                return Err(Rejection::Throttled);
            }
        }
        let verified = match self.verify_uncached(token) {
            Ok(v) => Arc::new(v),
            Err(r) => {
                if self.max_bad_tokens > 0 {
                    let mut cache = slot.lock().unwrap_or_else(|e| e.into_inner());
                    cache.failed(client, now);
                }
                return Err(r);
            }
        };
        if self.capacity > 0 && token.len() <= MAX_CACHED_TOKEN_BYTES {
            let mut cache = slot.lock().unwrap_or_else(|e| e.into_inner());
            if cache.tokens.len() >= self.capacity {
                // Full: drop the expired, and if that frees nothing, start over (a flood of
                // fresh tokens costs signature checks, never memory).
                let leeway = self.leeway;
                cache
                    .tokens
                    .retain(|_, v| v.exp.saturating_add(leeway) >= now);
                if cache.tokens.len() >= self.capacity {
                    cache.tokens.clear();
                }
            }
            cache.tokens.insert(Box::from(token), verified.clone());
        }
        Ok(verified)
    }

    /// What [`Verifier::verify`] would answer a request from `client` with `token`, changing
    /// nothing (`/-/explain`): no cache filled, no failure counted. [`Rejection::Throttled`]
    /// when some worker refuses `client`'s tokens this second and has not cached `token`
    /// (which worker a request lands on is not known here).
    pub fn verify_uncounted(
        &self,
        token: &str,
        client: IpAddr,
    ) -> Result<Arc<Verified>, Rejection> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Err(Rejection::Malformed);
        }
        if self.max_bad_tokens > 0 {
            let now = now_secs();
            let throttled = self.caches.iter().any(|slot| {
                let cache = slot.lock().unwrap_or_else(|e| e.into_inner());
                !cache.tokens.contains_key(token)
                    && cache
                        .failures
                        .get(&client)
                        .is_some_and(|&(second, n)| second == now && n >= self.max_bad_tokens)
            });
            if throttled {
                return Err(Rejection::Throttled);
            }
        }
        self.verify_uncached(token).map(Arc::new)
    }

    /// Addresses whose failures `worker` tracks this second.
    pub fn tracked(&self, worker: WorkerId) -> usize {
        self.caches[worker.slot(self.caches.len())]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failures
            .len()
    }

    /// Tokens in `worker`'s cache.
    pub fn cached(&self, worker: WorkerId) -> usize {
        self.caches[worker.slot(self.caches.len())]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tokens
            .len()
    }

    fn verify_uncached(&self, token: &str) -> Result<Verified, Rejection> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
            // An `alg` the crate does not know, `none` among them.
            jsonwebtoken::errors::ErrorKind::Json(_) if token_alg_is_unknown(token) => {
                Rejection::Algorithm
            }
            _ => Rejection::Malformed,
        })?;
        let Some((_, validation)) = self.validations.iter().find(|(a, _)| *a == header.alg) else {
            return Err(Rejection::Algorithm);
        };
        let candidates = self.keys.keys.iter().filter(|k| {
            k.alg.is_none_or(|a| a == header.alg)
                && match (&header.kid, &k.kid) {
                    (Some(want), Some(have)) => want == have,
                    (Some(_), None) => false,
                    (None, _) => true,
                }
        });
        let mut last = Rejection::UnknownKey;
        for k in candidates {
            match jsonwebtoken::decode::<serde_json::Value>(token, &k.key, validation) {
                Ok(data) => {
                    // `sub` is a string (RFC 7519 §4.1.2; a number is taken too, as many IdPs
                    // send one); another shape is a malformed token, whatever the shape (the
                    // decoder refuses a list but passes a boolean), issue #34 item 22.
                    if data
                        .claims
                        .get("sub")
                        .is_some_and(|s| !(s.is_string() || s.is_number()))
                    {
                        return Err(Rejection::Malformed);
                    }
                    let exp = data.claims.get("exp").and_then(numeric_date).unwrap_or(0);
                    return Ok(Verified {
                        claims: data.claims,
                        exp,
                    });
                }
                Err(e) => {
                    last = Rejection::of(&e);
                    // Only a signature (or key) mismatch is worth trying the next key for.
                    if last != Rejection::BadSignature && last != Rejection::Algorithm {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }
}

/// A NumericDate (RFC 7519 §2: seconds, possibly fractional) as whole seconds, rounded as the
/// `jsonwebtoken` crate rounds it when it checks `exp`: a cached token then expires at the
/// instant its first check would have refused it (a fractional `exp` read as 0 made every
/// cache hit an expiry, issue #34 item 19).
fn numeric_date(v: &serde_json::Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    // In range, the cast is exact for what a clock can reach; out of range it is refused.
    (f.is_finite() && f >= 0.0 && f < u64::MAX as f64).then(|| f.round() as u64)
}

/// Whether the token's header names an `alg` other than the known ones (`none` included).
fn token_alg_is_unknown(token: &str) -> bool {
    use base64::Engine as _;
    let Some(head) = token.split('.').next() else {
        return false;
    };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(head) else {
        return false;
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return false;
    };
    v.get("alg")
        .and_then(|a| a.as_str())
        .is_some_and(|a| a.parse::<Algorithm>().is_err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenSource;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use std::time::Duration;

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn cfg(issuer: Option<&str>, audience: Option<&str>) -> JwtConfig {
        JwtConfig {
            keys: JwtKeySource::SecretEnv("UNUSED".into()),
            algorithms: vec![Algorithm::HS256],
            issuer: issuer.map(str::to_owned),
            audience: audience.map(|a| vec![a.to_owned()]),
            leeway: Duration::from_secs(5),
            header: TokenSource::Bearer,
            query: None,
            cache_size: 2,
            max_bad_tokens: 0,
        }
    }

    fn verifier(c: &JwtConfig) -> Verifier {
        let keys = JwtKeys {
            keys: vec![Key {
                kid: None,
                alg: None,
                key: DecodingKey::from_secret(SECRET.as_bytes()),
            }],
        };
        Verifier::new(c, Arc::new(keys), 1)
    }

    fn token(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn tokens_are_checked_and_cached() {
        let c = cfg(Some("https://idp"), Some("api"));
        let v = verifier(&c);
        let exp = now_secs() + 600;
        let w = WorkerId::new(0);
        let good =
            token(serde_json::json!({"sub": "u1", "exp": exp, "iss": "https://idp", "aud": "api"}));
        assert_eq!(v.verify(&good, CLIENT, w).unwrap().claims["sub"], "u1");
        assert_eq!(v.cached(w), 1);
        assert!(v.verify(&good, CLIENT, w).is_ok());
        let no_iss = token(serde_json::json!({"sub": "u1", "exp": exp, "aud": "api"}));
        assert_eq!(v.verify(&no_iss, CLIENT, w).unwrap_err(), Rejection::Issuer);
        let bad_aud =
            token(serde_json::json!({"sub": "u1", "exp": exp, "iss": "https://idp", "aud": "x"}));
        assert_eq!(
            v.verify(&bad_aud, CLIENT, w).unwrap_err(),
            Rejection::Audience
        );
        let expired =
            token(serde_json::json!({"exp": now_secs() - 100, "iss": "https://idp", "aud": "api"}));
        assert_eq!(
            v.verify(&expired, CLIENT, w).unwrap_err(),
            Rejection::Expired
        );
        let no_exp = token(serde_json::json!({"iss": "https://idp", "aud": "api"}));
        assert_eq!(
            v.verify(&no_exp, CLIENT, w).unwrap_err(),
            Rejection::Malformed
        );
        let mut forged = good.clone();
        forged.pop();
        forged.push(if good.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(
            v.verify(&forged, CLIENT, w).unwrap_err(),
            Rejection::BadSignature
        );
        assert_eq!(
            v.verify("a.b", CLIENT, w).unwrap_err(),
            Rejection::Malformed
        );
        assert_eq!(
            v.verify(&"x".repeat(MAX_TOKEN_BYTES + 1), CLIENT, w)
                .unwrap_err(),
            Rejection::Malformed
        );
        // alg=none: header {"alg":"none"}, no signature.
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let none = format!(
            "{}.{}.",
            b64(r#"{"alg":"none","typ":"JWT"}"#),
            b64(&format!(
                r#"{{"sub":"u1","exp":{exp},"iss":"https://idp","aud":"api"}}"#
            ))
        );
        assert_eq!(
            v.verify(&none, CLIENT, w).unwrap_err(),
            Rejection::Algorithm
        );
        // The cache stays within its bound.
        for i in 0..10 {
            let t = token(
                serde_json::json!({"sub": i, "exp": exp, "iss": "https://idp", "aud": "api"}),
            );
            assert!(v.verify(&t, CLIENT, w).is_ok());
            assert!(v.cached(w) <= 2);
        }
    }

    /// Issue #34 item 19: a fractional `exp` (a NumericDate may be one, RFC 7519 §2) is the
    /// same instant on every request, cached or not.
    #[test]
    fn a_fractional_exp_verifies_alike_from_the_cache() {
        let c = cfg(None, None);
        let v = verifier(&c);
        let w = WorkerId::new(0);
        let exp = now_secs() as f64 + 600.5;
        let t = token(serde_json::json!({"sub": "u1", "exp": exp}));
        for i in 0..4 {
            assert!(v.verify(&t, CLIENT, w).is_ok(), "request {i}");
        }
        let past = token(serde_json::json!({"sub": "u1", "exp": now_secs() as f64 - 100.5}));
        assert_eq!(v.verify(&past, CLIENT, w).unwrap_err(), Rejection::Expired);
        // Not a number at all: no expiry known, malformed.
        let text = token(serde_json::json!({"sub": "u1", "exp": "soon"}));
        assert!(v.verify(&text, CLIENT, w).is_err());
    }

    /// Issue #34 item 22: `sub` is a string (RFC 7519 §4.1.2; a number is taken too, as many
    /// IdPs send one): a token whose `sub` is a list, an object, a boolean or null is malformed,
    /// whatever its shape — one rule, not the decoder's accident (a list was refused, a
    /// boolean passed).
    #[test]
    fn a_sub_of_another_shape_is_malformed() {
        let c = cfg(None, None);
        let v = verifier(&c);
        let w = WorkerId::new(0);
        let exp = now_secs() + 600;
        for sub in [
            serde_json::json!(["a", "b"]),
            serde_json::json!({"id": "a"}),
            serde_json::json!(true),
            serde_json::json!(null),
        ] {
            let t = token(serde_json::json!({"sub": sub, "exp": exp}));
            assert_eq!(
                v.verify(&t, CLIENT, w).unwrap_err(),
                Rejection::Malformed,
                "{sub}"
            );
        }
        for sub in [serde_json::json!("u1"), serde_json::json!(7)] {
            let t = token(serde_json::json!({"sub": sub, "exp": exp}));
            assert!(v.verify(&t, CLIENT, w).is_ok(), "{sub}");
        }
    }

    /// Issue #34, "Also decide": failed verifications are counted per address and second;
    /// past `max_bad_tokens` that address's uncached tokens are refused unverified, a cached
    /// one still serves, and the table of addresses stays bounded.
    #[test]
    fn failed_verifications_are_throttled_per_address() {
        let mut c = cfg(None, None);
        c.max_bad_tokens = 3;
        let v = verifier(&c);
        let w = WorkerId::new(0);
        let exp = now_secs() + 600;
        let good = token(serde_json::json!({"sub": "u1", "exp": exp}));
        assert!(v.verify(&good, CLIENT, w).is_ok());
        let bad = |i: u32| {
            let mut t = token(serde_json::json!({"sub": i, "exp": exp}));
            t.push_str("AA");
            t
        };
        // Within one second (retried once should the second turn meanwhile).
        let mut seen = Vec::new();
        for attempt in 0..2 {
            seen = (0..5)
                .map(|i| v.verify(&bad(i), CLIENT, w).unwrap_err())
                .collect();
            if seen[..3].iter().all(|r| *r == Rejection::BadSignature) && attempt == 0 {
                break;
            }
        }
        assert!(seen.contains(&Rejection::Throttled), "{seen:?}");
        assert!(
            v.verify(&good, CLIENT, w).is_ok(),
            "a cached token was throttled"
        );
        let other: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            v.verify(&bad(9), other, w).unwrap_err(),
            Rejection::BadSignature
        );
        for i in 0..(MAX_TRACKED_ADDRESSES as u32 + 10) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            let _ = v.verify("a.b.c", ip, w);
        }
        assert!(v.tracked(w) <= MAX_TRACKED_ADDRESSES);
    }

    #[test]
    fn jwks_files_are_checked() {
        assert!(JwtKeys::from_jwks("{").is_err());
        assert!(JwtKeys::from_jwks(r#"{"keys": []}"#).is_err());
        let k = JwtKeys::from_jwks(
            r#"{"keys":[{"kty":"RSA","kid":"k1","alg":"RS256","use":"sig","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"},{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}]}"#,
        )
        .unwrap();
        assert_eq!(k.len(), 1);
    }
}
