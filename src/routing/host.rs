//! The host a request is routed by: its `Host` or authority, normalised as routes' hosts are.

/// The host a request is routed by, from a `Host` value or an authority: without the port and
/// one trailing dot (`example.com.` is `example.com`, as in DNS), lower case. `None` when it is
/// not an authority.
pub fn route_host(authority: &str) -> Option<String> {
    if let Some(h) = plain_host(authority) {
        // What nearly every request sends: no parse, no copy but the result.
        return Some(without_dot(h).to_owned());
    }
    let authority: http::uri::Authority = authority.parse().ok()?;
    Some(without_dot(authority.host()).to_ascii_lowercase())
}

fn without_dot(h: &str) -> &str {
    h.strip_suffix('.').filter(|h| !h.is_empty()).unwrap_or(h)
}

/// The host of an authority that is a lower-case name or IPv4 address (`a-z`, `0-9`, `-`,
/// `.`), with or without a port of 1 to 5 digits: one `http::uri::Authority` takes as it is,
/// with that host. `None` for anything else (upper case, IPv6, user info, …), which goes
/// through the full parse.
fn plain_host(authority: &str) -> Option<&str> {
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    let name = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    let plain = !host.is_empty()
        && host.bytes().all(name)
        && port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    plain.then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_host_shortcut_agrees_with_the_full_parse() {
        let full = |a: &str| -> Option<String> {
            let authority: http::uri::Authority = a.parse().ok()?;
            Some(without_dot(authority.host()).to_ascii_lowercase())
        };
        let mut cases: Vec<String> = [
            "example.com",
            "example.com.",
            "example.com:8080",
            "a",
            ".",
            "-",
            "..",
            "1.2.3.4",
            "1.2.3.4:1",
            "x:65535",
            "x:99999",
            "x:0",
            "x:080",
            "api-v2.example.com.:443",
            "EXAMPLE.com",
            "ex_ample.com",
            "[::1]:80",
            "user@host",
            "host:",
            ":80",
            "",
            "host:80:80",
            "host:123456",
            "h%41",
            "a b",
            "a.b.",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every short string over an alphabet of what matters here.
        let alphabet = ['a', 'Z', '0', '-', '.', ':', '_', '@', '['];
        for n in 1..=4u32 {
            for k in 0..alphabet.len().pow(n) {
                let mut s = String::new();
                let mut k = k;
                for _ in 0..n {
                    s.push(alphabet[k % alphabet.len()]);
                    k /= alphabet.len();
                }
                cases.push(s);
            }
        }
        for a in &cases {
            if let Some(h) = plain_host(a) {
                assert_eq!(Some(without_dot(h).to_owned()), full(a), "{a:?}");
            }
            assert_eq!(route_host(a), full(a), "{a:?}");
        }
    }
}
