//! The consumers file, loaded into a hash map keyed by the SHA-256 of each consumer's key, and a
//! second one keyed by the SHA-256 of its client certificate (`cert_sha256`, mTLS).
//!
//! ```toml
//! [[consumer]]
//! name = "acme"
//! plan = "gold"
//! key_sha256 = "5e8848…"
//! cert_sha256 = "3f:a1:…"         # optional: its client certificate's fingerprint
//! limits = { monthly = 500000 }   # optional: this consumer's numbers for its plan's limits
//! ```
//!
//! A consumer has a key, a certificate, or both (at least one). The certificate map is a second
//! index beside the key map, not a reshaping of it: a consumer with both sits in each (a copy of
//! a few words), so the key path stays one probe, and a request on a connection without a client
//! certificate never looks at the second map.
//!
//! An override names a limit of the consumer's plan and gives its `limit` (see
//! `PlanLimit::overridden`); it is checked as the plan's limits are, and an error names the
//! line. Consumers with the same plan and the same overrides share one [`Variant`]: the routes
//! compile each variant's limits once, after the plans' (see [`Consumer::limits`]).
//!
//! The whole file is parsed and checked before anything is used: a reload with a bad file keeps
//! the previous table, and the error names the line. A request's lookup is one probe of the map
//! on the hash of its key: no file access, no scan, whatever the number of consumers.
//!
//! Parsing: a file in the plain shape above (what a script writes: `[[consumer]]` headers and
//! `key = "value"` lines with basic strings, comments, blank lines) is read by a line scanner
//! that borrows from the text — 100,000 consumers in milliseconds, with no intermediate
//! document. Anything else (escapes, literal strings, inline tables, a stray key, invalid TOML)
//! goes to the full TOML parser, which also words the errors.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::key::{parse_hex, KeyHash};
use crate::config::{PlanConfig, PlanLimit};
use crate::limiter::SubjectDigest;
use crate::subject::Consumer;
use crate::tls::peer::CertHash;

/// The longest consumer name.
const MAX_NAME: usize = 128;

/// A plan's limits with some overridden, shared by every consumer with the same overrides.
#[derive(Debug, Clone)]
pub struct Variant {
    pub plan: usize,
    /// The plan's limits, in the plan's order, overrides applied.
    pub limits: Vec<PlanLimit>,
}

/// What consumers are checked against: the plans' names, and their limits for overrides.
#[derive(Debug, Clone, Copy)]
pub enum Plans<'a> {
    /// Names only: no override can be checked (any is an error).
    Names(&'a [&'a str]),
    Configured(&'a [PlanConfig]),
}

impl Plans<'_> {
    fn position(&self, name: &str) -> Option<usize> {
        match self {
            Plans::Names(n) => n.iter().position(|p| *p == name),
            Plans::Configured(p) => p.iter().position(|p| p.name == name),
        }
    }

    fn count(&self) -> usize {
        match self {
            Plans::Names(n) => n.len(),
            Plans::Configured(p) => p.len(),
        }
    }

    fn limits(&self, plan: usize) -> &[PlanLimit] {
        match self {
            Plans::Names(_) => &[],
            Plans::Configured(p) => p.get(plan).map_or(&[], |p| p.limits.as_slice()),
        }
    }
}

/// A request's consumer: one of the consumers file's, or one a verified token names
/// (`[consumers] jwt_claim`), made for the request.
#[derive(Debug, Clone)]
pub enum ConsumerRef<'t> {
    Table(&'t Consumer),
    Token(std::sync::Arc<Consumer>),
}

impl std::ops::Deref for ConsumerRef<'_> {
    type Target = Consumer;
    fn deref(&self) -> &Consumer {
        match self {
            ConsumerRef::Table(c) => c,
            ConsumerRef::Token(c) => c,
        }
    }
}

/// Every consumer, by the SHA-256 of its key and by its client certificate's.
#[derive(Debug, Default)]
pub struct ConsumerTable {
    by_key: HashMap<KeyHash, Consumer>,
    /// Consumers with a `cert_sha256`, by that fingerprint.
    by_cert: HashMap<CertHash, Consumer>,
    variants: Vec<Variant>,
    /// Where each consumer is, by name (for consumers named by a token's claim).
    by_name: HashMap<Box<str>, Credential>,
}

/// The map a consumer is found in by name: its key's, or (a consumer without a key) its
/// certificate's.
#[derive(Debug, Clone, Copy)]
enum Credential {
    Key(KeyHash),
    Cert(CertHash),
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
    #[serde(default)]
    key_sha256: Option<Spanned<String>>,
    #[serde(default)]
    cert_sha256: Option<Spanned<String>>,
    #[serde(default)]
    limits: Option<BTreeMap<String, Spanned<i64>>>,
    #[serde(default)]
    anchor_day: Option<Spanned<i64>>,
}

/// One consumer as read: (byte offset in the file, value) of each field.
struct Entry<'a> {
    name: (usize, Cow<'a, str>),
    plan: (usize, Cow<'a, str>),
    key: Option<(usize, Cow<'a, str>)>,
    cert: Option<(usize, Cow<'a, str>)>,
    /// Overrides: (offset, limit name, value), in name order. The scanner reads none (a line
    /// `limits = {…}` hands the file to the TOML parser).
    limits: Vec<(usize, String, i64)>,
    /// `anchor_day`: (offset, value), the billing day of the plan's monthly limits.
    anchor: Option<(usize, i64)>,
}

/// The line scanner for files in the plain shape; `None` for anything it does not read exactly
/// as TOML would (the full parser then decides).
fn scan(text: &str) -> Option<Vec<Entry<'_>>> {
    type Slots<'a> = [Option<(usize, &'a str)>; 4];
    fn finish<'a>(slots: Slots<'a>, out: &mut Vec<Entry<'a>>) -> Option<()> {
        let [name, plan, key, cert] = slots;
        let (name, plan) = (name?, plan?);
        let borrowed = |(at, v): (usize, &'a str)| (at, Cow::Borrowed(v));
        out.push(Entry {
            name: borrowed(name),
            plan: borrowed(plan),
            key: key.map(borrowed),
            cert: cert.map(borrowed),
            limits: Vec::new(),
            anchor: None,
        });
        Some(())
    }
    let blank_or_comment = |rest: &str| {
        let rest = rest.trim_start_matches([' ', '\t']);
        rest.is_empty() || rest.starts_with('#')
    };
    let mut out = Vec::with_capacity(text.len() / 120);
    let mut current: Option<Slots<'_>> = None;
    let mut offset = 0;
    for raw in text.split_inclusive('\n') {
        let at = offset;
        offset += raw.len();
        let line = raw
            .strip_suffix('\n')
            .map_or(raw, |l| l.strip_suffix('\r').unwrap_or(l))
            .trim_matches([' ', '\t']);
        if line.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return None;
        }
        if blank_or_comment(line) {
            continue;
        }
        if let Some(rest) = line.strip_prefix("[[consumer]]") {
            if !blank_or_comment(rest) {
                return None;
            }
            if let Some(slots) = current.take() {
                finish(slots, &mut out)?;
            }
            current = Some([None; 4]);
            continue;
        }
        let (key, rest) = line.split_once('=')?;
        let slot = match key.trim_matches([' ', '\t']) {
            "name" => 0,
            "plan" => 1,
            "key_sha256" => 2,
            "cert_sha256" => 3,
            _ => return None,
        };
        let rest = rest.trim_start_matches([' ', '\t']).strip_prefix('"')?;
        let end = rest.find('"')?;
        let value = &rest[..end];
        if value.contains('\\') || !blank_or_comment(&rest[end + 1..]) {
            return None;
        }
        let slots = current.as_mut()?;
        if slots[slot].is_some() {
            return None;
        }
        slots[slot] = Some((at, value));
    }
    if let Some(slots) = current {
        finish(slots, &mut out)?;
    }
    Some(out)
}

/// The entries of a consumers file as the full TOML parser reads them.
fn toml_entries(text: &str) -> Result<Vec<Entry<'static>>, ConsumersFileError> {
    let raw: RawFile = toml::from_str(text)
        .map_err(|e| ConsumersFileError::Parse(e.to_string().trim_end().to_owned()))?;
    Ok(raw
        .consumer
        .into_iter()
        .map(|c| Entry {
            name: (c.name.span().start, Cow::Owned(c.name.into_inner())),
            plan: (c.plan.span().start, Cow::Owned(c.plan.into_inner())),
            key: c
                .key_sha256
                .map(|k| (k.span().start, Cow::Owned(k.into_inner()))),
            cert: c
                .cert_sha256
                .map(|k| (k.span().start, Cow::Owned(k.into_inner()))),
            limits: c
                .limits
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (v.span().start, k, v.into_inner()))
                .collect(),
            anchor: c.anchor_day.map(|a| (a.span().start, a.into_inner())),
        })
        .collect())
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
        ConsumerTable::load_for(path, Plans::Names(plans))
    }

    /// Reads and checks the consumers file at `path` against `plans` (their limits too, for
    /// the consumers' overrides).
    pub fn load_for(path: &Path, plans: Plans<'_>) -> Result<ConsumerTable, ConsumersFileError> {
        let text = std::fs::read_to_string(path)?;
        ConsumerTable::parse_for(&text, plans)
    }

    /// Parses and checks the text of a consumers file.
    pub fn parse(text: &str, plans: &[&str]) -> Result<ConsumerTable, ConsumersFileError> {
        ConsumerTable::parse_for(text, Plans::Names(plans))
    }

    /// Parses and checks the text of a consumers file against `plans`.
    pub fn parse_for(text: &str, plans: Plans<'_>) -> Result<ConsumerTable, ConsumersFileError> {
        let entries = match scan(text) {
            Some(e) => e,
            None => toml_entries(text)?,
        };
        ConsumerTable::check(text, &entries, plans)
    }

    /// [`ConsumerTable::parse`] through the full TOML parser only, never the line scanner: the
    /// fuzz target `consumers_file` holds the two to the same result. Not for the gateway.
    #[doc(hidden)]
    pub fn parse_with_toml(
        text: &str,
        plans: &[&str],
    ) -> Result<ConsumerTable, ConsumersFileError> {
        ConsumerTable::check(text, &toml_entries(text)?, Plans::Names(plans))
    }

    /// Checks the entries read from `text` and builds the table.
    fn check(
        text: &str,
        entries: &[Entry<'_>],
        plans: Plans<'_>,
    ) -> Result<ConsumerTable, ConsumersFileError> {
        let bad = |offset: usize, message: String| ConsumersFileError::Invalid {
            line: line_of(text, offset),
            message,
        };
        let mut by_key = HashMap::with_capacity(entries.len());
        let mut by_cert = HashMap::new();
        let mut by_name = HashMap::with_capacity(entries.len());
        let mut names: HashSet<&str> = HashSet::with_capacity(entries.len());
        let mut variants: Vec<Variant> = Vec::new();
        // (plan, overrides) → variant index: consumers with the same overrides share one.
        let mut shared: HashMap<(usize, Vec<(usize, u64)>), usize> = HashMap::new();
        for c in entries {
            let name: &str = &c.name.1;
            if !valid_name(name) {
                return Err(bad(
                    c.name.0,
                    format!("consumer name {name:?}: use 1-{MAX_NAME} visible ASCII characters (inner spaces allowed)"),
                ));
            }
            if !names.insert(name) {
                return Err(bad(c.name.0, format!("duplicate consumer name {name:?}")));
            }
            let plan_name: &str = &c.plan.1;
            let Some(plan) = plans.position(plan_name) else {
                return Err(bad(
                    c.plan.0,
                    format!("consumer {name:?}: no [[plans]] entry is named {plan_name:?}"),
                ));
            };
            let key = match &c.key {
                None => None,
                Some((at, k)) => Some(parse_hex(k).ok_or_else(|| {
                    bad(
                        *at,
                        format!("consumer {name:?}: key_sha256 must be 64 hex digits (the SHA-256 of the key; `tollgate key hash` prints it)"),
                    )
                })?),
            };
            let cert = match &c.cert {
                None => None,
                Some((at, f)) => Some(parse_fingerprint(f).ok_or_else(|| {
                    bad(
                        *at,
                        format!("consumer {name:?}: cert_sha256 must be the SHA-256 of the client certificate (DER): 64 hex digits, or 32 pairs separated by ':' (`openssl x509 -noout -fingerprint -sha256` prints it)"),
                    )
                })?),
            };
            if key.is_none() && cert.is_none() {
                return Err(bad(
                    c.name.0,
                    format!("consumer {name:?}: give key_sha256, cert_sha256 or both (how the consumer is recognised)"),
                ));
            }
            let mut limits = plan;
            if !c.limits.is_empty() || c.anchor.is_some() {
                let mut own: Vec<PlanLimit> = plans.limits(plan).to_vec();
                let mut key = Vec::with_capacity(c.limits.len() + 1);
                if let Some((at, value)) = c.anchor {
                    let day = crate::config::anchor_day(value)
                        .map_err(|m| bad(at, format!("consumer {name:?}: anchor_day {m}")))?;
                    let mut monthly = 0;
                    for l in own.iter_mut() {
                        if let Some(w) = l.limit.calendar.as_mut() {
                            if w.unit == tollgate_limit::calendar::Calendar::Month {
                                w.anchor_day = day;
                                monthly += 1;
                            }
                        }
                    }
                    if monthly == 0 {
                        return Err(bad(
                            at,
                            format!("consumer {name:?}: plan {plan_name:?} has no calendar = \"month\" limit for anchor_day to move"),
                        ));
                    }
                    key.push((usize::MAX, u64::from(day)));
                }
                for (at, limit, value) in &c.limits {
                    let Some(i) = own.iter().position(|l| l.limit.name == *limit) else {
                        let known: Vec<&str> = plans
                            .limits(plan)
                            .iter()
                            .map(|l| l.limit.name.as_str())
                            .collect();
                        return Err(bad(
                            *at,
                            format!(
                                "consumer {name:?}: plan {plan_name:?} has no limit named {limit:?} to override (its limits: {known:?})"
                            ),
                        ));
                    };
                    own[i].limit = own[i]
                        .overridden(*value)
                        .map_err(|m| bad(*at, format!("consumer {name:?}: {m}")))?;
                    key.push((i, own[i].limit.limit));
                }
                let next = variants.len();
                let v = *shared.entry((plan, key)).or_insert_with(|| {
                    variants.push(Variant { plan, limits: own });
                    next
                });
                limits = plans.count() + v;
            }
            let consumer = Consumer {
                name: name.into(),
                plan,
                subject: SubjectDigest::of(b'c', name.as_bytes()),
                limits,
            };
            if let (Some(fp), Some((at, _))) = (cert, &c.cert) {
                if let Some(other) = by_cert.insert(fp, consumer.clone()) {
                    return Err(bad(
                        *at,
                        format!(
                            "consumer {name:?} has the same cert_sha256 as consumer {:?}",
                            other.name
                        ),
                    ));
                }
            }
            match (key, &c.key) {
                (Some(hash), Some((at, _))) => {
                    by_name.insert(Box::from(name), Credential::Key(hash));
                    if let Some(other) = by_key.insert(hash, consumer) {
                        return Err(bad(
                            *at,
                            format!(
                                "consumer {name:?} has the same key as consumer {:?}",
                                other.name
                            ),
                        ));
                    }
                }
                _ => {
                    if let Some(fp) = cert {
                        by_name.insert(Box::from(name), Credential::Cert(fp));
                    }
                }
            }
        }
        Ok(ConsumerTable {
            by_key,
            by_cert,
            variants,
            by_name,
        })
    }

    /// The plans with overridden limits, in order: a consumer's `limits` index past the plans
    /// is one of these (see [`Consumer::limits`]).
    pub fn variants(&self) -> &[Variant] {
        &self.variants
    }

    /// The consumer named `name`.
    pub fn by_name(&self, name: &str) -> Option<&Consumer> {
        match self.by_name.get(name)? {
            Credential::Key(k) => self.by_key.get(k),
            Credential::Cert(c) => self.by_cert.get(c),
        }
    }

    /// The consumer whose client certificate's SHA-256 is `fingerprint` (`cert_sha256`).
    pub fn by_cert(&self, fingerprint: &CertHash) -> Option<&Consumer> {
        self.by_cert.get(fingerprint)
    }

    /// The consumer whose key hashes to `hash`.
    pub fn get(&self, hash: &KeyHash) -> Option<&Consumer> {
        self.by_key.get(hash)
    }

    /// How many consumers there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// About how many bytes the table holds: the key and certificate maps' buckets (hash,
    /// consumer, control byte) and their names (the by-name index, as before, is not counted).
    pub fn memory_bytes(&self) -> usize {
        let bucket = std::mem::size_of::<KeyHash>() + std::mem::size_of::<Consumer>() + 1;
        let names =
            |m: &HashMap<[u8; 32], Consumer>| m.values().map(|c| c.name.len()).sum::<usize>();
        (self.by_key.capacity() + self.by_cert.capacity()) * bucket
            + names(&self.by_key)
            + names(&self.by_cert)
    }

    /// The consumers (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = &Consumer> {
        self.by_name.keys().filter_map(|n| self.by_name(n))
    }

    /// Every consumer with the hash of its key (in no particular order); for the fuzz target
    /// `consumers_file`, which compares two tables.
    #[doc(hidden)]
    pub fn iter_keyed(&self) -> impl Iterator<Item = (&KeyHash, &Consumer)> {
        self.by_key.iter()
    }

    /// Every consumer with a certificate, with its fingerprint (in no particular order); for
    /// the fuzz target `consumers_file`.
    #[doc(hidden)]
    pub fn iter_certs(&self) -> impl Iterator<Item = (&CertHash, &Consumer)> {
        self.by_cert.iter()
    }
}

/// A certificate's SHA-256 as `cert_sha256` gives it: 64 hex digits, or 32 pairs separated by
/// `:` (what `openssl x509 -fingerprint -sha256` prints), in either case; `None` for anything
/// else.
pub fn parse_fingerprint(s: &str) -> Option<CertHash> {
    if s.len() == 64 {
        return parse_hex(s);
    }
    // 32 pairs and 31 colons, each colon after a pair.
    if s.len() != 95 || !s.bytes().skip(2).step_by(3).all(|b| b == b':') {
        return None;
    }
    let mut plain = String::with_capacity(64);
    plain.extend(s.chars().filter(|&c| c != ':'));
    parse_hex(&plain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::hash_key;
    use crate::hex;

    fn entry(name: &str, plan: &str, key: &str) -> String {
        format!(
            "[[consumer]]\nname = \"{name}\"\nplan = \"{plan}\"\nkey_sha256 = \"{}\"\n\n",
            hex::encode(&hash_key(key.as_bytes()))
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
    fn the_scanner_reads_what_toml_reads_and_hands_over_the_rest() {
        let plain = "# customers\n[[consumer]] # first\n  name = \"acme co\"  # a name\r\nplan=\"p\"\nkey_sha256 = \"".to_owned()
            + &hex::encode(&hash_key(b"k"))
            + "\"\n\n";
        assert_eq!(scan(&plain).map(|e| e.len()), Some(1));
        let t = ConsumerTable::parse(&plain, &["p"]).unwrap();
        assert_eq!(&*t.get(&hash_key(b"k")).unwrap().name, "acme co");
        // Escapes, literal strings, inline tables, stray keys: the TOML parser's.
        for odd in [
            plain.replace("acme co", "acme\\u0020co"),
            plain.replace("\"acme co\"", "'acme co'"),
            plain.replace("[[consumer]] # first", "[[ consumer ]]"),
            "consumer = [{ name = \"acme co\", plan = \"p\", key_sha256 = \"".to_owned()
                + &hex::encode(&hash_key(b"k"))
                + "\" }]\n",
        ] {
            assert!(scan(&odd).is_none(), "{odd}");
            let t = ConsumerTable::parse(&odd, &["p"]).unwrap();
            assert_eq!(&*t.get(&hash_key(b"k")).unwrap().name, "acme co", "{odd}");
        }
        for bad in [
            plain.replace("plan=\"p\"\n", ""),
            plain.replace("plan=\"p\"", "plan=\"p\"\nplan=\"p\""),
            plain.replace("[[consumer]] # first\n", ""),
            plain.replace("name", "nom"),
        ] {
            assert!(scan(&bad).is_none(), "{bad}");
            assert!(ConsumerTable::parse(&bad, &["p"]).is_err(), "{bad}");
        }
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

    #[test]
    fn consumers_are_found_by_certificate_too() {
        let fp = hex::encode(&hash_key(b"cert"));
        let colons = fp
            .to_uppercase()
            .as_bytes()
            .chunks(2)
            .map(|p| std::str::from_utf8(p).unwrap())
            .collect::<Vec<_>>()
            .join(":");
        let other = hex::encode(&hash_key(b"cert2"));
        // A certificate alone; a key and a certificate; the colon form in upper case.
        let text = format!(
            "[[consumer]]\nname = \"partner\"\nplan = \"gold\"\ncert_sha256 = \"{colons}\"\n\n"
        ) + &entry("acme", "free", "k1")
            .replace("\n\n", &format!("\ncert_sha256 = \"{other}\"\n\n"));
        assert_eq!(scan(&text).map(|e| e.len()), Some(2));
        for t in [
            ConsumerTable::parse(&text, &["free", "gold"]).unwrap(),
            ConsumerTable::parse_with_toml(&text, &["free", "gold"]).unwrap(),
        ] {
            assert_eq!(t.len(), 2);
            assert_eq!(t.iter().count(), 2);
            let p = t.by_cert(&hash_key(b"cert")).unwrap();
            assert_eq!((&*p.name, p.plan), ("partner", 1));
            assert_eq!(&*t.by_name("partner").unwrap().name, "partner");
            assert_eq!(&*t.by_cert(&hash_key(b"cert2")).unwrap().name, "acme");
            assert_eq!(&*t.get(&hash_key(b"k1")).unwrap().name, "acme");
            assert!(
                t.get(&hash_key(b"cert")).is_none(),
                "a fingerprint is not a key"
            );
            assert!(
                t.by_cert(&hash_key(b"k1")).is_none(),
                "a key is not a fingerprint"
            );
        }
    }

    #[test]
    fn a_bad_or_shared_fingerprint_names_the_line() {
        let plans = ["free"];
        let fp = hex::encode(&hash_key(b"cert"));
        let with = |name: &str, key: &str, cert: &str| {
            entry(name, "free", key).replace("\n\n", &format!("\ncert_sha256 = \"{cert}\"\n\n"))
        };
        // The second consumer's cert_sha256 is line 11.
        for (cert, says) in [
            (fp.clone(), "same cert_sha256 as consumer \"acme\""),
            (fp.to_uppercase(), "same cert_sha256"),
            (fp[..62].to_owned(), "64 hex digits"),
            (format!("{}:", &fp[..62]), "64 hex digits"),
            (format!("sha256:{fp}"), "64 hex digits"),
            (fp.replace('a', "g"), "64 hex digits"),
            (
                // Colons in the wrong places.
                format!("{}::{}", &fp[..31], &fp[31..]),
                "64 hex digits",
            ),
        ] {
            let text = with("acme", "k1", &fp) + &with("globex", "k2", &cert);
            let e = ConsumerTable::parse(&text, &plans).unwrap_err().to_string();
            assert!(e.starts_with("line 11:") && e.contains(says), "{cert}: {e}");
        }
        // Neither a key nor a certificate: the consumer's name line.
        let text =
            entry("acme", "free", "k1") + "[[consumer]]\nname = \"globex\"\nplan = \"free\"\n";
        let e = ConsumerTable::parse(&text, &plans).unwrap_err().to_string();
        assert!(e.starts_with("line 7:") && e.contains("cert_sha256"), "{e}");
        assert_eq!(
            e,
            ConsumerTable::parse_with_toml(&text, &plans)
                .unwrap_err()
                .to_string()
        );
        assert_eq!(parse_fingerprint(&fp), Some(hash_key(b"cert")));
    }

    fn plans() -> Vec<PlanConfig> {
        let cfg = crate::config::Config::parse(
            "[consumers]\nheader = \"k\"\nfile = \"c\"\n\
             [[plans]]\nname = \"gold\"\n\
             [[plans.limits]]\nname = \"monthly\"\nalgorithm = \"fixed_window\"\nlimit = 100\ncalendar = \"month\"\n\
             [[plans.limits]]\nname = \"rate\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\n",
            Path::new("."),
        )
        .unwrap();
        cfg.plans
    }

    #[test]
    fn overrides_change_a_consumers_numbers_and_share_variants() {
        let plans = plans();
        let text = entry("acme", "gold", "k1")
            .replace("\n\n", "\nlimits = { monthly = 500, rate = 20 }\n\n")
            + &entry("globex", "gold", "k2")
            + &entry("initech", "gold", "k3")
                .replace("\n\n", "\nlimits = { rate = 20, monthly = 500 }\n\n");
        let t = ConsumerTable::parse_for(&text, Plans::Configured(&plans)).unwrap();
        let acme = t.get(&hash_key(b"k1")).unwrap();
        let initech = t.get(&hash_key(b"k3")).unwrap();
        assert_eq!(
            (acme.plan, acme.limits),
            (0, 1),
            "the first variant follows the plan"
        );
        assert_eq!(initech.limits, 1, "the same overrides share the variant");
        assert_eq!(t.get(&hash_key(b"k2")).unwrap().limits, 0);
        assert_eq!(t.variants().len(), 1);
        let v = &t.variants()[0].limits;
        assert_eq!((v[0].limit.limit, v[0].limit.burst), (500, 0));
        // A GCRA burst left at its limit follows the override.
        assert_eq!((v[1].limit.limit, v[1].limit.burst), (20, 20));
    }

    #[test]
    fn a_bad_override_names_the_line() {
        let plans = plans();
        let with = |o: &str| {
            entry("acme", "gold", "k1")
                + &entry("globex", "gold", "k2").replace("\n\n", &format!("\nlimits = {o}\n\n"))
        };
        for (o, says) in [
            ("{ daily = 5 }", "no limit named \"daily\""),
            ("{ monthly = 0 }", "not a positive whole number"),
            ("{ monthly = -3 }", "not a positive whole number"),
            ("{ rate = 2000000 }", "period / limit"),
        ] {
            let e = ConsumerTable::parse_for(&with(o), Plans::Configured(&plans))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("line 10:") && e.contains(says), "{o}: {e}");
        }
        let e = ConsumerTable::parse_for(&with("{ monthly = \"x\" }"), Plans::Configured(&plans))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 10"), "{e}");
    }

    #[test]
    fn a_consumer_moves_its_billing_day() {
        let plans = plans();
        let text = entry("acme", "gold", "k1").replace("\n\n", "\nanchor_day = 15\n\n")
            + &entry("globex", "gold", "k2").replace("\n\n", "\nanchor_day = 31\n\n");
        let e = ConsumerTable::parse_for(&text, Plans::Configured(&plans))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("line 11:") && e.contains("1 to 28"), "{e}");
        let text = entry("acme", "gold", "k1").replace("\n\n", "\nanchor_day = 15\n\n");
        let t = ConsumerTable::parse_for(&text, Plans::Configured(&plans)).unwrap();
        let v = &t.variants()[0].limits;
        assert_eq!(v[0].limit.calendar.unwrap().anchor_day, 15);
        assert_eq!(v[1].limit.calendar, None);
    }
}
