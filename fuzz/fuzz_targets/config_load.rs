//! The config loader (`Config::parse`: TOML, then validation into domain types), and what a
//! snapshot compiles from a valid config (the route table, each route's and plan's limits).
//!
//! Input: the text of `gateway.toml`.
//!
//! Properties:
//! - no text panics the loader, and no config it accepts panics the route table's and limits'
//!   compilation, its warnings or its `Debug`;
//! - a route's `path_prefix` is a normalised path (`tollgate::path`), so requests can reach it;
//!   looked up with its own host, a method it accepts and its own prefix, the table finds a route
//!   at least that specific.
#![no_main]

use std::collections::HashMap;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tollgate::config::{Config, UpstreamRef};
use tollgate::path::{normalize_with, PathParams};
use tollgate::routing::RouteTable;

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
    for route in table.iter() {
        let _ = route.upstream_path(&route.path_prefix);
        let method = route
            .methods
            .as_ref()
            .and_then(|m| m.first().cloned())
            .unwrap_or(http::Method::GET);
        let found = table
            .find(route.host.as_deref(), &method, &route.path_prefix)
            .unwrap_or_else(|| panic!("route {:?} is unreachable", route.name));
        assert!(
            found.path_prefix.len() >= route.path_prefix.len(),
            "route {:?} found {:?}",
            route.name,
            found.name
        );
    }
});
