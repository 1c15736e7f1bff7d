//! `[rls]`: Tollgate as Envoy's rate limit service, asked directly by a gRPC client (tonic, with
//! Envoy's generated types): the reply's fields, `hits_addend`, the all-or-nothing rule over a
//! call's descriptors, the draft-11 fields, envoyproxy/ratelimit's YAML read as is, and bad
//! input answered with a gRPC status and counted. Store-facing scenarios run on every store.
//! (`tests/rls_envoy.rs` puts a real Envoy in front.)

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::*;
use tonic::transport::Channel;

/// The domains every scenario uses, in envoyproxy/ratelimit's YAML (written to `config_dir`).
const YAML: &str = "\
domain: edge
descriptors:
  # Per user: 3 a minute.
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  # One user is special.
  - key: user
    value: vip
    rate_limit:
      name: vip
      unit: minute
      requests_per_unit: 100
  # Nested: per path of a tenant.
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit:
          unit: hour
          requests_per_unit: 1
  - key: global
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: open
    rate_limit:
      unlimited: true
  - key: watch
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  # A queue of 6 places (5 waiting), drained 6 a minute.
  - key: queue
    rate_limit:
      algorithm: leaky_bucket
      unit: minute
      requests_per_unit: 6
      burst: 5
";

/// A gateway with the service on, no routes; `store` is the `[store]` body.
struct Service {
    gw: Gateway,
    port: u16,
    _dir: tempfile::TempDir,
}

async fn service(store: &str, extra: &str) -> Service {
    service_with("", store, extra).await
}

/// [`service`] with `server` added to `[server]`.
async fn service_with(server: &str, store: &str, extra: &str) -> Service {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.yaml"), YAML).unwrap();
    let port = free_port();
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n{store}\n\n\
         [rls]\nlisten = \"127.0.0.1:{port}\"\nconfig_dir = \"{}\"\n{extra}\n",
        dir.path().display()
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    Service {
        gw,
        port,
        _dir: dir,
    }
}

async fn client(port: u16) -> RateLimitServiceClient<Channel> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
            Ok(c) => return c,
            Err(e) if std::time::Instant::now() > deadline => panic!("cannot connect: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.expect("answered").into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

async fn reply_fields(kind: Kind) {
    let env = store_env(kind);
    reply_fields_on(&env.store).await;
}

async fn reply_fields_on(store: &str) {
    let s = service(store, "ratelimit_headers = true").await;
    let mut c = client(s.port).await;
    let alice = || vec![descriptor(&[("user", "alice")])];
    for remaining in [2, 1, 0] {
        let r = ask(&mut c, request("edge", alice(), 0)).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        let st = &r.statuses[0];
        assert_eq!(st.code, Code::Ok as i32);
        assert_eq!(st.limit_remaining, remaining, "{r:?}");
        let cl = st.current_limit.as_ref().expect("current_limit");
        assert_eq!((cl.requests_per_unit, cl.unit), (3, Unit::Minute as i32));
        let reset = st.duration_until_reset.expect("duration_until_reset");
        assert!(
            reset.seconds <= 60 && (reset.seconds > 0 || reset.nanos > 0),
            "{reset:?}"
        );
        let field = header(&r, "ratelimit").expect("RateLimit field");
        assert!(
            field.starts_with(&format!("\"user\";r={remaining};t=")),
            "{field}"
        );
        assert!(field.contains(";pk=:"), "{field}");
        let policy = header(&r, "ratelimit-policy").expect("RateLimit-Policy field");
        assert!(policy.starts_with("\"user\";q=3;w=60;pk=:"), "{policy}");
    }
    let r = ask(&mut c, request("edge", alice(), 0)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(header(&r, "retry-after").is_some(), "{r:?}");
    // Another user has a count of its own; the value-specific descriptor wins for `vip`.
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "bob")])], 0),
    )
    .await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 2)
    );
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "vip")])], 0),
    )
    .await;
    let cl = r.statuses[0].current_limit.as_ref().expect("current_limit");
    assert_eq!((cl.name.as_str(), cl.requests_per_unit), ("vip", 100));
    assert_eq!(r.statuses[0].limit_remaining, 99);
    // Nested descriptors; a descriptor matching nothing is under no limit (no current_limit).
    let nested = || vec![descriptor(&[("tenant", "acme"), ("path", "/a")])];
    let r = ask(&mut c, request("edge", nested(), 0)).await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().map(|l| l.unit),
        Some(Unit::Hour as i32)
    );
    let r = ask(&mut c, request("edge", nested(), 0)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![descriptor(&[("tenant", "other"), ("path", "/a")])],
            0,
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none(), "{r:?}");
    // `unlimited` and `shadow_mode` never refuse.
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request(
                "edge",
                vec![descriptor(&[("open", "x")]), descriptor(&[("watch", "x")])],
                0,
            ),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    }
    let m = s.gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_rls_decisions_total{domain=\"edge\",descriptor=\"user\",decision=\"over_limit\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "tollgate_rls_decisions_total{domain=\"edge\",descriptor=\"watch\",decision=\"shadow\"}"),
        Some(2.0),
        "{m}"
    );
    assert!(
        !m.contains("alice"),
        "a request's value became a label:\n{m}"
    );
    // `/-/top` lists the descriptor limit as route `rls:edge`, its subjects hashed.
    let top: serde_json::Value = support::client()
        .get(s.gw.admin_url("/-/top?route=rls:edge&limit=user"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(top["top"][0]["subject"], "descriptor", "{top}");
    assert_eq!(top["top"][0]["denied"], 1, "{top}");
    assert!(!top.to_string().contains("alice"), "{top}");
}

async fn descriptors_are_decided_all_or_nothing(kind: Kind) {
    let env = store_env(kind);
    descriptors_are_decided_all_or_nothing_on(&env.store).await;
}

async fn descriptors_are_decided_all_or_nothing_on(store: &str) {
    let s = service(store, "").await;
    let mut c = client(s.port).await;
    let both = || {
        vec![
            descriptor(&[("user", "carol")]),
            descriptor(&[("global", "all")]),
        ]
    };
    // `user` admits 3, `global` 5: three calls admitted, the fourth refused by `user`…
    for _ in 0..3 {
        assert_eq!(
            ask(&mut c, request("edge", both(), 0)).await.overall_code,
            Code::Ok as i32
        );
    }
    let r = ask(&mut c, request("edge", both(), 0)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    // …and charged nothing to `global` (envoyproxy/ratelimit would have): 2 left, not 1.
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("global", "all")])], 0),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 1, "{r:?}");
}

async fn hits_addend_counts(kind: Kind) {
    let env = store_env(kind);
    hits_addend_counts_on(&env.store).await;
}

async fn hits_addend_counts_on(store: &str) {
    let s = service(store, "").await;
    let mut c = client(s.port).await;
    let dave = || vec![descriptor(&[("user", "dave")])];
    let r = ask(&mut c, request("edge", dave(), 2)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 1)
    );
    let r = ask(&mut c, request("edge", dave(), 2)).await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "2 more than the 1 left"
    );
    // The descriptor's own hits_addend wins over the call's; a huge one is refused, not wrapped.
    let mut d = descriptor(&[("user", "erin")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: u64::MAX });
    let r = ask(&mut c, request("edge", vec![d], 1)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "erin")])], 0),
    )
    .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "the refused call charged nothing"
    );
    // A descriptor's explicit hits_addend 0 checks without charging.
    let mut d = descriptor(&[("user", "erin")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let r = ask(&mut c, request("edge", vec![d], 0)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 2),
        "{r:?}"
    );
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "erin")])], 0),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 1, "{r:?}");
}

/// `/-/explain?rls_domain=…&descriptor=…`: which configured descriptor a call's descriptor
/// matches, its limit and state, and the service's verdict, charging nothing.
async fn explain_covers_descriptors(kind: Kind) {
    let env = store_env(kind);
    let s = service(&env.store, "").await;
    let mut c = client(s.port).await;
    let http = support::client();
    let explain = |q: &str| {
        let url = s.gw.admin_url(&format!("/-/explain?{q}"));
        let http = http.clone();
        async move {
            let r = http.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    for _ in 0..2 {
        let (status, v) = explain("rls_domain=edge&descriptor=user=alice").await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["would_admit"], true, "{v}");
        let d = &v["descriptors"][0];
        assert_eq!(
            (&d["rule"], &d["limit"], &d["remaining"], &d["algorithm"]),
            (
                &serde_json::json!("user"),
                &serde_json::json!(3),
                &serde_json::json!(3),
                &serde_json::json!("fixed_window")
            ),
            "{v}"
        );
    }
    // Explaining charged nothing: the three calls are all admitted.
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("user", "alice")])], 0),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    // Now the limit is spent; another descriptor of the call is under no limit, a nested one
    // matches its path, and the verdict is the call's (all or nothing).
    let (_, v) = explain(
        "rls_domain=edge&descriptor=user=alice&descriptor=nope=x&descriptor=tenant=acme,path=%2Fa%2Cb",
    )
    .await;
    assert_eq!(
        (&v["would_admit"], &v["code"]),
        (&serde_json::json!(false), &serde_json::json!("OVER_LIMIT")),
        "{v}"
    );
    let ds = v["descriptors"].as_array().unwrap();
    assert_eq!(
        (&ds[0]["remaining"], &ds[0]["would_admit"]),
        (&serde_json::json!(0), &serde_json::json!(false)),
        "{v}"
    );
    assert!(
        ds[1]["rule"].is_null() && ds[1]["note"].as_str().unwrap().contains("no configured"),
        "{v}"
    );
    assert_eq!(ds[2]["rule"], "tenant_acme.path", "{v}");
    assert_eq!(ds[2]["entries"][1]["value"], "/a,b", "{v}");
    assert_eq!(ds[2]["would_admit"], true, "{v}");
    // The VIP and a shadow descriptor, an unknown domain, bad input.
    let (_, v) = explain("rls_domain=edge&descriptor=user=vip&descriptor=watch=w").await;
    assert_eq!(v["descriptors"][0]["name"], "vip", "{v}");
    assert_eq!(v["descriptors"][1]["mode"], "shadow", "{v}");
    let (status, v) = explain("rls_domain=nope&descriptor=user=a").await;
    assert_eq!(
        (status, &v["would_admit"]),
        (200, &serde_json::json!(true)),
        "{v}"
    );
    assert!(
        v["reason"].as_str().unwrap().contains("no such domain"),
        "{v}"
    );
    for q in [
        "rls_domain=edge",
        "rls_domain=edge&descriptor=user",
        "rls_domain=edge&descriptor=user=a&path=/x",
    ] {
        let (status, v) = explain(q).await;
        assert_eq!(status, 400, "{q}: {v}");
    }
    // The service's own counters saw none of it.
    let m = s.gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_rls_refused_total{reason=\"no_match\"}"),
        Some(0.0),
        "{m}"
    );
}

/// One call on a raw HTTP/2 stream: `message` (the protobuf bytes, whatever they are) framed as
/// gRPC. The answer's `grpc-status` (from the head of a trailers-only answer, else the
/// trailers) and its message, if any.
async fn raw_call(port: u16, message: &[u8]) -> (String, Option<RateLimitResponse>) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let call = http::Request::post(format!(
        "http://127.0.0.1:{port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(message);
    let (answer, mut body) = h2.send_request(call, false).unwrap();
    body.send_data(framed.into(), true).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("answered");
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    let head_status = status(answer.headers());
    let mut answer = answer.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.data().await {
        bytes.extend_from_slice(&chunk.expect("the reply's body"));
    }
    let trailers = answer.trailers().await.unwrap_or_default();
    let grpc_status = head_status
        .or_else(|| trailers.as_ref().and_then(status))
        .expect("a grpc-status");
    drop(h2);
    conn.abort();
    let reply = (bytes.len() >= 5)
        .then(|| prost::Message::decode(&bytes[5..]).expect("a RateLimitResponse"));
    (grpc_status, reply)
}

/// A RateLimitRequest whose one descriptor `user` has `value` as it comes, bytes that need not
/// be UTF-8 (hand-encoded: Envoy's generated types hold strings).
fn raw_request(domain: &str, value: &[u8]) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
        out.push(tag << 3 | 2);
        prost::encoding::encode_varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }
    let mut entry = Vec::new();
    field(&mut entry, 1, b"user");
    field(&mut entry, 2, value);
    let mut descriptor = Vec::new();
    field(&mut descriptor, 1, &entry);
    let mut call = Vec::new();
    field(&mut call, 1, domain.as_bytes());
    field(&mut call, 2, &descriptor);
    call
}

/// Issue 50 §1: Envoy forwards a header's bytes as a descriptor value (`X-User: caf\xe9`). A
/// value that is not UTF-8 used to fail the message's decoding (`INTERNAL`, so Envoy failed
/// open: every request passed); it is decided like any other, its own subject.
async fn values_that_are_not_utf8_are_decided(kind: Kind) {
    let env = store_env(kind);
    let s = service(&env.store, "").await;
    let _ = client(s.port).await; // the listener is up
    let cafe = raw_request("edge", b"caf\xe9");
    for remaining in [2, 1, 0] {
        let (status, reply) = raw_call(s.port, &cafe).await;
        assert_eq!(status, "0", "a value that is not UTF-8 fails the call");
        let reply = reply.expect("a reply");
        assert_eq!(reply.overall_code, Code::Ok as i32, "{reply:?}");
        assert_eq!(reply.statuses[0].limit_remaining, remaining, "{reply:?}");
    }
    let (status, reply) = raw_call(s.port, &cafe).await;
    assert_eq!(status, "0");
    assert_eq!(
        reply.expect("a reply").overall_code,
        Code::OverLimit as i32,
        "the fourth call of 3/min"
    );
    // Another invalid byte is another subject; the UTF-8 `café` is yet another.
    let (_, reply) = raw_call(s.port, &raw_request("edge", b"caf\xe8")).await;
    assert_eq!(reply.expect("a reply").statuses[0].limit_remaining, 2);
    let (_, reply) = raw_call(s.port, &raw_request("edge", "café".as_bytes())).await;
    assert_eq!(reply.expect("a reply").statuses[0].limit_remaining, 2);
}

/// Issue 50 §1: a call that fails before the service decides it (not protobuf, too large) is
/// counted by reason, and the connection serves on.
#[tokio::test(flavor = "multi_thread")]
async fn calls_that_fail_to_decode_are_counted() {
    let s = service("backend = \"memory\"", "").await;
    let _ = client(s.port).await;
    // A field header announcing 255 bytes that are not there: no RateLimitRequest.
    let (status, _) = raw_call(s.port, &[0x12, 0xff, 0x01, 0x00]).await;
    assert_ne!(status, "0");
    let m = s.gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_rls_refused_total{reason=\"malformed\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "tollgate_rls_requests_total{code=\"invalid\"}"),
        Some(1.0),
        "{m}"
    );
    let (status, _) = raw_call(s.port, &raw_request("edge", b"ok")).await;
    assert_eq!(status, "0");
}

/// One call on a raw HTTP/2 stream whose body comes in `parts` (DATA frames), each after a
/// pause: the head first, the message after it. The answer's `grpc-status` and message.
async fn raw_call_in_parts(port: u16, parts: Vec<Vec<u8>>) -> (String, Option<RateLimitResponse>) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let call = http::Request::post(format!(
        "http://127.0.0.1:{port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (answer, mut body) = h2.send_request(call, false).unwrap();
    let n = parts.len();
    for (i, part) in parts.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(30)).await;
        body.send_data(part.into(), i + 1 == n).unwrap();
    }
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("answered");
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    let head_status = status(answer.headers());
    let mut answer = answer.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.data().await {
        bytes.extend_from_slice(&chunk.expect("the reply's body"));
    }
    let trailers = answer.trailers().await.unwrap_or_default();
    let grpc_status = head_status
        .or_else(|| trailers.as_ref().and_then(status))
        .expect("a grpc-status");
    drop(h2);
    conn.abort();
    let reply = (bytes.len() >= 5)
        .then(|| prost::Message::decode(&bytes[5..]).expect("a RateLimitResponse"));
    (grpc_status, reply)
}

fn framed(message: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    f.extend_from_slice(message);
    f
}

/// Issue 52 §6: the listener reads a call's message where it arrives (usually with its head);
/// one that comes later, cut anywhere over several DATA frames, is read to the stream's end
/// (a second message is read and dropped, as tonic does) and decided once.
async fn a_message_after_its_head_is_read_whole(kind: Kind) {
    let env = store_env(kind);
    let s = service(&env.store, "").await;
    let _ = client(s.port).await; // the listener is up
    let f = framed(&raw_request("edge", b"late"));
    // Cut inside the prefix, then inside the message.
    let (status, reply) = raw_call_in_parts(
        s.port,
        vec![f[..3].to_vec(), f[3..9].to_vec(), f[9..].to_vec()],
    )
    .await;
    assert_eq!(status, "0");
    assert_eq!(reply.expect("a reply").statuses[0].limit_remaining, 2);
    // The message late and whole, then a second one that is dropped.
    let (status, reply) = raw_call_in_parts(s.port, vec![f.clone(), f.clone()]).await;
    assert_eq!(status, "0");
    assert_eq!(
        reply.expect("a reply").statuses[0].limit_remaining,
        1,
        "decided once"
    );
    // A head, then the stream's end without a message: INTERNAL, counted as malformed.
    let (status, _) = raw_call_in_parts(s.port, vec![Vec::new()]).await;
    assert_eq!(status, "13");
    // A compressed message (no `grpc-encoding` is taken): INTERNAL too.
    let mut compressed = f.clone();
    compressed[0] = 1;
    let (status, _) = raw_call_in_parts(s.port, vec![compressed]).await;
    assert_eq!(status, "13");
    let m = s.gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_rls_refused_total{reason=\"malformed\"}"),
        Some(2.0),
        "{m}"
    );
    let (_, reply) = raw_call_in_parts(s.port, vec![f]).await;
    assert_eq!(reply.expect("a reply").statuses[0].limit_remaining, 0);
}

/// Issue 50 §2: a descriptor repeated in one call is one key: its units are summed and decided
/// once, all or nothing (it used to be checked against the state before the call, each copy,
/// then charged: 4 hits admitted by a limit of 3).
async fn a_repeated_descriptor_is_decided_once(kind: Kind) {
    let env = store_env(kind);
    let s = service(&env.store, "").await;
    let mut c = client(s.port).await;
    let twice = |who: &str| vec![descriptor(&[("user", who)]), descriptor(&[("user", who)])];
    let r = ask(&mut c, request("edge", twice("fay"), 0)).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
        (1, 1),
        "what really remains after both"
    );
    let r = ask(&mut c, request("edge", twice("fay"), 0)).await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "2 hits against the 1 left: {r:?}"
    );
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "fay")])], 0),
    )
    .await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 0),
        "the refused call charged nothing: {r:?}"
    );
    // [hits 3, hits 3] against 3: refused, and nothing charged.
    let r = ask(&mut c, request("edge", twice("gus"), 3)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&[("user", "gus")])], 3),
    )
    .await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 0),
        "{r:?}"
    );
}

/// Issue 50 §3: a `hits_addend` above what a leaky bucket can ever hold (6: 5 waiting and one
/// going) is refused, as by the other algorithms, and charges nothing.
async fn a_leaky_bucket_refuses_more_than_it_holds(kind: Kind) {
    let env = store_env(kind);
    let s = service(&env.store, "").await;
    let mut c = client(s.port).await;
    let q = || vec![descriptor(&[("queue", "q")])];
    for hits in [7, 1000, u32::MAX] {
        let r = ask(&mut c, request("edge", q(), hits)).await;
        assert_eq!(
            r.overall_code,
            Code::OverLimit as i32,
            "{hits} hits against 6: {r:?}"
        );
    }
    let r = ask(&mut c, request("edge", q(), 6)).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "6 fit: {r:?}");
    let r = ask(&mut c, request("edge", q(), 1)).await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "the queue is full: {r:?}"
    );
}

/// Issue 50 §5: `requests_per_unit: 0`, envoyproxy/ratelimit's README way to block an address
/// (its example 3), was refused at load. It is a limit that refuses every hit; a call it refuses
/// charges none of its other descriptors, and a check of 0 hits passes.
///
/// The other descriptor's limit is per minute: per second (as it was), its window could turn
/// between the first call and the last on a slow machine (the Redis stores count on Redis's
/// clock), and the last call saw a fresh window (9 left, not 8).
async fn a_limit_of_zero_refuses_every_hit(kind: Kind) {
    let env = store_env(kind);
    let inline = "[[rls.domains]]\ndomain = \"edge_proxy_per_ip\"\n\
                  [[rls.domains.descriptors]]\nkey = \"remote_address\"\n\
                  rate_limit = { unit = \"minute\", requests_per_unit = 10 }\n\
                  [[rls.domains.descriptors]]\nkey = \"remote_address\"\nvalue = \"50.0.0.5\"\n\
                  rate_limit = { unit = \"second\", requests_per_unit = 0 }\n";
    let s = service(&env.store, inline).await;
    let mut c = client(s.port).await;
    let ip = |a: &str| descriptor(&[("remote_address", a)]);
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request("edge_proxy_per_ip", vec![ip("50.0.0.5")], 0),
        )
        .await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
        let st = &r.statuses[0];
        assert_eq!(
            (st.code, st.limit_remaining),
            (Code::OverLimit as i32, 0),
            "{r:?}"
        );
        assert_eq!(
            st.current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit)),
            Some((0, Unit::Second as i32))
        );
    }
    let r = ask(
        &mut c,
        request("edge_proxy_per_ip", vec![ip("50.0.0.1")], 0),
    )
    .await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 9)
    );
    let reset = |r: &RateLimitResponse| r.statuses[0].duration_until_reset.map(|d| d.seconds);
    let first_reset = reset(&r);
    // With a blocked descriptor, the call is refused and the other one charged nothing.
    let r = ask(
        &mut c,
        request("edge_proxy_per_ip", vec![ip("50.0.0.1"), ip("50.0.0.5")], 0),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(
        (r.statuses[0].code, r.statuses[1].code),
        (Code::Ok as i32, Code::OverLimit as i32)
    );
    let r = ask(
        &mut c,
        request("edge_proxy_per_ip", vec![ip("50.0.0.1")], 0),
    )
    .await;
    // 8 left: the refused call charged nothing. Unless the minute turned between the first
    // call and this one (its window then resets later than the first call's): a fresh window.
    let turned = reset(&r) > first_reset;
    assert_eq!(
        r.statuses[0].limit_remaining,
        if turned { 9 } else { 8 },
        "{r:?}"
    );
    // A descriptor's hits_addend 0 only checks: no hit, nothing refused.
    let mut check = ip("50.0.0.5");
    check.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let r = ask(&mut c, request("edge_proxy_per_ip", vec![check], 0)).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
}

/// Issue 50 §4: the listener had no timer before a connection's first call: a silent one, or
/// one that sends half of the HTTP/2 preface, stayed open forever (4,096 of them shut Envoy
/// out). It has the proxy listener's: `header_read_timeout` until the first call, then
/// `idle_timeout` with no call in flight.
#[tokio::test(flavor = "multi_thread")]
async fn connections_are_timed_as_the_proxy_listeners() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = service_with(
        "header_read_timeout = \"300ms\"\nidle_timeout = \"1s\"",
        "backend = \"memory\"",
        "",
    )
    .await;
    let _ = client(s.port).await;
    async fn closed_within(mut tcp: tokio::net::TcpStream, limit: Duration) -> Duration {
        let t = std::time::Instant::now();
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(limit, tcp.read(&mut buf)).await {
                Err(_) => panic!("still open after {limit:?}"),
                Ok(Ok(0)) | Ok(Err(_)) => return t.elapsed(),
                Ok(Ok(_)) => {} // the server's SETTINGS, a GOAWAY
            }
        }
    }
    let silent = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    let took = closed_within(silent, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(250), "{took:?}");
    let mut half = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    closed_within(half, Duration::from_secs(5)).await;
    // A connection that made a call is closed (GOAWAY) once idle for idle_timeout.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let call = http::Request::post(format!(
        "http://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        s.port
    ))
    .header("content-type", "application/grpc")
    .body(())
    .unwrap();
    let msg = raw_request("edge", b"idle");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&msg);
    let (answer, mut body) = h2.send_request(call, false).unwrap();
    body.send_data(framed.into(), true).unwrap();
    let mut answer = answer.await.unwrap().into_body();
    while let Some(chunk) = answer.data().await {
        chunk.unwrap();
    }
    let t = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(8), conn)
        .await
        .expect("closed once idle")
        .unwrap()
        .ok();
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    drop(h2);
}

/// Issue 50 §6 and §7, through `tollgate check`: YAML merge keys (`<<: *anchor`) resolve (they
/// were refused as an unknown field), and a file of deeply nested flow collections is refused
/// at once (400 KB of them used to take several seconds: the parser is quadratic in the depth).
#[test]
fn check_resolves_merge_keys_and_refuses_deep_nesting_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        "[rls]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"rules\"\n",
    )
    .unwrap();
    let check = || {
        let t = std::time::Instant::now();
        let out = std::process::Command::new(tollgate_bin())
            .arg("check")
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text, t.elapsed())
    };
    std::fs::write(
        rules.join("merge.yaml"),
        "domain: merged\ndescriptors:\n  - key: a\n    rate_limit: &per_minute\n      unit: minute\n      requests_per_unit: 5\n  - key: b\n    rate_limit:\n      <<: *per_minute\n      requests_per_unit: 9\n",
    )
    .unwrap();
    let (ok, text, _) = check();
    assert!(ok, "{text}");
    std::fs::write(
        rules.join("deep.yaml"),
        format!("domain: deep\ndescriptors: {}", "[".repeat(400 << 10)),
    )
    .unwrap();
    let (ok, text, took) = check();
    assert!(!ok, "{text}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {text}");
    assert!(
        text.contains("deep.yaml") && text.contains("nested deeper"),
        "{text}"
    );
}

on_every_store_and_cluster!(
    a_limit_of_zero_refuses_every_hit,
    explain_covers_descriptors,
    reply_fields,
    descriptors_are_decided_all_or_nothing,
    hits_addend_counts,
    leases_never_admit_more_than_the_limit,
    values_that_are_not_utf8_are_decided,
    a_repeated_descriptor_is_decided_once,
    a_leaky_bucket_refuses_more_than_it_holds,
    a_message_after_its_head_is_read_whole
);

#[tokio::test(flavor = "multi_thread")]
async fn the_service_scenarios_on_sentinel() {
    let set = start_sentinels();
    let store = set.store("timeout = \"2s\"");
    reply_fields_on(&store).await;
    descriptors_are_decided_all_or_nothing_on(&store).await;
    hits_addend_counts_on(&store).await;
}

/// A descriptor with `sync = "lease"` (written inline, `[[rls.domains]]`): two services on one
/// store, asked in turn, admit exactly the limit between them. (On memory each counts alone:
/// the store is per process, so each admits the limit.)
async fn leases_never_admit_more_than_the_limit(kind: Kind) {
    let env = store_env(kind);
    let inline = "[[rls.domains]]\ndomain = \"leased\"\n[[rls.domains.descriptors]]\nkey = \"k\"\n\
                  rate_limit = { unit = \"minute\", requests_per_unit = 10, sync = \"lease\", lease_max = 3 }\n";
    let (a, b) = (
        service(&env.store, inline).await,
        service(&env.store, inline).await,
    );
    let (mut ca, mut cb) = (client(a.port).await, client(b.port).await);
    let mut admitted = 0;
    for i in 0..30 {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        let r = ask(c, request("leased", vec![descriptor(&[("k", "v")])], 0)).await;
        if r.overall_code == Code::Ok as i32 {
            admitted += 1;
        }
    }
    let want = if matches!(kind, Kind::Memory) { 20 } else { 10 };
    assert_eq!(admitted, want);
    if !matches!(kind, Kind::Memory) {
        // The units were leased, not asked one by one.
        let m = a.gw.metrics().await;
        let leases = metric_sum(
            &m,
            "tollgate_ratelimit_lease_requests_total",
            &["route=\"rls:leased\""],
        );
        assert!((1.0..15.0).contains(&leases), "{leases} leases:\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_a_grpc_status_and_is_counted() {
    let s = service("backend = \"memory\"", "").await;
    let mut c = client(s.port).await;
    let code = |r: Result<tonic::Response<RateLimitResponse>, tonic::Status>| match r {
        Ok(ok) => panic!("answered {ok:?}"),
        Err(s) => s.code(),
    };
    let one = || vec![descriptor(&[("user", "x")])];
    assert_eq!(
        code(c.should_rate_limit(request("", one(), 0)).await),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        code(c.should_rate_limit(request("edge", vec![], 0)).await),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.should_rate_limit(request("edge", vec![descriptor(&[])], 0))
                .await
        ),
        tonic::Code::InvalidArgument
    );
    let many: Vec<_> = (0..5000)
        .map(|i| descriptor(&[("user", &i.to_string())]))
        .collect();
    assert_eq!(
        code(c.should_rate_limit(request("edge", many, 0)).await),
        tonic::Code::InvalidArgument
    );
    let long = "v".repeat(8192);
    assert_eq!(
        code(
            c.should_rate_limit(request("edge", vec![descriptor(&[("user", &long)])], 0))
                .await
        ),
        tonic::Code::InvalidArgument
    );
    // A value of megabytes: refused by the message size bound before it is decoded.
    let huge = "v".repeat(4 << 20);
    let status = code(
        c.should_rate_limit(request("edge", vec![descriptor(&[("user", &huge)])], 0))
            .await,
    );
    assert!(
        matches!(
            status,
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    // An unknown domain is under no limit, as with envoyproxy/ratelimit; counted.
    let r = ask(&mut c, request("nope", one(), 0)).await;
    assert_eq!((r.overall_code, r.statuses.len()), (Code::Ok as i32, 1));
    // The connection still serves.
    assert_eq!(
        ask(&mut c, request("edge", one(), 0)).await.overall_code,
        Code::Ok as i32
    );
    let m = s.gw.metrics().await;
    for (reason, n) in [
        ("empty_domain", 1.0),
        ("no_descriptors", 1.0),
        ("empty_descriptor", 1.0),
        ("too_many_descriptors", 1.0),
        ("entry_too_long", 1.0),
        ("unknown_domain", 1.0),
        // Refused by the decoder, before the service ran: counted too (issue 50 §1).
        ("too_large", 1.0),
    ] {
        assert_eq!(
            metric(
                &m,
                &format!("tollgate_rls_refused_total{{reason=\"{reason}\"}}")
            ),
            Some(n),
            "{reason}:\n{m}"
        );
    }
    assert_eq!(
        metric(&m, "tollgate_rls_requests_total{code=\"invalid\"}"),
        Some(6.0),
        "{m}"
    );
    assert!(
        !m.contains("nope"),
        "an unknown domain became a label:\n{m}"
    );
}

#[test]
fn tollgate_check_names_the_yaml_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("ok.yaml"), YAML).unwrap();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        "[rls]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"rules\"\n",
    )
    .unwrap();
    let check = || {
        let out = std::process::Command::new(tollgate_bin())
            .arg("check")
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = check();
    assert!(ok, "{text}");
    std::fs::write(
        rules.join("typo.yaml"),
        "domain: other\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unti: 5\n",
    )
    .unwrap();
    let (ok, text) = check();
    assert!(!ok, "{text}");
    assert!(
        text.contains("typo.yaml") && text.contains("line 6") && text.contains("requests_per_unti"),
        "{text}"
    );
    std::fs::write(rules.join("typo.yaml"), "domain: edge\n").unwrap();
    let (ok, text) = check();
    assert!(!ok && text.contains("duplicate domain"), "{text}");
}

/// Redis gone: the call fails with `UNAVAILABLE` (so Envoy's `failure_mode_deny` decides),
/// counted; back once Redis is.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_cannot_decide_answers_unavailable() {
    let mut redis = redis();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"300ms\"",
        redis.url()
    );
    let s = service(&store, "").await;
    let mut c = client(s.port).await;
    let one = || request("edge", vec![descriptor(&[("user", "x")])], 0);
    assert_eq!(ask(&mut c, one()).await.overall_code, Code::Ok as i32);
    redis.kill();
    let status = c.should_rate_limit(one()).await.expect_err("no store");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let m = s.gw.metrics().await;
    assert!(
        metric(&m, "tollgate_rls_requests_total{code=\"unavailable\"}").is_some_and(|n| n >= 1.0),
        "{m}"
    );
}

/// A reload (`POST /-/reload`) reads the YAML files again: a changed limit applies; a broken
/// file is refused and the running domains stay.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_reads_the_yaml_files_again() {
    let s = service("backend = \"memory\"", "").await;
    let mut c = client(s.port).await;
    let one = || request("edge", vec![descriptor(&[("user", "r")])], 0);
    let limit_of = |r: &RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(limit_of(&ask(&mut c, one()).await), Some(3));
    let file = s._dir.path().join("edge.yaml");
    std::fs::write(
        &file,
        YAML.replace("requests_per_unit: 3", "requests_per_unit: 9"),
    )
    .unwrap();
    let http = support::client();
    let r = http.post(s.gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(limit_of(&ask(&mut c, one()).await), Some(9));
    std::fs::write(&file, "domain: edge\nbogus: 1\n").unwrap();
    let r = http.post(s.gw.admin_url("/-/reload")).send().await.unwrap();
    assert_ne!(r.status(), 200);
    assert_eq!(
        limit_of(&ask(&mut c, one()).await),
        Some(9),
        "the running domains stay"
    );
}

/// Envoy cancels (RST_STREAM) every call its ratelimit filter's timeout (20 ms by default)
/// outlives, so under load it resets many calls the service has not yet picked up. h2's guard
/// against "rapid reset" (CVE-2023-44487) closes the connection when more than 20 such calls
/// wait at once — failing every call in flight on it, as stop 39's benchmark saw. The listener
/// allows as many as it allows calls in flight (`MAX_STREAMS`): 200 calls reset before they are
/// read leave the connection serving.
#[tokio::test(flavor = "multi_thread")]
async fn calls_reset_before_they_are_read_leave_the_connection_serving() {
    let s = service("backend = \"memory\"", "").await;
    let _ = client(s.port).await; // the listener is up
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let call = || {
        http::Request::post(format!(
            "http://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            s.port
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
    };
    // Queued without yielding: the 400 frames reach the server together, each call reset
    // before the server can accept it.
    for _ in 0..200 {
        let (answer, mut body) = h2.send_request(call(), false).unwrap();
        body.send_reset(h2::Reason::CANCEL);
        drop(answer);
    }
    // Then a real call on the same connection.
    let msg =
        prost::Message::encode_to_vec(&request("edge", vec![descriptor(&[("user", "rst")])], 0));
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&msg);
    let mut h2 = h2.ready().await.expect("the connection still serves");
    let (answer, mut body) = h2
        .send_request(call(), false)
        .expect("the connection still serves");
    body.send_data(framed.into(), true).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("answered, not a GOAWAY");
    assert_eq!(answer.status(), 200);
    let mut answer = answer.into_body();
    while let Some(chunk) = answer.data().await {
        chunk.expect("the reply's body");
    }
    let trailers = answer.trailers().await.unwrap().expect("grpc trailers");
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..]),
        "{trailers:?}"
    );
    drop(h2);
    conn.abort();
}
