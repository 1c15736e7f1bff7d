//! `[[routes]]`: which requests a route matches, where they go, and its limits.

use std::collections::HashSet;
use std::time::Duration;

use http::Method;

use super::limit::{validate_limit, LimitConfig};
use super::raw::RawRoute;
use super::subject::{AccessList, Prefixes};
use super::values::UpstreamRef;
use super::{bounded, invalid, is_label_safe, ConfigError, MAX_TIMEOUT};

/// One `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// Normalised: starts with `/`, no trailing `/` (except the root prefix `/`); `/` when the
    /// route has none (every path).
    pub path_prefix: String,
    /// A URL, or the name of a group of [`Config::upstreams`] (checked to exist); `None` for a
    /// redirect route.
    pub upstream: Option<UpstreamRef>,
    pub timeout: Duration,
    /// The route's other matchers: exact, regex or template path, hosts, headers, query,
    /// priority.
    pub matching: super::route_match::RouteMatch,
    /// `None`: every method.
    pub methods: Option<Vec<Method>>,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    pub rate_limit_headers: bool,
    /// `false`: the prefix matches in any ASCII case (`/Admin` is `/admin`), for upstreams
    /// that ignore case; the prefix is then kept in lower case.
    pub case_sensitive: bool,
    pub max_body_size: u64,
    /// The largest request body read for `json:` subject parts and reservations (bytes).
    pub max_json_bytes: u64,
    pub limits: Vec<LimitConfig>,
    /// Requests need a known consumer (`[consumers]`); its plan's limits apply too.
    pub consumers: bool,
    /// Header rules, CORS, rewrite.
    pub fronting: crate::fronting::Fronting,
    /// A redirect route's target (then `upstream` is `None`).
    pub redirect: Option<crate::fronting::Redirect>,
    /// `usage = true`: answered by the gateway with the calling consumer's usage of its
    /// limits (the gateway's `quota` module), never forwarded. Its `upstream` is then [`USAGE_UPSTREAM`].
    pub usage: bool,
    /// Who may use the route at all (`allow`, `deny`).
    pub access: AccessList,
    /// A bearer token verified by `[jwt]`: required, or optional.
    pub jwt: Option<super::jwt::JwtMode>,
    /// `client_cert = "required"`: a verified client certificate, or 403.
    pub client_cert_required: bool,
    /// The shape of the route's refusals by a limit without its own (`refusal`).
    pub refusal: Option<std::sync::Arc<super::Refusal>>,
    /// Response compression: the route's `[routes.compression]`, else the server's.
    pub compression: Option<std::sync::Arc<super::Compression>>,
    /// `limit_rate` (with `limit_rate_after`): each response's body paced; `None`: no limit.
    pub limit_rate: Option<crate::http::pacing::Pace>,
    /// `[routes.cache]` with `[cache]`'s defaults (`None`: the route caches nothing).
    pub cache: Option<std::sync::Arc<super::RouteCacheConfig>>,
}

/// The `upstream` of a `usage = true` route, which has none: never contacted (the pipeline
/// answers such a route itself), kept so that every route has a target.
pub const USAGE_UPSTREAM: &str = "http://127.0.0.1:9";

/// A route's `host`, as requests' hosts are matched: lower-case, without a port, and without
/// the one trailing dot a fully qualified name may carry (`example.com.` is `example.com`).
pub(super) fn route_host(raw: &str) -> Result<String, String> {
    let lower = raw.trim().to_ascii_lowercase();
    let h = lower.strip_suffix('.').unwrap_or(&lower);
    let bad = || format!("{raw:?} is not a valid host name");
    if h.is_empty() || h.ends_with('.') || h.contains('@') {
        return Err(bad());
    }
    let authority = h.parse::<http::uri::Authority>().map_err(|_| bad())?;
    if authority.host() != h {
        return Err(format!(
            "{raw:?} must be a host name without a port (the port of a request's Host is ignored)"
        ));
    }
    Ok(h.to_owned())
}

pub(super) fn validate_route(
    i: usize,
    r: RawRoute,
    prefixes: Prefixes,
    cache: &super::CacheConfig,
) -> Result<RouteConfig, ConfigError> {
    let at = |field: &str| format!("routes[{i}].{field}");
    if !is_label_safe(&r.name) {
        return Err(invalid(
            at("name"),
            format!("{:?}: use 1-64 letters, digits, '-', '_' or '.'", r.name),
        ));
    }
    if r.name == crate::metrics::UNMATCHED_ROUTE {
        return Err(invalid(
            at("name"),
            "\"unmatched\" is reserved for requests with no route",
        ));
    }
    let path_prefix = match &r.path_prefix {
        Some(p) => normal_path(&at("path_prefix"), p)?,
        None => "/".to_owned(),
    };
    let path_prefix = if path_prefix.len() > 1 {
        path_prefix.trim_end_matches('/').to_owned()
    } else {
        path_prefix
    };
    let fold = |p: String| {
        if r.case_sensitive {
            p
        } else {
            p.to_ascii_lowercase()
        }
    };
    let path_prefix = fold(path_prefix);
    let given = usize::from(r.path.is_some())
        + usize::from(r.path_regex.is_some())
        + usize::from(r.path_template.is_some());
    if given > 1 {
        return Err(invalid(
            at(if r.path_template.is_some() { "path_template" } else { "path_regex" }),
            "a route matches its path by one of `path`, `path_template` and `path_regex` (a `path_prefix` may narrow a `path_regex`)",
        ));
    }
    if r.path_prefix.is_some() && (r.path.is_some() || r.path_template.is_some()) {
        return Err(invalid(
            at("path_prefix"),
            "`path_prefix` cannot be combined with `path` or `path_template` (a path or template already says which paths match)",
        ));
    }
    if r.strip_prefix && r.path_prefix.is_none() {
        return Err(invalid(
            at("strip_prefix"),
            "strips the route's `path_prefix`: the route needs one (use `rewrite` for other path matchers)",
        ));
    }
    let exact = match &r.path {
        Some(p) => Some(fold(normal_path(&at("path"), p)?)),
        None => None,
    };
    let path_regex = match &r.path_regex {
        Some(re) => Some(super::route_match::path_regex(
            &at("path_regex"),
            re,
            r.case_sensitive,
        )?),
        None => None,
    };
    let path_template = match &r.path_template {
        Some(t) => Some(super::route_match::path_template(
            &at("path_template"),
            t.trim(),
            r.case_sensitive,
        )?),
        None => None,
    };
    let hosts = match (&r.host, &r.hosts) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                at("hosts"),
                "write one host in `host` or several in `hosts`, not both",
            ))
        }
        (Some(h), None) => vec![super::route_match::host_pattern(&at("host"), h)?],
        (None, Some(hs)) => {
            if hs.is_empty() {
                return Err(invalid(
                    at("hosts"),
                    "must list at least one host (or be left out: any host)",
                ));
            }
            if hs.len() > super::route_match::MAX_HOSTS {
                return Err(invalid(
                    at("hosts"),
                    format!("at most {} hosts", super::route_match::MAX_HOSTS),
                ));
            }
            let mut out = Vec::with_capacity(hs.len());
            for (k, h) in hs.iter().enumerate() {
                let p = super::route_match::host_pattern(&format!("routes[{i}].hosts[{k}]"), h)?;
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            out
        }
        (None, None) => Vec::new(),
    };
    let matching = super::route_match::RouteMatch {
        path: exact,
        path_regex,
        path_template,
        prefix_given: r.path_prefix.is_some(),
        hosts,
        headers: super::route_match::header_matches(&at("headers"), r.headers)?,
        query: super::route_match::query_matches(&at("query"), r.query)?,
        priority: r.priority,
    };
    let timeout = bounded(at("timeout"), r.timeout, MAX_TIMEOUT, "1day", false)?;
    let methods = match r.methods {
        Some(ms) => {
            if ms.is_empty() {
                return Err(invalid(
                    at("methods"),
                    "must list at least one method (or be left out)",
                ));
            }
            let mut out = Vec::with_capacity(ms.len());
            for m in ms {
                let upper = m.trim().to_ascii_uppercase();
                let method = Method::from_bytes(upper.as_bytes())
                    .map_err(|_| invalid(at("methods"), format!("{m:?} is not an HTTP method")))?;
                out.push(method);
            }
            Some(out)
        }
        None => None,
    };
    if r.max_body_size == 0 {
        return Err(invalid(at("max_body_size"), "must be positive"));
    }
    let mut limits = Vec::with_capacity(r.limits.len());
    let mut names = HashSet::new();
    for (j, l) in r.limits.into_iter().enumerate() {
        let limit = validate_limit(&format!("routes[{i}].limits[{j}]"), l, prefixes)?;
        if !names.insert(limit.name.clone()) {
            return Err(invalid(
                format!("routes[{i}].limits[{j}].name"),
                format!("duplicate limit name {:?} in this route", limit.name),
            ));
        }
        limits.push(limit);
    }
    for (j, l) in limits.iter().enumerate() {
        for (in_path, name) in l.subject.captures() {
            let defined = if in_path {
                matching.defines_path(name)
            } else {
                matching.defines_host(name)
            };
            if !defined {
                return Err(invalid(
                    format!("routes[{i}].limits[{j}].subject"),
                    if in_path {
                        format!("path:{name} names a capture of the route's path_template, which has no {{{name}}}")
                    } else {
                        format!("host:{name} names the label every host of the route captures ({{{name}}}.example.com); not every one does")
                    },
                ));
            }
        }
    }
    let rule_templates = r
        .request_headers
        .iter()
        .map(|q| (&q.0, "request_headers"))
        .chain(
            r.response_headers
                .iter()
                .map(|q| (&q.rules, "response_headers")),
        )
        .flat_map(|(rules, key)| {
            rules
                .set
                .iter()
                .chain(rules.add.iter())
                .flat_map(move |(_, t)| t.captures().map(move |c| (c, key)))
        });
    for ((host, name), key) in rule_templates {
        let defined = if host {
            matching.defines_host(name)
        } else {
            matching.defines_path(name)
        };
        if !defined {
            let kind = if host { "host" } else { "path" };
            return Err(invalid(
                at(key),
                format!("${{{kind}.{name}}} names a capture the route does not have (its path_template's {{{name}}} or every host's {{{name}}}.…)"),
            ));
        }
    }
    if r.usage && r.redirect.is_some() {
        return Err(invalid(
            at("redirect"),
            "a `usage = true` route is answered by the gateway: remove `redirect`",
        ));
    }
    let upstream = match (r.upstream, &r.redirect, r.usage) {
        (None, None, false) => {
            return Err(invalid(
                at("upstream"),
                "required (a URL or an [[upstreams]] group name), unless the route has a `redirect` or `usage = true`",
            ))
        }
        (Some(_), Some(_), _) => {
            return Err(invalid(
                at("redirect"),
                "a redirect route has no upstream; remove one of the two",
            ))
        }
        (Some(_), None, true) => {
            return Err(invalid(
                at("upstream"),
                "a `usage = true` route is answered by the gateway: remove `upstream`",
            ))
        }
        (None, None, true) => {
            if !r.consumers {
                return Err(invalid(
                    at("usage"),
                    "needs `consumers = true` (the usage answered is the calling consumer's)",
                ));
            }
            Some(
                UpstreamRef::try_from(USAGE_UPSTREAM.to_owned())
                    .map_err(|e| invalid(at("upstream"), e))?,
            )
        }
        (u, _, _) => u,
    };
    if r.redirect.is_some() && r.rewrite.is_some() {
        return Err(invalid(
            at("rewrite"),
            "a redirect route forwards nothing to rewrite; write the target in `redirect.to`",
        ));
    }
    if r.rewrite.is_some() && r.strip_prefix {
        return Err(invalid(
            at("rewrite"),
            "a rewrite replaces the whole path; it cannot be combined with strip_prefix",
        ));
    }
    if r.redirect.is_some() {
        if let Some(j) = limits.iter().position(|l| l.after.is_some()) {
            return Err(invalid(
                format!("routes[{i}].limits[{j}]"),
                "a redirect route has no upstream response to charge after (count_status, cost_header)",
            ));
        }
    }
    let fronting = crate::fronting::Fronting {
        request_headers: r.request_headers.map(|q| Box::new(q.0)),
        response_headers: r.response_headers.map(Box::new),
        cors: r.cors.map(Box::new),
        rewrite: r.rewrite.map(Box::new),
    };
    if r.allow.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid(
            at("allow"),
            "an empty allow list refuses everyone; list networks or leave it out",
        ));
    }
    let access = AccessList {
        allow: r.allow.map(|a| a.into_iter().map(|c| c.0).collect()),
        deny: r
            .deny
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.0)
            .collect(),
    };
    let refusal = match r.refusal {
        Some(raw) => Some(std::sync::Arc::new(super::refusal::validate_refusal(
            &at("refusal"),
            raw,
        )?)),
        None => None,
    };
    let compression = r
        .compression
        .map(|c| super::compression::validate_compression(&at("compression"), c))
        .transpose()?
        .map(std::sync::Arc::new);
    let limit_rate = super::limit_rate::validate_limit_rate(
        &format!("routes[{i}]"),
        r.limit_rate,
        r.limit_rate_after,
    )?
    .flatten();
    let cache = match r.cache {
        Some(c) => super::cache::validate_route_cache(&at("cache"), c, cache)?,
        None => None,
    };
    if cache.is_some() && r.redirect.is_some() {
        return Err(invalid(
            at("cache"),
            "a redirect route has no upstream response to cache",
        ));
    }
    Ok(RouteConfig {
        cache: cache.map(std::sync::Arc::new),
        limit_rate,
        compression,
        refusal,
        fronting,
        redirect: r.redirect,
        access,
        jwt: r.jwt,
        client_cert_required: r.client_cert.is_some(),
        name: r.name,
        path_prefix,
        matching,
        upstream,
        timeout,
        methods,
        strip_prefix: r.strip_prefix,
        preserve_host: r.preserve_host,
        rate_limit_headers: r.rate_limit_headers,
        case_sensitive: r.case_sensitive,
        max_body_size: r.max_body_size,
        max_json_bytes: r.max_json_bytes.0,
        limits,
        consumers: r.consumers,
        usage: r.usage,
    })
}

/// A `path` or `path_prefix` as written: a normalised path (the same rule for both).
fn normal_path(at: &str, raw: &str) -> Result<String, ConfigError> {
    let prefix = raw.trim();
    if prefix.contains(['?', '#']) {
        return Err(invalid(
            at,
            format!("{prefix:?} must be a path only, without '?' or '#' (routes match the path)"),
        ));
    }
    if !prefix.starts_with('/') {
        return Err(invalid(at, format!("{prefix:?} must start with '/'")));
    }
    // Allow: a path may name a `;` path when `[server] path_params = "allow"` (with the
    // other settings no request reaches it, which is harmless).
    match crate::http::path::normalize_with(prefix, crate::http::path::PathParams::Allow) {
        Ok(n) if n == prefix => Ok(n.into_owned()),
        // Another spelling of a valid path (`/caf%c3%a9`, `/café`, `/x%3Arun`): name the one.
        Ok(n) => Err(invalid(
            at,
            format!("{prefix:?} must be a normalised path: write {n:?}"),
        )),
        Err(_) => Err(invalid(
            at,
            format!(
                "{prefix:?} must be a normalised path (no '.', '..', '//', '%2f', '?', \
                 control characters or encoded spaces at a segment's ends)"
            ),
        )),
    }
}
