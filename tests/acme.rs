//! `[server.tls.acme]` through the binary against a real ACME server: Debian's `pebble` (with
//! `pebble-challtestsrv` as its DNS, every name resolving to 127.0.0.1), on free ports, its
//! HTTPS certificate made here and trusted through `ca`. Pebble validates for real: it fetches
//! the HTTP-01 token from the gateway's plain listener, or opens a TLS-ALPN-01 handshake to its
//! TLS listener. A first order (a verifying client then trusts what the gateway serves), a
//! restart reusing `storage` without ordering, TLS-ALPN-01, a renewal (pebble's short-lived
//! certificates), pebble refusing an order (the old certificate keeps serving), two gateways
//! sharing `storage` ordering once, and a directory that is down, silent or talks garbage.
//!
//! `scripts/test` installs pebble; run elsewhere without it, the pebble tests say so loudly
//! and pass (the directory-failure test needs no pebble and always runs).

#[path = "support/any_cert.rs"]
mod any_cert;
mod support;
use any_cert::{all_schemes, AnyCert};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use support::*;

// ---------------------------------------------------------------------------------------------
// Pebble.
// ---------------------------------------------------------------------------------------------

/// Whether pebble is installed; when not, panics under `scripts/test` (which installs it) and
/// otherwise says loudly that the test is skipped.
fn have_pebble(test: &str) -> bool {
    let found = Command::new("pebble").arg("-h").output().is_ok()
        && Command::new("pebble-challtestsrv")
            .arg("-h")
            .output()
            .is_ok();
    if found {
        return true;
    }
    if std::env::var_os("TOLLGATE_TEST_SCRIPT").is_some() {
        panic!("pebble is not installed, yet scripts/test should have installed it (apt-get install -y pebble)");
    }
    eprintln!(
        "\n!!!!! SKIPPED {test}: pebble is not installed (apt-get install -y pebble, or run \
         scripts/test, which installs it) !!!!!\n"
    );
    false
}

struct Pebble {
    /// The directory URL.
    directory: String,
    /// The PEM the gateway trusts for the directory (`ca`).
    ca: PathBuf,
    mgmt: SocketAddr,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What pebble is told beyond its listeners.
#[derive(Default)]
struct PebbleOpts {
    /// The port it validates HTTP-01 on (the gateway's plain listener).
    http_port: u16,
    /// The port it validates TLS-ALPN-01 on (the gateway's TLS listener).
    tls_port: u16,
    /// `certificateValidityPeriod`, seconds.
    validity: Option<u64>,
    /// Names it refuses to issue for.
    blocklist: Vec<&'static str>,
}

async fn wait_listening(addr: SocketAddr, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(addr).await.is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited: {status}");
        }
        assert!(Instant::now() < deadline, "{what} never listened on {addr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Pebble {
    async fn start(o: PebbleOpts) -> Pebble {
        let dir = tempfile::tempdir().unwrap();
        // The directory's own HTTPS certificate, from a CA of ours.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "pebble directory test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let cert = params.signed_by(&key, &issuer).unwrap();
        let ca = dir.path().join("directory-ca.pem");
        std::fs::write(&ca, ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();

        let (listen, mgmt, dns, dns_mgmt) = (free_port(), free_port(), free_port(), free_port());
        let mut pebble = serde_json::json!({
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{mgmt}"),
            "certificate": dir.path().join("cert.pem"),
            "privateKey": dir.path().join("key.pem"),
            "httpPort": o.http_port,
            "tlsPort": o.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "domainBlocklist": o.blocklist,
        });
        if let Some(v) = o.validity {
            pebble["certificateValidityPeriod"] = v.into();
        }
        let config = dir.path().join("pebble.json");
        std::fs::write(
            &config,
            serde_json::to_string(&serde_json::json!({ "pebble": pebble })).unwrap(),
        )
        .unwrap();

        let mut dns_srv = Command::new("pebble-challtestsrv")
            .args(["-dns01", &format!("127.0.0.1:{dns}")])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &format!("127.0.0.1:{dns_mgmt}")])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv");
        wait_listening(
            format!("127.0.0.1:{dns_mgmt}").parse().unwrap(),
            "pebble-challtestsrv",
            &mut dns_srv,
        )
        .await;
        let mut srv = Command::new("pebble")
            .arg("-config")
            .arg(&config)
            .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble");
        wait_listening(
            format!("127.0.0.1:{listen}").parse().unwrap(),
            "pebble",
            &mut srv,
        )
        .await;
        Pebble {
            directory: format!("https://127.0.0.1:{listen}/dir"),
            ca,
            mgmt: format!("127.0.0.1:{mgmt}").parse().unwrap(),
            children: vec![dns_srv, srv],
            _dir: dir,
        }
    }

    /// Pebble's issuing root (regenerated at each start), from its management interface.
    async fn root(&self) -> String {
        let ca = std::fs::read(&self.ca).unwrap();
        let c = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap();
        c.get(format!("https://{}/roots/0", self.mgmt))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// The gateway and a client.
// ---------------------------------------------------------------------------------------------

struct Ports {
    tls: u16,
    plain: u16,
}

fn ports() -> Ports {
    Ports {
        tls: free_port(),
        plain: free_port(),
    }
}

/// A gateway proxying `/` to `up` on TLS port `p.tls`, with `acme` as the body of
/// `[server.tls.acme]` and `tls` as more `[server.tls]` lines (before it); HTTP-01 needs the
/// plain listener, which is on `p.plain`.
fn acme_config(p: &Ports, up: &str, tls: &str, acme: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{}\"\nhttp_redirect_listen = \"127.0.0.1:{}\"\n\n\
         [server.tls]\n{tls}\n[server.tls.acme]\n{acme}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\nbackend = \"memory\"\n\n{}",
        p.tls,
        p.plain,
        route("all", "/", up, "")
    )
}

fn acme_body(pebble: &Pebble, storage: &Path, names: &[&str], challenge: &str) -> String {
    format!(
        "directory = \"{}\"\nca = \"{}\"\nstorage = \"{}\"\nnames = {names:?}\nchallenge = \"{challenge}\"\ncontact = [\"mailto:ops@example.test\"]\n",
        pebble.directory,
        pebble.ca.display(),
        storage.display(),
    )
}

/// The leaf the gateway serves for `sni`, or `None` when the handshake fails.
async fn leaf(addr: SocketAddr, sni: &str) -> Option<Vec<u8>> {
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(AnyCert {
        schemes: all_schemes(),
    }))
    .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.ok()?;
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(c))
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .ok()?;
    let der = s.get_ref().1.peer_certificates()?.first()?.to_vec();
    let _ = s.shutdown().await;
    Some(der)
}

/// The leaf's issuer (the CN), to tell pebble's certificates from others.
fn issuer_cn(der: &[u8]) -> String {
    let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
    c.issuer().to_string()
}

fn serial(der: &[u8]) -> String {
    let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
    c.raw_serial_as_string()
}

fn orders(text: &str, result: &str) -> f64 {
    metric(
        text,
        &format!("tollgate_acme_orders_total{{result=\"{result}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Waits (up to `secs`) until `tollgate_acme_orders_total{result}` reaches `n`.
async fn wait_orders(gw: &Gateway, result: &str, n: f64, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let m = gw.metrics().await;
        if orders(&m, result) >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {n} ACME orders {result} after {secs} s: {m}\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET https://name:port/` with a client that trusts only `root_pem`.
async fn verified_get(root_pem: &str, name: &str, addr: SocketAddr) -> Result<u16, String> {
    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(root_pem.as_bytes()).unwrap())
        .resolve(name, addr)
        .build()
        .unwrap();
    c.get(format!("https://{name}:{}/", addr.port()))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// An upstream, pebble validating on fresh ports, a storage directory and the gateway config
/// ordering `names` with `challenge` (the gateway is not started).
struct Setup {
    _up: Upstream,
    pebble: Pebble,
    storage: PathBuf,
    config: String,
    _dir: tempfile::TempDir,
}

async fn setup(mut o: PebbleOpts, names: &[&str], challenge: &str) -> Setup {
    let up = upstream().await;
    let p = ports();
    o.http_port = p.plain;
    o.tls_port = p.tls;
    let pebble = Pebble::start(o).await;
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("acme");
    let config = acme_config(
        &p,
        &up.url(),
        "",
        &acme_body(&pebble, &storage, names, challenge),
    );
    Setup {
        _up: up,
        pebble,
        storage,
        config,
        _dir: dir,
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn http01_first_order_is_trusted_and_a_restart_reuses_storage_without_ordering() {
    if !have_pebble("http01_first_order…") {
        return;
    }
    let s = setup(PebbleOpts::default(), &["api.acme.test"], "http-01").await;
    let (pebble, storage, config) = (&s.pebble, &s.storage, &s.config);
    let gw = gateway(config);
    // The gateway serves at once; the order runs in the background.
    wait_ready(&gw).await;
    wait_orders(&gw, "issued", 1.0, 60).await;
    let root = pebble.root().await;
    assert_eq!(
        verified_get(&root, "api.acme.test", gw.proxy).await,
        Ok(200),
        "a client trusting only pebble's root accepts the certificate for the name"
    );
    assert!(gw.logged("ACME certificate installed").await);
    assert!(storage.join("api.acme.test.pem").exists());
    assert!(storage.join("account.json").exists());
    assert!(
        !storage.join("api.acme.test.lock").exists(),
        "lock released"
    );
    let first = leaf(gw.proxy, "api.acme.test").await.unwrap();
    let m = gw.metrics().await;
    assert_eq!(orders(&m, "failed"), 0.0, "{}", gw.logs());
    assert!(
        metric(
            &m,
            "tollgate_tls_certificate_expiry_seconds{name=\"api.acme.test\"}"
        )
        .is_some(),
        "{m}"
    );
    drop(gw);

    // A restart: the stored certificate serves at once, nothing is ordered.
    let gw = gateway(config);
    wait_ready(&gw).await;
    assert!(gw.logged("ACME certificate loaded from storage").await);
    assert_eq!(
        leaf(gw.proxy, "api.acme.test").await.as_deref(),
        Some(&first[..])
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = gw.metrics().await;
    assert_eq!(
        orders(&m, "issued") + orders(&m, "renewed") + orders(&m, "failed"),
        0.0,
        "{m}"
    );
    assert!(
        !gw.logs().contains("ordering an ACME certificate"),
        "{}",
        gw.logs()
    );
}

#[tokio::test]
async fn tls_alpn01_is_answered_on_the_tls_listener() {
    if !have_pebble("tls_alpn01…") {
        return;
    }
    let s = setup(PebbleOpts::default(), &["alpn.acme.test"], "tls-alpn-01").await;
    let (pebble, config) = (&s.pebble, &s.config);
    let gw = gateway(config);
    wait_orders(&gw, "issued", 1.0, 60).await;
    let root = pebble.root().await;
    assert_eq!(
        verified_get(&root, "alpn.acme.test", gw.proxy).await,
        Ok(200)
    );
    assert!(!gw.logs().contains("ACME order failed"), "{}", gw.logs());
}

#[tokio::test]
async fn a_certificate_is_renewed_at_two_thirds_of_its_life() {
    if !have_pebble("renewal") {
        return;
    }
    // 12 s certificates: due 8 s after their notBefore.
    let opts = PebbleOpts {
        validity: Some(12),
        ..PebbleOpts::default()
    };
    let s = setup(opts, &["renew.acme.test"], "http-01").await;
    let config = &s.config;
    let gw = gateway(config);
    wait_orders(&gw, "issued", 1.0, 60).await;
    let first = leaf(gw.proxy, "renew.acme.test").await.unwrap();
    wait_orders(&gw, "renewed", 1.0, 60).await;
    let second = leaf(gw.proxy, "renew.acme.test").await.unwrap();
    assert_ne!(
        serial(&first),
        serial(&second),
        "the renewed certificate serves"
    );
}

#[tokio::test]
async fn a_refused_order_is_counted_and_the_old_certificate_keeps_serving() {
    if !have_pebble("refusal") {
        return;
    }
    let opts = PebbleOpts {
        blocklist: vec!["blocked.acme.test"],
        ..PebbleOpts::default()
    };
    let s = setup(opts, &["blocked.acme.test"], "http-01").await;
    let (storage, config) = (&s.storage, &s.config);
    std::fs::create_dir_all(storage).unwrap();
    // A stored certificate past two thirds of its life (issued 29 days ago, 1 day left): due.
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["blocked.acme.test".to_owned()]).unwrap();
    let now = time_now();
    params.not_before = now - time::Duration::days(29);
    params.not_after = now + time::Duration::days(1);
    let old = params.self_signed(&key).unwrap();
    std::fs::write(
        storage.join("blocked.acme.test.pem"),
        format!("{}{}", key.serialize_pem(), old.pem()),
    )
    .unwrap();
    let gw = gateway(config);
    wait_orders(&gw, "failed", 1.0, 60).await;
    assert_eq!(
        leaf(gw.proxy, "blocked.acme.test").await.as_deref(),
        Some(old.der().as_ref()),
        "the old certificate keeps serving"
    );
    let m = gw.metrics().await;
    assert_eq!(orders(&m, "renewed") + orders(&m, "issued"), 0.0, "{m}");
    assert!(gw.logged("ACME order failed").await);
    assert!(
        !storage.join("blocked.acme.test.lock").exists(),
        "lock released"
    );
}

#[tokio::test]
async fn two_gateways_sharing_storage_order_once() {
    if !have_pebble("fleet") {
        return;
    }
    let up = upstream().await;
    let (a, b) = (ports(), ports());
    // Pebble validates on one port, `a`'s: `b` starts once `a` holds the lock (it logs that it
    // orders), so `b` must wait for `a`'s certificate rather than order (and fail) itself.
    let pebble = Pebble::start(PebbleOpts {
        http_port: a.plain,
        tls_port: a.tls,
        ..PebbleOpts::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("acme");
    let body = acme_body(&pebble, &storage, &["fleet.acme.test"], "http-01");
    let gw_a = gateway(&acme_config(&a, &up.url(), "", &body));
    assert!(gw_a.logged("ordering an ACME certificate").await);
    let gw_b = gateway(&acme_config(&b, &up.url(), "", &body));
    wait_orders(&gw_a, "issued", 1.0, 60).await;
    // `b` found the lock taken (or the certificate stored) and serves what `a` stored.
    let deadline = Instant::now() + Duration::from_secs(15);
    let want = leaf(gw_a.proxy, "fleet.acme.test").await.unwrap();
    loop {
        if leaf(gw_b.proxy, "fleet.acme.test").await.as_deref() == Some(&want[..]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b never served a's certificate: {}",
            gw_b.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = gw_b.metrics().await;
    assert_eq!(
        orders(&m, "issued") + orders(&m, "failed"),
        0.0,
        "{m}\n{}",
        gw_b.logs()
    );
    assert!(
        issuer_cn(&want).to_lowercase().contains("pebble"),
        "{}",
        issuer_cn(&want)
    );
}

/// A directory on a closed port, one that accepts and never answers, one that answers bytes
/// that are not TLS: the gateway serves its configured certificate throughout, and counts the
/// failures it can see.
#[tokio::test]
async fn a_directory_down_silent_or_garbage_never_stops_serving() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    // The default certificate.
    let key = rcgen::KeyPair::generate().unwrap();
    let c = rcgen::CertificateParams::new(vec!["www.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("d.pem"), c.pem()).unwrap();
    std::fs::write(dir.path().join("d.key"), key.serialize_pem()).unwrap();
    let tls = format!(
        "cert = \"{}\"\nkey = \"{}\"\n",
        dir.path().join("d.pem").display(),
        dir.path().join("d.key").display()
    );
    let closed = free_port();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_port = garbage.local_addr().unwrap().port();
    let _garbage = tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\n\r\n{not json, not TLS\x00\xff")
                .await;
        }
    });
    for (what, port, counted) in [
        ("down", closed, true),
        ("silent", silent_port, false),
        ("garbage", garbage_port, true),
    ] {
        let p = ports();
        let acme = format!(
            "directory = \"https://127.0.0.1:{port}/dir\"\nstorage = \"{}\"\nnames = [\"x.acme.test\"]\n",
            dir.path().join(what).display()
        );
        let gw = gateway(&acme_config(&p, &up.url(), &tls, &acme));
        let proxy = gw.proxy;
        for _ in 0..3 {
            let got = leaf(proxy, "x.acme.test").await;
            assert_eq!(
                got.as_deref(),
                Some(c.der().as_ref()),
                "{what}: the default certificate serves"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if counted {
            wait_orders(&gw, "failed", 1.0, 30).await;
        }
        let plain = format!("http://127.0.0.1:{}/x", p.plain);
        let no_redirect = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let res = no_redirect.get(&plain).send().await.unwrap();
        assert_eq!(res.status(), 308, "{what}: the plain listener redirects");
        let token = format!(
            "http://127.0.0.1:{}/.well-known/acme-challenge/unknown",
            p.plain
        );
        let res = no_redirect.get(&token).send().await.unwrap();
        assert_eq!(res.status(), 404, "{what}: no such token");
        assert!(leaf(proxy, "www.test").await.is_some(), "{what}");
    }
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}
