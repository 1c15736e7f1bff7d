//! bench/fixed-rate.rs — an open-loop HTTP/1.1 load generator at a fixed request rate, for
//! bench/compare.sh (wrk2 is not packaged; `h2load --rate` paces new *connections*, not requests
//! on keep-alive connections). Standard library only: compare.sh builds it with a bare
//! `rustc -O`, no crates, no network.
//!
//!   fixed-rate URL RATE CONNECTIONS SECONDS
//!
//! CONNECTIONS keep-alive connections to http://127.0.0.1:PORT/PATH, one thread each, one request
//! in flight per connection (no pipelining). Connection i sends on its own schedule
//! start + i·T/C + k·T (T = CONNECTIONS / RATE), so together they send RATE requests per second,
//! evenly spread. Latency is measured from the request's *scheduled* send time to the end of its
//! response (as wrk2 does): when a response is late, the next request of that connection is late
//! too and its wait is counted, so a stall shows up in the percentiles instead of being hidden by
//! the client slowing down (coordinated omission). The latency from the actual send is printed
//! as well (`svc_*`), for comparison.
//!
//! Prints one line:
//!   FIXEDRATE requests=N duration_us=D rate=R p50_us= p90_us= p99_us= p999_us= max_us=
//!             svc_p50_us= svc_p99_us= non2xx= errors= late_sends=
//! late_sends counts requests sent more than 1 ms after their scheduled time (the server, or this
//! client on a busy machine, could not keep up).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

struct Stats {
    lat_us: Vec<u32>,
    svc_us: Vec<u32>,
    non2xx: u64,
    errors: u64,
    late: u64,
}

fn usage() -> ! {
    eprintln!("usage: fixed-rate http://127.0.0.1:PORT/PATH RATE CONNECTIONS SECONDS");
    std::process::exit(2)
}

fn parse_url(url: &str) -> (String, u16, String) {
    let rest = url.strip_prefix("http://").unwrap_or_else(|| usage());
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().unwrap_or_else(|_| usage())),
        None => (authority, 80),
    };
    (host.to_string(), port, path.to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Some((status, length of the whole response)) once `buf` holds a complete response.
fn complete(buf: &[u8]) -> Option<(u16, usize)> {
    let head_end = find(buf, b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    for line in head.split("\r\n").skip(1) {
        if let Some((name, value)) = line.split_once(':') {
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
    }
    if status == 204 || status == 304 || (100..200).contains(&status) {
        return Some((status, head_end));
    }
    if chunked {
        let mut at = head_end;
        loop {
            let line_end = at + find(&buf[at..], b"\r\n")?;
            let size_text = std::str::from_utf8(&buf[at..line_end]).ok()?;
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // No trailers expected: the last chunk is followed by an empty line.
                let end = at + find(&buf[at..], b"\r\n")? + 2;
                return Some((status, end));
            }
            if buf.len() < at + size + 2 {
                return None;
            }
            at += size + 2;
        }
    }
    let total = head_end + length.unwrap_or(0);
    (buf.len() >= total).then_some((status, total))
}

fn connect(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect((host, port))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// One request/response exchange; Ok(status).
fn exchange(s: &mut TcpStream, req: &[u8], buf: &mut Vec<u8>) -> std::io::Result<u16> {
    s.write_all(req)?;
    buf.clear();
    let mut chunk = [0u8; 16384];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((status, _)) = complete(buf) {
            return Ok(status);
        }
    }
}

extern "C" {
    fn prctl(option: i32, ...) -> i32;
}

/// Ask for 1 ns timer slack (the default 50 µs would add to every scheduled send).
fn fine_timer_slack() {
    const PR_SET_TIMERSLACK: i32 = 29;
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long and only affects this thread.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1u64);
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        usage();
    }
    let (host, port, path) = parse_url(&args[1]);
    let rate: f64 = args[2].parse().unwrap_or_else(|_| usage());
    let conns: usize = args[3].parse().unwrap_or_else(|_| usage());
    let secs: f64 = args[4].parse().unwrap_or_else(|_| usage());
    if !(rate > 0.0 && conns > 0 && secs > 0.0) {
        usage();
    }
    let period = Duration::from_secs_f64(conns as f64 / rate);
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: tollgate-bench-fixed-rate\r\n\r\n"
    )
    .into_bytes();

    let mut streams = Vec::with_capacity(conns);
    for _ in 0..conns {
        match connect(&host, port) {
            Ok(s) => streams.push(s),
            Err(e) => {
                eprintln!("fixed-rate: connect to {host}:{port}: {e}");
                std::process::exit(1);
            }
        }
    }
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + Duration::from_secs_f64(secs);

    let results: Vec<Stats> = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                let (req, host) = (&req, &host);
                scope.spawn(move || {
                    fine_timer_slack();
                    let mut st = Stats {
                        lat_us: Vec::new(),
                        svc_us: Vec::new(),
                        non2xx: 0,
                        errors: 0,
                        late: 0,
                    };
                    let mut buf = Vec::with_capacity(4096);
                    let mut due = start + period.mul_f64(i as f64 / conns as f64);
                    while due < end {
                        let now = Instant::now();
                        if now < due {
                            std::thread::sleep(due - now);
                        }
                        let sent = Instant::now();
                        if sent.duration_since(due) > Duration::from_millis(1) {
                            st.late += 1;
                        }
                        match exchange(&mut s, req, &mut buf) {
                            Ok(status) => {
                                let done = Instant::now();
                                let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
                                st.lat_us.push(us(done.duration_since(due)));
                                st.svc_us.push(us(done.duration_since(sent)));
                                if !(200..300).contains(&status) {
                                    st.non2xx += 1;
                                }
                            }
                            Err(_) => {
                                st.errors += 1;
                                match connect(host, port) {
                                    Ok(n) => s = n,
                                    Err(_) => break,
                                }
                            }
                        }
                        due += period;
                    }
                    st
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let elapsed = Instant::now().duration_since(start);

    let mut lat: Vec<u32> = Vec::new();
    let mut svc: Vec<u32> = Vec::new();
    let (mut non2xx, mut errors, mut late) = (0, 0, 0);
    for st in results {
        lat.extend(st.lat_us);
        svc.extend(st.svc_us);
        non2xx += st.non2xx;
        errors += st.errors;
        late += st.late;
    }
    lat.sort_unstable();
    svc.sort_unstable();
    let n = lat.len();
    println!(
        "FIXEDRATE requests={n} duration_us={} rate={:.0} p50_us={} p90_us={} p99_us={} p999_us={} max_us={} svc_p50_us={} svc_p99_us={} non2xx={non2xx} errors={errors} late_sends={late}",
        elapsed.as_micros(),
        n as f64 / elapsed.as_secs_f64(),
        percentile(&lat, 50.0),
        percentile(&lat, 90.0),
        percentile(&lat, 99.0),
        percentile(&lat, 99.9),
        lat.last().copied().unwrap_or(0),
        percentile(&svc, 50.0),
        percentile(&svc, 99.0),
    );
}
