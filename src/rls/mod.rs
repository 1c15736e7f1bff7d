//! Tollgate as Envoy's rate limit service (`[rls]`, issue #37): the `ratelimit.v3`
//! `ShouldRateLimit` API over the gateway's own store, configured by domain and descriptors in
//! envoyproxy/ratelimit's format (its YAML files are read as they are).
//!
//! `config::rls_model` is the format as written (the raw layer, kept with the config), `yaml`
//! reads a directory of it, `domains` compiles it into descriptor trees of limits, `matching` finds a descriptor's limit, `service` decides a call,
//! `server` is the gRPC listener (`unary` a `ShouldRateLimit` call on its HTTP/2 stream, `streaming` a quota stream's bodies), `source` what they read of the gateway, `metrics` what is counted. The quota service (RLQS):
//! `quota` maps the filter's buckets to limits, `rlqs` answers its usage reports with leases,
//! `rlqs_budget` bounds what its streams hold per connection and per process, `rlqs_message` is
//! its messages as decoded (bytes, not strings); `pb` is the messages both services send.

pub mod domains;
pub mod explain;
pub mod matching;
pub mod message;
pub mod metrics;
pub mod pb;
pub mod quota;
pub mod rlqs;
pub mod rlqs_budget;
pub mod rlqs_message;
pub mod server;
pub mod service;
mod source;
pub mod streaming;
pub mod unary;
pub mod yaml;
pub mod yaml_depth;

pub use self::domains::{Domain, Domains, Rule};
pub use self::source::{Source, Timers};
