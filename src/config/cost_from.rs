//! `cost_from`: where a limit charged after the response reads its cost in the response body
//! (`json:PATH`, also per event of a `text/event-stream`) or trailers (`trailer:NAME`), with a
//! weight per source (prices that differ between input and output tokens).

use http::HeaderName;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{invalid, ConfigError};

/// `cost_from` as written: one source, or a list of sources with optional weights.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum RawCostFrom {
    One(String),
    Many(Vec<RawSource>),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum RawSource {
    Path(String),
    Weighted(RawWeighted),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWeighted {
    /// `"json:PATH"` (a dotted path into the JSON body) or `"trailer:NAME"`.
    path: String,
    /// What one unit of this source costs (1 to 1000000; default 1).
    #[serde(default)]
    #[schemars(range(min = MIN_WEIGHT, max = MAX_WEIGHT))]
    weight: Option<u64>,
}

/// Where one part of the cost is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Object keys from the top of the JSON body (or of each SSE event's data).
    Json(Box<[Box<str>]>),
    /// An HTTP trailer holding an integer.
    Trailer(HeaderName),
}

/// One source and its weight: the cost is the sum of `weight × value` over the sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostSource {
    pub source: Source,
    pub weight: u64,
}

/// The most sources one limit reads.
pub const MAX_SOURCES: usize = 8;
/// The smallest weight (the loader's and the schema's bound).
pub const MIN_WEIGHT: u64 = 1;
/// The largest weight (with values of at most 2^53, the sum is computed in `u128` and clamped).
pub const MAX_WEIGHT: u64 = 1_000_000;
/// The most keys in a `json:` path.
const MAX_KEYS: usize = 16;

/// A `json:` path's keys (what follows `json:`): 1 to 16 non-empty object keys joined by dots;
/// `None` when it is not one. Shared by `cost_from`, `reserve` and `json:` subject parts.
pub(super) fn json_path(p: &str) -> Option<Box<[Box<str>]>> {
    let keys: Vec<Box<str>> = p.split('.').map(Box::from).collect();
    if keys.iter().any(|k| k.is_empty()) || keys.len() > MAX_KEYS {
        return None;
    }
    Some(keys.into())
}

fn parse_source(at: &str, path: &str) -> Result<Source, ConfigError> {
    if let Some(p) = path.strip_prefix("json:") {
        return json_path(p).map(Source::Json).ok_or_else(|| {
            invalid(
                at,
                format!("{path:?}: write json: and up to {MAX_KEYS} object keys joined by dots, e.g. \"json:usage.total_tokens\""),
            )
        });
    }
    if let Some(name) = path.strip_prefix("trailer:") {
        return HeaderName::from_bytes(name.as_bytes())
            .map(Source::Trailer)
            .map_err(|_| invalid(at, format!("{name:?} is not a header name")));
    }
    Err(invalid(
        at,
        format!("{path:?}: use \"json:PATH\" (a dotted path into the JSON body or each event of an event stream) or \"trailer:NAME\""),
    ))
}

/// Validates `cost_from` (`at` is the key's path, e.g. `routes[0].limits[1].cost_from`).
pub(super) fn validate(at: &str, raw: &RawCostFrom) -> Result<Vec<CostSource>, ConfigError> {
    let list: Vec<(String, RawSource)> = match raw {
        RawCostFrom::One(p) => vec![(at.to_owned(), RawSource::Path(p.clone()))],
        RawCostFrom::Many(l) => l
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("{at}[{i}]"), s.clone()))
            .collect(),
    };
    if list.is_empty() || list.len() > MAX_SOURCES {
        return Err(invalid(at, format!("list 1 to {MAX_SOURCES} sources")));
    }
    let mut out = Vec::with_capacity(list.len());
    for (at, s) in list {
        let (path, weight, wat) = match &s {
            RawSource::Path(p) => (p.as_str(), 1, at.clone()),
            RawSource::Weighted(w) => (
                w.path.as_str(),
                w.weight.unwrap_or(1),
                format!("{at}.weight"),
            ),
        };
        if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
            return Err(invalid(
                wat,
                format!("use a weight of {MIN_WEIGHT} to {MAX_WEIGHT}"),
            ));
        }
        let pat = match s {
            RawSource::Path(_) => at,
            RawSource::Weighted(_) => format!("{at}.path"),
        };
        let source = parse_source(&pat, path.trim())?;
        if out.iter().any(|c: &CostSource| c.source == source) {
            return Err(invalid(pat, format!("{path:?} is listed twice")));
        }
        out.push(CostSource { source, weight });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(toml_value: &str) -> Result<Vec<CostSource>, ConfigError> {
        #[derive(Deserialize)]
        struct T {
            c: RawCostFrom,
        }
        let t: T = toml::from_str(&format!("c = {toml_value}")).unwrap();
        validate("l.cost_from", &t.c)
    }

    #[test]
    fn sources_parse_with_weights() {
        let one = v("\"json:usage.total_tokens\"").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].weight, 1);
        assert_eq!(
            one[0].source,
            Source::Json(vec![Box::from("usage"), Box::from("total_tokens")].into())
        );
        let many = v("[{ path = \"json:usage.prompt_tokens\", weight = 1 }, { path = \"json:usage.completion_tokens\", weight = 4 }, \"trailer:x-tokens\"]").unwrap();
        assert_eq!(
            many.iter().map(|c| c.weight).collect::<Vec<_>>(),
            vec![1, 4, 1]
        );
        assert_eq!(
            many[2].source,
            Source::Trailer(HeaderName::from_static("x-tokens"))
        );
    }

    #[test]
    fn bad_sources_name_their_key() {
        for (bad, at) in [
            ("\"usage.total\"", "l.cost_from"),
            ("\"json:\"", "l.cost_from"),
            ("\"json:a..b\"", "l.cost_from"),
            ("\"trailer:bad name\"", "l.cost_from"),
            ("[]", "l.cost_from"),
            (
                "[{ path = \"json:a\", weight = 0 }]",
                "l.cost_from[0].weight",
            ),
            ("[\"json:a\", { path = \"xml:a\" }]", "l.cost_from[1].path"),
            ("[\"json:a\", \"json:a\"]", "l.cost_from[1]"),
        ] {
            let e = v(bad).unwrap_err().to_string();
            assert!(e.contains(at), "{bad}: {e}");
        }
    }
}
