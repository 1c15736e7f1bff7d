//! The keys of a limit that looks at the response: `count_status`, `cost_header` and
//! `strip_cost_header` (a limit *charged after* the upstream answers), and the rules of
//! `algorithm = "concurrency"`.
//!
//! Kept apart from `limit.rs` so that one limit's rate arithmetic and these response rules can
//! change independently; `validate_limit` calls [`validate_after`] once.

use http::HeaderName;
use schemars::JsonSchema;
use serde::Deserialize;

use super::values::Algorithm;
use super::{invalid, ConfigError};

/// One `count_status` entry as written: `"401"`, `401` or a class `"4xx"`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum RawStatus {
    Code(u64),
    Text(String),
}

/// `reserve` as written: a number of units, or `"json:PATH"` (read from the request body).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "reserve: a positive number of units, or \"json:PATH\" (read from the request's JSON body)"
)]
pub(super) enum RawReserve {
    Units(u64),
    Text(String),
}

/// What a limit reserves when a request is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// `reserve = N`: N units.
    Units(u64),
    /// `reserve = "json:PATH"` with `reserve_max`: the non-negative integer at `path` of the
    /// request's JSON body, at least the limit's `cost` and at most `max`; the limit's `cost`
    /// when the body has none there (absent, not such an integer, not JSON, too large).
    Json { path: Box<[Box<str>]>, max: u64 },
}

impl Reserve {
    /// The reservation of a request whose body holds `value` at the path (`None`: nothing
    /// usable) under a limit of `cost`: a fixed one whatever the body says.
    pub fn units(&self, value: Option<u64>, cost: u64) -> u64 {
        match self {
            Reserve::Units(n) => *n,
            Reserve::Json { max, .. } => value.map_or(cost, |v| v.clamp(cost.min(*max), *max)),
        }
    }

    /// The most a request reserves.
    pub fn max(&self) -> u64 {
        match self {
            Reserve::Units(n) | Reserve::Json { max: n, .. } => *n,
        }
    }
}

/// A set of HTTP statuses 100–599 (a bit per status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusSet([u64; 10]);

impl StatusSet {
    fn insert(&mut self, status: u16) {
        let i = usize::from(status);
        if let Some(word) = self.0.get_mut(i / 64) {
            *word |= 1u64 << (i % 64);
        }
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        let i = usize::from(status);
        self.0
            .get(i / 64)
            .is_some_and(|word| word & (1u64 << (i % 64)) != 0)
    }
}

/// How a limit is charged after the response head arrives (check before, charge after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeAfter {
    /// Charge only responses with these statuses; `None`: every response.
    pub statuses: Option<StatusSet>,
    /// Charge the integer in this upstream response header (missing or malformed: `cost`).
    pub cost_header: Option<HeaderName>,
    /// Remove `cost_header` from the response to the client.
    pub strip_cost_header: bool,
    /// `cost_from`: the cost read from the body or trailers (empty: none), charged when the
    /// body ends; when none of it is found, `cost_header`'s value or `cost`.
    pub cost_from: Vec<super::cost_from::CostSource>,
    /// `reserve`: units taken when the request is admitted (it needs that many left), settled
    /// to the real cost after the response (the difference charged or given back).
    pub reserve: Option<Reserve>,
    /// `unit = "bytes"`: the limit counts body bytes (which: `bytes`), charged when the
    /// response body ends (or is cut); `None`: the limit counts requests (or reported costs).
    pub bytes: Option<CountedBytes>,
}

/// What a limit counts (`unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Requests (or the costs `cost`, `cost_header`, `cost_from` give them).
    #[default]
    Requests,
    /// Body bytes (`bytes` says whose).
    Bytes,
}

/// Whose body bytes a `unit = "bytes"` limit counts (`bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CountedBytes {
    /// The request body's bytes, as sent to the upstream.
    Request,
    /// The response body's bytes, as sent to the client.
    #[default]
    Response,
    /// Both.
    Both,
}

impl CountedBytes {
    /// Whether the response's bytes count.
    pub fn response(self) -> bool {
        self != CountedBytes::Request
    }

    /// Whether the request's bytes count.
    pub fn request(self) -> bool {
        self != CountedBytes::Response
    }
}

/// `unit` and `bytes` on a limit whose response keys gave `after`: a byte limit is charged
/// after the response (so not on the algorithms that cannot be), and its cost is the bytes, so
/// not with the keys that report one (`cost_header`, `cost_from`, `reserve`).
pub(super) fn validate_bytes(
    at: &str,
    algorithm: Algorithm,
    unit: Unit,
    bytes: Option<CountedBytes>,
    after: Option<ChargeAfter>,
) -> Result<Option<ChargeAfter>, ConfigError> {
    let lat = |field: &str| format!("{at}.{field}");
    if unit == Unit::Requests {
        if bytes.is_some() {
            return Err(invalid(lat("bytes"), "only applies with unit = \"bytes\""));
        }
        return Ok(after);
    }
    let why = match algorithm {
        Algorithm::Concurrency => Some("a concurrency limit counts requests in flight, not bytes"),
        Algorithm::LeakyBucket => Some(
            "leaky_bucket delays a request by its cost before forwarding it, and bytes are counted after the response; use token_bucket, gcra or a window",
        ),
        _ => None,
    };
    if let Some(why) = why {
        return Err(invalid(lat("unit"), why));
    }
    let mut after = after.unwrap_or(ChargeAfter {
        statuses: None,
        cost_header: None,
        strip_cost_header: false,
        cost_from: Vec::new(),
        reserve: None,
        bytes: None,
    });
    for (key, set) in [
        ("cost_header", after.cost_header.is_some()),
        ("cost_from", !after.cost_from.is_empty()),
        ("reserve", after.reserve.is_some()),
    ] {
        if set {
            return Err(invalid(
                lat(key),
                "not with unit = \"bytes\": a byte limit's cost is the bytes sent",
            ));
        }
    }
    after.bytes = Some(bytes.unwrap_or_default());
    Ok(Some(after))
}

/// Parses one entry of `count_status`.
fn parse_status(at: &str, s: &RawStatus, set: &mut StatusSet) -> Result<(), ConfigError> {
    let bad = || {
        invalid(
            at,
            format!("{s:?}: use a status 100-599 (\"401\") or a class (\"4xx\")"),
        )
    };
    match s {
        RawStatus::Code(n) => {
            let n = u16::try_from(*n).map_err(|_| bad())?;
            if !(100..=599).contains(&n) {
                return Err(bad());
            }
            set.insert(n);
        }
        RawStatus::Text(t) => {
            let t = t.trim().as_bytes();
            match t {
                [c @ b'1'..=b'5', x, y]
                    if x.eq_ignore_ascii_case(&b'x') && y.eq_ignore_ascii_case(&b'x') =>
                {
                    let base = u16::from(c - b'0') * 100;
                    for n in base..base + 100 {
                        set.insert(n);
                    }
                }
                [a @ b'1'..=b'5', b @ b'0'..=b'9', c @ b'0'..=b'9'] => {
                    set.insert(
                        u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'),
                    );
                }
                _ => return Err(bad()),
            }
        }
    }
    Ok(())
}

/// Validates the response keys of one limit (`at` is its path, e.g. `routes[0].limits[1]`).
pub(super) fn validate_after(
    at: &str,
    algorithm: Algorithm,
    count_status: Option<&[RawStatus]>,
    cost_header: Option<&str>,
    strip_cost_header: Option<bool>,
    cost_from: Option<&super::cost_from::RawCostFrom>,
    (reserve, reserve_max): (Option<&RawReserve>, Option<u64>),
) -> Result<Option<ChargeAfter>, ConfigError> {
    let lat = |field: &str| format!("{at}.{field}");
    let reserve = match reserve {
        None if reserve_max.is_some() => return Err(invalid(
            lat("reserve_max"),
            "only applies with reserve = \"json:PATH\" (a reservation read from the request body)",
        )),
        None => None,
        Some(_) if cost_header.is_none() && cost_from.is_none() => {
            return Err(invalid(
                lat("reserve"),
                "reserves units to settle to a reported cost: use it with cost_from or cost_header",
            ))
        }
        Some(RawReserve::Units(0)) => {
            return Err(invalid(lat("reserve"), "reserve at least 1 unit"))
        }
        Some(RawReserve::Units(_)) if reserve_max.is_some() => {
            return Err(invalid(
                lat("reserve_max"),
                "only applies with reserve = \"json:PATH\"; a fixed reserve is its own maximum",
            ))
        }
        Some(RawReserve::Units(n)) => Some(Reserve::Units(*n)),
        Some(RawReserve::Text(t)) => {
            let path = t
                .trim()
                .strip_prefix("json:")
                .and_then(super::cost_from::json_path)
                .ok_or_else(|| {
                    invalid(
                        lat("reserve"),
                        format!("{t:?}: reserve a number of units, or \"json:PATH\" (a dotted path of up to 16 object keys into the request's JSON body, e.g. \"json:max_tokens\")"),
                    )
                })?;
            let max = match reserve_max {
                Some(0) => return Err(invalid(lat("reserve_max"), "must be positive")),
                Some(m) => m,
                None => {
                    return Err(invalid(
                        lat("reserve_max"),
                        "is required with reserve = \"json:…\": the most one request reserves, whatever its body asks",
                    ))
                }
            };
            Some(Reserve::Json { path, max })
        }
    };
    if reserve.is_some() && matches!(algorithm, Algorithm::SlidingLog) {
        return Err(invalid(
            lat("reserve"),
            "sliding_log cannot give reserved units back; use fixed_window, sliding_window, token_bucket or gcra",
        ));
    }
    if count_status.is_none() && cost_header.is_none() && cost_from.is_none() {
        if strip_cost_header.is_some() {
            return Err(invalid(
                lat("strip_cost_header"),
                "only applies with cost_header",
            ));
        }
        return Ok(None);
    }
    let refused = match algorithm {
        Algorithm::Concurrency => {
            Some("a concurrency limit counts requests in flight; it is not charged after the response")
        }
        Algorithm::LeakyBucket => Some(
            "leaky_bucket delays a request by its cost before forwarding it; use token_bucket or gcra to charge after the response",
        ),
        _ => None,
    };
    if let Some(why) = refused {
        let field = if count_status.is_some() {
            "count_status"
        } else if cost_header.is_some() {
            "cost_header"
        } else {
            "cost_from"
        };
        return Err(invalid(lat(field), why));
    }
    let statuses = match count_status {
        None => None,
        Some([]) => {
            return Err(invalid(
                lat("count_status"),
                "list at least one status or class",
            ))
        }
        Some(list) => {
            let mut set = StatusSet::default();
            for (i, s) in list.iter().enumerate() {
                parse_status(&format!("{at}.count_status[{i}]"), s, &mut set)?;
            }
            Some(set)
        }
    };
    let cost_header =
        match cost_header {
            None => None,
            Some(name) => Some(HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                invalid(lat("cost_header"), format!("{name:?} is not a header name"))
            })?),
        };
    let cost_from = match cost_from {
        None => Vec::new(),
        Some(raw) => super::cost_from::validate(&lat("cost_from"), raw)?,
    };
    Ok(Some(ChargeAfter {
        statuses,
        cost_header,
        strip_cost_header: strip_cost_header.unwrap_or(false),
        cost_from,
        reserve,
        bytes: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &[RawStatus]) -> Result<StatusSet, ConfigError> {
        validate_after(
            "l",
            Algorithm::FixedWindow,
            Some(list),
            None,
            None,
            None,
            (None, None),
        )
        .map(|a| a.and_then(|a| a.statuses).unwrap_or_default())
    }

    #[test]
    fn statuses_and_classes_parse() {
        let s = set(&[
            RawStatus::Text("401".into()),
            RawStatus::Code(403),
            RawStatus::Text("5XX".into()),
        ])
        .unwrap();
        assert!(s.contains(401) && s.contains(403) && s.contains(500) && s.contains(599));
        assert!(!s.contains(200) && !s.contains(404) && !s.contains(402));
    }

    #[test]
    fn bad_statuses_are_refused() {
        for bad in ["600", "099", "4x", "40", "6xx", "abc", ""] {
            assert!(set(&[RawStatus::Text(bad.into())]).is_err(), "{bad}");
        }
        assert!(set(&[RawStatus::Code(70000)]).is_err());
        assert!(set(&[]).is_err());
    }

    fn parse(limit: &str) -> Result<super::super::Config, ConfigError> {
        let text = format!(
            "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n[[routes.limits]]\nname = \"l\"\nsubject = \"ip\"\n{limit}"
        );
        super::super::Config::parse(&text, std::path::Path::new("."))
    }

    #[test]
    fn the_contract_keys_parse_and_bad_ones_name_their_field() {
        let c = parse("algorithm = \"sliding_window\"\nlimit = 5\nperiod = \"15m\"\ncount_status = [\"401\", 403, \"5xx\"]\ncost_header = \"X-Tokens-Used\"\nstrip_cost_header = true").unwrap();
        let a = c.routes[0].limits[0].after.clone().unwrap();
        assert!(a.statuses.unwrap().contains(403) && a.statuses.unwrap().contains(502));
        assert_eq!(a.cost_header.unwrap().as_str(), "x-tokens-used");
        assert!(a.strip_cost_header);
        let c = parse("algorithm = \"concurrency\"\nlimit = 4\nperiod = \"5m\"").unwrap();
        assert_eq!(c.routes[0].limits[0].algorithm, Algorithm::Concurrency);
        assert_eq!(c.routes[0].limits[0].after, None);
        for (bad, field) in [
            ("algorithm = \"concurrency\"\nlimit = 4\nperiod = \"5m\"\ncost = 2", "cost"),
            ("algorithm = \"concurrency\"\nlimit = 4\nperiod = \"5m\"\nburst = 2", "burst"),
            ("algorithm = \"concurrency\"\nlimit = 4\nperiod = \"5m\"\ncount_status = [\"401\"]", "count_status"),
            ("algorithm = \"leaky_bucket\"\nlimit = 4\nperiod = \"5m\"\ncost_header = \"x-cost\"", "cost_header"),
            ("algorithm = \"gcra\"\nlimit = 4\nperiod = \"5m\"\ncount_status = [\"4x\"]", "count_status[0]"),
            ("algorithm = \"gcra\"\nlimit = 4\nperiod = \"5m\"\nstrip_cost_header = true", "strip_cost_header"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("limits[0].{field}")), "{bad}: {e}");
        }
    }

    #[test]
    fn reserve_needs_a_cost_source_a_number_and_an_algorithm_that_gives_back() {
        let ok = parse("algorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1h\"\nreserve = 40\ncost_from = \"json:usage.total_tokens\"").unwrap();
        assert_eq!(
            ok.routes[0].limits[0].after.as_ref().unwrap().reserve,
            Some(Reserve::Units(40))
        );
        let gcra = "algorithm = \"gcra\"\nlimit = 100\nperiod = \"1h\"\ncost_header = \"x-c\"";
        for (bad, field) in [
            ("algorithm = \"gcra\"\nlimit = 100\nperiod = \"1h\"\nreserve = 40", "reserve"),
            (&format!("{gcra}\nreserve = 0"), "reserve"),
            (&format!("{gcra}\nreserve = 101"), "reserve"),
            ("algorithm = \"sliding_log\"\nlimit = 100\nperiod = \"1h\"\nreserve = 10\ncost_header = \"x-c\"", "reserve"),
            // The JSON form: a usable path, and reserve_max with it (and only with it).
            (&format!("{gcra}\nreserve = \"json:\"\nreserve_max = 10"), "reserve"),
            (&format!("{gcra}\nreserve = \"json:a..b\"\nreserve_max = 10"), "reserve"),
            (&format!("{gcra}\nreserve = \"max_tokens\"\nreserve_max = 10"), "reserve"),
            (&format!("{gcra}\nreserve = \"json:max_tokens\""), "reserve_max"),
            (&format!("{gcra}\nreserve = \"json:max_tokens\"\nreserve_max = 0"), "reserve_max"),
            (&format!("{gcra}\nreserve = \"json:max_tokens\"\nreserve_max = 101"), "reserve_max"),
            (&format!("{gcra}\nreserve = \"json:max_tokens\"\nreserve_max = 4\ncost = 5"), "reserve_max"),
            (&format!("{gcra}\nreserve = 10\nreserve_max = 20"), "reserve_max"),
            (&format!("{gcra}\nreserve_max = 20"), "reserve_max"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("limits[0].{field}")), "{bad}: {e}");
        }
        // A value of no form: the key and line.
        let e = parse(&format!("{gcra}\nreserve = -1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("reserve") && e.contains("line 12"), "{e}");
        let ok = parse(&format!(
            "{gcra}\nreserve = \"json:max_tokens\"\nreserve_max = 50\ncost = 5"
        ))
        .unwrap();
        let r = ok.routes[0].limits[0]
            .after
            .as_ref()
            .unwrap()
            .reserve
            .clone()
            .unwrap();
        assert_eq!(
            r,
            Reserve::Json {
                path: vec![Box::from("max_tokens")].into(),
                max: 50
            }
        );
        // At least the cost, at most reserve_max; the cost without a usable value.
        assert_eq!(
            [Some(0), Some(20), Some(900), None].map(|v| r.units(v, 5)),
            [5, 20, 50, 5]
        );
    }

    #[test]
    fn concurrency_and_leaky_bucket_are_not_charged_after() {
        for a in [Algorithm::Concurrency, Algorithm::LeakyBucket] {
            assert!(
                validate_after("l", a, None, Some("x-cost"), None, None, (None, None)).is_err()
            );
        }
        assert!(validate_after(
            "l",
            Algorithm::Gcra,
            None,
            None,
            Some(true),
            None,
            (None, None)
        )
        .is_err());
        assert!(validate_after(
            "l",
            Algorithm::Gcra,
            None,
            Some("bad header"),
            None,
            None,
            (None, None)
        )
        .is_err());
    }
}
