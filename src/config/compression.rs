//! `[server.compression]` and `[routes.compression]` (#38 §1): which codings the gateway
//! answers in (its order of preference), from which length, for which media types, at which
//! level. A route's table replaces the server's whole (no key-by-key merge, as nginx's `gzip`
//! directives in a `location` replace the server's); a route without one uses the server's.

use schemars::JsonSchema;
use serde::Deserialize;

use super::{invalid, ConfigError};

/// The media types compressed when `types` is not set: text, JSON and the JSON-based types
/// gateways serve (problem+json included), JavaScript and XML.
pub const DEFAULT_TYPES: &[&str] = &[
    "text/*",
    "application/json",
    "application/problem+json",
    "application/x-ndjson",
    "application/ld+json",
    "application/javascript",
    "application/xml",
    "image/svg+xml",
];

/// A content coding the gateway can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Zstd,
    Br,
    Gzip,
}

impl Coding {
    /// Its token in `Accept-Encoding` and `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }
}

/// The table as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCompression {
    /// The codings answered in, the gateway's preference first; the client's q-values decide
    /// first, this order breaks ties (list of `"zstd"`, `"br"`, `"gzip"`; default: `["zstd",
    /// "br", "gzip"]`).
    #[serde(default)]
    #[schemars(schema_with = "super::schema::codings")]
    algorithms: Option<Vec<String>>,
    /// A response whose `Content-Length` is below this is sent as is; a body of unknown length
    /// is compressed (integer (bytes); default: `256`).
    #[serde(default)]
    min_length: Option<u64>,
    /// The media types compressed: `type/subtype` or `type/*` (list of strings; default: text/*,
    /// JSON and problem+json, NDJSON, JSON-LD, JavaScript, XML, SVG).
    #[serde(default)]
    types: Option<Vec<String>>,
    /// The compression level, 1 (fastest) to 9, of gzip and zstd; brotli runs at its quality 1
    /// whatever the level, its memory bounded (integer; default: gzip 6, zstd 3).
    #[serde(default)]
    #[schemars(range(min = MIN_LEVEL, max = MAX_LEVEL))]
    level: Option<u32>,
}

/// The codings the gateway produces, by name: the loader's and the schema's one list.
pub(super) const CODINGS: [(&str, Coding); 3] = [
    ("zstd", Coding::Zstd),
    ("br", Coding::Br),
    ("gzip", Coding::Gzip),
];
/// The levels taken (the loader's and the schema's bounds).
pub(super) const MIN_LEVEL: u32 = 1;
pub(super) const MAX_LEVEL: u32 = 9;

/// A compression table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compression {
    /// Non-empty, no repeats, preference first.
    pub algorithms: Vec<Coding>,
    pub min_length: u64,
    /// `type/subtype` or `type/*`, lower case.
    pub types: Vec<String>,
    /// 1 to 9; `None`: each coding's default.
    pub level: Option<u32>,
}

impl Compression {
    /// The media types as the rule ([`crate::compression::may_compress`]) reads them.
    pub fn type_list(&self) -> impl Iterator<Item = &str> {
        self.types.iter().map(String::as_str)
    }
}

/// Validates a compression table at `at` (`server.compression`, `routes[2].compression`).
pub(super) fn validate_compression(
    at: &str,
    r: RawCompression,
) -> Result<Compression, ConfigError> {
    let algorithms = match r.algorithms {
        None => vec![Coding::Zstd, Coding::Br, Coding::Gzip],
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for a in &list {
                let Some(&(_, c)) = CODINGS.iter().find(|(name, _)| name == a) else {
                    return Err(invalid(
                        format!("{at}.algorithms"),
                        format!("{a:?} is not a coding the gateway produces: \"zstd\", \"br\" or \"gzip\""),
                    ));
                };
                if out.contains(&c) {
                    return Err(invalid(
                        format!("{at}.algorithms"),
                        format!("{a:?} is listed twice"),
                    ));
                }
                out.push(c);
            }
            if out.is_empty() {
                return Err(invalid(
                    format!("{at}.algorithms"),
                    "an empty list compresses nothing; list codings or leave the table out",
                ));
            }
            out
        }
    };
    let types = match r.types {
        None => DEFAULT_TYPES.iter().map(|t| (*t).to_owned()).collect(),
        Some(list) => {
            if list.is_empty() {
                return Err(invalid(
                    format!("{at}.types"),
                    "an empty list compresses nothing; list media types or leave it out",
                ));
            }
            let mut out = Vec::with_capacity(list.len());
            for t in list {
                let ok = t.split_once('/').is_some_and(|(m, s)| {
                    let token = |x: &str| {
                        !x.is_empty()
                            && x.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
                    };
                    token(m) && (s == "*" || token(s))
                });
                if !ok {
                    return Err(invalid(
                        format!("{at}.types"),
                        format!("{t:?} is not a media type (`type/subtype` or `type/*`)"),
                    ));
                }
                out.push(t.to_ascii_lowercase());
            }
            out
        }
    };
    let level = match r.level {
        None => None,
        Some(l) if (MIN_LEVEL..=MAX_LEVEL).contains(&l) => Some(l),
        Some(l) => {
            return Err(invalid(
                format!("{at}.level"),
                format!("{l}: a level is 1 (fastest) to 9 (smallest)"),
            ))
        }
    };
    Ok(Compression {
        algorithms,
        min_length: r.min_length.unwrap_or(256),
        types,
        level,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(toml_text: &str) -> RawCompression {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn defaults_and_errors_name_the_key() {
        let c = validate_compression("server.compression", raw("")).unwrap();
        assert_eq!(c.algorithms, [Coding::Zstd, Coding::Br, Coding::Gzip]);
        assert_eq!(c.min_length, 256);
        assert!(c.types.iter().any(|t| t == "application/json"));
        for (text, key) in [
            ("algorithms = [\"deflate\"]", "algorithms"),
            ("algorithms = []", "algorithms"),
            ("algorithms = [\"br\", \"br\"]", "algorithms"),
            ("types = [\"json\"]", "types"),
            ("types = []", "types"),
            ("level = 0", "level"),
            ("level = 10", "level"),
        ] {
            let e = validate_compression("routes[0].compression", raw(text)).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("routes[0].compression.{key}")),
                "{text}: {e}"
            );
        }
        assert!(toml::from_str::<RawCompression>("gzip = true").is_err());
    }
}
