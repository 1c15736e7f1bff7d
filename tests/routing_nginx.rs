//! nginx as the referee of route precedence (issue #51, "The oracles"): random nginx configs
//! of exact (`=`), `^~`, regex (`~`, `~*`) and plain prefix locations over a small alphabet, so
//! that they overlap, run by nginx and, after `tollgate import nginx`, by Tollgate; the same
//! random and adversarial paths sent to both (prefix edges, trailing slashes, case variants,
//! `//`, dot segments, percent-encoding) must reach the same location.
//!
//! Each location adds `X-Loc: <its name>` to its answers (`add_header … always`, which the
//! import turns into a response header rule) and passes the request to one upstream, so the
//! answer names the location on both sides. nginx's own redirect of `/x` to `/x/` (a prefix
//! location ending with `/` that passes requests on) is compared by status and `Location`
//! path. Every config is one `server` with its own name, all in one nginx and one gateway.
//!
//! `ROUTING_NGINX_SEED` picks another run; a failure prints the seed, the server and the path.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

use support::nginx::{nginx_bin, start_nginx};

/// Configs compared, and paths per config.
const CONFIGS: usize = 40;
const PATHS: usize = 40;

/// A small deterministic generator (xorshift64*): no dependency, a seed reproduces a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap()).unwrap()
    }
    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}

/// Regex locations: searches (nginx's are unanchored), anchors, case, over the same alphabet.
const REGEXES: &[&str] = &[
    r"\.b$", r"^/a/", "b/", "^/ab?$", "a", "/a$", r"a\.", "^/b", r"\.", "^/a/.*b$", "A", "^/B",
    "ba", "/$",
];

/// A location path over `ab/.` (no `//`, no dot segments: nginx compares a location with the
/// normalised path, so such a location never matches in nginx and is no path for Tollgate).
fn location_path(rng: &mut Rng) -> String {
    loop {
        let n = rng.below(5);
        let mut p = String::from("/");
        for _ in 0..n {
            p.push(*rng.pick(&['a', 'b', '/', '.', 'a', 'b']));
        }
        let dot_segment = p.split('/').any(|s| s == "." || s == "..");
        if !p.contains("//") && !dot_segment {
            return p;
        }
    }
}

#[derive(Debug, Clone)]
enum Loc {
    Exact(String),
    Caret(String),
    Plain(String),
    Regex { caseless: bool, re: &'static str },
}

fn config(rng: &mut Rng) -> Vec<Loc> {
    let n = 3 + rng.below(6);
    let mut locs: Vec<Loc> = Vec::new();
    while locs.len() < n {
        let loc = match rng.below(4) {
            0 => Loc::Exact(location_path(rng)),
            1 => Loc::Caret(location_path(rng)),
            2 => Loc::Plain(location_path(rng)),
            _ => Loc::Regex {
                caseless: rng.below(2) == 0,
                re: REGEXES[rng.below(REGEXES.len())],
            },
        };
        // nginx refuses a second location of one path (`^~` or not) and a second `=` one.
        let dup = locs.iter().any(|l| match (l, &loc) {
            (Loc::Exact(a), Loc::Exact(b)) => a == b,
            (Loc::Caret(a) | Loc::Plain(a), Loc::Caret(b) | Loc::Plain(b)) => a == b,
            _ => false,
        });
        if !dup {
            locs.push(loc);
        }
    }
    locs
}

/// The server block of config `k`; location `j` is named `c<k>l<j>`.
fn server(k: usize, locs: &[Loc], port: u16, upstream: &str) -> String {
    let mut s = format!("  server {{\n    listen 127.0.0.1:{port};\n    server_name c{k}.test;\n");
    for (j, l) in locs.iter().enumerate() {
        let head = match l {
            Loc::Exact(p) => format!("= {p}"),
            Loc::Caret(p) => format!("^~ {p}"),
            Loc::Plain(p) => p.clone(),
            Loc::Regex { caseless, re } => {
                format!("{} \"{re}\"", if *caseless { "~*" } else { "~" })
            }
        };
        writeln!(
            s,
            "    location {head} {{\n      add_header X-Loc c{k}l{j} always;\n      proxy_pass http://{upstream};\n    }}"
        )
        .unwrap();
    }
    s.push_str("  }\n");
    s
}

/// Paths for one config: each location's path and its edges, then random ones.
fn paths(rng: &mut Rng, locs: &[Loc]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |p: String| {
        if p.starts_with('/') && !out.contains(&p) {
            out.push(p);
        }
    };
    for l in locs {
        let (Loc::Exact(p) | Loc::Caret(p) | Loc::Plain(p)) = l else {
            continue;
        };
        add(p.clone());
        add(format!("{p}a"));
        add(format!("{p}x"));
        add(format!("{p}/"));
        add(format!("{p}/b"));
        add(format!("{p}.b"));
        add(p.trim_end_matches('/').to_owned());
        add(p[..p.len() - 1].to_owned());
        add(p.to_ascii_uppercase());
        add(format!("/{p}"));
        add(p.replacen('a', "%61", 1));
        add(p.replacen('/', "//", 1));
        add(format!("{p}/../b"));
        add(format!("/x/..{p}"));
    }
    let mut random = Vec::new();
    while random.len() < PATHS {
        let n = 1 + rng.below(7);
        let mut p = String::from("/");
        for _ in 0..n {
            p.push(*rng.pick(&['a', 'b', 'A', 'B', '/', '.', 'x', 'a']));
        }
        random.push(p);
    }
    // Half edges (shuffled), half random.
    let mut edges = std::mem::take(&mut out);
    for i in (1..edges.len()).rev() {
        edges.swap(i, rng.below(i + 1));
    }
    edges.truncate(PATHS / 2);
    out = edges;
    for p in random {
        if out.len() >= PATHS {
            break;
        }
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// What a proxy answered: the status, and the location (`X-Loc`) for a 2xx or the `Location`
/// path for a redirect.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    what: Option<String>,
}

/// One request, raw (the path exactly as written: no client normalises it).
async fn ask(addr: std::net::SocketAddr, host: &str, path: &str) -> Answer {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let what = match status {
        200..=299 => header("x-loc"),
        300..=399 => header("location").map(|l| {
            // nginx writes an absolute URL, Tollgate the path.
            match l.strip_prefix("http://") {
                Some(rest) => rest
                    .find('/')
                    .map_or(String::new(), |i| rest[i..].to_owned()),
                None => l,
            }
        }),
        _ => None,
    };
    Answer { status, what }
}

/// Report lines that say the import is not exact for routing: such a config is not compared.
fn inexact(report: &tollgate::import::Report) -> Vec<String> {
    report
        .items
        .iter()
        .filter(|i| i.severity != tollgate::import::Severity::Note)
        // nginx's redirect of `/x` to `/x/` keeps the query, the import's does not: the
        // requests here have none.
        .filter(|i| !i.message.contains("drops the query"))
        .map(ToString::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_and_the_import_choose_the_same_location() {
    let Some(bin) = nginx_bin() else {
        eprintln!("SKIPPED: no nginx on this machine (Debian package `nginx`; `scripts/test` installs it)");
        return;
    };
    let started = Instant::now();
    let seed: u64 = std::env::var("ROUTING_NGINX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_0051);
    let mut rng = Rng(seed | 1);
    let upstream = support::upstream().await;
    let up = upstream.addr.to_string();
    let port = support::free_port();

    // Configs whose import is exact; the others are counted (they must stay few).
    let mut kept: Vec<Vec<Loc>> = Vec::new();
    let mut skipped = Vec::new();
    while kept.len() < CONFIGS {
        let locs = config(&mut rng);
        let k = kept.len();
        let text = format!("http {{\n{}}}\n", server(k, &locs, port, &up));
        let import = tollgate::import::nginx::convert(&[("c.conf".into(), text)])
            .unwrap_or_else(|e| panic!("seed {seed}: import fails: {e}"));
        let why = inexact(&import.report);
        if why.is_empty() {
            kept.push(locs);
        } else {
            skipped.push(why.join("; "));
            assert!(
                skipped.len() <= CONFIGS,
                "seed {seed}: most configs import inexactly: {skipped:#?}"
            );
        }
    }
    let servers: String = kept
        .iter()
        .enumerate()
        .map(|(k, locs)| server(k, locs, port, &up))
        .collect();
    let nginx = start_nginx(&bin, &format!("events {{}}\nhttp {{\n{servers}}}\n"), port);
    let import =
        tollgate::import::nginx::convert(&[("all.conf".into(), format!("http {{\n{servers}}}\n"))])
            .unwrap();
    let toml = import.toml.replace(
        &format!("listen = \"127.0.0.1:{port}\""),
        "listen = \"127.0.0.1:0\"",
    );
    let gw = support::gateway(&support::with_front(&format!(
        "{toml}\n[admin]\nlisten = \"127.0.0.1:0\"\n"
    )));
    let nginx_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let mut differ = Vec::new();
    let mut compared = 0;
    let mut by_kind = [0usize; 3];
    let mut statuses = std::collections::BTreeMap::new();
    for (k, locs) in kept.iter().enumerate() {
        let host = format!("c{k}.test");
        for path in paths(&mut rng, locs) {
            let by_nginx = ask(nginx_addr, &host, &path).await;
            let by_tollgate = ask(gw.proxy, &host, &path).await;
            compared += 1;
            *statuses.entry(by_nginx.status).or_insert(0usize) += 1;
            by_kind[match by_nginx.status {
                200..=299 => 0,
                300..=399 => 1,
                _ => 2,
            }] += 1;
            if by_nginx != by_tollgate {
                differ.push(format!(
                    "c{k} {path}: nginx {by_nginx:?}, tollgate {by_tollgate:?}"
                ));
            }
        }
    }
    drop(nginx);
    let failing: String = differ
        .iter()
        .take(20)
        .map(|d| {
            let k: usize = d[1..d.find(' ').unwrap()].parse().unwrap();
            format!("{d}\n{}", server(k, &kept[k], port, "up"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        differ.is_empty(),
        "seed {seed}: {} of {compared} requests reach another location:\n{failing}\nimport:\n{toml}",
        differ.len()
    );
    // The comparison saw locations, redirects and misses alike.
    assert!(
        by_kind.iter().all(|n| *n > 0),
        "seed {seed}: answers by kind (2xx, 3xx, other) {by_kind:?}"
    );
    eprintln!(
        "seed {seed}: {compared} requests over {} configs agree ({} configs skipped as inexact imports), statuses {statuses:?}, {:?}; skipped: {skipped:?}",
        kept.len(),
        skipped.len(),
        started.elapsed()
    );
}
