//! A large file's `[[routes]]` parsed a few at a time, so that parsing never holds the whole
//! file's TOML document.
//!
//! Why: `toml::from_str` lexes the whole text into one vector of tokens and one of events and
//! builds the whole document before deserialising. For the 1.8 MB file of 10,000 routes those
//! are 26 MB and 15 MB, freed at once; glibc then raises its mmap threshold to the largest such
//! block freed (up to 32 MB) and its trim threshold to twice that, so from then on nothing below
//! 26 MB is given its own mapping and the heap is never trimmed: the parse's peak stays resident
//! (BENCHMARKS.md, stop 41). Parsed here instead: the text around the routes (`[server]`, …) as
//! one document, then runs of consecutive `[[routes]]` entries of at most [`BATCH_BYTES`] each,
//! and each route is validated as it comes, so no vector larger than a batch's is built.
//!
//! The file is split by `toml_parser`'s own lexer (the one `toml` parses with), so strings,
//! comments and multi-line arrays are read as the parser reads them. An entry runs from its
//! `[[routes]]` header to the next header that is not one of its sub-tables
//! (`[routes.compression]`, `[[routes.limits]]`); the text between entries is parsed as the rest
//! of the file. Whatever this does not understand plainly (a quoted key with escapes, `routes`
//! defined before its first `[[routes]]`, an error in any part) makes [`parse`] answer `None`,
//! and the caller parses the whole file as before: so every error is the one the whole file
//! gives, with its line, and a file is accepted here only if it parses into the same routes.

use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml_parser::lexer::{Token, TokenKind};

use super::raw::{RawConfig, RawRoute};
use super::{Config, ConfigError};

/// Below this size a file is parsed whole: its document is small.
pub(super) const MIN_FILE_BYTES: usize = 64 * 1024;

/// The most text parsed in one batch (one entry may be longer): its tokens and events stay
/// below glibc's default mmap threshold (128 KiB).
const BATCH_BYTES: usize = 8 * 1024;

/// A batch of consecutive `[[routes]]` entries, parsed alone.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    routes: Vec<RawRoute>,
}

/// The configuration in `text`, its routes parsed a batch at a time; `None` when the file is
/// not split plainly or any part of it fails (the whole file then gives the answer).
pub(super) fn parse(text: &str, base_dir: &Path) -> Option<Config> {
    let entries = entries(text)?;
    if entries.is_empty() {
        return None;
    }
    let mut rest = String::new();
    let mut at = 0;
    for e in &entries {
        rest.push_str(text.get(at..e.start)?);
        at = e.end;
    }
    rest.push_str(text.get(at..)?);
    let raw: RawConfig = toml::from_str(&rest).ok()?;
    drop(rest);
    if !raw.routes.is_empty() {
        return None;
    }
    let count = entries.len();
    let batches = batches(&entries);
    drop(entries);
    let routes = batches.into_iter().flat_map(|(range, n)| {
        match text
            .get(range)
            .and_then(|t| toml::from_str::<Batch>(t).ok())
            .filter(|b| b.routes.len() == n)
        {
            Some(b) => b.routes.into_iter().map(Ok).collect::<Vec<_>>(),
            None => vec![Err(ConfigError::Parse {
                path: "<config>".into(),
                message: "a batch of routes did not parse".into(),
            })],
        }
    });
    Config::from_parts(raw, count, routes, base_dir).ok()
}

/// Runs of consecutive entries (each ending where the next starts) of at most `BATCH_BYTES`
/// (or one longer entry), with how many entries each holds.
fn batches(entries: &[Range<usize>]) -> Vec<(Range<usize>, usize)> {
    let mut out: Vec<(Range<usize>, usize)> = Vec::new();
    for e in entries {
        match out.last_mut() {
            Some((run, n)) if run.end == e.start && e.end - run.start <= BATCH_BYTES => {
                run.end = e.end;
                *n += 1;
            }
            _ => out.push((e.clone(), 1)),
        }
    }
    out
}

/// The byte ranges of the file's top-level `[[routes]]` entries, in order; `None` when the
/// file is not laid out plainly (see the module comment).
fn entries(text: &str) -> Option<Vec<Range<usize>>> {
    let mut tokens = toml_parser::Source::new(text)
        .lex()
        .filter(|t| !matches!(t.kind(), TokenKind::Whitespace | TokenKind::Comment));
    let mut entries = Vec::new();
    // The start of the entry being read.
    let mut open: Option<usize> = None;
    // No header yet: keys are the root table's.
    let mut root = true;
    // At the start of a line, outside any value.
    while let Some(t) = tokens.next() {
        match t.kind() {
            TokenKind::Newline => {}
            TokenKind::Eof => break,
            TokenKind::LeftSquareBracket => {
                let start = t.span().start();
                root = false;
                let (routes, array) = header(text, t, &mut tokens)?;
                match routes {
                    // `[[routes]]`: a new entry.
                    Some(true) if array => {
                        if let Some(s) = open.replace(start) {
                            entries.push(s..start);
                        }
                    }
                    // `[routes]`, `[routes.x]`, `[[routes.x]]`: part of the open entry.
                    Some(_) => {
                        open?;
                    }
                    None => {
                        if let Some(s) = open.take() {
                            entries.push(s..start);
                        }
                    }
                }
            }
            TokenKind::Atom | TokenKind::BasicString | TokenKind::LiteralString => {
                // `routes = […]` or `routes.x = …` beside the entries: the whole file refuses
                // (or means) it.
                if root && key_part(text, t).is_none_or(|k| k == "routes") {
                    return None;
                }
                key_value(&mut tokens)?
            }
            _ => return None,
        }
    }
    if let Some(s) = open {
        entries.push(s..text.len());
    }
    Some(entries)
}

/// Reads a table header after its first `[` up to its line's end: whether its key starts with
/// `routes` (`Some(true)`: it is `routes` alone, `Some(false)`: `routes.…`, `None`: another
/// key), and whether it is an array of tables (`[[…]]`).
fn header(
    text: &str,
    open: Token,
    tokens: &mut impl Iterator<Item = Token>,
) -> Option<(Option<bool>, bool)> {
    let mut t = tokens.next()?;
    let array = t.kind() == TokenKind::LeftSquareBracket;
    if array {
        if t.span().start() != open.span().end() {
            return None;
        }
        t = tokens.next()?;
    }
    let first = key_part(text, t)?;
    let mut parts = 1;
    let close = loop {
        let t = tokens.next()?;
        match t.kind() {
            TokenKind::Dot => {
                key_part(text, tokens.next()?)?;
                parts += 1;
            }
            TokenKind::RightSquareBracket => break t,
            _ => return None,
        }
    };
    if array {
        let t = tokens.next()?;
        if t.kind() != TokenKind::RightSquareBracket || t.span().start() != close.span().end() {
            return None;
        }
    }
    match tokens.next()?.kind() {
        TokenKind::Newline | TokenKind::Eof => {}
        _ => return None,
    }
    let routes = (first == "routes").then_some(parts == 1);
    Some((routes, array))
}

/// One part of a dotted key, unquoted; `None` for a quoted part with escapes (not decoded here).
fn key_part(text: &str, t: Token) -> Option<&str> {
    let raw = text.get(t.span().start()..t.span().end())?;
    match t.kind() {
        TokenKind::Atom => Some(raw),
        TokenKind::BasicString if !raw.contains('\\') => raw.get(1..raw.len().checked_sub(1)?),
        TokenKind::LiteralString => raw.get(1..raw.len().checked_sub(1)?),
        _ => None,
    }
}

/// Skips a key/value line after its key's first token, up to the line's end outside its value
/// (an array or inline table may span lines).
fn key_value(tokens: &mut impl Iterator<Item = Token>) -> Option<()> {
    let mut depth = 0usize;
    loop {
        match tokens.next()?.kind() {
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => {
                depth = depth.checked_sub(1)?
            }
            TokenKind::Newline if depth == 0 => return Some(()),
            TokenKind::Eof => return (depth == 0).then_some(()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same configuration as the whole file gives (compared by its `Debug` form).
    fn same_as_whole(text: &str) {
        let dir = Path::new(".");
        let batched = parse(text, dir).expect("parsed in batches");
        let whole = Config::parse_whole(text, dir).expect("parsed whole");
        assert_eq!(format!("{batched:?}"), format!("{whole:?}"));
    }

    fn route(i: usize) -> String {
        format!(
            "\n[[routes]]\nname = \"svc{i}\"\npath_prefix = \"/svc{i}/api\"\nupstream = \"http://127.0.0.1:3000\"\n\n[[routes.limits]]\nname = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1s\"\nsubject = \"ip\"\n"
        )
    }

    fn many(n: usize) -> String {
        (0..n).map(route).collect()
    }

    #[test]
    fn many_routes_parse_as_the_whole_file_does() {
        let text = format!("[server]\nlisten = \"127.0.0.1:0\"\n{}", many(300));
        assert!(text.len() > 2 * BATCH_BYTES);
        same_as_whole(&text);
        // Sections between and after the routes, sub-tables, comments, arrays over lines, a
        // header in a string.
        let text = format!(
            "# gateway\n{}\n[server] # the listener\nlisten = \"127.0.0.1:0\"\ntrusted_proxies = [\n  \"10.0.0.0/8\", # lb\n]\n{}\n[[ routes ]]\nname = 'quoted'\npath_prefix = \"/q\"\nupstream = \"http://127.0.0.1:3000\"\n[routes.request_headers]\nset = {{ \"X-A\" = \"\"\"\n[[routes]]\"\"\" }}\n[[\"routes\".limits]]\nname = \"g\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"global\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            many(40),
            many(40).replace("svc", "other")
        );
        same_as_whole(&text);
    }

    #[test]
    fn what_is_not_split_plainly_is_left_to_the_whole_file() {
        let routes = many(10);
        for text in [
            // No routes, or routes only inline.
            "[server]\nlisten = \"127.0.0.1:0\"\n".to_owned(),
            // A quoted key with an escape.
            format!("{routes}[[\"rou\\u0074es\"]]\nname = \"x\"\n"),
            // A routes sub-table before any entry.
            format!("[routes.x]\na = 1\n{routes}"),
            // Routes at the root beside entries (the whole file refuses them).
            format!("routes = []\n{routes}"),
            format!("\"routes\" = []\n{routes}"),
            format!("routes.x = 1\n{routes}"),
            // An error in a route, or a route that does not validate.
            format!("{routes}[[routes]]\nname = \"x\"\npath_prefix = \n"),
            format!("{routes}{}", route(3)),
        ] {
            assert!(parse(&text, Path::new(".")).is_none(), "{text}");
        }
    }

    #[test]
    fn entries_end_at_the_next_other_header() {
        let text = "a = 1\n[[routes]]\nx = [\n[1]]\n[routes.b]\n[server]\n[[routes]]\n";
        let e = entries(text).unwrap();
        assert_eq!(
            e.iter().map(|r| &text[r.clone()]).collect::<Vec<_>>(),
            ["[[routes]]\nx = [\n[1]]\n[routes.b]\n", "[[routes]]\n"]
        );
    }
}
