//! The response phase: what a route does to the head of every response it gives, the
//! upstream's and the gateway's own answers alike — the CORS headers of `[routes.cors]`, then
//! the rules of `[routes.response_headers]` (on the gateway's own answers too unless
//! `own_answers = false`). A front calls [`respond`] once per response, after the gateway's
//! own headers (rate-limit headers, `Retry-After`) are in place; a route with neither costs
//! one branch.
//!
//! Front-neutral: [`respond`] edits any [`HeaderEdit`] — a `HeaderMap` (the hyper front, the
//! gateway's own answers), or [`ResponseEdits`], the fast front's overlay on the upstream's
//! head as received (no `HeaderMap` is built from the upstream's fields, and a route with
//! nothing to do builds no overlay at all).

use http::header::{HeaderName, HeaderValue};
use smallvec::SmallVec;

use super::record::Trail;
use crate::fronting::{HeaderEdit, Vars};

/// Whether [`respond`] has anything to do on the responses of `trail`'s request.
pub fn responds(trail: &Trail<'_>) -> bool {
    trail.route.is_some_and(|r| r.fronting.touches_responses())
}

/// Applies the route's response-side fronting to `headers`. `own`: the gateway answered
/// itself (a 429, 401, 404, 5xx, a preflight, a redirect) rather than the upstream.
pub fn respond(
    trail: &Trail<'_>,
    request_id: &HeaderValue,
    own: bool,
    headers: &mut impl HeaderEdit,
) {
    let Some(route) = trail.route else {
        return;
    };
    let f = &route.fronting;
    if !f.touches_responses() {
        return;
    }
    if let Some(c) = &f.cors {
        c.write_response(trail.origin.as_ref(), headers);
    }
    if let Some(r) = &f.response_headers {
        if !own || r.own_answers {
            let vars = Vars {
                client_ip: trail.client_ip,
                request_id: Some(request_id),
                consumer: trail.consumer.as_deref().map(|c| &*c.name),
                route: &route.name,
                claims: trail.token.as_deref().map(|v| &v.claims),
                host: trail.host.as_deref(),
                path: &trail.path,
                captured: Some(route),
                ..Vars::default()
            };
            r.rules.apply(&vars, headers);
        }
    }
}

/// One header name the response phase changed, as `HeaderMap` would hold it after the same
/// operations on the upstream's head.
#[derive(Debug)]
struct Entry {
    name: HeaderName,
    /// The upstream's values of the name are kept (only appended to).
    keep: bool,
    /// The name was removed: what is set after goes at the end, as a new entry of a
    /// `HeaderMap` does.
    removed: bool,
    /// The values added or set, in order.
    values: SmallVec<[HeaderValue; 1]>,
    /// Written where the upstream's first field of the name is ([`ResponseEdits::resolve`]).
    in_place: bool,
}

/// The response phase's changes to an upstream head kept as received (the fast front's): the
/// names it touched with their fate, in the order a `HeaderMap` would have them.
#[derive(Debug, Default)]
pub struct ResponseEdits {
    entries: SmallVec<[Entry; 4]>,
}

impl ResponseEdits {
    fn entry(&mut self, name: &HeaderName) -> &mut Entry {
        let i = match self.entries.iter().position(|e| e.name == *name) {
            Some(i) => i,
            None => {
                self.entries.push(Entry {
                    name: name.clone(),
                    keep: true,
                    removed: false,
                    values: SmallVec::new(),
                    in_place: false,
                });
                self.entries.len() - 1
            }
        };
        &mut self.entries[i]
    }

    /// Places the entries against the upstream's fields (`fields`): an entry whose name the
    /// upstream sent and that was not removed is written in the place of its first field
    /// (`HeaderMap::insert` and `append` keep an entry's place); the others are handed to
    /// `end`, name and value, in order, to be written after the upstream's fields.
    pub fn resolve<'f>(
        &mut self,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])> + Clone,
        mut end: impl FnMut(&HeaderName, &[u8]),
    ) {
        for e in &mut self.entries {
            let n = e.name.as_str().as_bytes();
            e.in_place = !e.removed
                && fields
                    .clone()
                    .any(|(f, _)| f.len() == n.len() && f.eq_ignore_ascii_case(n));
            if !e.in_place {
                for v in &e.values {
                    end(&e.name, v.as_bytes());
                }
            }
        }
    }

    /// What becomes of the upstream's field `name` (see [`Fate`]).
    pub fn fate(&self, name: &[u8]) -> Fate<'_> {
        let found = self.entries.iter().enumerate().find(|(_, e)| {
            let n = e.name.as_str().as_bytes();
            n.len() == name.len() && n.eq_ignore_ascii_case(name)
        });
        match found {
            None => Fate::Kept,
            Some((i, e)) if e.in_place => Fate::Here {
                index: i,
                keep: e.keep,
                values: &e.values,
            },
            Some(_) => Fate::Dropped,
        }
    }
}

/// What becomes of an upstream response field under [`ResponseEdits`].
#[derive(Debug)]
pub enum Fate<'e> {
    /// Untouched: written as received.
    Kept,
    /// Removed or replaced by values written at the end.
    Dropped,
    /// The name's values are written at its first field's place: the upstream's (when `keep`)
    /// then `values`; its other fields are skipped. `index`: the entry's, to write it once.
    Here {
        index: usize,
        keep: bool,
        values: &'e [HeaderValue],
    },
}

impl HeaderEdit for ResponseEdits {
    fn remove(&mut self, name: &HeaderName) {
        let e = self.entry(name);
        e.keep = false;
        e.removed = true;
        e.values.clear();
        // A name set again after its removal comes last, as in a `HeaderMap`.
        if let Some(i) = self.entries.iter().position(|e| e.name == *name) {
            let e = self.entries.remove(i);
            self.entries.push(e);
        }
    }

    fn insert(&mut self, name: &HeaderName, value: HeaderValue) {
        let e = self.entry(name);
        e.keep = false;
        e.values.clear();
        e.values.push(value);
    }

    fn append(&mut self, name: &HeaderName, value: HeaderValue) {
        self.entry(name).values.push(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderMap;

    /// The overlay, written out over the upstream's fields, holds what a `HeaderMap` holds
    /// after the same operations, in the same order.
    #[test]
    fn the_overlay_is_what_a_header_map_would_hold() {
        let upstream: Vec<(&[u8], &[u8])> = vec![
            (b"Server", b"up"),
            (b"Vary", b"Accept"),
            (b"X-A", b"1"),
            (b"vary", b"Cookie"),
            (b"X-Gone", b"1"),
        ];
        let n = |s: &'static str| HeaderName::from_static(s);
        let v = |s: &'static str| HeaderValue::from_static(s);
        type Op = fn(&mut dyn FnMut(&str, &HeaderName, HeaderValue));
        let ops: Op = |f| {
            f(
                "append",
                &HeaderName::from_static("vary"),
                HeaderValue::from_static("Origin"),
            );
            f(
                "insert",
                &HeaderName::from_static("server"),
                HeaderValue::from_static("gw"),
            );
            f(
                "remove",
                &HeaderName::from_static("x-gone"),
                HeaderValue::from_static(""),
            );
            f(
                "insert",
                &HeaderName::from_static("x-new"),
                HeaderValue::from_static("n"),
            );
            f(
                "remove",
                &HeaderName::from_static("x-a"),
                HeaderValue::from_static(""),
            );
            f(
                "append",
                &HeaderName::from_static("x-a"),
                HeaderValue::from_static("2"),
            );
            f(
                "append",
                &HeaderName::from_static("x-new"),
                HeaderValue::from_static("m"),
            );
        };
        let mut map = HeaderMap::new();
        for (k, val) in &upstream {
            map.append(
                HeaderName::from_bytes(k).unwrap(),
                HeaderValue::from_bytes(val).unwrap(),
            );
        }
        let mut edits = ResponseEdits::default();
        ops(&mut |op, name, value| match op {
            "append" => {
                HeaderEdit::append(&mut map, name, value.clone());
                edits.append(name, value);
            }
            "insert" => {
                HeaderEdit::insert(&mut map, name, value.clone());
                edits.insert(name, value);
            }
            _ => {
                HeaderEdit::remove(&mut map, name);
                HeaderEdit::remove(&mut edits, name);
            }
        });
        let want: Vec<(String, String)> = map
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let mut end = Vec::new();
        edits.resolve(upstream.iter().copied(), |k, v| {
            end.push((k.to_string(), String::from_utf8(v.to_vec()).unwrap()))
        });
        let mut got = Vec::new();
        let mut done = Vec::new();
        for (k, val) in &upstream {
            let name = String::from_utf8(k.to_ascii_lowercase()).unwrap();
            match edits.fate(k) {
                Fate::Kept => got.push((name, String::from_utf8(val.to_vec()).unwrap())),
                Fate::Dropped => {}
                Fate::Here {
                    index,
                    keep,
                    values,
                } => {
                    if done.contains(&index) {
                        continue;
                    }
                    done.push(index);
                    if keep {
                        for (k2, v2) in &upstream {
                            if k2.eq_ignore_ascii_case(k) {
                                got.push((name.clone(), String::from_utf8(v2.to_vec()).unwrap()));
                            }
                        }
                    }
                    for x in values {
                        got.push((name.clone(), x.to_str().unwrap().to_owned()));
                    }
                }
            }
        }
        got.extend(end);
        assert_eq!(got, want);
        let _ = (n("a"), v("b"));
    }
}
