//! The values at a few dotted paths of one JSON document held in memory: what a route's
//! `json:` subject parts and `reserve = "json:…"` read from a request body (at most the route's
//! `max_json_bytes`, read before the limits).
//!
//! The document is walked once by serde_json with a seed that descends only into the object
//! keys some path names and skips everything else without building it (no tree of values, no
//! allocation per skipped string or number), so the work is one validating pass over the bytes
//! and the memory a few small values, whatever the body holds. Rules, as `cost_from`'s scan of
//! response bodies (`crate::body_cost::json`):
//! - a path is a list of object keys from the top-level object (`model`, `a.b`); keys are
//!   compared after JSON unescaping; paths do not index arrays;
//! - a key repeated in one object: its last value counts, whole (paths through an earlier value
//!   are forgotten);
//! - a document that is not JSON (cut, trailing bytes, a byte-order mark) has no values at all.
//!
//! Depth: the seed recurses only along the paths (at most 16 keys); what it skips, serde_json
//! skips without recursion, so no nesting can exhaust the stack.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

/// What one path holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field {
    /// Not in the document (or the document is not JSON).
    #[default]
    Missing,
    /// A string, unescaped.
    Text(Box<str>),
    /// A non-negative integer that fits 64 bits.
    Int(u64),
    /// Anything else: a negative or fractional number, a boolean, null, an object, a list.
    Other,
}

/// The values found for a list of paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields<'p> {
    paths: &'p [Box<[Box<str>]>],
    /// One per path, in their order.
    pub values: Vec<Field>,
}

impl<'p> Fields<'p> {
    /// Every path missing (a body that was not read, or not JSON).
    pub fn missing(paths: &'p [Box<[Box<str>]>]) -> Fields<'p> {
        Fields {
            paths,
            values: vec![Field::Missing; paths.len()],
        }
    }

    /// What `path` holds (missing when it is not one of the paths looked for).
    pub fn get(&self, path: &[Box<str>]) -> &Field {
        self.paths
            .iter()
            .position(|p| **p == *path)
            .and_then(|i| self.values.get(i))
            .unwrap_or(&Field::Missing)
    }

    /// The non-empty string at `path`.
    pub fn text(&self, path: &[Box<str>]) -> Option<&str> {
        match self.get(path) {
            Field::Text(t) if !t.is_empty() => Some(t),
            _ => None,
        }
    }

    /// The non-negative integer at `path`.
    pub fn int(&self, path: &[Box<str>]) -> Option<u64> {
        match self.get(path) {
            Field::Int(n) => Some(*n),
            _ => None,
        }
    }
}

/// The values of `paths` in `doc`; every one missing when `doc` is not one JSON document.
pub fn extract<'p>(paths: &'p [Box<[Box<str>]>], doc: &[u8]) -> Fields<'p> {
    let mut found = Fields::missing(paths);
    let all: SmallVec<[usize; 4]> = (0..paths.len()).collect();
    let mut de = serde_json::Deserializer::from_slice(doc);
    let walked = At {
        paths,
        live: all,
        depth: 0,
        found: &mut found.values,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match walked {
        Ok(()) => found,
        Err(_) => Fields::missing(paths),
    }
}

/// A value at `depth` that the paths `live` lead to (their keys matched down to it).
struct At<'a, 'p> {
    paths: &'p [Box<[Box<str>]>],
    live: SmallVec<[usize; 4]>,
    depth: usize,
    found: &'a mut Vec<Field>,
}

impl At<'_, '_> {
    /// Records `f` for the live paths that end here.
    fn ends(&mut self, f: impl Fn() -> Field) {
        for &i in &self.live {
            if self.paths.get(i).is_some_and(|p| p.len() == self.depth) {
                if let Some(slot) = self.found.get_mut(i) {
                    *slot = f();
                }
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for At<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for At<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<(), E> {
        self.ends(|| Field::Text(Box::from(v)));
        Ok(())
    }

    fn visit_u64<E: de::Error>(mut self, v: u64) -> Result<(), E> {
        self.ends(|| Field::Int(v));
        Ok(())
    }

    fn visit_i64<E: de::Error>(mut self, v: i64) -> Result<(), E> {
        // serde_json hands non-negative integers to `visit_u64`: this one is negative.
        self.ends(|| u64::try_from(v).map_or(Field::Other, Field::Int));
        Ok(())
    }

    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.ends(|| Field::Other);
        Ok(())
    }

    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.ends(|| Field::Other);
        Ok(())
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.ends(|| Field::Other);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        // Paths name object keys only: nothing inside a list is theirs.
        self.ends(|| Field::Other);
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.ends(|| Field::Other);
        let depth = self.depth;
        while let Some(next) = map.next_key_seed(Key {
            paths: self.paths,
            live: &self.live,
            depth,
        })? {
            if next.is_empty() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            // A repeated key's new value replaces the old one whole.
            for &i in &next {
                if let Some(slot) = self.found.get_mut(i) {
                    *slot = Field::Missing;
                }
            }
            map.next_value_seed(At {
                paths: self.paths,
                live: next,
                depth: depth + 1,
                found: &mut *self.found,
            })?;
        }
        Ok(())
    }
}

/// An object key at `depth`: which of the `live` paths name it there.
struct Key<'a, 'p> {
    paths: &'p [Box<[Box<str>]>],
    live: &'a [usize],
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Key<'_, '_> {
    type Value = SmallVec<[usize; 4]>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_, '_> {
    type Value = SmallVec<[usize; 4]>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, k: &str) -> Result<Self::Value, E> {
        Ok(self
            .live
            .iter()
            .copied()
            .filter(|&i| {
                self.paths
                    .get(i)
                    .and_then(|p| p.get(self.depth))
                    .is_some_and(|key| **key == *k)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<Box<[Box<str>]>> {
        list.iter()
            .map(|p| p.split('.').map(Box::from).collect())
            .collect()
    }

    fn get(list: &[&str], doc: &str) -> Vec<Field> {
        extract(&paths(list), doc.as_bytes()).values
    }

    fn text(s: &str) -> Field {
        Field::Text(Box::from(s))
    }

    #[test]
    fn strings_integers_and_others() {
        let doc = r#"{"model":"gpt-x","max_tokens":500,"n":-1,"t":0.5,"s":true,"z":null,
                      "o":{"a":{"b":"deep"}},"l":["model"],"e":""}"#;
        assert_eq!(
            get(
                &[
                    "model",
                    "max_tokens",
                    "n",
                    "t",
                    "s",
                    "z",
                    "o.a.b",
                    "o",
                    "l",
                    "e",
                    "nope",
                    "o.x"
                ],
                doc
            ),
            vec![
                text("gpt-x"),
                Field::Int(500),
                Field::Other,
                Field::Other,
                Field::Other,
                Field::Other,
                text("deep"),
                Field::Other,
                Field::Other,
                text(""),
                Field::Missing,
                Field::Missing,
            ]
        );
    }

    #[test]
    fn keys_are_unescaped_and_the_last_repeat_counts_whole() {
        assert_eq!(
            get(&["model"], r#"{"mod\u0065l":"a\"b"}"#),
            vec![text("a\"b")]
        );
        assert_eq!(get(&["m"], r#"{"m":"a","m":"b"}"#), vec![text("b")]);
        assert_eq!(
            get(&["a.b"], r#"{"a":{"b":"x"},"a":1}"#),
            vec![Field::Missing]
        );
        assert_eq!(get(&["a.b"], r#"{"a":1,"a":{"b":"x"}}"#), vec![text("x")]);
        // Inside a list nothing matches.
        assert_eq!(get(&["m"], r#"[{"m":"a"}]"#), vec![Field::Missing]);
        assert_eq!(get(&["m"], r#""m""#), vec![Field::Missing]);
    }

    #[test]
    fn a_document_that_is_not_json_has_no_values() {
        for bad in [
            "",
            "not json",
            r#"{"model":"a""#,
            r#"{"model":"a"} x"#,
            r#"{"model":"a",}"#,
            "\u{feff}{\"model\":\"a\"}",
        ] {
            assert_eq!(get(&["model"], bad), vec![Field::Missing], "{bad:?}");
        }
        // Skipped nesting costs no stack, however deep.
        let deep = format!(
            "{{\"model\":\"a\",\"x\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(get(&["model"], &deep), vec![text("a")]);
        let cut = format!("{{\"model\":\"a\",\"x\":{}", "[".repeat(100_000));
        assert_eq!(get(&["model"], &cut), vec![Field::Missing]);
        assert_eq!(get(&["model"], "{\"model\":\"a\"}\n "), vec![text("a")]);
    }

    #[test]
    fn lookups_by_path() {
        let p = paths(&["model", "max_tokens", "e"]);
        let f = extract(&p, br#"{"model":"m","max_tokens":7,"e":""}"#);
        assert_eq!(f.text(&p[0]), Some("m"));
        assert_eq!(f.int(&p[1]), Some(7));
        assert_eq!(f.text(&p[1]), None);
        assert_eq!(f.text(&p[2]), None, "an empty string is no value");
        assert_eq!(f.get(&paths(&["other"])[0]), &Field::Missing);
    }

    /// Differential: on random documents, what a lookup in serde_json's parsed value gives.
    #[test]
    fn agrees_with_a_lookup_in_the_parsed_value() {
        use serde_json::{json, Value};
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        fn value(next: &mut dyn FnMut(u64) -> u64, depth: u32) -> Value {
            let keys = ["a", "b", "model", "m\"x"];
            match next(if depth > 3 { 6 } else { 8 }) {
                0 => json!(next(3) as i64 - 1),
                1 => json!(["a", "model"][next(2) as usize]),
                2 => json!(0.5),
                3 => Value::Null,
                4 => json!(true),
                5 => json!(""),
                6 => Value::Array((0..next(3)).map(|_| value(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next(4))
                        .map(|_| (keys[next(4) as usize].to_owned(), value(next, depth + 1)))
                        .collect(),
                ),
            }
        }
        let list = paths(&["a", "model", "a.b", "b.model.a", "m\"x"]);
        for _ in 0..2000 {
            let v = value(&mut next, 0);
            let doc = v.to_string();
            let got = extract(&list, doc.as_bytes());
            for (p, f) in list.iter().zip(&got.values) {
                let mut at = Some(&v);
                for k in p.iter() {
                    at = at.and_then(|x| x.as_object()).and_then(|o| o.get(&**k));
                }
                let want = match at {
                    None => Field::Missing,
                    Some(Value::String(s)) => Field::Text(Box::from(s.as_str())),
                    Some(x) => x.as_u64().map_or(Field::Other, Field::Int),
                };
                assert_eq!(*f, want, "{doc} at {p:?}");
            }
        }
    }

    #[test]
    fn big_numbers_are_not_integers() {
        assert_eq!(
            get(
                &["a", "b"],
                r#"{"a":18446744073709551615,"b":18446744073709551616}"#
            ),
            vec![Field::Int(u64::MAX), Field::Other]
        );
    }
}
