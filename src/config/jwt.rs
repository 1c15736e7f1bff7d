//! `[jwt]`: how bearer tokens are verified (keys, algorithms, issuer, audience, leeway, where the
//! token is read) and a route's `jwt = "required" | "optional"`. The keys themselves (the JWKS
//! file, the secret's variable) are loaded by [`crate::jwt`], at start-up and on every reload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::HumanDuration;
use super::{bounded, invalid, ConfigError};

/// A signature algorithm as written (`"RS256"`); `none` is refused while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct JwtAlgorithm(pub jsonwebtoken::Algorithm);

impl TryFrom<String> for JwtAlgorithm {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("none") {
            return Err("\"none\" is never accepted: an unsigned token proves nothing".to_owned());
        }
        s.trim()
            .parse::<jsonwebtoken::Algorithm>()
            .map(JwtAlgorithm)
            .map_err(|_| {
                format!(
                    "unknown algorithm {s:?}; expected HS256, HS384, HS512, RS256, RS384, RS512, \
                 PS256, PS384, PS512, ES256, ES384 or EdDSA"
                )
            })
    }
}

/// One audience or a list of them.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `[jwt]` as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    /// A JWKS document (relative to the config file): RSA, EC (P-256, P-384) and Ed25519 keys; keys
    /// with `"use": "enc"` and kinds that cannot verify are skipped, at least one must remain (at
    /// most 64). Read at start-up and on every reload; a file that does not parse is a config error
    /// then: the gateway does not start, a reload is refused and the running keys keep serving
    /// (path).
    #[serde(default)]
    jwks_file: Option<PathBuf>,
    /// The name of an environment variable holding an HMAC secret (at least 16 bytes; use 32 random
    /// ones). Exactly one of `jwks_file` and `secret_env` (string).
    #[serde(default)]
    secret_env: Option<String>,
    /// Accepted signature algorithms: `HS256`, `HS384`, `HS512` (with `secret_env` only),
    /// `RS256`…`RS512`, `PS256`…`PS512`, `ES256`, `ES384`, `EdDSA` (with `jwks_file` only). `none`
    /// is an error: an unsigned token is never accepted (list; default: `["RS256"]` / `["HS256"]`).
    #[serde(default)]
    algorithms: Option<Vec<JwtAlgorithm>>,
    /// The `iss` a token must carry (then required) (string).
    #[serde(default)]
    issuer: Option<String>,
    /// A token's `aud` must name one of them (then required); without it `aud` is not checked
    /// (string or list).
    #[serde(default)]
    audience: Option<OneOrMany>,
    /// Clock skew allowed on `exp` and `nbf`; at most `1h` (duration; default: `"60s"`).
    #[serde(default = "default_leeway")]
    leeway: HumanDuration,
    /// Where the token is read: `Authorization: Bearer <token>` (RFC 6750), or the whole value of
    /// another header (header name; default: `"Authorization"`).
    #[serde(default)]
    header: Option<String>,
    /// Also read the token from this query parameter, when the header has none (string).
    #[serde(default)]
    query: Option<String>,
    /// Verified tokens kept per worker (0: none; at most 100000); tokens over 4 KiB are verified
    /// every time, so a cache holds at most about `cache_size` × 4 KiB (integer; default: `1024`).
    #[serde(default = "default_cache_size")]
    cache_size: usize,
    /// Failed verifications one client address may cause per second and worker; past it, that
    /// address's tokens not already in the cache are answered 429 (`Retry-After: 1`) without a
    /// signature check until the second ends (0: never; at most 1000000). See Cost below (integer;
    /// default: `20`).
    #[serde(default = "default_max_bad_tokens")]
    max_bad_tokens: u32,
}

fn default_leeway() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}

fn default_cache_size() -> usize {
    1024
}

fn default_max_bad_tokens() -> u32 {
    20
}

/// Where the verification keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeySource {
    /// A JWKS document (RFC 7517), re-read on every reload.
    JwksFile(PathBuf),
    /// A shared secret (HS256/384/512) in this environment variable.
    SecretEnv(String),
}

/// Where a request's token is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer <token>` (RFC 6750 §2.1).
    Bearer,
    /// The whole value of this header.
    Header(http::HeaderName),
}

/// `[jwt]`, validated.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub keys: JwtKeySource,
    /// The allow-list: a token signed otherwise is refused (`none` can never be listed).
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    pub issuer: Option<String>,
    pub audience: Option<Vec<String>>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    pub header: TokenSource,
    /// Also read the token from this query parameter (after the header).
    pub query: Option<String>,
    /// Verified tokens kept per worker.
    pub cache_size: usize,
    /// Failed verifications one client address may cause per second and worker before its
    /// uncached tokens are answered 429 unverified for the rest of that second (0: never).
    pub max_bad_tokens: u32,
}

/// A route's `jwt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JwtMode {
    /// No token: 401. A bad token: 401.
    Required,
    /// No token: served without claims. A bad token: 401.
    Optional,
}

/// The longest `leeway`.
const MAX_LEEWAY: Duration = Duration::from_secs(3600);
/// The largest `cache_size`.
const MAX_CACHE: usize = 100_000;
const MAX_BAD_TOKENS: u32 = 1_000_000;

fn is_hmac(a: jsonwebtoken::Algorithm) -> bool {
    use jsonwebtoken::Algorithm::*;
    matches!(a, HS256 | HS384 | HS512)
}

pub(super) fn validate_jwt(raw: RawJwt, base_dir: &Path) -> Result<JwtConfig, ConfigError> {
    let keys = match (raw.jwks_file, raw.secret_env) {
        (Some(f), None) if !f.as_os_str().is_empty() => JwtKeySource::JwksFile(base_dir.join(f)),
        (None, Some(v)) if !v.is_empty() => JwtKeySource::SecretEnv(v),
        _ => {
            return Err(invalid(
                "jwt",
                "set exactly one of `jwks_file` (public keys) and `secret_env` (an HS256/384/512 secret)",
            ))
        }
    };
    let hmac = matches!(keys, JwtKeySource::SecretEnv(_));
    let algorithms: Vec<jsonwebtoken::Algorithm> = match raw.algorithms {
        None if hmac => vec![jsonwebtoken::Algorithm::HS256],
        None => vec![jsonwebtoken::Algorithm::RS256],
        Some(a) if a.is_empty() => {
            return Err(invalid(
                "jwt.algorithms",
                "must list at least one algorithm",
            ))
        }
        Some(a) => a.into_iter().map(|a| a.0).collect(),
    };
    if let Some(a) = algorithms.iter().find(|a| is_hmac(**a) != hmac) {
        return Err(invalid(
            "jwt.algorithms",
            if hmac {
                format!("{a:?} needs public keys (`jwks_file`); `secret_env` verifies HS256/384/512 only")
            } else {
                format!("{a:?} needs a shared secret (`secret_env`); a JWKS file's keys verify the others")
            },
        ));
    }
    let leeway = bounded("jwt.leeway", raw.leeway, MAX_LEEWAY, "1h", true)?;
    let audience = match raw.audience {
        None => None,
        Some(OneOrMany::One(a)) => Some(vec![a]),
        Some(OneOrMany::Many(v)) if v.is_empty() => {
            return Err(invalid(
                "jwt.audience",
                "must list at least one audience (or be left out)",
            ))
        }
        Some(OneOrMany::Many(v)) => Some(v),
    };
    let header = match raw.header {
        None => TokenSource::Bearer,
        Some(h) => {
            let name = http::HeaderName::from_bytes(h.trim().as_bytes())
                .map_err(|_| invalid("jwt.header", format!("{h:?} is not a header name")))?;
            if name == http::header::AUTHORIZATION {
                TokenSource::Bearer
            } else {
                TokenSource::Header(name)
            }
        }
    };
    if raw.query.as_ref().is_some_and(String::is_empty) {
        return Err(invalid("jwt.query", "must not be empty"));
    }
    if raw.max_bad_tokens > MAX_BAD_TOKENS {
        return Err(invalid(
            "jwt.max_bad_tokens",
            format!("at most {MAX_BAD_TOKENS} a second (0: never throttle)"),
        ));
    }
    if raw.cache_size > MAX_CACHE {
        return Err(invalid(
            "jwt.cache_size",
            format!("at most {MAX_CACHE} tokens per worker"),
        ));
    }
    Ok(JwtConfig {
        keys,
        algorithms,
        issuer: raw.issuer,
        audience,
        leeway,
        header,
        query: raw.query,
        cache_size: raw.cache_size,
        max_bad_tokens: raw.max_bad_tokens,
    })
}
