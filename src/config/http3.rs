//! `[server.http3]`: HTTP/3 over QUIC on the TLS listener's port (UDP), served by
//! `crate::front::h3`. The raw serde table and its validation into [`Http3Config`]: bounds on
//! every number a client's traffic is measured against (streams, payload size, idle time), and
//! the two settings that keep limits exact over QUIC — address validation (`retry`) and early
//! data (`early_data`). docs/src/http3.md is the manual page.

use std::net::SocketAddr;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{HumanDuration, ListenAddr};
use super::{bounded, invalid, ConfigError};

/// The largest `max_concurrent_streams` (HTTP/2's `h2_max_concurrent_streams` has none, but a
/// QUIC stream's receive buffer is granted up front: bounded so a connection's memory is).
pub const MAX_STREAMS: u32 = 1000;

/// The smallest UDP payload QUIC allows (RFC 9000 §14) and the largest a UDP datagram carries.
pub const MIN_UDP_PAYLOAD: u16 = 1200;
pub const MAX_UDP_PAYLOAD: u16 = 65527;

/// When a new connection must prove its address first (QUIC Retry, RFC 9000 §8.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryMode {
    /// Every connection: no request is ever served (nor charged) for an address that has not
    /// shown it receives packets there.
    Always,
    /// Only while more handshakes are in progress than
    /// [`crate::front::h3::UNDER_LOAD_HANDSHAKES`] (a flood of Initials).
    #[default]
    UnderLoad,
    /// Never (a load balancer in front validates addresses, or every round trip counts).
    Never,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp3 {
    /// Serve HTTP/3 (QUIC, UDP) beside the TLS listener, with its certificates; responses on
    /// the TCP listener advertise it (`Alt-Svc`). Needs `[server.tls]` (bool; default: `false`).
    #[serde(default)]
    enabled: bool,
    /// The UDP address, when it is not the TLS listener's (socket address; default: `listen`'s
    /// address and port, over UDP).
    #[serde(default)]
    listen: Option<ListenAddr>,
    /// Request streams one connection may have open at once; 1 to 1000 (integer; default:
    /// `100`).
    #[serde(default = "default_streams")]
    #[schemars(range(min = 1, max = MAX_STREAMS))]
    max_concurrent_streams: u32,
    /// A connection with no packet either way for this long is closed; positive, at most `10m`
    /// (duration; default: `"30s"`).
    #[serde(default = "default_idle_timeout")]
    idle_timeout: HumanDuration,
    /// The largest UDP payload received (and sent, once the path is known to carry it); 1200 to
    /// 65527 (integer; default: `1452`).
    #[serde(default = "default_udp_payload")]
    #[schemars(range(min = MIN_UDP_PAYLOAD, max = MAX_UDP_PAYLOAD))]
    max_udp_payload: u16,
    /// When a new connection must prove its address with a QUIC Retry before anything is
    /// served: `"always"`, `"under_load"` (past 64 handshakes in progress) or `"never"`
    /// (default: `"under_load"`).
    #[serde(default)]
    retry: RetryMode,
    /// Accept 0-RTT early data from resumed clients. Early requests with a method that is not
    /// idempotent are answered 425 Too Early, uncharged; idempotent ones are served once the
    /// handshake completes, so a replay is never charged (bool; default: `false`).
    #[serde(default)]
    early_data: bool,
}

impl Default for RawHttp3 {
    fn default() -> Self {
        RawHttp3 {
            enabled: false,
            listen: None,
            max_concurrent_streams: default_streams(),
            idle_timeout: default_idle_timeout(),
            max_udp_payload: default_udp_payload(),
            retry: RetryMode::default(),
            early_data: false,
        }
    }
}

fn default_streams() -> u32 {
    100
}

fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

fn default_udp_payload() -> u16 {
    1452
}

/// A validated, enabled `[server.http3]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http3Config {
    /// `None`: the TLS listener's address (its bound port, when it asked for port 0).
    pub listen: Option<SocketAddr>,
    pub max_concurrent_streams: u32,
    pub idle_timeout: Duration,
    pub max_udp_payload: u16,
    pub retry: RetryMode,
    pub early_data: bool,
}

/// `[server.http3]` checked (`None`: off); `tls`: whether `[server.tls]` is set.
pub(super) fn validate(raw: RawHttp3, tls: bool) -> Result<Option<Http3Config>, ConfigError> {
    const AT: &str = "server.http3";
    if !(1..=MAX_STREAMS).contains(&raw.max_concurrent_streams) {
        return Err(invalid(
            format!("{AT}.max_concurrent_streams"),
            format!("must be between 1 and {MAX_STREAMS}"),
        ));
    }
    if !(MIN_UDP_PAYLOAD..=MAX_UDP_PAYLOAD).contains(&raw.max_udp_payload) {
        return Err(invalid(
            format!("{AT}.max_udp_payload"),
            format!("must be between {MIN_UDP_PAYLOAD} and {MAX_UDP_PAYLOAD}"),
        ));
    }
    let idle_timeout = bounded(
        format!("{AT}.idle_timeout"),
        raw.idle_timeout,
        Duration::from_secs(600),
        "10m",
        false,
    )?;
    if !raw.enabled {
        return Ok(None);
    }
    if !tls {
        return Err(invalid(
            format!("{AT}.enabled"),
            "HTTP/3 is TLS 1.3 over QUIC with the TLS listener's certificates, so it needs [server.tls]",
        ));
    }
    Ok(Some(Http3Config {
        listen: raw.listen.map(|l| l.0),
        max_concurrent_streams: raw.max_concurrent_streams,
        idle_timeout,
        max_udp_payload: raw.max_udp_payload,
        retry: raw.retry,
        early_data: raw.early_data,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(toml_text: &str) -> RawHttp3 {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn defaults_and_bounds_name_their_key() {
        let on = validate(raw("enabled = true"), true).unwrap().unwrap();
        assert_eq!(
            on,
            Http3Config {
                listen: None,
                max_concurrent_streams: 100,
                idle_timeout: Duration::from_secs(30),
                max_udp_payload: 1452,
                retry: RetryMode::UnderLoad,
                early_data: false,
            }
        );
        assert_eq!(validate(raw(""), false).unwrap(), None);
        let err = |t: &str, tls: bool| validate(raw(t), tls).unwrap_err().to_string();
        assert!(err("enabled = true", false).contains("server.http3.enabled"));
        assert!(err("max_concurrent_streams = 0", true).contains("max_concurrent_streams"));
        assert!(err("max_udp_payload = 1000", true).contains("server.http3.max_udp_payload"));
        assert!(err("idle_timeout = \"1h\"", true).contains("server.http3.idle_timeout"));
        assert!(toml::from_str::<RawHttp3>("retry = \"sometimes\"").is_err());
        assert!(toml::from_str::<RawHttp3>("zero_rtt = true").is_err());
        let r = validate(
            raw("enabled = true\nretry = \"always\"\nearly_data = true"),
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.retry, r.early_data), (RetryMode::Always, true));
    }
}
