//! The edge's TLS through the binary with a real client (rustls): the certificate chosen by
//! SNI (exact, wildcard, default, reject; RSA or ECDSA by the client's signature schemes),
//! reload swapping certificates under open connections, `tollgate check` on a key that does
//! not fit, the expiry gauge, `min_version`, and resumption on a second gateway sharing the
//! ticket key file. Certificates are made here with rcgen; nothing private is committed but the
//! RSA test key `tests/fixtures/rsa-key.pem`.

#[path = "support/any_cert.rs"]
mod any_cert;
mod support;
use any_cert::{all_schemes, AnyCert};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::SignatureScheme;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::*;
use tollgate::consumers::{hash_key, hex};

// The store-facing scenarios (limits counted by certificate, consumers' plans) run on every
// store the support offers; each loops over both HTTP/1 fronts itself.
on_every_store_and_cluster!(client_certificates_are_subjects_on_both_fronts);
on_every_store!(
    a_route_can_demand_a_client_certificate_on_an_optional_listener,
    consumers_are_recognised_by_their_client_certificate,
);

// ---------------------------------------------------------------------------------------------
// Certificates and a client.
// ---------------------------------------------------------------------------------------------

/// A certificate and key written to `dir/<stem>.{pem,key}`; returns the paths and the leaf DER.
struct Made {
    cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
}

fn write(dir: &Path, stem: &str, cert_pem: String, key_pem: String, der: Vec<u8>) -> Made {
    let cert = dir.join(format!("{stem}.pem"));
    let key = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, key_pem).unwrap();
    Made { cert, key, der }
}

/// A self-signed ECDSA P-256 certificate for `names`, expiring on the first of `not_after`
/// (year, month).
fn ecdsa(dir: &Path, stem: &str, names: &[&str], not_after: Option<(i32, u8)>) -> Made {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .unwrap();
    if let Some((year, month)) = not_after {
        params.not_after = rcgen::date_time_ymd(year, month, 1);
    }
    let c = params.self_signed(&key).unwrap();
    write(dir, stem, c.pem(), key.serialize_pem(), c.der().to_vec())
}

/// A self-signed RSA certificate for `names` (the key is the fixture: ring makes no RSA keys).
fn rsa(dir: &Path, stem: &str, names: &[&str]) -> Made {
    const KEY: &str = include_str!("fixtures/rsa-key.pem");
    let key = rcgen::KeyPair::from_pem(KEY).unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .unwrap();
    let c = params.self_signed(&key).unwrap();
    write(dir, stem, c.pem(), KEY.to_owned(), c.der().to_vec())
}

/// How a test client connects.
#[derive(Clone)]
struct Client {
    config: Arc<rustls::ClientConfig>,
}

impl Client {
    fn new(
        schemes: Vec<SignatureScheme>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Client {
        Client::with(schemes, versions, |_| {})
    }
    fn with(
        schemes: Vec<SignatureScheme>,
        versions: &[&'static rustls::SupportedProtocolVersion],
        edit: impl FnOnce(&mut rustls::ClientConfig),
    ) -> Client {
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert { schemes }))
        .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        edit(&mut c);
        Client {
            config: Arc::new(c),
        }
    }
    fn any() -> Client {
        Client::new(all_schemes(), rustls::DEFAULT_VERSIONS)
    }
    /// A client presenting `id` (its chain, leaf first, and key).
    fn with_cert(id: &Identity) -> Client {
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert {
            schemes: all_schemes(),
        }))
        .with_client_auth_cert(
            id.chain.clone(),
            rustls::pki_types::PrivateKeyDer::try_from(id.key.clone()).unwrap(),
        )
        .unwrap();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Client {
            config: Arc::new(c),
        }
    }

    /// Connects with `sni` (a DNS name, an IP address, or `None`: no SNI sent).
    async fn connect(
        &self,
        addr: SocketAddr,
        sni: Option<&str>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut config = self.config.clone();
        let name = match sni {
            Some(n) => ServerName::try_from(n.to_owned()).unwrap(),
            None => {
                let mut c = (*config).clone();
                c.enable_sni = false;
                config = Arc::new(c);
                ServerName::try_from("unsent.invalid").unwrap()
            }
        };
        let tcp = TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
    }

    /// The leaf certificate the gateway presents for `sni`.
    async fn leaf(&self, addr: SocketAddr, sni: Option<&str>) -> std::io::Result<Vec<u8>> {
        let s = self.connect(addr, sni).await?;
        Ok(s.get_ref().1.peer_certificates().unwrap()[0].to_vec())
    }

    /// One `GET path` with `Connection: close`, or the error the connection ended with.
    async fn get_result(&self, addr: SocketAddr, sni: &str, path: &str) -> std::io::Result<String> {
        let mut s = self.connect(addr, Some(sni)).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        match tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await {
            Ok(Err(e)) if out.is_empty() => Err(e),
            _ => Ok(String::from_utf8_lossy(&out).into_owned()),
        }
    }

    /// One `GET path` with `Connection: close`; returns the response and how the handshake went.
    async fn get(
        &self,
        addr: SocketAddr,
        sni: &str,
        path: &str,
    ) -> (String, rustls::HandshakeKind) {
        self.get_with(addr, sni, path, "").await
    }

    /// [`Client::get`] with `fields` (whole `Name: value\r\n` lines) added to the request.
    async fn get_with(
        &self,
        addr: SocketAddr,
        sni: &str,
        path: &str,
        fields: &str,
    ) -> (String, rustls::HandshakeKind) {
        let mut s = self.connect(addr, Some(sni)).await.unwrap();
        let kind = s.get_ref().1.handshake_kind().unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\n{fields}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        // The gateway may close without close_notify after `Connection: close`.
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        (String::from_utf8_lossy(&out).into_owned(), kind)
    }
}

// ---------------------------------------------------------------------------------------------
// Configs.
// ---------------------------------------------------------------------------------------------

fn tls_config(up: &Upstream, tls: &str) -> String {
    with_front(&tls_routes(&route("api", "/api", &up.url(), ""), tls))
}

/// A config of `routes` on the in-process store with `tls` as its `[server.tls]`.
fn tls_routes(routes: &str, tls: &str) -> String {
    tls_routes_on("backend = \"memory\"", routes, tls)
}

/// [`tls_routes`] on the store `store` (a `[store]` body).
fn tls_routes_on(store: &str, routes: &str, tls: &str) -> String {
    config(store, routes).replacen("[admin]", &format!("[server.tls]\n{tls}\n[admin]"), 1)
}

fn pair(m: &Made) -> String {
    format!(
        "cert = {:?}\nkey = {:?}\n",
        m.cert.display().to_string(),
        m.key.display().to_string()
    )
}

fn entry(m: &Made, extra: &str) -> String {
    format!("[[server.tls.certs]]\n{}{extra}\n", pair(m))
}

async fn wait_metric(gw: &Gateway, name: &str, labels: &[&str], want: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = metric_sum(&gw.metrics().await, name, labels);
        if v == want || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const ERRORS: &str = "tollgate_tls_handshake_errors_total";

// ---------------------------------------------------------------------------------------------
// A certificate per name.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn the_certificate_is_chosen_by_sni_exact_then_wildcard_then_default() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let default = ecdsa(d, "default", &["default.test"], None);
    let api = ecdsa(d, "api", &["api.example.com"], None);
    let api_rsa = rsa(d, "api-rsa", &["api.example.com"]);
    let wild = ecdsa(d, "wild", &["*.example.com"], None);
    // `names` given: the certificate's own names do not count.
    let named = ecdsa(d, "named", &["ignored.test"], None);
    let tls = pair(&default)
        + &entry(&api_rsa, "")
        + &entry(&api, "")
        + &entry(&wild, "")
        + &entry(&named, "names = [\"Other.Test\"]");
    let gw = gateway(&tls_config(&up, &tls));
    let c = Client::any();
    let leaf = |sni: Option<&'static str>| {
        let c = c.clone();
        let addr = gw.proxy;
        async move { c.leaf(addr, sni).await.unwrap() }
    };
    assert_eq!(
        leaf(Some("api.example.com")).await,
        api.der,
        "ECDSA preferred"
    );
    assert_eq!(
        leaf(Some("API.Example.COM")).await,
        api.der,
        "case-insensitive"
    );
    assert_eq!(
        leaf(Some("api.example.com.")).await,
        api.der,
        "trailing dot"
    );
    assert_eq!(leaf(Some("web.example.com")).await, wild.der, "wildcard");
    assert_eq!(
        leaf(Some("a.b.example.com")).await,
        default.der,
        "one label only"
    );
    assert_eq!(leaf(Some("example.com")).await, default.der);
    assert_eq!(
        leaf(Some("other.test")).await,
        named.der,
        "configured names"
    );
    assert_eq!(leaf(Some("ignored.test")).await, default.der);
    assert_eq!(leaf(Some("unknown.test")).await, default.der);
    assert_eq!(leaf(None).await, default.der, "no SNI");
    assert_eq!(
        leaf(Some("127.0.0.1")).await,
        default.der,
        "an IP is no SNI"
    );

    // A client that cannot verify ECDSA gets the RSA twin.
    let rsa_only = Client::new(
        all_schemes()
            .into_iter()
            .filter(|s| format!("{s:?}").starts_with("RSA"))
            .collect(),
        rustls::DEFAULT_VERSIONS,
    );
    assert_eq!(
        rsa_only
            .leaf(gw.proxy, Some("api.example.com"))
            .await
            .unwrap(),
        api_rsa.der
    );

    // And requests are served.
    let (res, _) = c.get(gw.proxy, "web.example.com", "/api/x").await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    assert_eq!(wait_metric(&gw, ERRORS, &[], 0.0).await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_sni_reject_ends_the_handshake_and_is_counted() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let api = ecdsa(dir.path(), "api", &["api.example.com"], None);
    let gw = gateway(&tls_config(
        &up,
        &(pair(&api) + "unknown_sni = \"reject\"\n"),
    ));
    let c = Client::any();
    assert_eq!(
        c.leaf(gw.proxy, Some("api.example.com")).await.unwrap(),
        api.der
    );
    assert!(c.connect(gw.proxy, Some("other.test")).await.is_err());
    assert!(c.connect(gw.proxy, None).await.is_err());
    assert!(c.connect(gw.proxy, Some("127.0.0.1")).await.is_err());
    assert_eq!(
        wait_metric(&gw, ERRORS, &["reason=\"unknown_sni\""], 3.0).await,
        3.0
    );
    // Served names still work.
    let (res, _) = c.get(gw.proxy, "api.example.com", "/api/x").await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_swaps_certificates_without_dropping_a_connection() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let old = ecdsa(dir.path(), "old", &["api.example.com"], None);
    let new = ecdsa(dir.path(), "new", &["api.example.com"], None);
    let gw = gateway(&tls_config(&up, &pair(&old)));
    let c = Client::any();

    // An open keep-alive connection, one request served on it.
    let mut s = c.connect(gw.proxy, Some("api.example.com")).await.unwrap();
    assert_eq!(
        s.get_ref().1.peer_certificates().unwrap()[0].as_ref(),
        &old.der[..]
    );
    let request = b"GET /api/1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
    s.write_all(request).await.unwrap();
    let first = read_head(&mut s).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");

    gw.write_config(&tls_config(&up, &pair(&new)));
    gw.signal(Signal::HUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.leaf(gw.proxy, Some("api.example.com")).await.unwrap() != new.der {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The old connection still serves.
    s.write_all(request).await.unwrap();
    let second = read_head(&mut s).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert_eq!(up.hits(), 2);
}

/// Reads one response (head and a `Content-Length` body) from `s`.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if out.len() >= end + 4 + len {
                return text;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .expect("no response in time")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn check_refuses_a_key_that_does_not_fit_naming_the_files() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let default = ecdsa(dir.path(), "default", &["default.test"], None);
    let api = ecdsa(dir.path(), "api", &["api.example.com"], None);
    let other = ecdsa(dir.path(), "other", &["other.test"], None);
    let wrong = Made {
        cert: api.cert.clone(),
        key: other.key.clone(),
        der: vec![],
    };
    let file = dir.path().join("gateway.toml");
    std::fs::write(
        &file,
        tls_config(&up, &(pair(&default) + &entry(&wrong, ""))),
    )
    .unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("does not fit")
            && text.contains(&*other.key.display().to_string())
            && text.contains(&*api.cert.display().to_string()),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_expiry_gauge_has_each_names_soonest_not_after() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    // 2030-01-01 and 2031-01-01, 00:00 UTC.
    let (t1, t2) = (1_893_456_000_i64, 1_924_992_000_i64);
    let a = ecdsa(dir.path(), "a", &["a.test", "*.a.test"], Some((2031, 1)));
    let a_soon = ecdsa(dir.path(), "a-soon", &["a.test"], Some((2030, 1)));
    let gw = gateway(&tls_config(&up, &(pair(&a) + &entry(&a_soon, ""))));
    let m = gw.metrics().await;
    let g = |name: &str| {
        metric(
            &m,
            &format!("tollgate_tls_certificate_expiry_seconds{{name=\"{name}\"}}"),
        )
    };
    assert_eq!(g("a.test"), Some(t1 as f64), "{m}");
    assert_eq!(g("*.a.test"), Some(t2 as f64), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn min_version_1_3_refuses_a_tls_1_2_client() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let gw = gateway(&tls_config(&up, &(pair(&a) + "min_version = \"1.3\"\n")));
    let tls12 = Client::new(all_schemes(), &[&rustls::version::TLS12]);
    assert!(tls12.connect(gw.proxy, Some("a.test")).await.is_err());
    assert_eq!(
        wait_metric(&gw, ERRORS, &["reason=\"incompatible\""], 1.0).await,
        1.0
    );
    let (res, _) = Client::any().get(gw.proxy, "a.test", "/api/x").await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
}

// ---------------------------------------------------------------------------------------------
// Sessions.
// ---------------------------------------------------------------------------------------------

/// A client that remembers sessions (tickets) across connections, by server name.
fn resuming(versions: &[&'static rustls::SupportedProtocolVersion]) -> Client {
    Client::with(all_schemes(), versions, |c| {
        c.resumption = rustls::client::Resumption::in_memory_sessions(64);
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_resumes_on_a_second_gateway_sharing_the_ticket_key_file() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let keys = dir.path().join("tickets.key");
    std::fs::write(
        &keys,
        "# the fleet's ticket keys\n1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a7988\n",
    )
    .unwrap();
    let shared = pair(&a) + &format!("ticket_key_file = {:?}\n", keys.display().to_string());
    let one = gateway(&tls_config(&up, &shared));
    let two = gateway(&tls_config(&up, &shared));
    let alone = gateway(&tls_config(&up, &pair(&a)));

    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let c = resuming(versions);
        let (res, kind) = c.get(one.proxy, "a.test", "/api/1").await;
        assert!(res.starts_with("HTTP/1.1 200"), "{res}");
        assert_eq!(kind, rustls::HandshakeKind::Full);
        let (res, kind) = c.get(two.proxy, "a.test", "/api/2").await;
        assert!(res.starts_with("HTTP/1.1 200"), "{res}");
        assert_eq!(
            kind,
            rustls::HandshakeKind::Resumed,
            "{versions:?} on the second gateway"
        );
        // A gateway with keys of its own cannot open the fleet's tickets: a full handshake.
        let (_, kind) = c.get(alone.proxy, "a.test", "/api/3").await;
        assert_eq!(kind, rustls::HandshakeKind::Full, "{versions:?}");
    }
    // The session cache (TLS 1.2 session ids) without tickets resumes on the same gateway.
    let cache_only = gateway(&tls_config(&up, &(pair(&a) + "session_tickets = false\n")));
    let c = Client::with(all_schemes(), &[&rustls::version::TLS12], |c| {
        c.resumption = rustls::client::Resumption::in_memory_sessions(64)
            .tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
    });
    let (_, kind) = c.get(cache_only.proxy, "a.test", "/api/4").await;
    assert_eq!(kind, rustls::HandshakeKind::Full);
    let (_, kind) = c.get(cache_only.proxy, "a.test", "/api/5").await;
    assert_eq!(kind, rustls::HandshakeKind::Resumed);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_ticket_key_file_is_a_config_error_naming_it() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let keys = dir.path().join("tickets.key");
    std::fs::write(&keys, "not-hex\n").unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::write(
        &file,
        tls_config(
            &up,
            &(pair(&a) + &format!("ticket_key_file = {:?}\n", keys.display().to_string())),
        ),
    )
    .unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains("tickets.key") && text.contains("line 1"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Client certificates.
// ---------------------------------------------------------------------------------------------

/// A client certificate chain (leaf first) and its PKCS#8 key.
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

/// A certificate authority made for the test.
struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
    der: CertificateDer<'static>,
}

fn ca(cn: &str) -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        der: cert.der().clone(),
        issuer: rcgen::Issuer::new(params, key),
    }
}

impl Ca {
    /// A client certificate for `cn` issued by this CA, valid until `not_after` (year).
    fn client(&self, cn: &str, not_after: i32) -> Identity {
        self.client_with(cn, not_after, None)
    }

    /// A client certificate for `cn` with a URI SAN (a SPIFFE ID), valid until 2100.
    fn spiffe(&self, cn: &str, uri: &str) -> Identity {
        self.client_with(cn, 2100, Some(uri))
    }

    fn client_with(&self, cn: &str, not_after: i32, uri: Option<&str>) -> Identity {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![format!("{cn}.clients.test")]).unwrap();
        if let Some(uri) = uri {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(uri.try_into().unwrap()));
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after, 1, 1);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Identity {
            chain: vec![cert.der().clone(), self.der.clone()],
            key: key.serialize_der(),
        }
    }

    /// A sub-CA of this one.
    fn sub(&self, cn: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }
}

fn client_auth(dir: &Path, ca: &Ca, mode: &str) -> String {
    let file = dir.join("clients-ca.pem");
    std::fs::write(&file, &ca.pem).unwrap();
    format!(
        "[server.tls.client_auth]\nca = {:?}\nmode = \"{mode}\"\n",
        file.display().to_string()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn required_client_certificates_are_verified_and_refusals_counted_by_reason() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let gw = gateway(&tls_config(
        &up,
        &(pair(&a) + &client_auth(dir.path(), &partners, "required")),
    ));
    let good = Client::with_cert(&partners.client("acme", 2100));
    // One keep-alive connection open through the refusals below.
    let mut open = good.connect(gw.proxy, Some("a.test")).await.unwrap();
    let request = b"GET /api/1 HTTP/1.1\r\nHost: a.test\r\n\r\n";
    open.write_all(request).await.unwrap();
    assert!(read_head(&mut open).await.starts_with("HTTP/1.1 200"));

    // Each refused handshake: the client sees an error (TLS 1.3 reports the server's alert on
    // its first read), the gateway counts the reason.
    async fn refused(c: &Client, addr: SocketAddr) {
        let res = c.get_result(addr, "a.test", "/api/x").await;
        assert!(
            res.is_err() || !res.as_ref().unwrap().starts_with("HTTP/1.1 200"),
            "{res:?}"
        );
    }
    refused(&Client::any(), gw.proxy).await;
    refused(
        &Client::with_cert(&ca("Other CA").client("acme", 2100)),
        gw.proxy,
    )
    .await;
    refused(&Client::with_cert(&partners.client("old", 2021)), gw.proxy).await;
    // A chain longer than the verifier follows (webpki: at most 6 intermediates).
    let mut deep = partners.sub("sub 0");
    let mut intermediates = vec![deep.der.clone()];
    for i in 1..8 {
        deep = deep.sub(&format!("sub {i}"));
        intermediates.push(deep.der.clone());
    }
    let mut long = deep.client("deep", 2100);
    long.chain.truncate(1);
    long.chain.extend(intermediates.into_iter().rev());
    refused(&Client::with_cert(&long), gw.proxy).await;

    for (reason, n) in [
        ("client_cert_missing", 1.0),
        ("client_cert_unknown_ca", 1.0),
        ("client_cert_expired", 1.0),
        ("client_cert_invalid", 1.0),
    ] {
        assert_eq!(
            wait_metric(&gw, ERRORS, &[&format!("reason=\"{reason}\"")], n).await,
            n,
            "{reason}: {}",
            gw.metrics().await
        );
    }
    assert_eq!(
        wait_metric(&gw, ERRORS, &[], 4.0).await,
        4.0,
        "{}",
        gw.metrics().await
    );

    // The good client is served, on its open connection and on new ones.
    open.write_all(request).await.unwrap();
    assert!(read_head(&mut open).await.starts_with("HTTP/1.1 200"));
    let (res, _) = good.get(gw.proxy, "a.test", "/api/2").await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
}

#[tokio::test(flavor = "multi_thread")]
async fn optional_client_certificates_let_a_client_without_one_in() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let gw = gateway(&tls_config(
        &up,
        &(pair(&a) + &client_auth(dir.path(), &partners, "optional")),
    ));
    let (res, _) = Client::any().get(gw.proxy, "a.test", "/api/1").await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    let (res, _) = Client::with_cert(&partners.client("acme", 2100))
        .get(gw.proxy, "a.test", "/api/2")
        .await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    // One it sends must still be valid.
    let res = Client::with_cert(&ca("Other CA").client("acme", 2100))
        .get_result(gw.proxy, "a.test", "/api/3")
        .await;
    assert!(
        res.is_err() || !res.as_ref().unwrap().starts_with("HTTP/1.1 200"),
        "{res:?}"
    );
    assert_eq!(
        wait_metric(&gw, ERRORS, &["reason=\"client_cert_unknown_ca\""], 1.0).await,
        1.0
    );
    assert_eq!(up.hits(), 2);
}

// ---------------------------------------------------------------------------------------------
// Resumption under a changed `client_auth`, and revocation (#50 §8).
// ---------------------------------------------------------------------------------------------

impl Ca {
    /// This CA's CRL (PEM) revoking the leaves of `revoked`.
    fn crl(&self, revoked: &[&Identity]) -> String {
        let revoked_certs = revoked
            .iter()
            .map(|id| {
                let (_, leaf) = x509_parser::parse_x509_certificate(id.chain[0].as_ref()).unwrap();
                rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from_slice(leaf.raw_serial()),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                }
            })
            .collect();
        rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .unwrap()
        .pem()
        .unwrap()
    }
}

/// A client presenting `id` that remembers its sessions: tickets, or with `session_id_only`
/// TLS 1.2 session ids.
fn resuming_with_cert(
    id: &Identity,
    versions: &[&'static rustls::SupportedProtocolVersion],
    session_id_only: bool,
) -> Client {
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(AnyCert {
        schemes: all_schemes(),
    }))
    .with_client_auth_cert(
        id.chain.clone(),
        rustls::pki_types::PrivateKeyDer::try_from(id.key.clone()).unwrap(),
    )
    .unwrap();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    c.resumption = rustls::client::Resumption::in_memory_sessions(64);
    if session_id_only {
        c.resumption = c
            .resumption
            .tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
    }
    Client {
        config: Arc::new(c),
    }
}

async fn reload(gw: &Gateway) {
    let res = client()
        .post(gw.admin_url("/-/reload"))
        .send()
        .await
        .unwrap();
    let status = res.status();
    assert_eq!(status, 200, "{}", res.text().await.unwrap_or_default());
}

/// `tollgate check --config file`: whether it passed, and what it printed.
fn tollgate_check(file: &Path) -> (bool, String) {
    let out = std::process::Command::new(tollgate_bin())
        .args(["check", "--config"])
        .arg(file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

const TICKET_KEYS: &str = "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a7988\n";

/// #50 §8: a client whose CA is removed from `client_auth.ca` (and the gateway reloaded) does
/// not keep its access by resuming its session — TLS 1.3 tickets, TLS 1.2 tickets (from the
/// fleet's `ticket_key_file`, which outlives a reload) and TLS 1.2 session ids: the resumed
/// session's certificate is verified again under the current `client_auth`, the
/// `client_cert = "required"` route never answers and the upstream never sees its XFCC. The
/// check is in the TLS accept path, before either HTTP/1 front; both run it anyway.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_session_keeps_no_access_once_its_ca_is_removed() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let others = ca("Others CA");
    let keys = dir.path().join("tickets.key");
    std::fs::write(&keys, TICKET_KEYS).unwrap();
    let ca_file = dir.path().join("clients-ca.pem");
    let routes = route(
        "partners",
        "/partners",
        &up.url(),
        "client_cert = \"required\"\n",
    ) + &route("public", "/public", &up.url(), "");
    let acme = partners.client("acme", 2100);
    let tickets = format!("ticket_key_file = {:?}\n", keys.display().to_string());
    let cases: [(
        &str,
        &[&'static rustls::SupportedProtocolVersion],
        bool,
        &str,
    ); 3] = [
        (
            "TLS 1.3 tickets",
            &[&rustls::version::TLS13],
            false,
            &tickets,
        ),
        (
            "TLS 1.2 tickets",
            &[&rustls::version::TLS12],
            false,
            &tickets,
        ),
        (
            "TLS 1.2 session ids",
            &[&rustls::version::TLS12],
            true,
            "session_tickets = false\n",
        ),
    ];
    // Every case is tried; the leaks are reported together.
    let mut leaks = Vec::new();
    for front in ["fast", "hyper"] {
        for (case, versions, session_id_only, resumption) in cases {
            std::fs::write(&ca_file, partners.pem.clone() + &others.pem).unwrap();
            let tls = pair(&a)
                + resumption
                + &format!(
                    "[server.tls.client_auth]\nca = {:?}\nmode = \"optional\"\n",
                    ca_file.display().to_string()
                );
            let gw = gateway(&with_http1(&tls_routes(&routes, &tls), front));
            let c = resuming_with_cert(&acme, versions, session_id_only);
            let (res, kind) = c.get(gw.proxy, "a.test", "/partners/1").await;
            assert!(res.starts_with("HTTP/1.1 200"), "{front} {case}: {res}");
            assert_eq!(kind, rustls::HandshakeKind::Full, "{front} {case}");
            let (res, kind) = c.get(gw.proxy, "a.test", "/partners/2").await;
            assert!(res.starts_with("HTTP/1.1 200"), "{front} {case}: {res}");
            assert_eq!(kind, rustls::HandshakeKind::Resumed, "{front} {case}");
            let before = up.seen().len();

            // Partners CA removed.
            std::fs::write(&ca_file, &others.pem).unwrap();
            reload(&gw).await;
            let mut served = 0;
            for n in 3..5 {
                let res = c
                    .get_result(gw.proxy, "a.test", &format!("/partners/{n}"))
                    .await;
                if res.as_ref().is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                    served += 1;
                }
            }
            let forwarded = up.seen().split_off(before);
            if served > 0 || !forwarded.is_empty() {
                let xfcc = forwarded
                    .iter()
                    .filter(|r| r.headers.contains_key("x-forwarded-client-cert"))
                    .count();
                leaks.push(format!(
                    "{front} {case}: {served} of 2 served, {} forwarded ({xfcc} with XFCC)",
                    forwarded.len()
                ));
                continue;
            }
            assert!(
                wait_metric(&gw, ERRORS, &["reason=\"client_cert_unknown_ca\""], 2.0).await >= 1.0,
                "{front} {case}: {}",
                gw.metrics().await
            );
            // A client of a CA still listed still resumes.
            let other =
                resuming_with_cert(&others.client("globex", 2100), versions, session_id_only);
            let (res, _) = other.get(gw.proxy, "a.test", "/partners/5").await;
            assert!(res.starts_with("HTTP/1.1 200"), "{front} {case}: {res}");
            let (res, kind) = other.get(gw.proxy, "a.test", "/partners/6").await;
            assert!(res.starts_with("HTTP/1.1 200"), "{front} {case}: {res}");
            assert_eq!(kind, rustls::HandshakeKind::Resumed, "{front} {case}");
        }
    }
    assert!(
        leaks.is_empty(),
        "resumed sessions of a removed CA were served:\n{}",
        leaks.join("\n")
    );
}

/// #50 §8: a session made where no client certificate was asked for (no `client_auth`) does
/// not resume past `mode = "required"` once it is configured and reloaded: the listener's
/// demand holds for a resumed session too.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_without_a_certificate_does_not_resume_past_a_required_listener() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let keys = dir.path().join("tickets.key");
    std::fs::write(&keys, TICKET_KEYS).unwrap();
    let tls = pair(&a) + &format!("ticket_key_file = {:?}\n", keys.display().to_string());
    let text = tls_config(&up, &tls);
    let gw = gateway(&text);
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        gw.write_config(&text);
        reload(&gw).await;
        let c = resuming(versions);
        let (res, kind) = c.get(gw.proxy, "a.test", "/api/1").await;
        assert!(res.starts_with("HTTP/1.1 200"), "{versions:?}: {res}");
        assert_eq!(kind, rustls::HandshakeKind::Full);
        let (_, kind) = c.get(gw.proxy, "a.test", "/api/2").await;
        assert_eq!(kind, rustls::HandshakeKind::Resumed);
        gw.write_config(&text.replacen(
            "[admin]",
            &(client_auth(dir.path(), &partners, "required") + "[admin]"),
            1,
        ));
        reload(&gw).await;
        let before = up.hits();
        let res = c.get_result(gw.proxy, "a.test", "/api/3").await;
        assert!(
            res.as_ref()
                .map_or(true, |r| !r.starts_with("HTTP/1.1 200")),
            "{versions:?}: a resumed session without a certificate was served: {res:?}"
        );
        assert_eq!(up.hits(), before, "{versions:?}");
    }
}

/// #50 §8: `client_auth.crl`: a revoked client certificate is refused at the handshake (and
/// counted as `client_cert_revoked`), one not revoked is served; the CRL is re-read on reload,
/// and a session resumed after its certificate was revoked is refused too.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_client_certificate_is_refused_and_the_crl_reloads() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let acme = partners.client("acme", 2100);
    let globex = partners.client("globex", 2100);
    let stolen = partners.client("stolen", 2100);
    let crl = dir.path().join("partners.crl");
    std::fs::write(&crl, partners.crl(&[&stolen])).unwrap();
    let keys = dir.path().join("tickets.key");
    std::fs::write(&keys, TICKET_KEYS).unwrap();
    let tls = pair(&a)
        + &format!("ticket_key_file = {:?}\n", keys.display().to_string())
        + &client_auth(dir.path(), &partners, "required")
        + &format!("crl = [{:?}]\n", crl.display().to_string());
    let gw = gateway(&tls_config(&up, &tls));

    let (res, _) = Client::with_cert(&acme)
        .get(gw.proxy, "a.test", "/api/1")
        .await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    let res = Client::with_cert(&stolen)
        .get_result(gw.proxy, "a.test", "/api/2")
        .await;
    assert!(
        res.as_ref()
            .map_or(true, |r| !r.starts_with("HTTP/1.1 200")),
        "a revoked certificate was served: {res:?}"
    );
    assert_eq!(
        wait_metric(&gw, ERRORS, &["reason=\"client_cert_revoked\""], 1.0).await,
        1.0,
        "{}",
        gw.metrics().await
    );

    // acme holds a session (TLS 1.3 and 1.2 tickets) when it is revoked in turn.
    let t13 = resuming_with_cert(&acme, &[&rustls::version::TLS13], false);
    let t12 = resuming_with_cert(&acme, &[&rustls::version::TLS12], false);
    for c in [&t13, &t12] {
        let (res, kind) = c.get(gw.proxy, "a.test", "/api/3").await;
        assert!(res.starts_with("HTTP/1.1 200"), "{res}");
        assert_eq!(kind, rustls::HandshakeKind::Full);
    }
    std::fs::write(&crl, partners.crl(&[&stolen, &acme])).unwrap();
    reload(&gw).await;
    let before = up.hits();
    for c in [&t13, &t12, &Client::with_cert(&acme)] {
        let res = c.get_result(gw.proxy, "a.test", "/api/4").await;
        assert!(
            res.as_ref()
                .map_or(true, |r| !r.starts_with("HTTP/1.1 200")),
            "acme, revoked, was served: {res:?}"
        );
    }
    assert_eq!(up.hits(), before, "nothing of acme's forwarded");
    assert_eq!(
        wait_metric(&gw, ERRORS, &["reason=\"client_cert_revoked\""], 4.0).await,
        4.0,
        "{}",
        gw.metrics().await
    );
    let (res, _) = Client::with_cert(&globex)
        .get(gw.proxy, "a.test", "/api/5")
        .await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");

    // Un-revoked (a CRL without it) and reloaded: served again.
    std::fs::write(&crl, partners.crl(&[&stolen])).unwrap();
    reload(&gw).await;
    let (res, _) = Client::with_cert(&acme)
        .get(gw.proxy, "a.test", "/api/6")
        .await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
}

/// #50 §8: a CRL that is not one, or a CA of `client_auth.ca` with no CRL in `crl` (its
/// clients would all be refused: a CA's revocation status must be known), is a config error
/// naming `server.tls.client_auth.crl` — in `tollgate check` and on reload (the previous
/// configuration stays).
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_crl_is_a_config_error_naming_the_key() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let others = ca("Others CA");
    let crl = dir.path().join("partners.crl");
    let garbage = dir.path().join("garbage.crl");
    std::fs::write(
        &garbage,
        "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
    )
    .unwrap();
    std::fs::write(&crl, partners.crl(&[])).unwrap();
    let with = |ca_pem: String, crls: &[&Path]| {
        let ca_file = dir.path().join("clients-ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let list: Vec<String> = crls
            .iter()
            .map(|p| format!("{:?}", p.display().to_string()))
            .collect();
        tls_config(
            &up,
            &(pair(&a)
                + &format!(
                    "[server.tls.client_auth]\nca = {:?}\ncrl = [{}]\n",
                    ca_file.display().to_string(),
                    list.join(", ")
                )),
        )
    };
    let file = dir.path().join("gateway.toml");
    for (text, what) in [
        (with(partners.pem.clone(), &[&garbage]), "garbage.crl"),
        (
            with(partners.pem.clone(), &[&dir.path().join("missing.crl")]),
            "missing.crl",
        ),
        (
            with(partners.pem.clone() + &others.pem, &[&crl]),
            "Others CA",
        ),
    ] {
        std::fs::write(&file, &text).unwrap();
        let (ok, out) = tollgate_check(&file);
        assert!(!ok, "{what}: {out}");
        assert!(
            out.contains("server.tls.client_auth.crl") && out.contains(what),
            "{what}: {out}"
        );
    }
    let good = with(partners.pem.clone(), &[&crl]);
    std::fs::write(&file, &good).unwrap();
    let (ok, out) = tollgate_check(&file);
    assert!(ok, "{out}");
    // On reload: refused, naming the key; the running configuration stays.
    let gw = gateway(&good);
    gw.write_config(&with(partners.pem.clone(), &[&garbage]));
    let res = client()
        .post(gw.admin_url("/-/reload"))
        .send()
        .await
        .unwrap();
    let status = res.status();
    let body = res.text().await.unwrap();
    assert_ne!(status, 200, "{body}");
    assert!(body.contains("server.tls.client_auth.crl"), "{body}");
    let (res, _) = Client::with_cert(&partners.client("acme", 2100))
        .get(gw.proxy, "a.test", "/api/1")
        .await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
}

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn oversized_or_malformed_client_hellos_are_refused_and_counted() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let gw = gateway(&tls_config(&up, &pair(&a)));
    let c = Client::any();
    let mut open = c.connect(gw.proxy, Some("a.test")).await.unwrap();

    // A ClientHello that says it is 1 MiB long (rustls takes at most 64 KiB of handshake).
    let mut oversized = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x10, 0x00, 0x00];
    oversized.resize(5 + 0x4000, 0);
    // A ClientHello whose body is garbage.
    let malformed = [
        0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x04, 0xff, 0xff, 0xff, 0xff,
    ];
    for bytes in [&oversized[..], &malformed[..]] {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        let _ = s.write_all(bytes).await;
        let mut buf = [0u8; 256];
        // The gateway answers with an alert (or nothing) and closes.
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection was left open");
    }
    assert_eq!(
        wait_metric(&gw, ERRORS, &["reason=\"malformed\""], 2.0).await,
        2.0,
        "{}",
        gw.metrics().await
    );
    // The open connection is unaffected.
    open.write_all(b"GET /api/1 HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    assert!(read_head(&mut open).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_certificate_is_forwarded_in_xfcc_and_a_clients_own_is_stripped() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let gw = gateway(&tls_config(
        &up,
        &(pair(&a) + &client_auth(dir.path(), &partners, "optional")),
    ));
    let acme = partners.client("acme", 2100);
    let hash: String = {
        use sha2::Digest;
        sha2::Sha256::digest(acme.chain[0].as_ref())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let forged = "Hash=0000;Subject=\"CN=root\"";
    let send = |c: Client| {
        let addr = gw.proxy;
        async move {
            let mut s = c.connect(addr, Some("a.test")).await.unwrap();
            s.write_all(
                format!("GET /api/x HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-Client-Cert: {forged}\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
            let res = read_head(&mut s).await;
            assert!(res.starts_with("HTTP/1.1 200"), "{res}");
        }
    };
    send(Client::with_cert(&acme)).await;
    send(Client::any()).await;
    // A plain listener strips it too.
    let plain = gateway(&with_front(&config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
    )));
    let res = client()
        .get(plain.url("/api/plain"))
        .header("x-forwarded-client-cert", forged)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    let xfcc = seen[0]
        .headers
        .get("x-forwarded-client-cert")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert!(
        xfcc.starts_with(&format!("Hash={hash};Subject=\"CN=acme"))
            && xfcc.contains(";DNS=acme.clients.test"),
        "{xfcc}"
    );
    assert!(!xfcc.contains(forged));
    assert_eq!(
        seen[1].headers.get("x-forwarded-client-cert"),
        None,
        "no certificate: no header"
    );
    assert_eq!(
        seen[2].headers.get("x-forwarded-client-cert"),
        None,
        "plain: no header"
    );
}

/// #36 §3: the client certificate's facts as subject parts, on both HTTP/1 fronts: one budget
/// per certificate (`tls:fingerprint`), one per SPIFFE ID (`tls:san_uri`, shared by two
/// certificates naming the same workload), and a request without a certificate counted by its
/// address in the part's place (`on_missing = "ip"`, as for an absent header).
async fn client_certificates_are_subjects_on_both_fronts(kind: Kind) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let limits = limit(
        "name = \"per-cert\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"tls:fingerprint\"",
    );
    let spiffe = limit(
        "name = \"per-workload\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"tls:san_uri\"",
    );
    let routes =
        route("api", "/api", &up.url(), &limits) + &route("svc", "/svc", &up.url(), &spiffe);
    for front in ["fast", "hyper"] {
        // A store of its own per front: the second gateway starts with no counts.
        let env = store_env(kind);
        let tls = pair(&a) + &client_auth(dir.path(), &partners, "optional");
        let text = with_http1(&tls_routes_on(&env.store, &routes, &tls), front);
        let gw = gateway(&text);
        wait_ready(&gw).await;
        let status = |c: Client, path: &'static str| {
            let addr = gw.proxy;
            async move {
                let (res, _) = c.get(addr, "a.test", path).await;
                res.get(9..12).unwrap_or_default().to_owned()
            }
        };
        let acme = partners.client("acme", 2100);
        let globex = partners.client("globex", 2100);
        // Each certificate has its own budget of one.
        assert_eq!(
            status(Client::with_cert(&acme), "/api/1").await,
            "200",
            "{front}"
        );
        assert_eq!(
            status(Client::with_cert(&acme), "/api/2").await,
            "429",
            "{front}"
        );
        assert_eq!(
            status(Client::with_cert(&globex), "/api/3").await,
            "200",
            "{front}"
        );
        // No certificate: the address in the part's place, a budget of its own.
        assert_eq!(status(Client::any(), "/api/4").await, "200", "{front}");
        assert_eq!(status(Client::any(), "/api/5").await, "429", "{front}");
        // Two certificates of one SPIFFE ID share its budget; another ID has its own.
        let w1 = partners.spiffe("w1", "spiffe://example.org/billing");
        let w2 = partners.spiffe("w2", "spiffe://example.org/billing");
        let w3 = partners.spiffe("w3", "spiffe://example.org/search");
        assert_eq!(
            status(Client::with_cert(&w1), "/svc/1").await,
            "200",
            "{front}"
        );
        assert_eq!(
            status(Client::with_cert(&w2), "/svc/2").await,
            "429",
            "{front}"
        );
        assert_eq!(
            status(Client::with_cert(&w3), "/svc/3").await,
            "200",
            "{front}"
        );
    }
    assert_eq!(up.hits(), 10);
}

/// #36 §3: a route's `client_cert = "required"` on an `"optional"` listener, on both HTTP/1
/// fronts: a request without a certificate gets 403 problem+json before the limits (not
/// charged) and the upstream; one with a certificate is served; the listener's other routes
/// serve a client without one.
async fn a_route_can_demand_a_client_certificate_on_an_optional_listener(kind: Kind) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let one = limit(
        "name = \"one\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"",
    );
    let routes = route(
        "partners",
        "/partners",
        &up.url(),
        &format!("client_cert = \"required\"\n{one}"),
    ) + &route("public", "/public", &up.url(), "");
    for front in ["fast", "hyper"] {
        let env = store_env(kind);
        let tls = pair(&a) + &client_auth(dir.path(), &partners, "optional");
        let text = with_http1(&tls_routes_on(&env.store, &routes, &tls), front);
        let gw = gateway(&text);
        wait_ready(&gw).await;
        let before = up.hits();
        let (res, _) = Client::any().get(gw.proxy, "a.test", "/partners/1").await;
        assert!(res.starts_with("HTTP/1.1 403"), "{front}: {res}");
        assert!(
            res.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{front}: {res}"
        );
        assert!(res.contains("client certificate"), "{front}: {res}");
        assert_eq!(up.hits(), before, "{front}: not forwarded");
        // Not charged: the one request the limit allows is still there.
        let acme = partners.client("acme", 2100);
        let (res, _) = Client::with_cert(&acme)
            .get(gw.proxy, "a.test", "/partners/2")
            .await;
        assert!(res.starts_with("HTTP/1.1 200"), "{front}: {res}");
        let (res, _) = Client::with_cert(&acme)
            .get(gw.proxy, "a.test", "/partners/3")
            .await;
        assert!(res.starts_with("HTTP/1.1 429"), "{front}: {res}");
        // Another route of the listener serves a client without one.
        let (res, _) = Client::any().get(gw.proxy, "a.test", "/public/1").await;
        assert!(res.starts_with("HTTP/1.1 200"), "{front}: {res}");
        assert_eq!(up.hits(), before + 2, "{front}");
    }
}

// ---------------------------------------------------------------------------------------------
// Consumers by client certificate (`cert_sha256`).
// ---------------------------------------------------------------------------------------------

/// The SHA-256 of a leaf as `openssl x509 -fingerprint -sha256` prints it: upper case, pairs
/// separated by `:` (the consumers file accepts it as well as plain hex).
fn openssl_fingerprint(der: &[u8]) -> String {
    let h = hex(&hash_key(der)).to_uppercase();
    h.as_bytes()
        .chunks(2)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

/// `[consumers]` reading `X-Api-Key`, the consumers file `file`, unknown or missing keys on the
/// plan `anon`; plans `gold` (2 an hour), `free` (1) and `anon` (2, per address); one route.
fn consumer_routes(file: &Path, up: &Upstream) -> String {
    let hourly = |n: u32| {
        format!("[[plans.limits]]\nname = \"hourly\"\nalgorithm = \"fixed_window\"\nlimit = {n}\nperiod = \"1h\"\n")
    };
    format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = {:?}\non_unknown = \"anon\"\n\n\
         [[plans]]\nname = \"gold\"\n{}[[plans]]\nname = \"free\"\n{}[[plans]]\nname = \"anon\"\n{}\n",
        file.display().to_string(),
        hourly(2),
        hourly(1),
        hourly(2),
    ) + &route("api", "/api", &up.url(), "consumers = true")
}

/// #36 §3: consumers found by their client certificate's SHA-256 (`cert_sha256`), on both
/// HTTP/1 fronts: each gets its plan's limit and is named upstream (`X-Consumer`); a key sent
/// with a certificate decides (known: its consumer; unknown: an unknown key), the certificate
/// is not consulted; a certificate of no consumer without a key is as a request without a key
/// (`on_unknown`'s plan, per address, no `X-Consumer`); a reload picks up a new fingerprint.
async fn consumers_are_recognised_by_their_client_certificate(kind: Kind) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let partners = ca("Partners CA");
    let acme = partners.client("acme", 2100);
    let globex = partners.client("globex", 2100);
    let stranger = partners.client("stranger", 2100);
    let file = dir.path().join("consumers.toml");
    let consumers = |extra: &str| {
        format!(
            "[[consumer]]\nname = \"acme\"\nplan = \"gold\"\ncert_sha256 = \"{}\"\n\n\
             [[consumer]]\nname = \"globex\"\nplan = \"free\"\ncert_sha256 = \"{}\"\n\n\
             [[consumer]]\nname = \"keyed\"\nplan = \"gold\"\nkey_sha256 = \"{}\"\n\n{extra}",
            openssl_fingerprint(&acme.chain[0]),
            hex(&hash_key(&globex.chain[0])),
            hex(&hash_key(b"k1")),
        )
    };
    for front in ["fast", "hyper"] {
        std::fs::write(&file, consumers("")).unwrap();
        let env = store_env(kind);
        let tls = pair(&a) + &client_auth(dir.path(), &partners, "optional");
        let text = with_http1(
            &tls_routes_on(&env.store, &consumer_routes(&file, &up), &tls),
            front,
        );
        let gw = gateway(&text);
        wait_ready(&gw).await;
        let ask = |id: Option<&Identity>, fields: &'static str| {
            let c = id.map_or_else(Client::any, Client::with_cert);
            let addr = gw.proxy;
            let up = &up;
            async move {
                let before = up.hits();
                let (res, _) = c.get_with(addr, "a.test", "/api/x", fields).await;
                let status = res.get(9..12).unwrap_or_default().to_owned();
                // The consumer the upstream was told of ("-": none; "": not forwarded).
                let told = if up.hits() > before {
                    up.seen()
                        .last()
                        .unwrap()
                        .headers
                        .get("x-consumer")
                        .map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned())
                } else {
                    String::new()
                };
                (status, told)
            }
        };
        let r = |s: &str, t: &str| (s.to_owned(), t.to_owned());
        // A key no consumer has, with acme's certificate: the key decides (an unknown key:
        // the anonymous plan), not the certificate.
        assert_eq!(
            ask(Some(&acme), "X-Api-Key: nope\r\n").await,
            r("200", "-"),
            "{front}"
        );
        // acme by its certificate (the colon form in the file): gold, 2 an hour.
        assert_eq!(ask(Some(&acme), "").await, r("200", "acme"), "{front}");
        assert_eq!(ask(Some(&acme), "").await, r("200", "acme"), "{front}");
        assert_eq!(ask(Some(&acme), "").await, r("429", ""), "{front}");
        // `/-/explain` asked with the certificate's fingerprint finds acme and its spent plan.
        let q = format!(
            "/-/explain?path=/api/x&host=a.test&ip=127.0.0.1&cert_sha256={}",
            openssl_fingerprint(&acme.chain[0])
        );
        let v: serde_json::Value = client()
            .get(gw.admin_url(&q))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["consumer"], "acme", "{front}: {v}");
        assert_eq!(v["status"], 429, "{front}: {v}");
        assert_eq!(v["limits"][0]["plan"], "gold", "{front}: {v}");
        // globex (plain hex): free, 1 an hour; its own budget, not acme's.
        assert_eq!(ask(Some(&globex), "").await, r("200", "globex"), "{front}");
        assert_eq!(ask(Some(&globex), "").await, r("429", ""), "{front}");
        // A known key with globex's (spent) certificate: the key's consumer.
        assert_eq!(
            ask(Some(&globex), "X-Api-Key: k1\r\n").await,
            r("200", "keyed"),
            "{front}"
        );
        // A certificate of no consumer, no key: anonymous, per address (the unknown key above
        // spent one of the two).
        assert_eq!(ask(Some(&stranger), "").await, r("200", "-"), "{front}");
        assert_eq!(ask(None, "").await, r("429", ""), "{front}");
        // A reload gives the stranger's certificate to a new consumer.
        std::fs::write(
            &file,
            consumers(&format!(
                "[[consumer]]\nname = \"newco\"\nplan = \"gold\"\ncert_sha256 = \"{}\"\n",
                hex(&hash_key(&stranger.chain[0]))
            )),
        )
        .unwrap();
        let res = client()
            .post(gw.admin_url("/-/reload"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{front}");
        assert_eq!(ask(Some(&stranger), "").await, r("200", "newco"), "{front}");
        assert_eq!(metric(&gw.metrics().await, "tollgate_consumers"), Some(4.0));
    }
}

/// #36 §3: a fingerprint given to two consumers is a config error naming the line (at start,
/// in `tollgate check`), as is one that is not a SHA-256.
#[tokio::test(flavor = "multi_thread")]
async fn a_fingerprint_of_two_consumers_is_an_error_naming_the_line() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ecdsa(dir.path(), "a", &["a.test"], None);
    let file = dir.path().join("consumers.toml");
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, tls_routes(&consumer_routes(&file, &up), &pair(&a))).unwrap();
    let fp = hex(&hash_key(b"a certificate"));
    for (second, says) in [
        (
            fp.to_uppercase(),
            "line 9: consumer \"globex\" has the same cert_sha256 as consumer \"acme\"",
        ),
        (
            fp[..60].to_owned(),
            "line 9: consumer \"globex\": cert_sha256 must be",
        ),
    ] {
        std::fs::write(
            &file,
            format!(
                "[[consumer]]\nname = \"acme\"\nplan = \"gold\"\ncert_sha256 = \"{fp}\"\n\n\
                 [[consumer]]\nname = \"globex\"\nplan = \"free\"\ncert_sha256 = \"{second}\"\n"
            ),
        )
        .unwrap();
        let out = std::process::Command::new(tollgate_bin())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(text.contains(says), "{says}: {text}");
    }
}
