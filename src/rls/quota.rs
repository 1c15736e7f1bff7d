//! `[[rls.quota]]` compiled: the limits the buckets of Envoy's `rate_limit_quota` filter map
//! to. A bucket (its `bucket_id`, a map of strings) falls under the first quota, in file order,
//! whose `domain` (if set) is the stream's and whose `match` entries it all has (`"*"`: any
//! value); its subject is the values of the quota's `subject` keys (by default every entry),
//! hashed like every subject, so each distinct set of values has its own count.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::rls_model::RawQuota;
use crate::config::{check_numbers, invalid, Algorithm, ConfigError, MAX_PERIOD};
use crate::limiter::{Limit, Policy, SubjectDigest};

/// The longest `assignment_ttl` (Envoy keeps an assignment this long without a report).
const MAX_TTL: Duration = Duration::from_secs(3600);

/// One compiled `[[rls.quota]]`.
#[derive(Debug)]
pub struct Quota {
    pub name: Arc<str>,
    pub domain: Option<String>,
    /// `match`: (key, value), `None` for `"*"`.
    pub matches: Vec<(String, Option<String>)>,
    /// `subject`: the keys, sorted; `None`: every key of the bucket_id.
    pub subject: Option<Vec<String>>,
    /// What the store decides by (scope `rlqs`, name the quota's).
    pub limit: Arc<Limit>,
    /// `assignment_time_to_live`'s most, in whole seconds (at least 1).
    pub ttl_secs: u64,
    pub lease_max: u64,
}

impl Quota {
    /// Whether a bucket of `domain` with `bucket` (its bucket_id's entries, as bytes: a value
    /// that is not UTF-8 equals no configured one, but matches `"*"`) falls under this quota.
    pub fn matches(&self, domain: &[u8], bucket: &BTreeMap<&[u8], &[u8]>) -> bool {
        self.domain
            .as_deref()
            .is_none_or(|d| d.as_bytes() == domain)
            && self.matches.iter().all(|(k, v)| {
                bucket
                    .get(k.as_bytes())
                    .is_some_and(|got| v.as_ref().is_none_or(|v| v.as_bytes() == *got))
            })
    }

    /// The bucket's subject: its entries (the `subject` keys, or all), sorted by key, hashed
    /// (kind `q`), lengths mixed in.
    pub fn subject_of(&self, bucket: &BTreeMap<&[u8], &[u8]>) -> SubjectDigest {
        let mut keys: Vec<&[u8]> = match &self.subject {
            Some(keys) => keys.iter().map(String::as_bytes).collect(),
            None => bucket.keys().copied().collect(),
        };
        keys.sort_unstable();
        let mut bytes = Vec::new();
        for k in keys {
            let v = bucket.get(k).copied().unwrap_or_default();
            for part in [k, v] {
                bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
                bytes.extend_from_slice(part);
            }
        }
        SubjectDigest::of(b'q', &bytes)
    }
}

/// Compiles `[[rls.quota]]`; errors name `rls.quota[i].<key>`.
pub fn compile(raw: &[RawQuota]) -> Result<Vec<Arc<Quota>>, ConfigError> {
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, q) in raw.iter().enumerate() {
        let at = |key: &str| format!("rls.quota[{i}].{key}");
        if q.name.is_empty() {
            return Err(invalid(at("name"), "must not be empty"));
        }
        if !names.insert(q.name.as_str()) {
            return Err(invalid(at("name"), format!("duplicate quota {:?}", q.name)));
        }
        let algorithm = q.algorithm.unwrap_or(Algorithm::FixedWindow);
        if !matches!(
            algorithm,
            Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::Gcra
        ) {
            return Err(invalid(
                at("algorithm"),
                "an assignment is a lease: fixed_window, token_bucket or gcra",
            ));
        }
        let period = q.period.0;
        if period < Duration::from_secs(1)
            || period > MAX_PERIOD
            || period.subsec_nanos() % 1_000_000 != 0
        {
            return Err(invalid(
                at("period"),
                "must be from 1s to 1year, in milliseconds",
            ));
        }
        let burst = match (algorithm, q.burst) {
            (Algorithm::FixedWindow, Some(_)) => {
                return Err(invalid(
                    at("burst"),
                    "fixed_window has no burst; leave it out",
                ))
            }
            (Algorithm::FixedWindow, None) => 0,
            (_, Some(0)) => return Err(invalid(at("burst"), "must be positive")),
            (_, b) => b.unwrap_or(q.limit),
        };
        check_numbers(algorithm, q.limit, burst, 1, period.as_micros())
            .map_err(|(f, m)| invalid(at(f), m))?;
        let ttl = q.assignment_ttl.map_or(Duration::from_secs(10), |d| d.0);
        if ttl < Duration::from_secs(1) || ttl > MAX_TTL || ttl.subsec_nanos() != 0 {
            return Err(invalid(
                at("assignment_ttl"),
                "whole seconds from 1s to 1h (Envoy reads only its seconds)",
            ));
        }
        let policy = Policy {
            algorithm: algorithm.into(),
            limit: q.limit,
            period: u64::try_from(period.as_micros()).unwrap_or(u64::MAX),
            burst,
            cost: 1,
            calendar: None,
        };
        let lease_max = match q.lease_max {
            Some(0) => return Err(invalid(at("lease_max"), "must be positive")),
            Some(m) if m > policy.quota() => {
                return Err(invalid(
                    at("lease_max"),
                    "must not exceed the limit (or burst)",
                ))
            }
            Some(m) => m,
            // Enough for one Envoy to run at the limit's average rate, twice over, for the
            // seconds an assignment is spent from (rlqs::ask_for): an assignment refills
            // lease_max ÷ (TTL + 2 s) a second, all a drained Envoy bucket admits. At least a
            // tenth of the limit; at most all of it.
            None => {
                let rate_based = u128::from(q.limit)
                    .saturating_mul(2)
                    .saturating_mul(u128::from(ttl.as_secs().saturating_add(2)))
                    .saturating_mul(1_000_000)
                    .div_ceil(period.as_micros().max(1));
                let rate_based = u64::try_from(rate_based).unwrap_or(u64::MAX);
                rate_based
                    .max(policy.quota() / 10)
                    .clamp(1, policy.quota().max(1))
            }
        };
        let lease_max = lease_max.min(u64::from(u32::MAX));
        let mut matches: Vec<(String, Option<String>)> = q
            .matches
            .iter()
            .map(|(k, v)| (k.clone(), (v != "*").then(|| v.clone())))
            .collect();
        matches.sort();
        let subject = q.subject.clone().map(|mut s| {
            s.sort();
            s.dedup();
            s
        });
        let name: Arc<str> = Arc::from(q.name.as_str());
        out.push(Arc::new(Quota {
            limit: Arc::new(Limit::new("rlqs", name.clone(), policy)),
            name,
            domain: q.domain.clone(),
            matches,
            subject,
            ttl_secs: ttl.as_secs(),
            lease_max,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(toml_body: &str) -> Result<Vec<Arc<Quota>>, ConfigError> {
        #[derive(serde::Deserialize)]
        struct W {
            quota: Vec<RawQuota>,
        }
        let w: W = toml::from_str(toml_body).expect("parses");
        compile(&w.quota)
    }

    fn bucket<'a>(entries: &[(&'a str, &'a str)]) -> BTreeMap<&'a [u8], &'a [u8]> {
        entries
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
            .collect()
    }

    #[test]
    fn buckets_match_by_entries_and_their_subject_is_the_chosen_values() {
        let q = quotas(
            "[[quota]]\nname = \"api\"\ndomain = \"d\"\nmatch = { route = \"api\", tenant = \"*\" }\n\
             subject = [\"tenant\"]\nlimit = 10\nperiod = \"1m\"\n",
        )
        .unwrap();
        let q = &q[0];
        assert!(q.matches(b"d", &bucket(&[("route", "api"), ("tenant", "a")])));
        assert!(!q.matches(b"other", &bucket(&[("route", "api"), ("tenant", "a")])));
        assert!(!q.matches(b"d", &bucket(&[("route", "web"), ("tenant", "a")])));
        assert!(!q.matches(b"d", &bucket(&[("route", "api")])));
        // A value that is not UTF-8 matches `"*"` and is its own subject.
        let latin1: BTreeMap<&[u8], &[u8]> =
            [(&b"route"[..], &b"api"[..]), (b"tenant", b"caf\xe9")].into();
        assert!(q.matches(b"d", &latin1));
        assert_ne!(
            q.subject_of(&latin1),
            q.subject_of(&bucket(&[("route", "api"), ("tenant", "caf")]))
        );
        let a = q.subject_of(&bucket(&[("route", "api"), ("tenant", "a"), ("x", "1")]));
        let a2 = q.subject_of(&bucket(&[("route", "api"), ("tenant", "a"), ("x", "2")]));
        let b = q.subject_of(&bucket(&[("route", "api"), ("tenant", "b")]));
        assert_eq!(a, a2);
        assert_ne!(a, b);
        // 10 a minute for one Envoy, twice, over TTL + 2 s: ⌈2 × 10 × 12 ÷ 60⌉.
        assert_eq!(q.lease_max, 4);
        assert_eq!(q.ttl_secs, 10);
    }

    #[test]
    fn bad_quotas_name_the_key() {
        for (body, needle) in [
            (
                "name = \"a\"\nlimit = 10\nperiod = \"1m\"\nalgorithm = \"sliding_window\"",
                "algorithm",
            ),
            (
                "name = \"a\"\nlimit = 10\nperiod = \"1m\"\nassignment_ttl = \"1500ms\"",
                "assignment_ttl",
            ),
            ("name = \"a\"\nlimit = 10\nperiod = \"100ms\"", "period"),
            (
                "name = \"a\"\nlimit = 10\nperiod = \"1m\"\nlease_max = 11",
                "lease_max",
            ),
            ("name = \"\"\nlimit = 10\nperiod = \"1m\"", "name"),
        ] {
            let e = quotas(&format!("[[quota]]\n{body}\n"))
                .expect_err(body)
                .to_string();
            assert!(e.contains(needle), "{body}: {e}");
        }
    }
}
