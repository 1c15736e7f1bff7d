//! The consumers file, loaded into a hash map keyed by the SHA-256 of each consumer's key.
//!
//! ```toml
//! [[consumer]]
//! name = "acme"
//! plan = "gold"
//! key_sha256 = "5e8848…"
//! ```
//!
//! The whole file is parsed and checked before anything is used: a reload with a bad file keeps
//! the previous table, and the error names the line. A request's lookup is one probe of the map
//! on the hash of its key: no file access, no scan, whatever the number of consumers.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::key::{parse_hex, KeyHash};
use crate::limiter::SubjectDigest;

/// The longest consumer name.
const MAX_NAME: usize = 128;

/// One consumer.
#[derive(Debug, Clone)]
pub struct Consumer {
    /// Shown in logs, the access log and sent upstream as `X-Consumer`; never a metric label.
    pub name: Box<str>,
    /// Its plan: an index into the configuration's `[[plans]]`.
    pub plan: usize,
    /// What its plan limits count by: the consumer, not the key (a rotated key keeps the count).
    pub subject: SubjectDigest,
}

/// Every consumer, by the SHA-256 of its key.
#[derive(Debug, Default)]
pub struct ConsumerTable {
    by_key: HashMap<KeyHash, Consumer>,
}

/// Why the consumers file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConsumersFileError {
    #[error("cannot read the consumers file: {0}")]
    Read(#[from] std::io::Error),
    /// Not TOML, or a consumer entry of the wrong shape (the message names the line).
    #[error("{0}")]
    Parse(String),
    /// A consumer is invalid: the line of the offending value.
    #[error("line {line}: {message}")]
    Invalid { line: usize, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    consumer: Vec<RawConsumer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConsumer {
    name: Spanned<String>,
    plan: Spanned<String>,
    key_sha256: Spanned<String>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()
        .get(..offset)
        .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
        + 1
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && !name.starts_with(' ')
        && !name.ends_with(' ')
}

impl ConsumerTable {
    /// Reads and checks the consumers file at `path`; `plans` are the configured plan names.
    pub fn load(path: &Path, plans: &[&str]) -> Result<ConsumerTable, ConsumersFileError> {
        let text = std::fs::read_to_string(path)?;
        ConsumerTable::parse(&text, plans)
    }

    /// Parses and checks the text of a consumers file.
    pub fn parse(text: &str, plans: &[&str]) -> Result<ConsumerTable, ConsumersFileError> {
        let raw: RawFile = toml::from_str(text)
            .map_err(|e| ConsumersFileError::Parse(e.to_string().trim_end().to_owned()))?;
        let bad = |offset: usize, message: String| ConsumersFileError::Invalid {
            line: line_of(text, offset),
            message,
        };
        let mut by_key = HashMap::with_capacity(raw.consumer.len());
        let mut names: HashSet<&str> = HashSet::with_capacity(raw.consumer.len());
        for c in &raw.consumer {
            let name = c.name.get_ref().as_str();
            if !valid_name(name) {
                return Err(bad(
                    c.name.span().start,
                    format!("consumer name {name:?}: use 1-{MAX_NAME} visible ASCII characters (inner spaces allowed)"),
                ));
            }
            if !names.insert(name) {
                return Err(bad(
                    c.name.span().start,
                    format!("duplicate consumer name {name:?}"),
                ));
            }
            let plan_name = c.plan.get_ref();
            let Some(plan) = plans.iter().position(|p| p == plan_name) else {
                return Err(bad(
                    c.plan.span().start,
                    format!("consumer {name:?}: no [[plans]] entry is named {plan_name:?}"),
                ));
            };
            let Some(hash) = parse_hex(c.key_sha256.get_ref()) else {
                return Err(bad(
                    c.key_sha256.span().start,
                    format!("consumer {name:?}: key_sha256 must be 64 hex digits (the SHA-256 of the key; `tollgate key hash` prints it)"),
                ));
            };
            let consumer = Consumer {
                name: name.into(),
                plan,
                subject: SubjectDigest::of(b'c', name.as_bytes()),
            };
            if let Some(other) = by_key.insert(hash, consumer) {
                return Err(bad(
                    c.key_sha256.span().start,
                    format!(
                        "consumer {name:?} has the same key as consumer {:?}",
                        other.name
                    ),
                ));
            }
        }
        Ok(ConsumerTable { by_key })
    }

    /// The consumer whose key hashes to `hash`.
    pub fn get(&self, hash: &KeyHash) -> Option<&Consumer> {
        self.by_key.get(hash)
    }

    /// How many consumers there are.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The consumers (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = &Consumer> {
        self.by_key.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::{hash_key, hex};

    fn entry(name: &str, plan: &str, key: &str) -> String {
        format!(
            "[[consumer]]\nname = \"{name}\"\nplan = \"{plan}\"\nkey_sha256 = \"{}\"\n\n",
            hex(&hash_key(key.as_bytes()))
        )
    }

    #[test]
    fn consumers_are_found_by_the_hash_of_their_key() {
        let text = entry("acme", "gold", "k1") + &entry("globex", "free", "k2");
        let t = ConsumerTable::parse(&text, &["free", "gold"]).unwrap();
        assert_eq!(t.len(), 2);
        let acme = t.get(&hash_key(b"k1")).unwrap();
        assert_eq!((&*acme.name, acme.plan), ("acme", 1));
        assert_eq!(t.get(&hash_key(b"k2")).unwrap().plan, 0);
        assert!(t.get(&hash_key(b"k3")).is_none());
    }

    #[test]
    fn errors_name_the_line() {
        let plans = ["free"];
        let text = entry("acme", "free", "k1") + &entry("globex", "platinum", "k2");
        let e = ConsumerTable::parse(&text, &plans).unwrap_err().to_string();
        assert!(e.starts_with("line 8:"), "{e}");
        assert!(e.contains("platinum"), "{e}");

        let text = entry("acme", "free", "k1") + &entry("acme", "free", "k2");
        let e = ConsumerTable::parse(&text, &plans).unwrap_err().to_string();
        assert!(e.starts_with("line 7:") && e.contains("duplicate"), "{e}");

        let text = entry("acme", "free", "k1") + &entry("globex", "free", "k1");
        let e = ConsumerTable::parse(&text, &plans).unwrap_err().to_string();
        assert!(e.starts_with("line 9:") && e.contains("same key"), "{e}");

        let text = "[[consumer]]\nname = \"a\"\nplan = \"free\"\nkey_sha256 = \"xyz\"\n";
        let e = ConsumerTable::parse(text, &plans).unwrap_err().to_string();
        assert!(e.starts_with("line 4:"), "{e}");

        let text = "[[consumer]]\nname = \"a\"\nplan = \"free\"\nkey = \"xyz\"\n";
        let e = ConsumerTable::parse(text, &plans).unwrap_err().to_string();
        assert!(e.contains("line 4"), "{e}");
    }
}
