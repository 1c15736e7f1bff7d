//! Reloads through the real binary: reloads that overlap (SIGHUP and `POST /-/reload`, or two
//! posts) run one after another and the last one requested is what serves, many reloads at once
//! of a large config build one at a time and give their memory back, and a replaced snapshot
//! is dropped once its last request ends.

mod support;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;
use tollgate::consumers::{hash_key, hex};

on_every_store!(overlapping_reloads_serve_the_last_one_requested);

/// A consumers file: `(name, key)` entries, all on plan `free`, then `filler` more consumers
/// whose keys nobody knows.
fn consumers_text(consumers: &[(&str, &str)], filler: usize) -> String {
    let mut text = String::with_capacity(80 * (consumers.len() + filler));
    for (name, key) in consumers {
        text.push_str(&format!(
            "[[consumer]]\nname = \"{name}\"\nplan = \"free\"\nkey_sha256 = \"{}\"\n\n",
            hex(&hash_key(key.as_bytes()))
        ));
    }
    for i in 0..filler {
        text.push_str(&format!(
            "[[consumer]]\nname = \"filler-{i}\"\nplan = \"free\"\nkey_sha256 = \"{i:064x}\"\n\n"
        ));
    }
    text
}

/// A route `/api` that needs a consumer (`X-Api-Key`, read from `file`) on `store`.
fn consumers_config(store: &str, file: &Path, up: &Upstream) -> String {
    let top = format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = {:?}\n\n[[plans]]\nname = \"free\"\n[[plans.limits]]\nname = \"per-hour\"\nalgorithm = \"fixed_window\"\nlimit = 1000000\nperiod = \"1h\"\n\n",
        file.display().to_string()
    );
    config(
        store,
        &(top + &route("api", "/api", &up.url(), "consumers = true")),
    )
}

async fn status_with_key(c: &reqwest::Client, gw: &Gateway, key: &str) -> u16 {
    c.get(gw.url("/api/x"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn post_reload(c: reqwest::Client, url: String) -> (u16, Value) {
    let res = c.post(url).send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// Opens the FIFO at `path` for writing once a reader has it open (a reload reading it).
async fn fifo_writer(path: &Path) -> std::fs::File {
    use rustix::fs::{Mode, OFlags};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rustix::fs::open(
            path,
            OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => return std::fs::File::from(fd),
            // No reader yet.
            Err(rustix::io::Errno::NXIO) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("no reload opened the consumers file within 10 s: {e}"),
        }
    }
}

async fn wait_reloads(gw: &Gateway, result: &str, want: f64) {
    let name = format!("tollgate_config_reloads_total{{result=\"{result}\"}}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = metric(&gw.metrics().await, &name).unwrap_or(0.0);
        if got >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is {got}, not {want}: {}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A consumer is revoked while a reload is still reading the old consumers file: the reload
/// requested after the revocation must be the one that serves. The first reload (SIGHUP) reads
/// the consumers file from a FIFO the test holds, so it is still building when the operator
/// revokes `revoked` and posts the second; only then does the FIFO give the first its (old)
/// list. Run side by side, the second finished first and the first, finishing last, brought
/// the revoked consumer back.
async fn overlapping_reloads_serve_the_last_one_requested(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    let old_list = consumers_text(&[("acme", "k-acme"), ("revoked", "k-revoked")], 0);
    std::fs::write(&file, &old_list).unwrap();
    let gw = gateway(&consumers_config(&env.store, &file, &up));
    wait_ready(&gw).await;
    let c = client();
    assert_eq!(status_with_key(&c, &gw, "k-revoked").await, 200);

    // Reload 1 (SIGHUP) will read the consumers file from a FIFO.
    let fifo = dir.path().join("consumers.fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    std::fs::rename(&fifo, &file).unwrap();
    gw.signal(Signal::HUP);
    let mut writer = fifo_writer(&file).await;

    // The operator revokes the consumer (a new file replaces the FIFO) and reloads.
    let new_file = dir.path().join("consumers.new");
    std::fs::write(&new_file, consumers_text(&[("acme", "k-acme")], 0)).unwrap();
    std::fs::rename(&new_file, &file).unwrap();
    let mut second = tokio::spawn(post_reload(c.clone(), gw.admin_url("/-/reload")));
    // A gateway that runs reloads side by side finishes the second now; one that serialises
    // them holds it until the first is done.
    let early = tokio::time::timeout(Duration::from_secs(1), &mut second)
        .await
        .ok();

    // Reload 1 gets the old list (with `revoked`) and finishes.
    writer.write_all(old_list.as_bytes()).unwrap();
    drop(writer);
    let (status, body) = match early {
        Some(done) => done.unwrap(),
        None => second.await.unwrap(),
    };
    wait_reloads(&gw, "success", 2.0).await;

    assert_eq!(
        status_with_key(&c, &gw, "k-revoked").await,
        401,
        "the revoked consumer is admitted: the reload that started first finished last"
    );
    assert_eq!(status_with_key(&c, &gw, "k-acme").await, 200);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "reloaded", "{body}");
    // Start-up served generation 1, the SIGHUP's build 2, the post's build 3.
    assert_eq!(body["generation"], 3, "{body}");
    assert_eq!(metric(&gw.metrics().await, "tollgate_consumers"), Some(1.0));
}

const MB: u64 = 1 << 20;

/// 40 reloads at once of a config with 100,000 consumers: built side by side, each held its own
/// copy of the consumers (and the allocator kept the peak: RSS went from 19 MB to 1.3 GB and
/// stayed there). One build at a time, and RSS comes back near where it was.
#[tokio::test(flavor = "multi_thread")]
async fn parallel_reloads_build_one_at_a_time_and_memory_returns() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    std::fs::write(&file, consumers_text(&[("acme", "k-acme")], 100_000)).unwrap();
    let gw = gateway(&consumers_config("backend = \"memory\"", &file, &up));
    wait_ready(&gw).await;
    let c = client();
    assert_eq!(status_with_key(&c, &gw, "k-acme").await, 200);
    // One reload first: the steady state holds the snapshot that serves and what a build
    // leaves in the allocator's free lists.
    let (status, body) = post_reload(c.clone(), gw.admin_url("/-/reload")).await;
    assert_eq!(status, 200, "{body}");
    let pid = gw.child.id();
    let before = rss(pid);

    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (peak, watching) = (peak.clone(), watching.clone());
        tokio::spawn(async move {
            while watching.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(rss(pid), std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let posts: Vec<_> = (0..40)
        .map(|_| tokio::spawn(post_reload(c.clone(), gw.admin_url("/-/reload"))))
        .collect();
    let mut generations = Vec::new();
    for p in posts {
        let (status, body) = p.await.unwrap();
        assert_eq!(status, 200, "{body}");
        generations.push(body["generation"].as_u64().unwrap_or(0));
    }
    watching.store(false, std::sync::atomic::Ordering::SeqCst);
    watcher.await.unwrap();
    assert_eq!(status_with_key(&c, &gw, "k-acme").await, 200);

    // The old snapshots go once the last request on them ends; give the allocator a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = rss(pid);
    while after > before + 64 * MB && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = rss(pid);
    }
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "RSS before {} MB, peak {} MB, after {} MB; generations {generations:?}",
        before / MB,
        peak / MB,
        after / MB
    );
    assert!(
        after <= before + 64 * MB,
        "RSS did not come back: {} MB before the reloads, {} MB after (peak {} MB)",
        before / MB,
        after / MB,
        peak / MB
    );
    assert!(
        peak <= before + 256 * MB,
        "the reloads built side by side: RSS {} MB before, peak {} MB",
        before / MB,
        peak / MB
    );
}

/// A worker's accept loop kept the snapshot of its last accepted connection (to reuse that
/// connection's settings) until its next connection: a replaced snapshot, with its consumers
/// table, lived on in every worker that accepted nothing since. Only requests in flight may
/// hold one.
#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_snapshot_is_dropped_once_its_requests_end() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let toml = config("backend = \"memory\"", &route("api", "/api", &up.url(), "")).replacen(
        "[server]\n",
        "[server]\nworkers = 2\n",
        1,
    );
    std::fs::write(&path, &toml).unwrap();
    let loaded = tollgate::runtime::load::load_and_check(&path).unwrap();
    let gw = tollgate::Gateway::bind(loaded, Some(path.clone()), None)
        .await
        .unwrap();
    let (proxy, admin) = (gw.proxy_addr().unwrap(), gw.admin_addr().unwrap());
    let shared = gw.shared();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(gw.serve(async {
        let _ = stopped.await;
    }));
    // A few connections, so that every worker accepts one on the first snapshot.
    for _ in 0..8 {
        let res = client()
            .get(format!("http://{proxy}/api/x"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let first = std::sync::Arc::downgrade(&shared.snapshot.load_full());
    let (status, body) = post_reload(client(), format!("http://{admin}/-/reload")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["generation"], 2, "{body}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while first.upgrade().is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = first.strong_count();
    let _ = stop.send(());
    let _ = serving.await;
    assert_eq!(
        held, 0,
        "the replaced snapshot is still held ({held} references) with no request in flight"
    );
}
