//! Which configured limit a request's descriptor falls under, by envoyproxy/ratelimit's rules:
//! the descriptor's entries are walked level by level; at each level a value match wins over a
//! wildcard (`value: "a*"`, in file order), which wins over the key alone (no `value`); the
//! limit is the one of the node the *last* entry reaches (a descriptor longer or shorter than
//! the configured one matches nothing). No backtracking: a value match that leads nowhere does
//! not fall back to the key alone, as in envoyproxy/ratelimit.

use std::sync::Arc;

use super::domains::{Domain, Node, Rule};

impl Domain {
    /// The rule of the descriptor whose entries are `entries` (key, value), if any.
    pub fn find<'a, 'e>(
        &'a self,
        entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&'a Arc<Rule>> {
        let last = entries.len().checked_sub(1)?;
        let mut level = &self.root;
        for (i, (key, value)) in entries.enumerate() {
            let k = level.keys.get(key)?;
            let node: &Node = k
                .values
                .get(value)
                .or_else(|| {
                    k.wildcards
                        .iter()
                        .find(|(parts, _)| wildcard_match(parts, value))
                        .map(|(_, n)| n)
                })
                .or(k.any.as_deref())?;
            if i == last {
                return node.rule.as_ref();
            }
            level = &node.next;
        }
        None
    }
}

/// Whether `value` matches the pattern split on `*` (`parts`: at least two).
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(lastp)) = (parts.first(), parts.last()) else {
        return false;
    };
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(lastp.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - lastp.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p.as_str()) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::domains::Domains;
    use super::*;
    use crate::config::rls::RlsConfig;
    use crate::config::rls_model::RawDomain;

    fn domains(yaml: &str) -> Domains {
        let raw: RawDomain = serde_norway::from_str(yaml).expect("parses");
        Domains::load(&RlsConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            config_dir: None,
            ratelimit_headers: false,
            domains: vec![raw],
            quota: Vec::new(),
        })
        .expect("valid")
    }

    fn find<'a>(d: &'a Domains, entries: &[(&str, &str)]) -> Option<&'a str> {
        d.get("d")?.find(entries.iter().copied()).map(|r| &*r.path)
    }

    #[test]
    fn the_most_specific_descriptor_wins() {
        let d = domains(
            "domain: d\ndescriptors:\n\
             - key: k\n  rate_limit: {unit: second, requests_per_unit: 1}\n\
             - key: k\n  value: v\n  rate_limit: {unit: second, requests_per_unit: 2}\n\
             - key: k\n  value: ab*\n  rate_limit: {unit: second, requests_per_unit: 3}\n\
             - key: k\n  value: a*z*9\n  rate_limit: {unit: second, requests_per_unit: 4}\n\
             - key: outer\n  value: x\n  descriptors:\n  - key: inner\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        );
        assert_eq!(find(&d, &[("k", "v")]), Some("k_v"));
        assert_eq!(find(&d, &[("k", "other")]), Some("k"));
        assert_eq!(find(&d, &[("k", "abc")]), Some("k_ab*"));
        assert_eq!(find(&d, &[("k", "a-z-9")]), Some("k_a*z*9"));
        assert_eq!(
            find(&d, &[("outer", "x"), ("inner", "any")]),
            Some("outer_x.inner")
        );
        // Shorter or longer than configured: nothing.
        assert_eq!(find(&d, &[("outer", "x")]), None);
        assert_eq!(find(&d, &[("k", "v"), ("more", "1")]), None);
        assert_eq!(find(&d, &[("outer", "y"), ("inner", "any")]), None);
        assert_eq!(find(&d, &[("nope", "v")]), None);
        assert_eq!(find(&d, &[]), None);
    }

    #[test]
    fn wildcards_match_runs_of_characters() {
        let p = |s: &str| s.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&p("ab*"), "ab"));
        assert!(wildcard_match(&p("*"), ""));
        assert!(wildcard_match(&p("a*b*c"), "axxbyyc"));
        assert!(!wildcard_match(&p("a*b*c"), "axxc"));
        assert!(!wildcard_match(&p("ab*ba"), "aba"));
    }
}
