//! A streaming scanner that finds the values at a few dotted paths of one JSON document as its
//! bytes pass, without holding the document: memory is bounded by the nesting depth it allows
//! ([`MAX_DEPTH`]), the longest key it compares ([`MAX_KEY`]) and the longest number it reads
//! ([`MAX_NUMBER`]), whatever the body's size.
//!
//! Rules (the README's "Cost from the body"):
//! - a path is a list of object keys from the top-level object (`usage.total_tokens`); keys are
//!   compared after JSON unescaping, so `"us\u0061ge"` is `usage`;
//! - a key that appears several times: the last value counts (as most JSON parsers keep it);
//! - the value must be a non-negative integer of at most 2^53 (JSON's exact integers): `12`, not
//!   `12.0`, `-1`, `1e3` or `"12"`, which are *malformed*;
//! - a document that is not JSON, is cut, carries anything after its end, or nests deeper than
//!   [`MAX_DEPTH`] makes every path *malformed* (the scan stops there).

/// How deep objects and arrays may nest before the document counts as malformed.
pub const MAX_DEPTH: usize = 64;
/// The longest key compared (longer keys match no path).
pub const MAX_KEY: usize = 256;
/// The longest number read (longer numbers are malformed values).
pub const MAX_NUMBER: usize = 32;
/// The largest value taken: 2^53, the largest integer every JSON reader holds exactly.
pub const MAX_VALUE: u64 = 1 << 53;

/// What a path's value was found to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Not in the document (yet).
    Missing,
    /// A non-negative integer of at most 2^53.
    Value(u64),
    /// Something else: a string, a fraction, a negative or too large number, an object …
    Malformed,
}

/// The scanner of one document for up to 64 paths.
pub struct JsonScan {
    paths: Vec<Vec<Box<[u8]>>>,
    found: Vec<Found>,
    /// One entry per open object or array: whether it is an object, and the paths that still
    /// match down to it.
    stack: Vec<(bool, u64)>,
    state: State,
    /// The key being read (unescaped), up to `MAX_KEY` bytes (reused from key to key).
    key: Vec<u8>,
    /// The key can still match a path (not too long, no unpaired surrogate).
    key_ok: bool,
    /// The paths the last complete key leads to (at the current depth).
    key_mask: u64,
    number: Vec<u8>,
    /// `\uXXXX` being read in a key: the digits so far and the value.
    escape: (u8, u32),
    /// A high surrogate waiting for its low half.
    high: Option<u32>,
    literal: &'static [u8],
    broken: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Before the document's value.
    Start,
    /// A value is expected (after `:`, `[` or `,` in an array). `first`: right after `[`.
    Value {
        first: bool,
    },
    /// A key or `}` is expected (right after `{`), or a key alone (after `,`).
    Key {
        first: bool,
    },
    /// Inside a key string; `esc`: after `\`; `uni`: inside `\u`.
    InKey {
        esc: bool,
        uni: bool,
    },
    /// After a key, before `:`.
    Colon,
    /// Inside a string value.
    InString {
        esc: bool,
    },
    InNumber,
    InLiteral {
        at: u8,
    },
    /// After a value: `,` or the closing bracket expected.
    After,
    /// After the document's value: only whitespace.
    Done,
}

/// The length of the run of bytes at the start of `bytes` that mean nothing inside a string
/// or a key but themselves: up to the next quote, backslash or control byte. Sixteen bytes at
/// a time without an early exit inside each (the compiler vectorises the test), then byte by
/// byte in the chunk that holds one.
fn plain_run(bytes: &[u8]) -> usize {
    let special = |b: u8| (b == b'"') | (b == b'\\') | (b < 0x20);
    let mut skipped = 0;
    for chunk in bytes.chunks_exact(16) {
        if chunk.iter().fold(false, |any, &b| any | special(b)) {
            break;
        }
        skipped += 16;
    }
    let tail = bytes.get(skipped..).unwrap_or_default();
    skipped + tail.iter().position(|&b| special(b)).unwrap_or(tail.len())
}

fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonScan {
    /// A scanner for `paths` (each a list of keys; at most 64 paths, the rest are never found).
    pub fn new(paths: &[&[Box<str>]]) -> JsonScan {
        let paths: Vec<Vec<Box<[u8]>>> = paths
            .iter()
            .take(64)
            .map(|p| p.iter().map(|k| Box::from(k.as_bytes())).collect())
            .collect();
        let found = vec![Found::Missing; paths.len()];
        JsonScan {
            paths,
            found,
            stack: Vec::new(),
            state: State::Start,
            key: Vec::new(),
            key_ok: false,
            key_mask: 0,
            number: Vec::new(),
            escape: (0, 0),
            high: None,
            literal: b"",
            broken: false,
        }
    }

    /// Ready for another document, with the same paths (an SSE stream scans one per event).
    pub fn reset(&mut self) {
        self.found.fill(Found::Missing);
        self.stack.clear();
        self.state = State::Start;
        self.key.clear();
        self.key_ok = false;
        self.key_mask = 0;
        self.number.clear();
        self.high = None;
        self.broken = false;
    }

    /// What each path was found to be (in the order given); every path is `Malformed` when the
    /// document is, and `Missing` ones stay so until the document is complete.
    pub fn results(&self) -> Vec<Found> {
        match self.complete() {
            Some(found) => found.to_vec(),
            None => vec![Found::Malformed; self.found.len()],
        }
    }

    /// What each path was found to be, when the document is complete JSON (call
    /// [`JsonScan::finish`] first); `None` when it is not.
    pub fn complete(&self) -> Option<&[Found]> {
        (!self.broken && self.state == State::Done).then_some(self.found.as_slice())
    }

    /// Feeds the next bytes of the document.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !self.broken {
            match self.state {
                State::InString { esc: false } => {
                    // Inside a string value only `"`, `\` and control bytes mean anything:
                    // skip the run before the next one (most of an LLM's body is its text).
                    rest = rest.get(plain_run(rest)..).unwrap_or_default();
                }
                State::InKey { esc: false, .. } => {
                    // A key's plain bytes at once, as `byte` takes them one by one: a pending
                    // high surrogate makes the key match nothing, and so does a key longer
                    // than MAX_KEY (its bytes are not kept).
                    let n = plain_run(rest);
                    if n > 0 {
                        if self.high.take().is_some() {
                            self.key_ok = false;
                        }
                        let run = rest.get(..n).unwrap_or_default();
                        if self.key_ok {
                            if self.key.len().saturating_add(n) <= MAX_KEY {
                                self.key.extend_from_slice(run);
                            } else {
                                self.key_ok = false;
                            }
                        }
                        rest = rest.get(n..).unwrap_or_default();
                    }
                }
                _ => {}
            }
            let Some((&b, tail)) = rest.split_first() else {
                return;
            };
            self.byte(b);
            rest = tail;
        }
    }

    /// The end of the document: a number at the very end is complete.
    pub fn finish(&mut self) {
        if self.state == State::InNumber {
            self.end_number();
            self.after_value();
        }
    }

    fn depth(&self) -> usize {
        self.stack.len()
    }

    /// The mask of paths a value at the current position completes or continues: the key's in
    /// an object, none in an array (paths name object keys only).
    fn value_mask(&self) -> u64 {
        match self.stack.last() {
            Some((true, _)) => self.key_mask,
            Some((false, _)) => 0,
            None => 0,
        }
    }

    /// Paths of `mask` that end at the current depth (the value is theirs).
    fn ending(&self, mask: u64) -> u64 {
        let d = self.depth();
        let mut out = 0;
        for (i, p) in self.paths.iter().enumerate() {
            if mask & (1 << i) != 0 && p.len() == d {
                out |= 1 << i;
            }
        }
        out
    }

    fn set(&mut self, mask: u64, v: Found) {
        for (i, f) in self.found.iter_mut().enumerate() {
            if mask & (1 << i) != 0 {
                *f = v;
            }
        }
    }

    fn push(&mut self, object: bool) {
        if self.depth() >= MAX_DEPTH {
            self.broken = true;
            return;
        }
        let mask = match self.stack.last() {
            None => {
                // The document's own value: every path starts here.
                if self.paths.len() >= 64 {
                    u64::MAX
                } else {
                    (1u64 << self.paths.len()) - 1
                }
            }
            Some(_) => {
                let m = self.value_mask();
                // A container value ends the paths that wanted a number here.
                let ends = self.ending(m);
                self.set(ends, Found::Malformed);
                m & !ends
            }
        };
        self.stack.push((object, if object { mask } else { 0 }));
        self.state = if object {
            State::Key { first: true }
        } else {
            State::Value { first: true }
        };
    }

    fn pop(&mut self, object: bool) {
        match self.stack.pop() {
            Some((o, _)) if o == object => self.after_value(),
            _ => self.broken = true,
        }
    }

    /// A value has ended at the current position.
    fn after_value(&mut self) {
        self.state = if self.stack.is_empty() {
            State::Done
        } else {
            State::After
        };
    }

    /// A scalar value other than a number (string, literal) at the current position.
    fn scalar(&mut self) {
        let ends = self.ending(self.value_mask());
        self.set(ends, Found::Malformed);
    }

    fn end_number(&mut self) {
        let ends = self.ending(self.value_mask());
        if ends == 0 {
            return;
        }
        let n = &self.number;
        let v = if n.len() <= MAX_NUMBER
            && !n.is_empty()
            && n.iter().all(u8::is_ascii_digit)
            && (n.len() == 1 || n[0] != b'0')
        {
            std::str::from_utf8(n)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|v| *v <= MAX_VALUE)
                .map_or(Found::Malformed, Found::Value)
        } else {
            Found::Malformed
        };
        self.set(ends, v);
    }

    fn start_value(&mut self, b: u8) {
        match b {
            b'{' => self.push(true),
            b'[' => self.push(false),
            b'"' => {
                self.scalar();
                self.state = State::InString { esc: false };
            }
            b'-' | b'0'..=b'9' => {
                self.number.clear();
                self.number.push(b);
                self.state = State::InNumber;
            }
            b't' => self.start_literal(b"true"),
            b'f' => self.start_literal(b"false"),
            b'n' => self.start_literal(b"null"),
            _ => self.broken = true,
        }
    }

    fn start_literal(&mut self, lit: &'static [u8]) {
        self.scalar();
        self.literal = lit;
        self.state = State::InLiteral { at: 1 };
    }

    fn key_byte(&mut self, b: u8) {
        if self.key_ok {
            if self.key.len() < MAX_KEY {
                self.key.push(b);
            } else {
                self.key_ok = false;
            }
        }
    }

    fn key_char(&mut self, c: u32) {
        let mut buf = [0u8; 4];
        match char::from_u32(c) {
            Some(ch) => {
                for &b in ch.encode_utf8(&mut buf).as_bytes() {
                    self.key_byte(b);
                }
            }
            None => self.key_ok = false, // an unpaired surrogate matches nothing
        }
    }

    fn end_key(&mut self) {
        // Keys of the object at depth d (d >= 1: keys are only read inside one) are element d - 1.
        let at = self.depth().saturating_sub(1);
        let mask = self.stack.last().map_or(0, |(_, m)| *m);
        let mut out = 0;
        if self.key_ok {
            let k = self.key.as_slice();
            for (i, p) in self.paths.iter().enumerate() {
                if mask & (1 << i) != 0 && p.get(at).is_some_and(|e| **e == *k) {
                    out |= 1 << i;
                }
            }
        }
        // A repeated key's new value replaces the old one whole: what its old value gave the
        // paths through it is forgotten (its new value sets what it sets).
        self.set(out, Found::Missing);
        self.key_mask = out;
        self.state = State::Colon;
    }

    fn byte(&mut self, b: u8) {
        match self.state {
            State::Start => {
                if !ws(b) {
                    self.start_value(b);
                }
            }
            State::Value { first } => {
                if ws(b) {
                } else if b == b']' && first {
                    self.pop(false);
                } else {
                    self.start_value(b);
                }
            }
            State::Key { first } => {
                if ws(b) {
                } else if b == b'"' {
                    self.key.clear();
                    self.key_ok = true;
                    self.high = None;
                    self.state = State::InKey {
                        esc: false,
                        uni: false,
                    };
                } else if b == b'}' && first {
                    self.pop(true);
                } else {
                    self.broken = true;
                }
            }
            State::InKey { esc: false, .. } => match b {
                b'"' => {
                    if self.high.is_some() {
                        self.key_ok = false;
                    }
                    self.end_key();
                }
                b'\\' => {
                    self.state = State::InKey {
                        esc: true,
                        uni: false,
                    }
                }
                0..=0x1f => self.broken = true,
                _ => {
                    if self.high.take().is_some() {
                        self.key_ok = false;
                    }
                    self.key_byte(b);
                }
            },
            State::InKey { esc: true, uni } => {
                if uni {
                    let Some(digit) = (b as char).to_digit(16) else {
                        self.broken = true;
                        return;
                    };
                    self.escape.0 += 1;
                    self.escape.1 = self.escape.1 * 16 + digit;
                    if self.escape.0 == 4 {
                        let c = self.escape.1;
                        match (self.high.take(), c) {
                            (None, 0xD800..=0xDBFF) => self.high = Some(c),
                            (Some(h), 0xDC00..=0xDFFF) => {
                                self.key_char(0x10000 + ((h - 0xD800) << 10) + (c - 0xDC00));
                            }
                            (Some(_), _) => self.key_ok = false,
                            (None, c) => self.key_char(c),
                        }
                        self.state = State::InKey {
                            esc: false,
                            uni: false,
                        };
                    }
                    return;
                }
                if b != b'u' && self.high.take().is_some() {
                    self.key_ok = false;
                }
                let c = match b {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 8,
                    b'f' => 12,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.escape = (0, 0);
                        self.state = State::InKey {
                            esc: true,
                            uni: true,
                        };
                        return;
                    }
                    _ => {
                        self.broken = true;
                        return;
                    }
                };
                self.key_byte(c);
                self.state = State::InKey {
                    esc: false,
                    uni: false,
                };
            }
            State::Colon => {
                if b == b':' {
                    self.state = State::Value { first: false };
                } else if !ws(b) {
                    self.broken = true;
                }
            }
            State::InString { esc } => {
                if esc {
                    // Any escape's first byte; `\uXXXX`'s digits are plain bytes after it.
                    if !matches!(
                        b,
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' | b'u'
                    ) {
                        self.broken = true;
                    }
                    self.state = State::InString { esc: false };
                } else {
                    match b {
                        b'"' => self.after_value(),
                        b'\\' => self.state = State::InString { esc: true },
                        0..=0x1f => self.broken = true,
                        _ => {}
                    }
                }
            }
            State::InNumber => match b {
                b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E' => {
                    if self.number.len() <= MAX_NUMBER {
                        self.number.push(b);
                    }
                }
                _ => {
                    if !number_syntax(&self.number) {
                        self.broken = true;
                        return;
                    }
                    self.end_number();
                    self.after_value();
                    self.byte(b);
                }
            },
            State::InLiteral { at } => {
                if self.literal.get(usize::from(at)) != Some(&b) {
                    self.broken = true;
                    return;
                }
                if usize::from(at) + 1 == self.literal.len() {
                    self.after_value();
                } else {
                    self.state = State::InLiteral { at: at + 1 };
                }
            }
            State::After => match b {
                b',' => {
                    self.state = match self.stack.last() {
                        Some((true, _)) => State::Key { first: false },
                        _ => State::Value { first: false },
                    }
                }
                b'}' => self.pop(true),
                b']' => self.pop(false),
                _ if ws(b) => {}
                _ => self.broken = true,
            },
            State::Done => {
                if !ws(b) {
                    self.broken = true;
                }
            }
        }
    }
}

/// Whether `n` (at most `MAX_NUMBER + 1` bytes kept) is a JSON number; a longer one is only
/// checked on what was kept.
fn number_syntax(n: &[u8]) -> bool {
    let mut i = 0;
    let at = |i: usize| n.get(i).copied();
    if at(i) == Some(b'-') {
        i += 1;
    }
    match at(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            while matches!(at(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        _ => return false,
    }
    if at(i) == Some(b'.') {
        i += 1;
        if !matches!(at(i), Some(b'0'..=b'9')) {
            return n.len() > MAX_NUMBER;
        }
        while matches!(at(i), Some(b'0'..=b'9')) {
            i += 1;
        }
    }
    if matches!(at(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(at(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !matches!(at(i), Some(b'0'..=b'9')) {
            return n.len() > MAX_NUMBER;
        }
        while matches!(at(i), Some(b'0'..=b'9')) {
            i += 1;
        }
    }
    i == n.len() || n.len() > MAX_NUMBER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_stops_at_the_first_quote_backslash_or_control_byte() {
        for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 100] {
            for at in 0..=len {
                for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    let mut v = vec![b'a'; len];
                    let want = if at < len {
                        v[at] = stop;
                        at
                    } else {
                        len
                    };
                    // Bytes that look close but are plain: space, DEL, high bytes.
                    if at > 0 {
                        v[at - 1] = [b' ', 0x7f, 0xff, 0x80][at % 4];
                    }
                    assert_eq!(plain_run(&v), want, "len {len}, {stop:#x} at {at}");
                }
            }
        }
    }

    fn path(p: &str) -> Vec<Box<str>> {
        p.split('.').map(Box::from).collect()
    }

    fn scan_in(doc: &[u8], paths: &[&str], chunk: usize) -> Vec<Found> {
        let owned: Vec<Vec<Box<str>>> = paths.iter().map(|p| path(p)).collect();
        let refs: Vec<&[Box<str>]> = owned.iter().map(|p| p.as_slice()).collect();
        let mut s = JsonScan::new(&refs);
        for c in doc.chunks(chunk.max(1)) {
            s.feed(c);
        }
        s.finish();
        s.results()
    }

    fn scan(doc: &str, paths: &[&str]) -> Vec<Found> {
        let whole = scan_in(doc.as_bytes(), paths, usize::MAX);
        // Any split of the bytes gives the same answer.
        for chunk in [1, 2, 3, 7] {
            assert_eq!(
                scan_in(doc.as_bytes(), paths, chunk),
                whole,
                "{doc} in {chunk}s"
            );
        }
        whole
    }

    const OPENAI: &str = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi \"usage\": {\"total_tokens\": 1}"}}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;

    #[test]
    fn finds_nested_integers_and_ignores_lookalikes_in_strings() {
        assert_eq!(
            scan(
                OPENAI,
                &[
                    "usage.total_tokens",
                    "usage.prompt_tokens",
                    "usage.completion_tokens",
                    "usage.nope",
                    "id"
                ]
            ),
            vec![
                Found::Value(42),
                Found::Value(12),
                Found::Value(30),
                Found::Missing,
                Found::Malformed
            ]
        );
    }

    #[test]
    fn the_last_repeated_key_counts_and_escaped_keys_match() {
        assert_eq!(
            scan(r#"{"usage":{"n":1},"usage":{"n":7}}"#, &["usage.n"]),
            vec![Found::Value(7)]
        );
        assert_eq!(
            scan(r#"{"us\u0061ge":{"n":3}}"#, &["usage.n"]),
            vec![Found::Value(3)]
        );
        assert_eq!(
            scan(r#"{"a\ud83d\ude00":{"n":3}}"#, &["a😀.n"]),
            vec![Found::Value(3)]
        );
        // The last value of a repeated key replaces the earlier one whole (found by the
        // `body_scan` fuzz target against serde_json).
        assert_eq!(
            scan(r#"{"(a":1,"a":{"b":2},"a":12.0}"#, &["a.b", "a"]),
            vec![Found::Missing, Found::Malformed]
        );
        assert_eq!(
            scan(r#"{"a":{"b":2},"a":{"c":1}}"#, &["a.b", "a.c"]),
            vec![Found::Missing, Found::Value(1)]
        );
        // Only at the path: the same key deeper or in an array is another value.
        assert_eq!(
            scan(
                r#"{"x":{"usage":{"n":5}},"l":[{"usage":{"n":6}}]}"#,
                &["usage.n"]
            ),
            vec![Found::Missing]
        );
    }

    #[test]
    fn only_exact_non_negative_integers_up_to_2_53_are_values() {
        for (v, want) in [
            ("0", Found::Value(0)),
            ("9007199254740992", Found::Value(1 << 53)),
            ("9007199254740993", Found::Malformed),
            ("99999999999999999999999999999999999999", Found::Malformed),
            ("12.0", Found::Malformed),
            ("1e3", Found::Malformed),
            ("-1", Found::Malformed),
            ("\"12\"", Found::Malformed),
            ("null", Found::Malformed),
            ("true", Found::Malformed),
            ("{}", Found::Malformed),
            ("[1]", Found::Malformed),
        ] {
            assert_eq!(scan(&format!(r#"{{"n":{v}}}"#), &["n"]), vec![want], "{v}");
        }
    }

    #[test]
    fn a_broken_or_cut_document_makes_every_path_malformed() {
        for doc in [
            r#"{"n":1"#,
            r#"{"n":1}}"#,
            r#"{"n":1} x"#,
            r#"{"n":01}"#,
            r#"{"n":1,}"#,
            r#"{n:1}"#,
            "not json",
            "",
            r#"{"n":"a
b"}"#,
            r#"{"n":-}"#,
            r#"{"n":[1,2}"#,
        ] {
            assert_eq!(scan(doc, &["n"]), vec![Found::Malformed], "{doc}");
        }
        // A bare number as the whole document: complete at the end.
        assert_eq!(scan("5", &["n"]), vec![Found::Missing]);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(scan(&deep, &["n"]), vec![Found::Malformed]);
        let ok = format!(
            r#"{{"a":{}{}, "n": 4}}"#,
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(scan(&ok, &["n"]), vec![Found::Value(4)]);
    }

    #[test]
    fn memory_stays_bounded_on_huge_keys_strings_and_numbers() {
        let mut s = JsonScan::new(&[&path("n")[..]]);
        s.feed(b"{\"");
        for _ in 0..10_000 {
            s.feed(&[b'k'; 1000]);
        }
        s.feed(b"\":\"");
        for _ in 0..10_000 {
            s.feed(&[b'v'; 1000]);
        }
        s.feed(b"\",\"n\":");
        for _ in 0..1000 {
            s.feed(b"1111111111");
        }
        s.feed(b"}");
        s.finish();
        assert!(s.key.capacity() <= 2 * MAX_KEY);
        assert!(s.number.capacity() <= 4 * MAX_NUMBER);
        assert_eq!(s.results(), vec![Found::Malformed]);
    }
}
