//! `Accept-Encoding` negotiation (RFC 9110 §12.5.3): the gateway's codings in its order of
//! preference against what the client accepts, with q-values.
//!
//! Robust to junk, as nginx and Envoy are: a member whose `q` is not a valid qvalue (`q=2`,
//! `q=-1`, `q=abc`, more than three decimals) is ignored as a whole, so a malformed header can
//! only lead to identity, never to a coding the client did not accept.

use crate::config::Coding;

/// A qvalue in thousandths: `0`, `1`, `0.5`, `1.000`; `None` when malformed or above 1.
fn qvalue(s: &str) -> Option<u16> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_val = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    match int {
        "0" => Some(frac_val),
        "1" if frac_val == 0 => Some(1000),
        _ => None,
    }
}

/// The q (thousandths) the client gives each coding token it names, `*` included; malformed
/// members left out.
fn accepted(header: &str) -> Vec<(&str, u16)> {
    header
        .split(',')
        .filter_map(|member| {
            let mut parts = member.split(';');
            let token = parts.next()?.trim();
            if token.is_empty() {
                return None;
            }
            let mut q = 1000;
            for p in parts {
                let (k, v) = p.split_once('=')?;
                if k.trim().eq_ignore_ascii_case("q") {
                    q = qvalue(v)?;
                }
            }
            Some((token, q))
        })
        .collect()
}

/// The coding to answer with: among `offered` (the gateway's, best first), the one the client
/// gives the highest q above 0 (ties: the gateway's order); `None` for identity — no
/// `Accept-Encoding` (RFC 9110: any coding is then acceptable, but a gateway sending one
/// unasked breaks clients, so identity, as nginx and Envoy do), or nothing acceptable.
/// `headers`: every `Accept-Encoding` field value of the request.
pub fn negotiate<'a>(
    headers: impl IntoIterator<Item = &'a str>,
    offered: &[Coding],
) -> Option<Coding> {
    let mut list: Vec<(&str, u16)> = Vec::new();
    for h in headers {
        list.extend(accepted(h));
    }
    let q_of = |c: Coding| -> u16 {
        // An explicit mention wins over `*` (the highest if named twice).
        let named = list
            .iter()
            .filter(|(t, _)| t.eq_ignore_ascii_case(c.token()))
            .map(|&(_, q)| q)
            .max();
        named
            .or_else(|| {
                list.iter()
                    .filter(|(t, _)| *t == "*")
                    .map(|&(_, q)| q)
                    .max()
            })
            .unwrap_or(0)
    };
    let mut best: Option<(Coding, u16)> = None;
    for &c in offered {
        let q = q_of(c);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((c, q));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

    fn pick(h: &str) -> Option<Coding> {
        negotiate([h], &ALL)
    }

    #[test]
    fn the_gateways_order_breaks_ties_and_q_decides() {
        assert_eq!(pick("gzip, br"), Some(Coding::Br));
        assert_eq!(pick("gzip, deflate, br, zstd"), Some(Coding::Zstd));
        assert_eq!(pick("gzip;q=1, br;q=0.5"), Some(Coding::Gzip));
        assert_eq!(pick("*"), Some(Coding::Zstd));
        assert_eq!(pick("*;q=0.1, gzip"), Some(Coding::Gzip));
        assert_eq!(pick("zstd;q=0, *"), Some(Coding::Br));
        assert_eq!(pick("GZIP"), Some(Coding::Gzip));
        assert_eq!(pick("identity"), None);
        assert_eq!(pick(""), None);
        assert_eq!(negotiate([], &ALL), None);
        assert_eq!(
            negotiate(["br", "gzip;q=0.9"], &[Coding::Gzip]),
            Some(Coding::Gzip)
        );
        assert_eq!(pick("gzip;q=0.001, br;q=0.002"), Some(Coding::Br));
    }

    #[test]
    fn malformed_members_are_ignored() {
        // The issue's case: every member is malformed, so identity.
        assert_eq!(pick("gzip;q=2, *;q=-1, br;q=abc"), None);
        assert_eq!(pick("gzip;q=2, br"), Some(Coding::Br));
        assert_eq!(pick("gzip;q=0.5000"), None);
        assert_eq!(pick("gzip;q=1.5"), None);
        assert_eq!(pick("gzip;q=1.000"), Some(Coding::Gzip));
        assert_eq!(pick("gzip;q"), None);
        assert_eq!(pick(",,;q=1, gzip ;level=9"), Some(Coding::Gzip));
        assert_eq!(pick("gzip;q=0"), None);
    }
}
