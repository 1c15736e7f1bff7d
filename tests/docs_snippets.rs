//! The manual (`docs/src/**/*.md`) cannot drift from the code: every ```` ```toml ```` block is
//! loaded by the same function `tollgate check` uses (`load::load_and_check`), and every relative
//! link points to an existing page and anchor. How snippets are marked is documented in
//! `docs/src/development/docs.md` and in `tests/support/snippets.rs` (which completes fragments;
//! `tests/schema.rs` validates the same snippets against `tollgate schema`):
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

mod support;

use support::snippets::{complete, docs_src, pages, sandbox, Snippet};

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

/// Loads one snippet as `tollgate check` would; `Err` says why it is refused.
fn check_snippet(info: &str, text: &str) -> Result<(), String> {
    let dir = sandbox();
    let config = match complete(info, text)? {
        Snippet::Config(config) => config,
        Snippet::ConsumersFile { file, config } => {
            std::fs::write(dir.path().join("consumers.toml"), file).unwrap();
            config
        }
        Snippet::NoCheck => return Ok(()),
    };
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    tollgate::runtime::load::load_and_check(&path)
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

#[test]
fn every_toml_snippet_loads() {
    let mut checked = 0;
    let mut failures = Vec::new();
    // The front page's example too.
    for (page, block) in support::snippets::toml_snippets() {
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
