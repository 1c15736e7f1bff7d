//! `[tracing]` in the config file: where OpenTelemetry traces go (`otlp_endpoint`, used as is),
//! how (`otlp_protocol`), how many (`sample_ratio`, for requests that do not come with a
//! sampling decision of their own) and under which `service.name`. The raw serde struct and its
//! validation into [`TracingConfig`]; errors name the key (`tracing.sample_ratio`).

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::{invalid, ConfigError, HumanDuration};

/// How spans are sent to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (`POST` to the endpoint).
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC (the endpoint is the collector's `http://host:port`).
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    /// The collector's traces endpoint, used as is: `http(s)://host:4318/v1/traces` for
    /// `http/protobuf`, `http://host:4317` for `grpc` (URL; without it traces are off).
    #[serde(default)]
    otlp_endpoint: Option<String>,
    /// OTLP over HTTP with protobuf bodies, or OTLP/gRPC (plain-text `http://` only: a local
    /// collector or sidecar; for TLS use `http/protobuf` with `https://`) (`"http/protobuf"` |
    /// `"grpc"`; default: `"http/protobuf"`).
    #[serde(default)]
    otlp_protocol: OtlpProtocol,
    /// The share of new traces recorded (by trace id, as OpenTelemetry's `TraceIdRatioBased`); a
    /// request whose `traceparent` carries a decision keeps it (parent-based) (number in `[0, 1]`;
    /// default: `1.0`).
    #[serde(default = "default_sample_ratio")]
    sample_ratio: f64,
    /// The resource's `service.name` (string; default: `"tollgate"`).
    #[serde(default = "default_service_name")]
    service_name: String,
    /// The most one export may take (at most `1m`); a slower collector fails that export (duration;
    /// default: `"10s"`).
    #[serde(default = "default_export_timeout")]
    export_timeout: HumanDuration,
}

fn default_sample_ratio() -> f64 {
    1.0
}
fn default_service_name() -> String {
    "tollgate".to_owned()
}
fn default_export_timeout() -> HumanDuration {
    HumanDuration(DEFAULT_EXPORT_TIMEOUT)
}

/// How long one export may take (OTel's `OTEL_EXPORTER_OTLP_TIMEOUT` default).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `export_timeout`.
pub const MAX_EXPORT_TIMEOUT: Duration = Duration::from_secs(60);

/// A validated `[tracing]` with an endpoint: traces are on.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    pub otlp_endpoint: http::Uri,
    pub otlp_protocol: OtlpProtocol,
    /// In `[0, 1]`: the share of new traces recorded (a client's own decision is followed).
    pub sample_ratio: f64,
    pub service_name: String,
    pub export_timeout: Duration,
}

/// Validates `[tracing]`: `None` (traces off) without an `otlp_endpoint`.
pub(super) fn validate_tracing(t: RawTracing) -> Result<Option<TracingConfig>, ConfigError> {
    if !(0.0..=1.0).contains(&t.sample_ratio) {
        return Err(invalid(
            "tracing.sample_ratio",
            format!("{} is not between 0 and 1", t.sample_ratio),
        ));
    }
    let name = t.service_name.trim();
    if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
        return Err(invalid(
            "tracing.service_name",
            "use 1-255 printable characters",
        ));
    }
    let export_timeout = super::bounded(
        "tracing.export_timeout",
        t.export_timeout,
        MAX_EXPORT_TIMEOUT,
        "1m",
        false,
    )?;
    let Some(endpoint) = t.otlp_endpoint else {
        return Ok(None);
    };
    let uri: http::Uri = endpoint.parse().map_err(|e| {
        invalid(
            "tracing.otlp_endpoint",
            format!("{endpoint:?} is not a URL: {e}"),
        )
    })?;
    let scheme = uri.scheme_str();
    if !matches!(scheme, Some("http" | "https")) || uri.authority().is_none() {
        return Err(invalid(
            "tracing.otlp_endpoint",
            format!("{endpoint:?}: use http://host:port/… or https://host:port/…"),
        ));
    }
    if t.otlp_protocol == OtlpProtocol::Grpc && scheme == Some("https") {
        return Err(invalid(
            "tracing.otlp_endpoint",
            "OTLP/gRPC is sent in plain text (a local collector or sidecar); for TLS use otlp_protocol = \"http/protobuf\" with an https:// endpoint",
        ));
    }
    Ok(Some(TracingConfig {
        otlp_endpoint: uri,
        otlp_protocol: t.otlp_protocol,
        sample_ratio: t.sample_ratio,
        service_name: name.to_owned(),
        export_timeout,
    }))
}
