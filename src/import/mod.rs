//! `tollgate import`: turn the configs people already have (ingress-nginx Ingress manifests, an
//! nginx.conf) into a `gateway.toml`. One module per source; both build the same [`output`]
//! model and fill the same [`report`] with whatever they could not convert, so nothing is
//! dropped silently and `--strict` has one rule.

pub mod gateway_api;
pub mod ingress;
pub mod nginx;
pub mod nginx_conf;
pub mod output;
pub mod report;

pub use output::{Import, ImportError};
pub use report::{Item, Report, Severity};
