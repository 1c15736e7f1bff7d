//! The service's domains compiled once: each domain's descriptor tree, whose nodes carry a
//! [`Rule`] (the crate's [`Limit`] and what the reply and the metrics need). Built from
//! `[[rls.domains]]` and the YAML files of `[rls] config_dir` (see [`super::yaml`]) by
//! [`Domains::load`], at start-up, by `tollgate check` and on every reload (a broken file keeps
//! the running configuration).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::pb::rate_limit_response::rate_limit::Unit;

use super::metrics::RuleMetrics;
use crate::config::rls::RlsConfig;
use crate::config::rls_model::{RawDescriptor, RawDomain, RawRateLimit};
use crate::config::{check_numbers, invalid, Algorithm, ConfigError, MAX_PERIOD};
use crate::limiter::{LeaseSettings, Limit, Policy};

/// Every domain the service answers for.
#[derive(Debug, Default)]
pub struct Domains {
    by_name: HashMap<String, Domain>,
    /// `[rls] ratelimit_headers`.
    pub ratelimit_headers: bool,
    /// `[[rls.quota]]`: the quota service's (RLQS) limits, in file order.
    pub quotas: Vec<Arc<super::quota::Quota>>,
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    pub(super) root: Level,
}

/// The descriptors of one level, by their entry's key.
#[derive(Debug, Default)]
pub(super) struct Level {
    pub(super) keys: HashMap<String, KeyLevel>,
}

/// The descriptors of one key at one level: by value, by wildcard pattern, and the key alone.
#[derive(Debug, Default)]
pub(super) struct KeyLevel {
    pub(super) values: HashMap<String, Node>,
    /// `value` with `*`: the pattern split on `*`, in file order.
    pub(super) wildcards: Vec<(Vec<String>, Node)>,
    /// A descriptor with a key and no value: any value.
    pub(super) any: Option<Box<Node>>,
}

/// One configured descriptor: its rule (if it has a `rate_limit`) and its deeper levels.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) rule: Option<Arc<Rule>>,
    pub(super) next: Level,
    /// `share_threshold` on a wildcard `value`: the pattern (`files/*`), which stands for the
    /// request's value in the subject, so every value it matches shares one count.
    pub(super) shared: Option<Arc<str>>,
}

/// A configured descriptor's limit.
#[derive(Debug)]
pub struct Rule {
    pub domain: Arc<str>,
    /// The descriptor's place in the tree: `key_value.key2` (values as configured).
    pub path: Arc<str>,
    /// `rate_limit.name` (for `replaces` and the reply's `current_limit.name`).
    pub name: Option<Arc<str>>,
    /// What the store decides by (scope `rls:<domain>`, name the path); `None`: `unlimited`,
    /// or a limit that [`blocks`](Rule::blocks).
    pub limit: Option<Arc<Limit>>,
    /// `requests_per_unit: 0` (envoyproxy/ratelimit's way to block): every hit is refused,
    /// without asking the store.
    pub blocks: bool,
    /// `shadow_mode`: decided and counted, never refusing.
    pub shadow: bool,
    /// `quota_mode`: over its limit, it refuses the call only when every quota-mode descriptor
    /// of the call is over (see [`super::service`]). Its [`Limit`] is a shadow limit to the
    /// store, so that it never denies the batch by itself.
    pub quota: bool,
    /// The limit's period (`unit` or `period`); zero for `unlimited`.
    pub period: Duration,
    /// The reply's `current_limit`: requests per unit, and the unit (`Unknown` for a `period`
    /// that is none of Envoy's units).
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub replaces: Vec<Arc<str>>,
    /// `"name";q=L;w=P` for `RateLimit-Policy`.
    pub policy_item: String,
    pub metrics: RuleMetrics,
    /// The descriptors this limit denies most (`/-/top`, as `route` `rls:<domain>`).
    pub top: Arc<crate::top::DeniedTop>,
}

impl Rule {
    /// The metric label and the RateLimit fields' name: `rate_limit.name`, else the path.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.path)
    }
}

impl Domains {
    /// `[rls]`'s domains: those written inline, then each file of `config_dir`.
    pub fn load(config: &RlsConfig) -> Result<Domains, ConfigError> {
        let mut domains = Domains {
            by_name: HashMap::new(),
            ratelimit_headers: config.ratelimit_headers,
            quotas: super::quota::compile(&config.quota)?,
        };
        for (i, raw) in config.domains.iter().enumerate() {
            let field = format!("rls.domains[{i}]");
            domains.add(raw, |m| invalid(field.clone(), m))?;
        }
        if let Some(dir) = &config.config_dir {
            for (path, raw) in super::yaml::read_dir(dir)? {
                domains.add(&raw, |m| ConfigError::Parse {
                    path: path.clone(),
                    message: m,
                })?;
            }
        }
        Ok(domains)
    }

    fn add(
        &mut self,
        raw: &RawDomain,
        err: impl Fn(String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if raw.domain.is_empty() {
            return Err(err("`domain` must not be empty".into()));
        }
        if self.by_name.contains_key(&raw.domain) {
            return Err(err(format!("duplicate domain {:?}", raw.domain)));
        }
        let name: Arc<str> = Arc::from(raw.domain.as_str());
        let root = compile_level(&name, "", &raw.descriptors).map_err(err)?;
        self.by_name
            .insert(raw.domain.clone(), Domain { name, root });
        Ok(())
    }

    pub fn get(&self, domain: &str) -> Option<&Domain> {
        self.by_name.get(domain)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Every rule, for `/-/top`-like listings and tests.
    pub fn rules(&self) -> Vec<&Arc<Rule>> {
        fn walk<'a>(level: &'a Level, out: &mut Vec<&'a Arc<Rule>>) {
            for k in level.keys.values() {
                let nodes = k
                    .values
                    .values()
                    .chain(k.wildcards.iter().map(|(_, n)| n))
                    .chain(k.any.as_deref());
                for n in nodes {
                    out.extend(n.rule.iter());
                    walk(&n.next, out);
                }
            }
        }
        let mut out = Vec::new();
        for d in self.by_name.values() {
            walk(&d.root, &mut out);
        }
        out
    }
}

/// The deepest nesting accepted (envoyproxy/ratelimit has none; Envoy's descriptors are short).
const MAX_DEPTH: usize = 16;

fn compile_level(domain: &Arc<str>, parent: &str, raw: &[RawDescriptor]) -> Result<Level, String> {
    if parent.matches('.').count() >= MAX_DEPTH {
        return Err(format!(
            "descriptor {parent:?}: nested deeper than {MAX_DEPTH} levels"
        ));
    }
    let mut level = Level::default();
    for d in raw {
        if d.key.is_empty() {
            return Err(format!("descriptor under {parent:?} has an empty key"));
        }
        let own = match &d.value {
            Some(v) if !v.is_empty() => format!("{}_{v}", d.key),
            _ => d.key.clone(),
        };
        let path = if parent.is_empty() {
            own
        } else {
            format!("{parent}.{own}")
        };
        let rule = match &d.rate_limit {
            Some(rl) => Some(Arc::new(
                compile_rule(domain, &path, d, rl)
                    .map_err(|m| format!("descriptor {path:?}: {m}"))?,
            )),
            None => None,
        };
        let shared = match d.value.as_deref() {
            Some(v) if d.share_threshold && v.contains('*') => Some(Arc::from(v)),
            _ if d.share_threshold => {
                // As envoyproxy/ratelimit: only a wildcard value can share its count.
                return Err(format!(
                    "descriptor {path:?}: `share_threshold` needs a wildcard `value` (with `*`)"
                ));
            }
            _ => None,
        };
        let node = Node {
            rule,
            next: compile_level(domain, &path, &d.descriptors)?,
            shared,
        };
        let k = level.keys.entry(d.key.clone()).or_default();
        let duplicate = match d.value.as_deref() {
            None | Some("") => k.any.replace(Box::new(node)).is_some(),
            Some(v) if v.contains('*') => {
                let parts: Vec<String> = v.split('*').map(str::to_owned).collect();
                let dup = k.wildcards.iter().any(|(p, _)| *p == parts);
                k.wildcards.push((parts, node));
                dup
            }
            Some(v) => k.values.insert(v.to_owned(), node).is_some(),
        };
        if duplicate {
            return Err(format!("duplicate descriptor {path:?}"));
        }
    }
    // `replaces` names limits of the same domain; checked once the tree is whole (below).
    Ok(level)
}

/// Envoy's units as periods; `month` and `year` as envoyproxy/ratelimit counts them.
fn unit_period(unit: &str) -> Option<(Unit, Duration)> {
    const DAY: u64 = 86_400;
    Some(match unit.to_ascii_lowercase().as_str() {
        "second" => (Unit::Second, Duration::from_secs(1)),
        "minute" => (Unit::Minute, Duration::from_secs(60)),
        "hour" => (Unit::Hour, Duration::from_secs(3600)),
        "day" => (Unit::Day, Duration::from_secs(DAY)),
        "week" => (Unit::Week, Duration::from_secs(7 * DAY)),
        "month" => (Unit::Month, Duration::from_secs(30 * DAY)),
        "year" => (Unit::Year, Duration::from_secs(365 * DAY)),
        _ => return None,
    })
}

/// The unit a period is, if it is one.
fn unit_of(period: Duration) -> Unit {
    ["second", "minute", "hour", "day", "week", "month", "year"]
        .into_iter()
        .filter_map(unit_period)
        .find(|(_, p)| *p == period)
        .map_or(Unit::Unknown, |(u, _)| u)
}

fn compile_rule(
    domain: &Arc<str>,
    path: &str,
    d: &RawDescriptor,
    rl: &RawRateLimit,
) -> Result<Rule, String> {
    let name = match rl.name.as_deref() {
        Some("") => return Err("`rate_limit.name` must not be empty".into()),
        n => n.map(Arc::from),
    };
    let mut replaces = Vec::with_capacity(rl.replaces.len());
    let mut seen = HashSet::new();
    for r in &rl.replaces {
        if r.name.is_empty() {
            return Err("a `replaces` entry has an empty name".into());
        }
        if name.as_deref() == Some(r.name.as_str()) {
            return Err("`replaces` names the limit itself".into());
        }
        if seen.insert(r.name.as_str()) {
            replaces.push(Arc::from(r.name.as_str()));
        }
    }
    let label: Arc<str> = name.clone().unwrap_or_else(|| Arc::from(path));
    let path: Arc<str> = Arc::from(path);
    let metrics = RuleMetrics::new(domain, &label);
    if rl.unlimited {
        if rl.unit.is_some() || rl.requests_per_unit.is_some() || rl.period.is_some() {
            return Err("an `unlimited` limit has no unit, requests_per_unit or period".into());
        }
        return Ok(Rule {
            domain: domain.clone(),
            path,
            name,
            limit: None,
            blocks: false,
            shadow: d.shadow_mode,
            quota: d.quota_mode,
            period: Duration::ZERO,
            requests_per_unit: 0,
            unit: Unit::Unknown,
            replaces,
            policy_item: String::new(),
            metrics,
            top: Arc::default(),
        });
    }
    let (unit, period) = match (&rl.unit, &rl.period) {
        (Some(_), Some(_)) => return Err("give `unit` or `period`, not both".into()),
        (Some(u), None) => {
            unit_period(u).ok_or_else(|| format!("invalid rate limit unit {u:?}"))?
        }
        (None, Some(p)) => (unit_of(p.0), p.0),
        (None, None) => {
            return Err("a limit needs `unit` (or `period`), or `unlimited: true`".into())
        }
    };
    if period < Duration::from_millis(1)
        || period > MAX_PERIOD
        || period.subsec_micros() % 1000 != 0
    {
        return Err("`period` must be a whole number of milliseconds from 1ms to 1year".into());
    }
    let w = period.as_secs_f64();
    let limit = match rl.requests_per_unit {
        None => return Err("a limit needs `requests_per_unit`".into()),
        // envoyproxy/ratelimit's way to block (its README's example 3): every hit refused.
        Some(0) => {
            if rl.algorithm.is_some()
                || rl.burst.is_some()
                || rl.cost.is_some()
                || rl.store.is_some()
                || rl.sync.is_some()
                || rl.lease_ttl.is_some()
                || rl.lease_max.is_some()
            {
                return Err("`requests_per_unit: 0` refuses every hit: leave out algorithm, burst, cost, store, sync, lease_ttl and lease_max".into());
            }
            let mut policy_item = String::new();
            push_sf_string(&mut policy_item, &label);
            return Ok(Rule {
                domain: domain.clone(),
                path,
                name,
                limit: None,
                blocks: true,
                shadow: d.shadow_mode,
                quota: d.quota_mode,
                period,
                requests_per_unit: 0,
                unit,
                replaces,
                policy_item: format!("{policy_item};q=0;w={w}"),
                metrics,
                top: Arc::default(),
            });
        }
        Some(n) => n,
    };
    let algorithm = rl.algorithm.unwrap_or(Algorithm::FixedWindow);
    if algorithm == Algorithm::Concurrency {
        return Err(
            "`concurrency` counts requests in flight, which a rate limit service never sees end"
                .into(),
        );
    }
    let burst = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => match rl.burst {
            Some(0) => return Err("`burst` must be positive".into()),
            Some(b) => b,
            None => limit,
        },
        Algorithm::LeakyBucket => rl.burst.unwrap_or(0),
        _ if rl.burst.is_some() => {
            return Err(format!("{} has no burst; leave it out", algorithm.as_str()))
        }
        _ => 0,
    };
    let cost = match rl.cost {
        Some(0) => return Err("`cost` must be positive".into()),
        c => c.unwrap_or(1),
    };
    check_numbers(algorithm, limit, burst, cost, period.as_micros())
        .map_err(|(f, m)| format!("`{f}`: {m}"))?;
    let policy = Policy {
        algorithm: algorithm.into(),
        limit,
        period: u64::try_from(period.as_micros()).unwrap_or(u64::MAX),
        burst,
        cost,
        calendar: None,
    };
    let scope = format!("rls:{domain}");
    let fleet = crate::config::rls::validate_fleet(
        "rate_limit",
        rl.store,
        rl.sync,
        rl.lease_ttl,
        rl.lease_max,
        (algorithm, policy.quota(), cost),
    )
    .map_err(|e| e.to_string())?;
    let mut core = Limit::new(scope.as_str(), path.clone(), policy);
    // A quota-mode limit never denies the store's batch by itself (the service decides the
    // call from every quota descriptor's decision); like a shadow limit it is charged only
    // when it admits.
    core.shadow = d.shadow_mode || d.quota_mode;
    core.local = fleet.store == crate::config::LimitStore::Local;
    core.lease = fleet.lease.map(|c| {
        (
            LeaseSettings {
                ttl: c.ttl,
                max: c.max,
            },
            crate::metrics::LeaseMetrics::new(&scope, &path),
        )
    });
    let mut policy_item = String::new();
    push_sf_string(&mut policy_item, &label);
    Ok(Rule {
        domain: domain.clone(),
        path,
        name,
        limit: Some(Arc::new(core)),
        blocks: false,
        shadow: d.shadow_mode,
        quota: d.quota_mode,
        period,
        requests_per_unit: u32::try_from(limit).unwrap_or(u32::MAX),
        unit,
        replaces,
        policy_item: format!("{policy_item};q={};w={w}", policy.quota()),
        metrics,
        top: Arc::default(),
    })
}

/// `s` as a structured-field string: quoted, `"` and `\` escaped.
pub(super) fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        if ch == '"' || ch == '\\' {
            out.push('\\');
        }
        out.push(ch);
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(yaml: &str) -> Result<Domains, ConfigError> {
        let raw: RawDomain = serde_norway::from_str(yaml).expect("parses");
        let mut d = Domains::default();
        d.add(&raw, |m| invalid("t", m))?;
        Ok(d)
    }

    #[test]
    fn units_and_periods_compile_to_policies() {
        let d = domain(
            "domain: d\ndescriptors:\n- key: a\n  rate_limit: {unit: MINUTE, requests_per_unit: 5}\n- key: b\n  rate_limit: {period: 10s, requests_per_unit: 3, algorithm: gcra}\n",
        )
        .unwrap();
        let mut rules: Vec<_> = d
            .rules()
            .into_iter()
            .map(|r| {
                (
                    r.path.to_string(),
                    r.unit,
                    r.limit.as_ref().map(|l| l.policy),
                )
            })
            .collect();
        rules.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(rules[0].1, Unit::Minute);
        assert_eq!(rules[0].2.map(|p| p.period), Some(60_000_000));
        assert_eq!(rules[1].1, Unit::Unknown);
        assert_eq!(
            rules[1].2.map(|p| (p.period, p.burst)),
            Some((10_000_000, 3))
        );
    }

    #[test]
    fn bad_limits_are_refused_with_the_descriptor_path() {
        for (yaml, needle) in [
            ("domain: d\ndescriptors:\n- key: a\n  rate_limit: {unit: fortnight, requests_per_unit: 5}\n", "fortnight"),
            ("domain: d\ndescriptors:\n- key: a\n  rate_limit: {unit: second, requests_per_unit: 0, burst: 2}\n", "requests_per_unit"),
            ("domain: d\ndescriptors:\n- key: a\n  rate_limit: {unit: second, unlimited: true}\n", "unlimited"),
            ("domain: d\ndescriptors:\n- key: a\n- key: a\n", "duplicate"),
            ("domain: d\ndescriptors:\n- key: a\n  value: v\n  rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: x}]}\n", "itself"),
            ("domain: ''\n", "empty"),
            // As envoyproxy/ratelimit: only a wildcard value shares its count.
            ("domain: d\ndescriptors:\n- key: a\n  value: v\n  share_threshold: true\n", "share_threshold"),
            ("domain: d\ndescriptors:\n- key: a\n  share_threshold: true\n", "wildcard"),
        ] {
            let e = domain(yaml).expect_err(yaml).to_string();
            assert!(e.contains(needle), "{yaml}: {e}");
        }
        let e = domain("domain: d\ndescriptors:\n- key: a\n  value: v\n  rate_limit: {unit: day, requests_per_unit: 0, cost: 1}\n").unwrap_err();
        assert!(e.to_string().contains("a_v"), "{e}");
    }
}
