//! `[server] proxy_protocol`, `proxy_protocol_from`, `proxy_protocol_timeout`: which peers
//! (load balancers) start their connections with a PROXY protocol header, and which versions
//! are accepted. Applied by [`crate::front::server`] on every accepted connection.

use std::time::Duration;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{Cidr, HumanDuration};
use super::{bounded, invalid, ConfigError};

/// `proxy_protocol` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocolMode {
    #[default]
    Off,
    /// The text header only.
    V1,
    /// The binary header only.
    V2,
    /// Either.
    Any,
}

/// The PROXY protocol settings of a listener that expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyProtocolConfig {
    /// `V1`, `V2` or `Any` (never `Off`).
    pub mode: ProxyProtocolMode,
    /// Peers whose connections must start with a header; any other peer's header is refused.
    pub from: Vec<IpNet>,
    /// Time to receive the header (and, from other peers, the first bytes).
    pub timeout: Duration,
}

/// The default `proxy_protocol_timeout`.
pub fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}

pub(super) fn validate(
    mode: ProxyProtocolMode,
    from: &[Cidr],
    timeout: HumanDuration,
) -> Result<Option<ProxyProtocolConfig>, ConfigError> {
    let timeout = bounded(
        "server.proxy_protocol_timeout",
        timeout,
        Duration::from_secs(60),
        "1m",
        false,
    )?;
    match mode {
        ProxyProtocolMode::Off if from.is_empty() => Ok(None),
        ProxyProtocolMode::Off => Err(invalid(
            "server.proxy_protocol_from",
            "has no effect without proxy_protocol = \"v1\", \"v2\" or \"any\"",
        )),
        _ if from.is_empty() => Err(invalid(
            "server.proxy_protocol_from",
            "must list the networks of the load balancers that send the PROXY header",
        )),
        mode => Ok(Some(ProxyProtocolConfig {
            mode,
            from: from.iter().map(|c| c.0).collect(),
            timeout,
        })),
    }
}
