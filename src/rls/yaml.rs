//! `[rls] config_dir`: envoyproxy/ratelimit's YAML files, read as they are. Every `*.yaml` /
//! `*.yml` file directly in the directory (not below it), in name order, one domain each; an
//! unknown field, a wrong type or a YAML error is a config error naming the file and the line.

use std::path::{Path, PathBuf};

use crate::config::rls_model::RawDomain;
use crate::config::ConfigError;

/// The largest file read (a descriptor file is a few kilobytes).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// Each YAML file of `dir`, parsed.
pub fn read_dir(dir: &Path) -> Result<Vec<(PathBuf, RawDomain)>, ConfigError> {
    let read_err = |path: &Path, source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| read_err(dir, e))? {
        let path = entry.map_err(|e| read_err(dir, e))?.path();
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if yaml && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        let len = std::fs::metadata(&path)
            .map_err(|e| read_err(&path, e))?
            .len();
        if len > MAX_FILE_BYTES {
            return Err(ConfigError::Parse {
                path,
                message: format!(
                    "{len} bytes; a descriptor file may have at most {MAX_FILE_BYTES}"
                ),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| read_err(&path, e))?;
        let raw = parse(&text).map_err(|message| ConfigError::Parse {
            path: path.clone(),
            message,
        })?;
        out.push((path, raw));
    }
    Ok(out)
}

/// One file's text; the error names the line (serde's location, 1-based).
pub fn parse(text: &str) -> Result<RawDomain, String> {
    serde_norway::from_str(text).map_err(|e| match e.location() {
        Some(l) => format!("line {} column {}: {e}", l.line(), l.column()),
        None => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoyproxy_ratelimit_readme_example_reads_as_is() {
        let raw = parse(
            "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n\n  - key: database\n    value: default\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n    shadow_mode: true\n    detailed_metric: true\n",
        )
        .expect("parses");
        assert_eq!(raw.domain, "mongo_cps");
        assert_eq!(raw.descriptors.len(), 2);
    }

    #[test]
    fn unknown_fields_name_the_line() {
        let e = parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unti: 5\n")
            .expect_err("a typo");
        assert!(
            e.contains("line 6") && e.contains("requests_per_unti"),
            "{e}"
        );
    }
}
