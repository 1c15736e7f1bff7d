//! The manual's TOML snippets: extraction and completion, shared by `tests/docs_snippets.rs`
//! (which loads each with the config loader) and `tests/schema.rs` (which validates each against
//! `tollgate schema`). How snippets are marked is documented in `docs/src/development/docs.md`:
//!
//! - ```` ```toml ```` — a complete `gateway.toml`, loaded as it is;
//! - ```` ```toml fragment=route ```` — the inside of a `[[routes]]` table (keys, `[routes.cors]`,
//!   `[[routes.limits]]`…): a route header with `name`, `path_prefix` and `upstream` is put in
//!   front of it;
//! - ```` ```toml fragment=limit ```` — some keys of one `[[routes.limits]]` table, on such a
//!   route: the required keys the snippet leaves out are filled in (`limit_with_defaults`);
//! - ```` ```toml fragment=plan ```` — the inside of a `[[plans]]` table (`name` given here);
//! - ```` ```toml consumers-file ```` — a consumers file, loaded with a config whose plans are
//!   `free`, `gold` and `standard` (`gold` has the limits `per-minute` and `monthly`);
//! - ```` ```toml no-check ```` — not checked; the block's first line is a `#` comment that says
//!   why.

use std::path::{Path, PathBuf};

pub const ROUTE_HEAD: &str = "[[routes]]\nname = \"snippet\"\npath_prefix = \"/snippet\"\nupstream = \"http://127.0.0.1:3000\"\n";

/// The plans a `consumers-file` snippet's consumers may name.
pub const CONSUMERS_CONFIG: &str = r#"
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

pub fn docs_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src")
}

/// Every page of the manual.
pub fn pages() -> Vec<PathBuf> {
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
pub struct Block {
    pub info: String,
    pub text: String,
    pub line: usize,
    pub indent: usize,
}

pub fn blocks(page: &str) -> Vec<Block> {
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

/// Every ```` ```toml ```` block of the manual and of the README: (page, block).
pub fn toml_snippets() -> Vec<(PathBuf, Block)> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let mut out = Vec::new();
    for page in pages().into_iter().chain([readme]) {
        let text = std::fs::read_to_string(&page).unwrap();
        for block in blocks(&text) {
            if block.info.split_whitespace().next() == Some("toml") {
                out.push((page.clone(), block));
            }
        }
    }
    out
}

/// The directory a snippet is loaded in, with the files snippets name.
pub fn sandbox() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs");
    std::fs::copy(examples.join("jwt/jwks.json"), dir.path().join("jwks.json")).unwrap();
    std::fs::write(dir.path().join("consumers.toml"), "# no consumers\n").unwrap();
    // The SHA-256 of "change-me", as `admin-tokens` and as Kubernetes mounts it, `admin/tokens`.
    let token = "e2186dbdb1bb4193608605e84f33208765b5693b55edd4f730a719a100eeea6f\n";
    std::fs::write(dir.path().join("admin-tokens"), token).unwrap();
    std::fs::create_dir(dir.path().join("admin")).unwrap();
    std::fs::write(dir.path().join("admin/tokens"), token).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
    // `ca.pem`'s revocation list (revoking nothing), for `client_auth.crl`.
    let crl = rcgen::CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2024, 1, 1),
        next_update: rcgen::date_time_ymd(2100, 1, 1),
        crl_number: rcgen::SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: Vec::new(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&rcgen::Issuer::new(params, key))
    .unwrap();
    std::fs::write(dir.path().join("ca.crl"), crl.pem().unwrap()).unwrap();
    dir
}

/// A `fragment=limit` snippet with the keys it leaves out filled in: `name`, `algorithm`
/// (`token_bucket`, or `fixed_window` with `calendar`), `limit` (100000), `period` (`1h`, not with
/// `calendar`) and `subject` (`ip`). The snippet's own keys are kept as they are.
pub fn limit_with_defaults(text: &str) -> Result<String, String> {
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

/// A snippet made whole.
pub enum Snippet {
    /// A complete `gateway.toml`.
    Config(String),
    /// A consumers file, and the `gateway.toml` it is loaded with.
    ConsumersFile { file: String, config: String },
    /// Not checked (`no-check`, with its reason on the first line).
    NoCheck,
}

/// Completes one snippet by its marks; `Err` for unknown marks or an unreadable fragment.
pub fn complete(info: &str, text: &str) -> Result<Snippet, String> {
    let mut words = info.split_whitespace();
    assert_eq!(words.next(), Some("toml"));
    let marks: Vec<&str> = words.collect();
    Ok(match marks.as_slice() {
        [] => Snippet::Config(text.to_owned()),
        ["fragment=route"] => Snippet::Config(format!("{ROUTE_HEAD}{text}")),
        ["fragment=limit"] => Snippet::Config(format!(
            "{ROUTE_HEAD}[[routes.limits]]\n{}",
            limit_with_defaults(text)?
        )),
        ["fragment=plan"] => Snippet::Config(format!("[[plans]]\nname = \"snippet\"\n{text}")),
        ["consumers-file"] => Snippet::ConsumersFile {
            file: text.to_owned(),
            config: CONSUMERS_CONFIG.to_owned(),
        },
        ["no-check"] => {
            let first = text.lines().next().unwrap_or("");
            if first.starts_with('#') && first.len() > 10 {
                Snippet::NoCheck
            } else {
                return Err(
                    "a `no-check` block must say why on its first line (a `#` comment)".into(),
                );
            }
        }
        other => return Err(format!("unknown marks {other:?}")),
    })
}
