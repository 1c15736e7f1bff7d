//! What one refused bearer token costs the gateway (issue #34, "Also decide"): the verifier's
//! work on a forged token — `decode_header`, then `jsonwebtoken::decode` with the key (base64,
//! JSON, the signature check that fails) — in CPU time per token, for RS256 (2048-bit), ES256,
//! HS256 and a malformed token. BENCHMARKS.md has the numbers and how they were taken.
//!
//!     CARGO_PROFILE_RELEASE_LTO=false cargo run --release --example bad_tokens
//!
//! CPU time (utime + stime of /proc/self/stat), not wall time: the machine is shared.

use jsonwebtoken::{decode, decode_header, encode, Algorithm, DecodingKey, EncodingKey, Header};

const RSA_KEY: &str = include_str!("../tests/fixtures/rsa-key.pem");

/// CPU seconds of this process so far (Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn forge(token: &str) -> String {
    let at = token.rfind('.').map_or(0, |i| i + 20);
    let mut forged = token.to_owned();
    let was = forged.as_bytes().get(at).copied().unwrap_or(b'A');
    forged.replace_range(at..=at, if was == b'A' { "B" } else { "A" });
    forged
}

fn run(name: &str, token: &str, key: &DecodingKey, alg: Algorithm, n: u32) {
    let mut v = jsonwebtoken::Validation::new(alg);
    v.validate_aud = false;
    let t0 = cpu_seconds();
    let mut refused = 0u32;
    for _ in 0..n {
        if decode_header(token).is_err() || decode::<serde_json::Value>(token, key, &v).is_err() {
            refused += 1;
        }
    }
    let per = (cpu_seconds() - t0) * 1e6 / f64::from(n);
    println!("{name}: {refused} of {n} refused, {per:.1} µs CPU per token");
}

fn main() {
    let claims = serde_json::json!({"sub": "u1", "exp": 4_000_000_000u64});
    let rsa = EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).expect("the fixture key");
    let good = encode(&Header::new(Algorithm::RS256), &claims, &rsa).expect("signed");
    let der: Vec<u8> = {
        use base64::Engine as _;
        let body: String = RSA_KEY
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .expect("PEM body")
    };
    let pair = ring::rsa::KeyPair::from_pkcs8(&der).expect("PKCS#8");
    let c: ring::rsa::PublicKeyComponents<Vec<u8>> =
        ring::signature::KeyPair::public_key(&pair).into();
    let key = DecodingKey::from_rsa_raw_components(&c.n, &c.e);
    run(
        "RS256 forged",
        &forge(&good),
        &key,
        Algorithm::RS256,
        20_000,
    );

    use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
    let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .expect("key");
    let good = encode(
        &Header::new(Algorithm::ES256),
        &claims,
        &EncodingKey::from_ec_der(pkcs8.as_ref()),
    )
    .expect("signed");
    let point = ec.public_key().as_ref();
    let b64 = |x: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(x)
    };
    let key =
        DecodingKey::from_ec_components(&b64(&point[1..33]), &b64(&point[33..65])).expect("EC key");
    run(
        "ES256 forged",
        &forge(&good),
        &key,
        Algorithm::ES256,
        20_000,
    );

    let secret = b"0123456789abcdef0123456789abcdef";
    let good = encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .expect("signed");
    run(
        "HS256 forged",
        &forge(&good),
        &DecodingKey::from_secret(secret),
        Algorithm::HS256,
        200_000,
    );
    run(
        "malformed",
        "bm90.YQ.YQ",
        &DecodingKey::from_secret(secret),
        Algorithm::HS256,
        200_000,
    );
}
