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
///
/// Its flow collections nest at most [`MAX_FLOW_DEPTH`](crate::rls::yaml_depth::MAX_FLOW_DEPTH)
/// deep, checked before the parser runs (see [`crate::rls::yaml_depth`]: the parser's time is
/// quadratic in that depth). YAML merge keys (`<<: *anchor`, `<<: [*a, *b]`), which
/// envoyproxy/ratelimit's parser resolves, are resolved: the mapping's own keys first, then
/// each merged mapping's in order.
pub fn parse(text: &str) -> Result<RawDomain, String> {
    crate::rls::yaml_depth::check(text, crate::rls::yaml_depth::MAX_FLOW_DEPTH)
        .map_err(|e| e.to_string())?;
    let located = |e: serde_norway::Error| match e.location() {
        Some(l) => format!("line {} column {}: {e}", l.line(), l.column()),
        None => e.to_string(),
    };
    let direct = match serde_norway::from_str(text) {
        Ok(raw) => return Ok(raw),
        Err(e) => e,
    };
    // Only a text with merge keys is read again, as a value with them resolved (serde's
    // errors then have no line: the key's path names the place).
    let Ok(mut value) = serde_norway::from_str::<serde_norway::Value>(text) else {
        return Err(located(direct));
    };
    if !has_merge_key(&value) {
        return Err(located(direct));
    }
    resolve_merges(&mut value, 0)?;
    serde_norway::from_value(value).map_err(|e| format!("(merge keys resolved) {e}"))
}

/// The merge key.
const MERGE: &str = "<<";

fn has_merge_key(v: &serde_norway::Value) -> bool {
    use serde_norway::Value;
    match v {
        Value::Mapping(m) => m.contains_key(MERGE) || m.values().any(has_merge_key),
        Value::Sequence(s) => s.iter().any(has_merge_key),
        Value::Tagged(t) => has_merge_key(&t.value),
        _ => false,
    }
}

/// Resolves every merge key of `v`, those of the merged mappings first (a merged mapping may
/// merge another). `depth`: the value's nesting, which the loader bounds (128).
fn resolve_merges(v: &mut serde_norway::Value, depth: usize) -> Result<(), String> {
    use serde_norway::Value;
    if depth > 256 {
        return Err("merge keys nested too deeply".into());
    }
    match v {
        Value::Mapping(m) => {
            if let Some(merged) = m.remove(MERGE) {
                let sources = match merged {
                    Value::Sequence(s) => s,
                    one => vec![one],
                };
                for mut source in sources {
                    resolve_merges(&mut source, depth + 1)?;
                    let Value::Mapping(source) = source else {
                        return Err(
                            "a merge key (`<<`) takes a mapping or a list of mappings".into()
                        );
                    };
                    for (k, val) in source {
                        if !m.contains_key(&k) {
                            m.insert(k, val);
                        }
                    }
                }
            }
            for val in m.values_mut() {
                resolve_merges(val, depth + 1)?;
            }
        }
        Value::Sequence(s) => {
            for val in s {
                resolve_merges(val, depth + 1)?;
            }
        }
        Value::Tagged(t) => resolve_merges(&mut t.value, depth + 1)?,
        _ => {}
    }
    Ok(())
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

    /// Issue 50 §6: merge keys were refused as an unknown field `<<`.
    #[test]
    fn merge_keys_are_resolved() {
        let raw = parse(
            "\
domain: d
x-limits:
  per_minute: &per_minute
    unit: minute
    requests_per_unit: 5
  base: &base
    <<: *per_minute
    name: base
descriptors:
  - key: a
    rate_limit:
      <<: *per_minute
  - key: b
    rate_limit:
      <<: [*base, {unit: hour}]
      requests_per_unit: 9
",
        );
        // `x-limits` is no field of the format: refused, merge keys or not.
        let e = raw.expect_err("an unknown field");
        assert!(e.contains("x-limits"), "{e}");
        let raw = parse(
            "\
domain: d
descriptors:
  - key: a
    rate_limit: &per_minute
      unit: minute
      requests_per_unit: 5
  - key: b
    rate_limit:
      <<: *per_minute
  - key: c
    rate_limit: &named
      <<: *per_minute
      name: named
  - key: d
    rate_limit:
      <<: [*named, {unit: hour, requests_per_unit: 1}]
      requests_per_unit: 9
",
        )
        .expect("merge keys resolve");
        let rl = |i: usize| raw.descriptors[i].rate_limit.clone().expect("a limit");
        assert_eq!(
            (rl(1).unit.as_deref(), rl(1).requests_per_unit),
            (Some("minute"), Some(5))
        );
        assert_eq!(rl(2).name.as_deref(), Some("named"));
        // The mapping's own keys first, then the merged ones in order.
        let d = rl(3);
        assert_eq!(
            (d.unit.as_deref(), d.requests_per_unit, d.name.as_deref()),
            (Some("minute"), Some(9), Some("named"))
        );
        let e = parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      <<: 3\n")
            .expect_err("a scalar merged");
        assert!(e.contains("merge"), "{e}");
    }

    /// Issue 50 §7: nested flow collections parsed in quadratic time (600 KB: more than 15 s).
    #[test]
    fn deep_flow_nesting_is_refused_at_once() {
        let t = std::time::Instant::now();
        for text in [
            format!("domain: d\ndescriptors: {}", "[".repeat(600 << 10)),
            format!("domain: d\ndescriptors: {}", "[{a: ".repeat(1 << 20)),
        ] {
            let e = parse(&text).expect_err("too deep");
            assert!(e.contains("nested deeper"), "{e}");
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        // A whole tree in flow style, 16 levels deep (the most the service takes), parses.
        let mut tree = "{key: k, rate_limit: {unit: second, requests_per_unit: 1}}".to_owned();
        for _ in 0..15 {
            tree = format!("{{key: k, descriptors: [{tree}]}}");
        }
        parse(&format!("{{domain: d, descriptors: [{tree}]}}")).expect("a flow tree parses");
    }

    /// envoyproxy/ratelimit's `metadata` is any mapping (it becomes a protobuf Struct there),
    /// read and dropped; anything but a mapping is refused, as there.
    #[test]
    fn metadata_is_any_mapping() {
        let raw = parse(
            "domain: d\ndescriptors:\n  - key: a\n    metadata:\n      x: {y: [1, {z: true}], w: null}\n      n: 3\n    quota_mode: true\n    value_to_metric: true\n",
        )
        .expect("parses");
        assert!(raw.descriptors[0].metadata.is_some() && raw.descriptors[0].quota_mode);
        let e = parse("domain: d\ndescriptors:\n  - key: a\n    metadata: [1, 2]\n")
            .expect_err("a list");
        assert!(e.contains("line 4"), "{e}");
        // A null `descriptors:` is an empty list (envoyproxy/ratelimit's test configs have one).
        let raw = parse("domain: d\ndescriptors:\n").expect("parses");
        assert!(raw.descriptors.is_empty());
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
