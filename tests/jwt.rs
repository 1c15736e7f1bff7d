//! Bearer tokens through the real binary (issue #25 item 5): `[jwt]` with a JWKS file (RS256
//! with the fixed test key, ES256 with a key made here) or a secret from the environment
//! (HS256); required and optional routes; the 401s of RFC 6750 and their counter; `jwt:CLAIM`
//! subjects (alone and as parts, dotted paths) on every store; the JWKS file on reload. Every
//! token is signed in the test.

mod support;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use support::*;

on_every_store_and_cluster!(a_claim_keys_a_limit);

on_every_store!(
    consumers_and_plans_come_from_tokens,
    claims_as_parts_and_nested_paths,
    an_optional_route_counts_tokenless_requests_by_address,
);

const RSA_KEY: &str = include_str!("fixtures/rsa-key.pem");
const SECRET: &str = "a-test-secret-of-32-bytes-------";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The fixture's RSA key as PKCS#8 DER.
fn rsa_der() -> Vec<u8> {
    let body: String = RSA_KEY
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// The JWK of the fixture's RSA public key.
fn rsa_jwk(kid: &str) -> Value {
    let pair = ring::rsa::KeyPair::from_pkcs8(&rsa_der()).unwrap();
    let c: ring::rsa::PublicKeyComponents<Vec<u8>> = pair.public().into();
    json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": b64(&c.n), "e": b64(&c.e)})
}

/// A fresh P-256 key: its PKCS#8 DER and its JWK.
fn ec_key(kid: &str) -> (Vec<u8>, Value) {
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "x": b64(&point[1..33]), "y": b64(&point[33..65])});
    (pkcs8.as_ref().to_vec(), jwk)
}

fn rs256(kid: &str, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some(kid.to_owned());
    encode(
        &h,
        claims,
        &EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn es256(der: &[u8], kid: &str, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.to_owned());
    encode(&h, claims, &EncodingKey::from_ec_der(der)).unwrap()
}

fn hs256(secret: &str, claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

fn write_jwks(path: &Path, keys: &[Value]) {
    std::fs::write(path, json!({ "keys": keys }).to_string()).unwrap();
}

/// GET `path` with `Authorization: Bearer token` (none for `""`) from client `ip`.
async fn get(gw: &Gateway, path: &str, token: &str, ip: &str) -> reqwest::Response {
    let mut r = client().get(gw.url(path)).header("x-forwarded-for", ip);
    if !token.is_empty() {
        r = r.header("authorization", format!("Bearer {token}"));
    }
    r.send().await.unwrap()
}

async fn status(gw: &Gateway, path: &str, token: &str) -> u16 {
    get(gw, path, token, "198.51.100.1").await.status().as_u16()
}

fn rejected(m: &str, route: &str, reason: &str) -> Option<f64> {
    metric(
        m,
        &format!("tollgate_jwt_rejected_total{{route=\"{route}\",reason=\"{reason}\"}}"),
    )
}

/// `[server]` trusting the test for X-Forwarded-For, then `top` and the routes.
fn cfg(store: &str, top: &str, routes: &str) -> String {
    config(store, &format!("{top}\n{routes}")).replacen(
        "[server]\n",
        "[server]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
        1,
    )
}

/// Required routes: every bad token is a 401 with the RFC 6750 challenge, counted by reason,
/// never forwarded; a good one is served.
#[tokio::test(flavor = "multi_thread")]
async fn bad_tokens_get_401_and_are_never_forwarded() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks, &[rsa_jwk("k1")]);
    let top = format!(
        "[jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\"]\nissuer = \"https://idp.example\"\naudience = \"api\"\nleeway = \"5s\"",
        jwks.display()
    );
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"");
    let gw = gateway(&cfg("backend = \"memory\"", &top, &routes));
    wait_ready(&gw).await;
    let exp = now() + 600;
    let claims = |extra: Value| {
        let mut c = json!({"sub": "u1", "iss": "https://idp.example", "aud": "api", "exp": exp});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let good = rs256("k1", &claims(json!({})));
    assert_eq!(status(&gw, "/api/x", &good).await, 200);
    // Missing: a plain challenge.
    let res = get(&gw, "/api/x", "", "198.51.100.1").await;
    assert_eq!(res.status(), 401);
    assert_eq!(
        res.headers()["www-authenticate"],
        "Bearer realm=\"tollgate\""
    );
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    // Another scheme is no bearer token.
    let res = client()
        .get(gw.url("/api/x"))
        .header("authorization", "Basic dTpw")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    // One character in the middle of the signature changed (the last one may carry padding bits).
    let at = good.rfind('.').unwrap() + 20;
    let mut forged = good.clone();
    let was = forged.as_bytes()[at];
    forged.replace_range(at..=at, if was == b'A' { "B" } else { "A" });
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(claims(json!({})).to_string().as_bytes())
    );
    // alg confusion: HS256 signed with the public key's bytes.
    let confused = hs256(&rsa_jwk("k1")["n"].to_string(), &claims(json!({})));
    let cases = [
        (rs256("k1", &claims(json!({"exp": now() - 60}))), "expired"),
        (
            rs256("k1", &claims(json!({"nbf": now() + 600}))),
            "not_yet_valid",
        ),
        (
            rs256("k1", &claims(json!({"iss": "https://evil"}))),
            "issuer",
        ),
        (rs256("k1", &claims(json!({"aud": "other"}))), "audience"),
        (rs256("k2", &claims(json!({}))), "unknown_key"),
        (forged, "bad_signature"),
        (none, "algorithm"),
        (confused, "algorithm"),
        ("not.a.jwt".to_owned(), "malformed"),
        ("x".repeat(20_000), "malformed"),
    ];
    for (token, reason) in &cases {
        let res = get(&gw, "/api/x", token, "198.51.100.1").await;
        assert_eq!(res.status(), 401, "{reason}");
        let challenge = res.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            challenge.starts_with("Bearer realm=\"tollgate\", error=\"invalid_token\""),
            "{reason}: {challenge}"
        );
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["status"], 401, "{reason}");
    }
    assert_eq!(up.hits(), 1, "a refused token reached the upstream");
    let m = gw.metrics().await;
    assert_eq!(rejected(&m, "api", "missing"), Some(2.0), "{m}");
    for reason in [
        "expired",
        "not_yet_valid",
        "issuer",
        "audience",
        "unknown_key",
        "bad_signature",
    ] {
        assert_eq!(rejected(&m, "api", reason), Some(1.0), "{reason}: {m}");
    }
    assert_eq!(rejected(&m, "api", "algorithm"), Some(2.0), "{m}");
    assert_eq!(rejected(&m, "api", "malformed"), Some(2.0), "{m}");
    // The good token again (from the worker's cache).
    assert_eq!(status(&gw, "/api/x", &good).await, 200);
}

/// A JWT-keyed limit: one count per `sub`, on every store.
async fn a_claim_keys_a_limit(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let top = "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"\nalgorithms = [\"HS256\"]";
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"")
        + &limit("name = \"per-user\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"jwt:sub\"");
    let gw = gateway_env(
        &cfg(&env.store, top, &routes),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    let token = |sub: &str| hs256(SECRET, &json!({"sub": sub, "exp": now() + 600}));
    let (alice, bob) = (token("alice"), token("bob"));
    // A new token for the same user shares the count: the subject is the claim.
    let alice2 = hs256(SECRET, &json!({"sub": "alice", "exp": now() + 601}));
    assert_eq!(status(&gw, "/api/x", &alice).await, 200, "{kind:?}");
    assert_eq!(status(&gw, "/api/x", &alice2).await, 200);
    assert_eq!(status(&gw, "/api/x", &alice).await, 429);
    // From another address too: the token, not the address, is counted.
    assert_eq!(
        get(&gw, "/api/x", &alice, "203.0.113.9").await.status(),
        429
    );
    assert_eq!(status(&gw, "/api/x", &bob).await, 200);
    // A token signed with another secret: 401, charged to nobody.
    let forged = hs256(
        "another-secret-of-32-bytes------",
        &json!({"sub": "bob", "exp": now() + 600}),
    );
    assert_eq!(status(&gw, "/api/x", &forged).await, 401);
    assert_eq!(status(&gw, "/api/x", &bob).await, 200);
    assert_eq!(status(&gw, "/api/x", &bob).await, 429);
    assert_eq!(up.hits(), 4);
    // /-/top names the claim's part, hashed.
    let v: Value = client()
        .get(gw.admin_url("/-/top?route=api&limit=per-user"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!v.to_string().contains("alice"), "{v}");
    assert_eq!(v["top"][0]["parts"][0]["part"], "jwt:sub", "{v}");
}

/// `jwt:CLAIM` as a part, a dotted path, and claims that are not strings or numbers.
async fn claims_as_parts_and_nested_paths(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let top = "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"";
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"")
        + &limit("name = \"per-org-method\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = [\"jwt:org.id\", \"method\"]\non_missing = \"reject\"");
    let gw = gateway_env(
        &cfg(&env.store, top, &routes),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    let t = |org: Value| hs256(SECRET, &json!({"sub": "u", "org": org, "exp": now() + 600}));
    assert_eq!(
        status(&gw, "/api/x", &t(json!({"id": "acme"}))).await,
        200,
        "{kind:?}"
    );
    assert_eq!(status(&gw, "/api/x", &t(json!({"id": "acme"}))).await, 429);
    // A number is a value like a string ("7" and 7 are the same org).
    assert_eq!(status(&gw, "/api/x", &t(json!({"id": 7}))).await, 200);
    assert_eq!(status(&gw, "/api/x", &t(json!({"id": "7"}))).await, 429);
    // Missing, an object, a list, a boolean: no value, and on_missing = "reject" answers 401.
    for bad in [
        json!({}),
        json!({"id": {"x": 1}}),
        json!({"id": [1]}),
        json!({"id": true}),
        json!("acme"),
    ] {
        let res = get(&gw, "/api/x", &t(bad.clone()), "198.51.100.1").await;
        assert_eq!(res.status(), 401, "{bad}");
        let body: Value = res.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains("jwt:org.id"),
            "{body}"
        );
    }
    assert_eq!(up.hits(), 2);
}

async fn an_optional_route_counts_tokenless_requests_by_address(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let top = "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"\nquery = \"access_token\"";
    let routes = route("api", "/api", &up.url(), "jwt = \"optional\"")
        + &limit("name = \"per-user\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"jwt:sub\"");
    let gw = gateway_env(
        &cfg(&env.store, top, &routes),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    // No token: counted by address (on_missing = "ip").
    assert_eq!(
        get(&gw, "/api/x", "", "198.51.100.1").await.status(),
        200,
        "{kind:?}"
    );
    assert_eq!(get(&gw, "/api/x", "", "198.51.100.1").await.status(), 429);
    assert_eq!(get(&gw, "/api/x", "", "198.51.100.2").await.status(), 200);
    // A token in the query parameter.
    let alice = hs256(SECRET, &json!({"sub": "alice", "exp": now() + 600}));
    let q = |t: &str| {
        let r = client()
            .get(gw.url(&format!("/api/x?access_token={t}")))
            .header("x-forwarded-for", "198.51.100.1");
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(q(&alice).await, 200);
    assert_eq!(q(&alice).await, 429);
    // A bad token is refused even where a token is optional.
    assert_eq!(q("garbage").await, 401);
    assert_eq!(status(&gw, "/api/x", "garbage").await, 401);
}

/// The JWKS file is re-read on reload: a rotated key serves at once; a file that does not
/// parse is refused and the running keys keep serving.
#[tokio::test(flavor = "multi_thread")]
async fn the_jwks_file_is_reread_on_reload() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks, &[rsa_jwk("rsa1")]);
    let top = format!(
        "[jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\", \"ES256\"]",
        jwks.display()
    );
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"");
    let gw = gateway(&cfg("backend = \"memory\"", &top, &routes));
    wait_ready(&gw).await;
    let claims = json!({"sub": "u", "exp": now() + 600});
    let old = rs256("rsa1", &claims);
    let (ec_der, ec_jwk) = ec_key("ec1");
    let new = es256(&ec_der, "ec1", &claims);
    assert_eq!(status(&gw, "/api/x", &old).await, 200);
    assert_eq!(status(&gw, "/api/x", &new).await, 401);
    let reload = || async {
        client()
            .post(gw.admin_url("/-/reload"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    write_jwks(&jwks, &[ec_jwk]);
    assert_eq!(reload().await, 200);
    assert_eq!(status(&gw, "/api/x", &new).await, 200);
    assert_eq!(
        status(&gw, "/api/x", &old).await,
        401,
        "a removed key (or its cache) still served"
    );
    // Broken: refused, the running keys keep serving.
    std::fs::write(&jwks, "{\"keys\": [").unwrap();
    assert_eq!(reload().await, 422);
    assert_eq!(status(&gw, "/api/x", &new).await, 200);
    // And refused at start-up, by `tollgate check` too.
    let out = std::process::Command::new(tollgate_bin())
        .args(["check", "--config"])
        .arg(&gw.config_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("jwt.jwks_file"), "{text}");
}

/// `[consumers] jwt_claim` and `plan_claim`: a token names the consumer (and its plan), besides
/// API keys; counted like the file's consumer of that name.
async fn consumers_and_plans_come_from_tokens(kind: Kind) {
    use tollgate::consumers::{hash_key, hex};
    let up = upstream().await;
    let env = store_env(kind);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    std::fs::write(
        &file,
        format!(
            "[[consumer]]\nname = \"acme\"\nplan = \"free\"\nkey_sha256 = \"{}\"\n",
            hex(&hash_key(b"key-acme"))
        ),
    )
    .unwrap();
    let plan = |name: &str, n: u32| {
        format!("[[plans]]\nname = \"{name}\"\n[[plans.limits]]\nname = \"{name}-quota\"\nalgorithm = \"fixed_window\"\nlimit = {n}\nperiod = \"1h\"\n")
    };
    let top = format!(
        "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"\n\n[consumers]\nheader = \"X-Api-Key\"\nfile = \"{}\"\njwt_claim = \"sub\"\nplan_claim = \"plan\"\n\n{}{}",
        file.display(),
        plan("free", 2),
        plan("gold", 4)
    );
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "consumers = true\njwt = \"optional\"",
    );
    let gw = gateway_env(
        &cfg(&env.store, &top, &routes),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    let t = |claims: Value| hs256(SECRET, &claims);
    let exp = now() + 600;
    // acme by token (no plan claim: the file's plan, free) and by key share one count.
    let acme = t(json!({"sub": "acme", "exp": exp}));
    assert_eq!(status(&gw, "/api/x", &acme).await, 200, "{kind:?}");
    let by_key = client()
        .get(gw.url("/api/x"))
        .header("x-api-key", "key-acme")
        .send()
        .await
        .unwrap();
    assert_eq!(by_key.status(), 200);
    assert_eq!(status(&gw, "/api/x", &acme).await, 429);
    // A consumer only a token knows, on the plan its claim names.
    let zed = t(json!({"sub": "zed", "plan": "gold", "exp": exp}));
    for _ in 0..4 {
        assert_eq!(status(&gw, "/api/x", &zed).await, 200);
    }
    assert_eq!(status(&gw, "/api/x", &zed).await, 429);
    // The upstream is told who it is, by the gateway alone.
    let seen = up.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.headers["x-consumer"], "zed");
    // No consumer claim, a plan no [[plans]] entry has, a name not in the file: unknown (401).
    for claims in [
        json!({"exp": exp}),
        json!({"sub": "nobody", "plan": "platinum", "exp": exp}),
        json!({"sub": "nobody", "exp": exp}),
        json!({"sub": {"id": 1}, "plan": "gold", "exp": exp}),
    ] {
        assert_eq!(
            status(&gw, "/api/x", &t(claims.clone())).await,
            401,
            "{claims}"
        );
    }
    assert_eq!(up.hits(), 6);
    let m = gw.metrics().await;
    assert_eq!(
        plan_decisions(&m, "api", "gold-quota", "gold", "allowed"),
        Some(4.0),
        "{m}"
    );
}

/// `$jwt.CLAIM` in header rules (issue #27 with #25): a claim of the verified token goes
/// upstream and back to the client; a claim that is not a string or number is empty (a `set`
/// then removes the header); a CR/LF in a claim never reaches a head.
#[tokio::test(flavor = "multi_thread")]
async fn header_rules_carry_claims_of_the_verified_token() {
    let up = upstream().await;
    let top = "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"";
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "jwt = \"required\"\n[routes.request_headers]\nset = { \"X-Sub\" = \"$jwt.sub\", \"X-Org\" = \"org-${jwt.org.id}\" }\n[routes.response_headers]\nset = { \"X-Seen-By\" = \"$jwt.name\" }",
    );
    let gw = gateway_env(
        &cfg("backend = \"memory\"", top, &routes),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    let token = hs256(
        SECRET,
        &json!({"sub": "u-1\r\nX-Evil: 1", "name": "n1", "org": {"id": 7}, "exp": now() + 600}),
    );
    let res = get(&gw, "/api/x", &token, "198.51.100.1").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-seen-by"], "n1");
    let seen = up.seen();
    let h = &seen[0].headers;
    assert_eq!(h["x-sub"], "u-1X-Evil: 1");
    assert_eq!(h["x-org"], "org-7");
    assert!(!h.contains_key("x-evil"));
    // No `name`, and an `org.id` that is not text: empty (the `set` then removes the header).
    let token = hs256(
        SECRET,
        &json!({"sub": "u-2", "org": {"id": {"not": "text"}}, "exp": now() + 600}),
    );
    let res = get(&gw, "/api/x", &token, "198.51.100.1").await;
    assert_eq!(res.status(), 200);
    assert!(!res.headers().contains_key("x-seen-by"));
    let seen = up.seen();
    assert_eq!(seen[1].headers["x-sub"], "u-2");
    assert_eq!(seen[1].headers["x-org"], "org-");
}

/// Issue #34 item 18: every spelling of the Bearer scheme (any case, a tab or several spaces
/// after it) is read and verified — on an `optional` route a bad token so spelt is a 401, never
/// forwarded as an anonymous request's; a good one is counted by its claim.
#[tokio::test(flavor = "multi_thread")]
async fn every_spelling_of_bearer_is_verified() {
    let up = upstream().await;
    let top = "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"";
    let routes = route("api", "/api", &up.url(), "jwt = \"optional\"")
        + &limit("name = \"per-user\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"jwt:sub\"");
    let gw = gateway_env(
        &cfg("backend = \"memory\"", top, &routes),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    let send = |authorization: String| {
        let r = client()
            .get(gw.url("/api/x"))
            .header("x-forwarded-for", "198.51.100.1")
            .header("authorization", authorization);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    for spelling in ["Bearer\t", "bearer\t", "BEARER  ", "Bearer \t"] {
        assert_eq!(
            send(format!("{spelling}forged.token.here")).await,
            401,
            "{spelling:?}: an unverified token passed as anonymous"
        );
    }
    assert_eq!(up.hits(), 0, "an unverified token was forwarded");
    let alice = hs256(SECRET, &json!({"sub": "alice", "exp": now() + 600}));
    assert_eq!(send(format!("Bearer\t{alice}")).await, 200);
    assert_eq!(
        send(format!("Bearer {alice}")).await,
        429,
        "the tab-spelt token was not counted as alice"
    );
}

/// Issue #34 item 20: with `watch_config`, a change to the JWKS file reloads by itself, so a
/// key removed from it stops verifying without a `POST /-/reload`.
#[tokio::test(flavor = "multi_thread")]
async fn watch_config_reloads_when_the_jwks_file_changes() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks, &[rsa_jwk("rsa1")]);
    let top = format!(
        "[jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\", \"ES256\"]",
        jwks.display()
    );
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"");
    let gw = gateway(&cfg("backend = \"memory\"", &top, &routes).replacen(
        "[server]\n",
        "[server]\nwatch_config = true\n",
        1,
    ));
    wait_ready(&gw).await;
    let claims = json!({"sub": "u", "exp": now() + 600});
    let old = rs256("rsa1", &claims);
    let (ec_der, ec_jwk) = ec_key("ec1");
    let new = es256(&ec_der, "ec1", &claims);
    assert_eq!(status(&gw, "/api/x", &old).await, 200);
    // Let the watcher take its first look, then revoke the key.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    write_jwks(&jwks, &[ec_jwk]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status(&gw, "/api/x", &new).await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the JWKS file changed and nothing reloaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        status(&gw, "/api/x", &old).await,
        401,
        "a revoked key verified"
    );
}

/// Issue #34, "Also decide": a flood of bad tokens from one address is throttled. Each refused
/// token costs a signature check (≈ 30 µs RS256, ≈ 80 µs ES256, BENCHMARKS.md); past
/// `[jwt] max_bad_tokens` (default 20) failed verifications in a second, that address's
/// uncached tokens are answered 429 without one, for the rest of the second. A cached good
/// token still passes; other addresses are not affected.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_bad_tokens_is_throttled_per_address() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks, &[rsa_jwk("k1")]);
    let top = format!(
        "[jwt]\njwks_file = \"{}\"\nalgorithms = [\"RS256\"]",
        jwks.display()
    );
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"");
    let gw = gateway(&cfg("backend = \"memory\"", &top, &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    ));
    wait_ready(&gw).await;
    let good = rs256("k1", &json!({"sub": "u1", "exp": now() + 600}));
    assert_eq!(status(&gw, "/api/x", &good).await, 200);
    // 60 forged signatures from one address, as fast as they go.
    let at = good.rfind('.').unwrap() + 20;
    let started = std::time::Instant::now();
    let mut throttled = 0;
    for i in 0..60u8 {
        let mut forged = good.clone();
        forged.replace_range(at..=at, if i % 2 == 0 { "A" } else { "B" });
        forged.replace_range(at + 1..=at + 1, &((b'a' + i % 26) as char).to_string());
        let res = get(&gw, "/api/x", &forged, "198.51.100.1").await;
        match res.status().as_u16() {
            401 => {}
            429 => {
                throttled += 1;
                assert_eq!(res.headers()["retry-after"], "1");
            }
            s => panic!("forged token {i}: {s}"),
        }
    }
    let secs = started.elapsed().as_secs();
    assert!(throttled > 0, "60 bad tokens in {secs} s, none throttled");
    let m = gw.metrics().await;
    let checked = rejected(&m, "api", "bad_signature").unwrap_or(0.0);
    assert!(
        checked <= 20.0 * (secs as f64 + 2.0),
        "{checked} signature checks in {secs} s"
    );
    assert_eq!(
        rejected(&m, "api", "throttled"),
        Some(throttled as f64),
        "{m}"
    );
    // The cached good token still passes; another address is not throttled.
    assert_eq!(status(&gw, "/api/x", &good).await, 200);
    let other = rs256("k1", &json!({"sub": "u2", "exp": now() + 600}));
    assert_eq!(
        get(&gw, "/api/x", &other, "198.51.100.2").await.status(),
        200
    );
    assert_eq!(up.hits(), 3);
}
