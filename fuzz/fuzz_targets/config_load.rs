//! The config loader (`Config::parse`: TOML, then validation into domain types), and what a
//! snapshot compiles from a valid config (the route table, each route's and plan's limits).
//!
//! Input: the text of `gateway.toml`.
//!
//! Properties:
//! - no text panics the loader, and no config it accepts panics the route table's and limits'
//!   compilation, its warnings or its `Debug`;
//! - a route's `path_prefix` is a normalised path (`tollgate::http::path`), so requests can reach it;
//!   looked up with a request it matches (its host, a method it accepts, its exact path, template
//!   or prefix), the table finds a route, the very one asking every route every matcher finds
//!   (`RouteTable::candidates`), and never one `check` reports as shadowed.
#![no_main]

use std::collections::HashMap;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tollgate::config::{Config, UpstreamRef};
use tollgate::http::path::{normalize_with, PathParams};
use tollgate::config::route_match::{HostPattern, TemplateSeg};
use tollgate::http::head::OwnedHead;
use tollgate::routing::{PathKind, RouteTable};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A directory that does not exist: relative file names resolve against it, nothing is read.
    let Ok(config) = Config::parse(text, Path::new("/nonexistent/tollgate-fuzz")) else {
        return;
    };
    let _ = config.warnings();
    let _ = format!("{config:?}");
    for r in &config.routes {
        if r.case_sensitive {
            assert_eq!(
                normalize_with(&r.path_prefix, PathParams::Allow).as_deref(),
                Ok(r.path_prefix.as_str()),
                "route {:?}",
                r.name
            );
        }
    }
    // Routes on https:// URLs build a TLS client with the platform's roots: slow, and not
    // parsing; leave those configs at validation.
    if config
        .routes
        .iter()
        .any(|r| matches!(&r.upstream, Some(UpstreamRef::Url(u)) if u.scheme != http::uri::Scheme::HTTP))
    {
        return;
    }
    let groups = HashMap::new();
    let Ok(mut table) = RouteTable::new(&config.routes, &groups, 1) else {
        // Only a route naming an [[upstreams]] group, absent from the empty `groups`.
        assert!(config
            .routes
            .iter()
            .any(|r| matches!(r.upstream, Some(UpstreamRef::Group(_)))));
        return;
    };
    tollgate::consumers::compile_plan_limits(
        &mut table,
        &config.plans,
        &tollgate::consumers::ConsumerTable::default(),
    );
    let shapes: Vec<_> = table.iter().map(|r| r.shape()).collect();
    let shadowed = tollgate::routing::shadowed(&shapes);
    for route in table.iter() {
        let _ = route.upstream_path(&route.path_prefix);
        let method = route
            .methods
            .as_ref()
            .and_then(|m| m.first().cloned())
            .unwrap_or(http::Method::GET);
        // A request the route matches: its first host (a wildcard's with one label), its exact
        // path, its template with every capture `x` (the rest empty), or its prefix.
        let host = route.matching.hosts.first().map(|h| match h {
            HostPattern::Exact(h) => h.clone(),
            HostPattern::Wildcard { suffix, .. } => format!("x.{suffix}"),
        });
        let path = probe_path(route);
        let head = OwnedHead {
            method: method.clone(),
            path: path.clone(),
            ..OwnedHead::default()
        };
        let found = table.find(host.as_deref(), &method, &path, &head);
        // The indexed lookup finds what asking every route every matcher finds.
        let reference = table
            .candidates(host.as_deref(), &method, &path, &head, usize::MAX)
            .into_iter()
            .last()
            .filter(|c| c.refused.is_none())
            .map(|c| c.route);
        assert_eq!(
            found.map(|r| &*r.name),
            reference.map(|r| &*r.name),
            "{host:?} {method} {path:?}"
        );
        let probed = route.path_kind() != PathKind::Regex
            && route.matching.headers.is_empty()
            && route.matching.query.is_empty();
        if probed {
            let found = found.unwrap_or_else(|| panic!("route {:?} is unreachable", route.name));
            // `check`'s shadowing never names a route that takes a request.
            assert!(
                !shadowed.iter().any(|(never, _)| *never == &*found.name),
                "{:?} is reported shadowed but takes {path:?}",
                found.name
            );
        }
    }
});

/// A path `route`'s path matcher takes (for a regex route, its prefix only).
fn probe_path(route: &tollgate::routing::Route) -> String {
    if let Some(p) = &route.matching.path {
        return p.clone();
    }
    if let Some(t) = &route.matching.path_template {
        let mut out = String::new();
        for seg in t.segs.iter() {
            match seg {
                TemplateSeg::Lit(l) => {
                    out.push('/');
                    out.push_str(l);
                }
                TemplateSeg::Param(_) => out.push_str("/x"),
                TemplateSeg::Rest(_) => {}
            }
        }
        if out.is_empty() {
            out.push('/');
        }
        return out;
    }
    route.path_prefix.clone()
}
