//! The manual (`docs/src/**/*.md`) cannot drift from the code: every ```` ```toml ```` block is
//! loaded by the same function `tollgate check` uses (`load::load_and_check`), and every relative
//! link points to an existing page and anchor. How snippets are marked is documented in
//! `docs/src/development/docs.md`:
//!
//! - ```` ```toml ```` — a complete `gateway.toml`, loaded as it is;
//! - ```` ```toml fragment=route ```` — the inside of a `[[routes]]` table (keys, `[routes.cors]`,
//!   `[[routes.limits]]`…): the test puts a route header with `name`, `path_prefix` and `upstream`
//!   in front of it;
//! - ```` ```toml fragment=limit ```` — some keys of one `[[routes.limits]]` table, on such a
//!   route: the test fills in the required keys the snippet leaves out (`limit_with_defaults`);
//! - ```` ```toml fragment=plan ```` — the inside of a `[[plans]]` table (`name` given by the
//!   test);
//! - ```` ```toml consumers-file ```` — a consumers file, loaded with a config whose plans are
//!   `free`, `gold` and `standard` (`gold` has the limits `per-minute` and `monthly`);
//! - ```` ```toml no-check ```` — not checked; the block's first line is a `#` comment that says
//!   why.
//!
//! Every snippet is loaded in a fresh directory that holds the files snippets name:
//! `consumers.toml`, `jwks.json`, `admin-tokens` (and `admin/tokens`), `ca.pem`, `cert.pem` and `key.pem`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROUTE_HEAD: &str = "[[routes]]\nname = \"snippet\"\npath_prefix = \"/snippet\"\nupstream = \"http://127.0.0.1:3000\"\n";

/// The plans a `consumers-file` snippet's consumers may name.
const CONSUMERS_CONFIG: &str = r#"
[consumers]
header = "X-Api-Key"
file = "consumers.toml"

[[plans]]
name = "free"
[[plans.limits]]
name = "per-minute"
algorithm = "gcra"
limit = 60
period = "1m"

[[plans]]
name = "gold"
[[plans.limits]]
name = "per-minute"
algorithm = "gcra"
limit = 600
period = "1m"
[[plans.limits]]
name = "monthly"
algorithm = "fixed_window"
limit = 100000
calendar = "month"

[[plans]]
name = "standard"
[[plans.limits]]
name = "daily"
algorithm = "fixed_window"
limit = 1000
calendar = "day"
"#;

fn docs_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src")
}

fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&docs_src(), &mut out);
    out.sort();
    assert!(out.len() > 10, "docs/src has too few pages: {out:?}");
    out
}

/// A fenced code block: its info string, its text, the line it starts on and the fence's indent.
struct Block {
    info: String,
    text: String,
    line: usize,
    indent: usize,
}

fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut open {
            None if trimmed.starts_with("```") => {
                open = Some(Block {
                    info: trimmed.trim_start_matches('`').trim().to_owned(),
                    text: String::new(),
                    line: i + 1,
                    indent: line.len() - trimmed.len(),
                })
            }
            Some(_) if trimmed.starts_with("```") => out.push(open.take().unwrap()),
            Some(b) => {
                // A fence in a list item is indented, and so are its lines.
                let strip = b.indent.min(line.len() - trimmed.len());
                b.text.push_str(&line[strip..]);
                b.text.push('\n');
            }
            None => {}
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    out
}

/// The headings of a page, outside code blocks.
fn headings(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            out.push(line[hashes + 1..].to_owned());
        }
    }
    out
}

/// The anchor mdBook (and GitHub) give a heading: lower case, spaces to `-`, every character but
/// letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap())
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The directory a snippet is loaded in, with the files snippets name.
fn sandbox() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs");
    std::fs::copy(examples.join("jwt/jwks.json"), dir.path().join("jwks.json")).unwrap();
    std::fs::write(dir.path().join("consumers.toml"), "# no consumers\n").unwrap();
    // The SHA-256 of "change-me", as `admin-tokens` and as Kubernetes mounts it, `admin/tokens`.
    let token = "e2186dbdb1bb4193608605e84f33208765b5693b55edd4f730a719a100eeea6f\n";
    std::fs::write(dir.path().join("admin-tokens"), token).unwrap();
    std::fs::create_dir(dir.path().join("admin")).unwrap();
    std::fs::write(dir.path().join("admin/tokens"), token).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("ca.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    dir
}

/// A `fragment=limit` snippet with the keys it leaves out filled in: `name`, `algorithm`
/// (`token_bucket`, or `fixed_window` with `calendar`), `limit` (100000), `period` (`1h`, not with
/// `calendar`) and `subject` (`ip`). The snippet's own keys are kept as they are.
fn limit_with_defaults(text: &str) -> Result<String, String> {
    let mut limit: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
    let calendar = limit.contains_key("calendar");
    let algorithm = if calendar {
        "fixed_window"
    } else {
        "token_bucket"
    };
    let mut defaults = vec![
        ("name", toml::Value::from("snippet")),
        ("algorithm", toml::Value::from(algorithm)),
        ("limit", toml::Value::from(100_000)),
        ("subject", toml::Value::from("ip")),
    ];
    if !calendar {
        defaults.push(("period", toml::Value::from("1h")));
    }
    for (key, value) in defaults {
        limit.entry(key).or_insert(value);
    }
    toml::to_string(&limit).map_err(|e| format!("{e}"))
}

/// Loads one snippet as `tollgate check` would; `Err` says why it is refused.
fn check_snippet(info: &str, text: &str) -> Result<(), String> {
    let mut words = info.split_whitespace();
    assert_eq!(words.next(), Some("toml"));
    let marks: Vec<&str> = words.collect();
    let dir = sandbox();
    let config = match marks.as_slice() {
        [] => text.to_owned(),
        ["fragment=route"] => format!("{ROUTE_HEAD}{text}"),
        ["fragment=limit"] => format!(
            "{ROUTE_HEAD}[[routes.limits]]\n{}",
            limit_with_defaults(text)?
        ),
        ["fragment=plan"] => format!("[[plans]]\nname = \"snippet\"\n{text}"),
        ["consumers-file"] => {
            std::fs::write(dir.path().join("consumers.toml"), text).unwrap();
            CONSUMERS_CONFIG.to_owned()
        }
        ["no-check"] => {
            let first = text.lines().next().unwrap_or("");
            return if first.starts_with('#') && first.len() > 10 {
                Ok(())
            } else {
                Err("a `no-check` block must say why on its first line (a `#` comment)".into())
            };
        }
        other => return Err(format!("unknown marks {other:?}")),
    };
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    tollgate::load::load_and_check(&path)
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

#[test]
fn every_toml_snippet_loads() {
    let mut checked = 0;
    let mut failures = Vec::new();
    // The front page's example too.
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    for page in pages().into_iter().chain([readme]) {
        let text = std::fs::read_to_string(&page).unwrap();
        for block in blocks(&text) {
            if block.info.split_whitespace().next() != Some("toml") {
                continue;
            }
            checked += 1;
            if let Err(e) = check_snippet(&block.info, &block.text) {
                failures.push(format!(
                    "{}:{} ({}): {e}",
                    page.display(),
                    block.line,
                    block.info
                ));
            }
        }
    }
    eprintln!("{checked} TOML snippets checked");
    assert!(checked >= 40, "only {checked} TOML snippets found");
    assert!(
        failures.is_empty(),
        "{} snippet(s) refused:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_snippet_with_an_unknown_key_is_refused() {
    // The check above is only worth something if the loader refuses what it does not know.
    let good = "algorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\nsubject = \"ip\"\n";
    assert_eq!(check_snippet("toml fragment=limit", good), Ok(()));
    let bad = format!("{good}burts = 5\n");
    let err = check_snippet("toml fragment=limit", &bad).unwrap_err();
    assert!(err.contains("burts"), "{err}");
    assert!(check_snippet("toml", "[server]\nlisten_on = \"0.0.0.0:1\"\n").is_err());
    assert!(check_snippet("toml no-check", "listen = 1\n").is_err());
}

#[test]
fn every_relative_link_points_to_a_page_and_anchor() {
    let pages = pages();
    let anchors: BTreeMap<PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            (
                p.clone(),
                headings(&text).iter().map(|h| anchor(h)).collect(),
            )
        })
        .collect();
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut in_code = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for cap in link.captures_iter(line) {
                let target = &cap[1];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, frag) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target, None),
                };
                let dest = if file.is_empty() {
                    page.clone()
                } else {
                    page.parent().unwrap().join(file)
                };
                let dest = match dest.canonicalize() {
                    Ok(d) if d.starts_with(docs_src().canonicalize().unwrap()) => d,
                    _ => {
                        broken.push(format!(
                            "{}:{}: {target}: no such page",
                            page.display(),
                            n + 1
                        ));
                        continue;
                    }
                };
                if let Some(frag) = frag {
                    let known = anchors
                        .iter()
                        .find(|(p, _)| p.canonicalize().unwrap() == dest)
                        .map(|(_, a)| a);
                    if !known.is_some_and(|a| a.contains(frag)) {
                        broken.push(format!(
                            "{}:{}: {target}: no such anchor",
                            page.display(),
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    // SUMMARY.md lists every page, and every page is in it.
    let summary = std::fs::read_to_string(docs_src().join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = link
        .captures_iter(&summary)
        .map(|c| docs_src().join(&c[1]))
        .collect();
    for page in &pages {
        if !page.ends_with("SUMMARY.md") && !listed.contains(page) {
            broken.push(format!("{}: not in SUMMARY.md", page.display()));
        }
    }
    eprintln!("{checked} relative links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_front_page_links_to_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    // The front page, not the manual (issue #39): the reference lives in docs/.
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; the manual is docs/"
    );
    let link = regex::Regex::new(r"\]\(([^)\s#]+)(#[^)\s]*)?\)").unwrap();
    let mut checked = 0;
    let missing: Vec<&str> = link
        .captures_iter(&readme)
        .map(|c| c.get(1).unwrap().as_str())
        .filter(|target| !target.contains("://"))
        .inspect(|_| checked += 1)
        .filter(|target| !root.join(target).exists())
        .collect();
    assert!(checked >= 10, "the README links to {checked} files only");
    assert!(
        missing.is_empty(),
        "README.md links to missing files: {missing:?}"
    );
}
