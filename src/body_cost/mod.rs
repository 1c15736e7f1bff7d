//! Reading a cost from a response body as it streams past (`cost_from`): a scan of a JSON
//! body or of each event of a `text/event-stream` ([`json`], [`sse`]), and the trailers. It
//! holds no body: memory is bounded per request whatever the body's size.
//!
//! A body the upstream sent gzip-encoded (`Content-Encoding: gzip`) is decoded as it passes
//! ([`gzip`]: a streaming decoder, its 32 KiB window and buffer the only memory it adds) and
//! the decoded bytes scanned; past [`gzip::MAX_DECODED`] decoded bytes (a decompression bomb),
//! or when the bytes are not gzip, every JSON path is *malformed* (the limit's fallback cost is
//! charged) and decoding stops. Other codings are not decoded: malformed.

pub mod gzip;
pub mod json;
pub mod json_fields;
pub mod sse;

use http::header::{HeaderMap, HeaderName, CONTENT_ENCODING, CONTENT_TYPE};

pub use self::json::Found;
use self::json::JsonScan;
use self::sse::SseScan;
use crate::config::{CostSource, CostSourceKind};
use crate::limiter::charge::parse_cost;

/// How the body is followed.
pub(crate) enum Mode {
    Json(JsonScan),
    Sse(SseScan),
    /// A gzip body, decoded into the scan of what it encodes.
    Gzip(Box<gzip::GzipScan>),
    /// A body encoded (`Content-Encoding`) or with no JSON path asked: not scanned; every JSON
    /// path is `Malformed` (encoded) or never asked.
    Off(Found),
}

/// The scan of one response body for the JSON paths and trailers of its limits' `cost_from`.
pub struct BodyScan {
    paths: Vec<Box<[Box<str>]>>,
    trailers: Vec<(HeaderName, Found)>,
    mode: Mode,
    /// The JSON paths' results, once the body has ended.
    ended: Option<Vec<Found>>,
}

impl BodyScan {
    /// A scan for every source of `sources`, of a response with `headers`.
    pub fn new<'a>(sources: impl Iterator<Item = &'a CostSource>, headers: &HeaderMap) -> BodyScan {
        let mut paths: Vec<Box<[Box<str>]>> = Vec::new();
        let mut trailers = Vec::new();
        for s in sources {
            match &s.source {
                CostSourceKind::Json(p) => {
                    if !paths.contains(p) {
                        paths.push(p.clone());
                    }
                }
                CostSourceKind::Trailer(n) => {
                    if !trailers.iter().any(|(t, _)| t == n) {
                        trailers.push((n.clone(), Found::Missing));
                    }
                }
            }
        }
        let refs: Vec<&[Box<str>]> = paths.iter().map(|p| &**p).collect();
        let coding = headers.get(CONTENT_ENCODING).map(|v| v.as_bytes());
        let encoded = coding.is_some_and(|v| !v.eq_ignore_ascii_case(b"identity"));
        let gzip = coding
            .is_some_and(|v| v.eq_ignore_ascii_case(b"gzip") || v.eq_ignore_ascii_case(b"x-gzip"));
        let stream = headers.get(CONTENT_TYPE).is_some_and(|v| {
            let v = v.as_bytes();
            v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream")
        });
        let plain = || {
            if stream {
                Mode::Sse(SseScan::new(&refs))
            } else {
                Mode::Json(JsonScan::new(&refs))
            }
        };
        let mode = if paths.is_empty() {
            Mode::Off(Found::Missing)
        } else if gzip {
            Mode::Gzip(Box::new(gzip::GzipScan::new(plain())))
        } else if encoded {
            Mode::Off(Found::Malformed)
        } else {
            plain()
        };
        BodyScan {
            paths,
            trailers,
            mode,
            ended: None,
        }
    }

    /// The next bytes of the body.
    pub fn data(&mut self, bytes: &[u8]) {
        self.mode.feed(bytes);
    }

    /// The body's trailers.
    pub fn trailers(&mut self, headers: &HeaderMap) {
        self.trailer_fields(|| {
            headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        });
    }

    /// Whether a source is a trailer (the fast front keeps a chunked body's trailers then).
    pub fn reads_trailers(&self) -> bool {
        !self.trailers.is_empty()
    }

    /// The body's trailer fields (`fields()` lists them, name in any case and value, in
    /// order): a source's trailer sent once with an integer is found; sent twice or not an
    /// integer, malformed.
    pub fn trailer_fields<'a, I: Iterator<Item = (&'a [u8], &'a [u8])>>(
        &mut self,
        fields: impl Fn() -> I,
    ) {
        for (name, found) in &mut self.trailers {
            let name = name.as_str().as_bytes();
            let mut values = fields()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v);
            *found = match (values.next(), values.next()) {
                (Some(v), None) => parse_cost(v).map_or(Found::Malformed, Found::Value),
                (None, _) => Found::Missing,
                _ => Found::Malformed,
            };
        }
    }

    /// The body ended (in full, or cut: the client left, the upstream failed). A JSON body
    /// that is cut is malformed; an event stream keeps what its complete events carried.
    pub fn end(&mut self) {
        if self.ended.is_some() {
            return;
        }
        self.ended = Some(self.mode.results(self.paths.len()));
    }

    /// What `source` was found to be (call [`BodyScan::end`] first).
    pub fn found(&self, source: &CostSourceKind) -> Found {
        match source {
            CostSourceKind::Json(p) => self
                .paths
                .iter()
                .position(|q| q == p)
                .and_then(|i| self.ended.as_ref()?.get(i).copied())
                .unwrap_or(Found::Missing),
            CostSourceKind::Trailer(n) => self
                .trailers
                .iter()
                .find(|(t, _)| t == n)
                .map_or(Found::Missing, |(_, f)| *f),
        }
    }
}

impl Mode {
    fn feed(&mut self, bytes: &[u8]) {
        match self {
            Mode::Json(s) => s.feed(bytes),
            Mode::Sse(s) => s.feed(bytes),
            Mode::Gzip(g) => g.feed(bytes),
            Mode::Off(_) => {}
        }
    }

    /// What the scan found for each of its `paths` JSON paths, the body having ended.
    fn results(&mut self, paths: usize) -> Vec<Found> {
        match self {
            Mode::Json(s) => {
                s.finish();
                s.results()
            }
            Mode::Sse(s) => s.results(),
            Mode::Gzip(g) => match g.finish() {
                Some(inner) => inner.results(paths),
                None => vec![Found::Malformed; paths],
            },
            Mode::Off(f) => vec![*f; paths],
        }
    }
}

/// How a limit's `cost_from` came out: the weighted sum when every source held a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Found(u64),
    Missing,
    Malformed,
}

/// The weighted sum of `sources` as found by `scan`: `Found` when every source is a value,
/// `Malformed` when one is malformed, else `Missing`. Saturates (the charge is clamped to the
/// limit's quota anyway).
pub fn cost_of(scan: &BodyScan, sources: &[CostSource]) -> Outcome {
    let mut sum: u128 = 0;
    let mut missing = false;
    for s in sources {
        match scan.found(&s.source) {
            Found::Value(v) => sum = sum.saturating_add(u128::from(v) * u128::from(s.weight)),
            Found::Missing => missing = true,
            Found::Malformed => return Outcome::Malformed,
        }
    }
    if missing {
        Outcome::Missing
    } else {
        Outcome::Found(u64::try_from(sum).unwrap_or(u64::MAX))
    }
}
