//! One access-log line: what the request path collects, and how the writer thread turns it into
//! JSON.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Method};

/// The rate-limit decision of a request (the `decision` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitDecision {
    Allowed,
    Limited,
    Delayed,
    FailOpen,
    FailClosed,
    /// Admitted, but a shadow limit would have denied it.
    Shadow,
    /// Exempt from every limit of the route (`exempt`).
    Exempt,
}

impl LimitDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitDecision::Allowed => "allowed",
            LimitDecision::Limited => "limited",
            LimitDecision::Delayed => "delayed",
            LimitDecision::FailOpen => "fail_open",
            LimitDecision::FailClosed => "fail_closed",
            LimitDecision::Shadow => "shadow",
            LimitDecision::Exempt => "exempt",
        }
    }
}

/// What one request's line says. Filled on the request path by moving values the request
/// already owns; formatted on the writer thread.
#[derive(Debug)]
pub struct Record {
    /// When the request started (the line's `ts`, converted to wall-clock time by the writer).
    pub started: Instant,
    /// From the start to the end of the response body (set when the body ends).
    pub duration: Duration,
    pub request_id: HeaderValue,
    pub client_ip: IpAddr,
    pub method: Method,
    /// The request's host (normalised: no port, lower case), if it had one.
    pub host: Option<String>,
    /// The normalised path, never the query.
    pub path: String,
    pub status: u16,
    /// Response body bytes sent (like nginx's `$body_bytes_sent`).
    pub bytes_sent: u64,
    /// Time to the upstream's response head, or to its failure; `None` when not called.
    pub upstream: Option<(Arc<str>, Duration)>,
    pub route: Option<Arc<str>>,
    /// The limit that denied (or, for `shadow`, the shadow limit that would have).
    pub limit: Option<Arc<str>>,
    /// `None` when no limit was consulted (no route, no limits, refused before the limits).
    pub decision: Option<LimitDecision>,
    /// The consumer whose key the request carried (routes with `consumers = true`).
    pub consumer: Option<Box<str>>,
    /// The parts of the subject `limit` counted (subjects of parts or of the newer kinds).
    pub subject: Option<Arc<[crate::limiter::ShownPart]>>,
    /// What the HTTP cache did (routes with `[routes.cache]`: `hit`, `miss`, …).
    pub cache: Option<&'static str>,
}

/// Appends `s` as a JSON string.
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_opt(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.push_str("null"),
    }
}

fn millis(out: &mut String, d: Duration) {
    let us = d.as_micros();
    let _ = write!(out, "{}.{:03}", us / 1000, us % 1000);
}

/// RFC 3339 in UTC with microseconds (`2025-01-31T23:59:59.123456Z`) for `t` after the epoch.
pub fn write_rfc3339(out: &mut String, t: SystemTime) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    );
}

impl Record {
    /// Appends the line (with its newline). `wall` and `now` are one reading of both clocks,
    /// taken by the writer, from which the request's start is placed in wall-clock time.
    pub fn write_json(&self, out: &mut String, wall: SystemTime, now: Instant) {
        let ago = now.saturating_duration_since(self.started);
        let ts = wall.checked_sub(ago).unwrap_or(wall);
        out.push_str("{\"ts\":\"");
        write_rfc3339(out, ts);
        out.push_str("\",\"request_id\":");
        crate::http::request_id::write_json(out, &self.request_id);
        let _ = write!(out, ",\"client_ip\":\"{}\",\"method\":", self.client_ip);
        json_str(out, self.method.as_str());
        out.push_str(",\"host\":");
        json_opt(out, self.host.as_deref());
        out.push_str(",\"path\":");
        json_str(out, &self.path);
        let _ = write!(
            out,
            ",\"status\":{},\"bytes_sent\":{},\"duration_ms\":",
            self.status, self.bytes_sent
        );
        millis(out, self.duration);
        out.push_str(",\"upstream_ms\":");
        match &self.upstream {
            Some((_, d)) => millis(out, *d),
            None => out.push_str("null"),
        }
        out.push_str(",\"route\":");
        json_opt(out, self.route.as_deref());
        out.push_str(",\"upstream\":");
        json_opt(out, self.upstream.as_ref().map(|(a, _)| &**a));
        out.push_str(",\"limit\":");
        json_opt(out, self.limit.as_deref());
        out.push_str(",\"decision\":");
        json_opt(out, self.decision.map(LimitDecision::as_str));
        out.push_str(",\"consumer\":");
        json_opt(out, self.consumer.as_deref());
        if let Some(parts) = &self.subject {
            // Only for subjects of parts: the line keeps its fields otherwise.
            let v: Vec<serde_json::Value> = parts.iter().map(|p| p.json()).collect();
            out.push_str(",\"subject\":");
            out.push_str(&serde_json::Value::from(v).to_string());
        }
        if let Some(c) = self.cache {
            // Only on caching routes: the line keeps its fields otherwise.
            let _ = write!(out, ",\"cache\":\"{c}\"");
        }
        out.push_str("}\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        let at = |secs: u64, micros: u32| {
            let mut s = String::new();
            write_rfc3339(
                &mut s,
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros.into()),
            );
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(1_735_689_599, 999_999), "2024-12-31T23:59:59.999999Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
    }

    #[test]
    fn a_line_is_one_json_object_with_every_field() {
        let now = Instant::now();
        let r = Record {
            started: now,
            duration: Duration::from_micros(1_234),
            request_id: HeaderValue::from_static("id\"1"),
            client_ip: "2001:db8::1".parse().unwrap(),
            method: Method::GET,
            host: Some("example.com".into()),
            path: "/a\"b\u{1}".into(),
            status: 429,
            bytes_sent: 10,
            upstream: None,
            route: Some("api".into()),
            limit: Some("per-ip".into()),
            decision: Some(LimitDecision::Limited),
            consumer: Some("acme \"co\"".into()),
            subject: None,
            cache: None,
        };
        let mut s = String::new();
        r.write_json(&mut s, SystemTime::now(), now);
        assert!(s.ends_with("}\n") && s.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["request_id"], "id\"1");
        assert_eq!(v["client_ip"], "2001:db8::1");
        assert_eq!(v["path"], "/a\"b\u{1}");
        assert_eq!(v["duration_ms"], 1.234);
        assert_eq!(v["upstream_ms"], serde_json::Value::Null);
        assert_eq!(v["upstream"], serde_json::Value::Null);
        assert_eq!(v["decision"], "limited");
        assert_eq!(v["consumer"], "acme \"co\"");
        assert_eq!(v["limit"], "per-ip");
        assert_eq!(v.as_object().unwrap().len(), 15);
        let r = Record {
            cache: Some("hit"),
            ..r
        };
        let mut s = String::new();
        r.write_json(&mut s, SystemTime::now(), now);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["cache"], "hit");
    }
}
