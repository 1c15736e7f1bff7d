//! Which configured limit a request's descriptor falls under, by envoyproxy/ratelimit's rules:
//! the descriptor's entries are walked level by level; at each level a value match wins over a
//! wildcard (`value: "a*"`, in file order), which wins over the key alone (no `value`); the
//! limit is the one of the node the *last* entry reaches (a descriptor longer or shorter than
//! the configured one matches nothing). No backtracking: a value match that leads nowhere does
//! not fall back to the key alone, as in envoyproxy/ratelimit.

use std::sync::Arc;

use super::domains::{Domain, Node, Rule};

/// A descriptor's match: the rule of the node its last entry reaches, and the entries that a
/// `share_threshold` wildcard matched on the way.
#[derive(Debug)]
pub struct Found<'a> {
    pub rule: &'a Arc<Rule>,
    /// (entry index, pattern): those entries count by the pattern (`files/*`), not their value,
    /// so every value the pattern matches shares one count (envoyproxy/ratelimit's cache key
    /// does the same). Empty (no allocation) for a match without one.
    pub shared: Vec<(usize, &'a str)>,
}

impl Domain {
    /// The rule of the descriptor whose entries are `entries` (key, value, as bytes), if any.
    /// A key or value that is not UTF-8 equals no configured one (those are UTF-8); a value
    /// still matches a wildcard byte for byte, and a descriptor with a key alone.
    pub fn find<'a, 'e>(
        &'a self,
        entries: impl ExactSizeIterator<Item = (&'e [u8], &'e [u8])>,
    ) -> Option<Found<'a>> {
        let last = entries.len().checked_sub(1)?;
        let mut level = &self.root;
        let mut shared = Vec::new();
        for (i, (key, value)) in entries.enumerate() {
            let k = level.keys.get(std::str::from_utf8(key).ok()?)?;
            let node: &Node = match std::str::from_utf8(value)
                .ok()
                .and_then(|v| k.values.get(v))
            {
                Some(n) => n,
                None => match k
                    .wildcards
                    .iter()
                    .find(|(parts, _)| wildcard_match(parts, value))
                {
                    Some((_, n)) => {
                        if let Some(p) = &n.shared {
                            shared.push((i, &**p));
                        }
                        n
                    }
                    None => k.any.as_deref()?,
                },
            };
            if i == last {
                return node.rule.as_ref().map(|rule| Found { rule, shared });
            }
            level = &node.next;
        }
        None
    }
}

/// Whether `value` matches the pattern split on `*` (`parts`: at least two), byte for byte.
fn wildcard_match(parts: &[String], value: &[u8]) -> bool {
    let (Some(first), Some(lastp)) = (parts.first(), parts.last()) else {
        return false;
    };
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed
        || !value.starts_with(first.as_bytes())
        || !value.ends_with(lastp.as_bytes())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - lastp.len()];
    for p in &parts[1..parts.len() - 1] {
        match memchr::memmem::find(rest, p.as_bytes()) {
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
        d.get("d")?
            .find(entries.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
            .map(|f| &*f.rule.path)
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
        assert!(wildcard_match(&p("ab*"), b"ab"));
        assert!(wildcard_match(&p("*"), b""));
        assert!(wildcard_match(&p("a*b*c"), b"axxbyyc"));
        assert!(!wildcard_match(&p("a*b*c"), b"axxc"));
        assert!(!wildcard_match(&p("ab*ba"), b"aba"));
        // Bytes that are not UTF-8 match as bytes.
        assert!(wildcard_match(&p("caf*"), b"caf\xe9"));
    }
}
