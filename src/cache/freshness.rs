//! RFC 9111's rules for a shared cache as pure functions of the messages and the time (in
//! seconds since the Unix epoch, injected): whether a response may be stored (§3, §3.5), its
//! freshness lifetime (§4.2.1, heuristics §4.2.2), its age (§4.2.3), and whether a stored
//! response may answer a request as it is, stale, or only once revalidated (§4, §4.2.4, §5.2).

use http::header::{HeaderMap, HeaderName, AGE, DATE, ETAG, EXPIRES, LAST_MODIFIED, SET_COOKIE};
use http::StatusCode;

use super::control::Directives;
use crate::config::CacheRules;

/// An HTTP-date's seconds since the epoch (`None`: missing or invalid).
pub fn http_date(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    parse_date(headers.get(name)?.to_str().ok()?)
}

/// An HTTP-date (RFC 9110 §5.6.7) as a recipient reads one: IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37 1994`) in their exact
/// layout but in any case and whatever the weekday says (as nginx reads them), and RFC 850's
/// obsolete form; anything else is invalid (an invalid `Expires` is in the past).
pub fn parse_date(s: &str) -> Option<u64> {
    let s = s.trim();
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let t = s.get(r)?.trim_start();
        (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit()))
            .then(|| t.parse().ok())
            .flatten()
    };
    let month = |r: std::ops::Range<usize>| -> Option<u64> {
        let m = s.get(r)?.to_ascii_lowercase();
        const MONTHS: [&str; 12] = [
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ];
        MONTHS.iter().position(|x| *x == m).map(|i| i as u64 + 1)
    };
    let weekday = |r: std::ops::Range<usize>| {
        s.get(r).is_some_and(|w| {
            ["mon", "tue", "wed", "thu", "fri", "sat", "sun"].contains(&&*w.to_ascii_lowercase())
        })
    };
    let time = |at: usize| -> Option<(u64, u64, u64)> {
        (b.get(at + 2) == Some(&b':') && b.get(at + 5) == Some(&b':'))
            .then(|| Some((num(at..at + 2)?, num(at + 3..at + 5)?, num(at + 6..at + 8)?)))
            .flatten()
    };
    let (y, mo, d, (h, mi, sec)) = if b.len() == 29
        && weekday(0..3)
        && &b[3..5] == b", "
        && b[7] == b' '
        && b[11] == b' '
        && b[16] == b' '
        && b[25] == b' '
        && s.get(26..).is_some_and(|t| t.eq_ignore_ascii_case("gmt"))
        && b[5].is_ascii_digit()
    {
        (num(12..16)?, month(8..11)?, num(5..7)?, time(17)?)
    } else if b.len() == 24
        && weekday(0..3)
        && b[3] == b' '
        && b[7] == b' '
        && b[10] == b' '
        && b[19] == b' '
    {
        (num(20..24)?, month(4..7)?, num(8..10)?, time(11)?)
    } else {
        let t = httpdate::parse_http_date(s).ok()?;
        return t
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
    };
    if !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 || y < 1970 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), from 1970-01-01.
    let (yy, mm) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = yy / 400;
    let yoe = yy - era * 400;
    let doy = (153 * mm + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    days.checked_mul(86_400)?
        .checked_add(h * 3600 + mi * 60 + sec)
}

/// Whether a response to a request may be stored by a shared cache (RFC 9111 §3): a status the
/// route stores (any final status with an explicit lifetime), no `no-store` on either side, no `private`, no `Vary: *`; a request with
/// `Authorization` only when the response says a shared cache may (`public`, `s-maxage`,
/// `must-revalidate`, §3.5); a response that sets a cookie only with `public` or `s-maxage`
/// (as nginx and Varnish: a cookie is one caller's); and something to serve it by: a
/// lifetime, or a validator to revalidate it with.
#[allow(clippy::too_many_arguments)]
pub fn storable(
    status: StatusCode,
    request: &Directives,
    authorized: bool,
    response: &Directives,
    headers: &HeaderMap,
    lifetime: u64,
    rules: &CacheRules,
) -> bool {
    // A status of `statuses` is stored on any lifetime; any other final status only on an
    // explicit one (RFC 9111 §3: a status the cache understands, with freshness information),
    // never a refusal, a condition's or a range's answer.
    let explicit =
        response.s_maxage.is_some() || response.max_age.is_some() || headers.contains_key(EXPIRES);
    let status_ok = rules.statuses.contains(&status.as_u16())
        || (explicit && !crate::config::NEVER_STORED.contains(&status.as_u16()));
    if !status_ok || request.no_store || response.no_store {
        return false;
    }
    if response.private {
        return false;
    }
    if authorized && !(response.public || response.s_maxage.is_some() || response.must_revalidate) {
        return false;
    }
    if headers.contains_key(SET_COOKIE) && !(response.public || response.s_maxage.is_some()) {
        return false;
    }
    if vary_star(headers) {
        return false;
    }
    lifetime > 0 || headers.contains_key(ETAG) || headers.contains_key(LAST_MODIFIED)
}

/// Whether the response varies on `*` (it never matches a later request, §4.1).
pub fn vary_star(headers: &HeaderMap) -> bool {
    vary_names(headers).any(|n| n == "*")
}

/// The field names a response's `Vary` lists, lower case.
pub fn vary_names(headers: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    headers
        .get_all(http::header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
}

/// A response's freshness lifetime in seconds (§4.2.1): `s-maxage`, else `max-age`, else
/// `Expires` less `Date` (the response time without a `Date`; an invalid `Expires` is already
/// stale), else a heuristic where the rules allow one (§4.2.2): 10% of the time since
/// `Last-Modified`, else `default_ttl`. Never more than `max_ttl`.
pub fn lifetime(
    response: &Directives,
    headers: &HeaderMap,
    response_time: u64,
    rules: &CacheRules,
) -> u64 {
    let max = rules.max_ttl.as_secs();
    let explicit = if let Some(s) = response.s_maxage {
        Some(s)
    } else if let Some(m) = response.max_age {
        Some(m)
    } else if headers.contains_key(EXPIRES) {
        let date = http_date(headers, &DATE).unwrap_or(response_time);
        Some(http_date(headers, &EXPIRES).map_or(0, |e| e.saturating_sub(date)))
    } else {
        None
    };
    let secs = match explicit {
        Some(s) => s,
        None if !rules.heuristic => 0,
        None => {
            let date = http_date(headers, &DATE).unwrap_or(response_time);
            match http_date(headers, &LAST_MODIFIED) {
                Some(lm) if lm < date => (date - lm) / 10,
                _ => rules.default_ttl.as_secs(),
            }
        }
    };
    secs.min(max)
}

/// When a stored response was received: what its age is computed from (§4.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    /// When the request that got it was sent.
    pub request: u64,
    /// When its head arrived.
    pub response: u64,
}

/// A stored response's current age at `now` (§4.2.3): its corrected initial age (the larger of
/// its apparent age by `Date` and its `Age` plus the response delay) plus its time in the cache.
pub fn current_age(headers: &HeaderMap, times: Times, now: u64) -> u64 {
    // The first value's number (`7200, 0`, `7200;foo=bar`: 7200); a value that is no whole
    // number (`7200.0`) is ignored.
    let age_value = headers
        .get(AGE)
        .and_then(|v| v.to_str().ok())
        .map(str::trim_start)
        .filter(|v| {
            let digits = v.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0
                && v[digits..]
                    .chars()
                    .next()
                    .is_none_or(|c| ", ;\t".contains(c))
        })
        .map_or(0, super::control::delta_seconds);
    let date = http_date(headers, &DATE).unwrap_or(times.response);
    let apparent = times.response.saturating_sub(date);
    let delay = times.response.saturating_sub(times.request);
    let corrected = age_value.saturating_add(delay);
    let initial = apparent.max(corrected);
    initial.saturating_add(now.saturating_sub(times.response))
}

/// What a stored response may do for a request (§4.2.4, §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Served as it is.
    Fresh,
    /// Served stale: the request allows it (`max-stale`).
    Stale,
    /// Served stale while it is revalidated (`stale-while-revalidate`).
    StaleRevalidating,
    /// Only once revalidated (or replaced) by the origin.
    Revalidate,
}

/// Whether a response stored with `response`'s directives, `lifetime` and `age` may answer a
/// request with `request`'s directives. (`Pragma` is not read: RFC 9111 §5.4 deprecates it.)
pub fn usable(request: &Directives, response: &Directives, lifetime: u64, age: u64) -> Use {
    if request.no_cache || response.no_cache {
        return Use::Revalidate;
    }
    let fresh_for = lifetime.saturating_sub(age);
    let within_request = request.max_age.is_none_or(|m| age <= m)
        && request.min_fresh.is_none_or(|m| fresh_for >= m);
    if lifetime > age {
        return if within_request {
            Use::Fresh
        } else {
            Use::Revalidate
        };
    }
    // Stale: served only where neither side forbids it.
    if response.must_revalidate || response.proxy_revalidate || response.s_maxage.is_some() {
        return Use::Revalidate;
    }
    let staleness = age - lifetime;
    if request.max_age.is_none_or(|m| age <= m) {
        if let Some(allowed) = request.max_stale {
            if allowed.is_none_or(|s| staleness <= s) {
                return Use::Stale;
            }
        }
    }
    if request.max_age.is_none()
        && request.min_fresh.is_none()
        && response
            .stale_while_revalidate
            .is_some_and(|w| staleness <= w)
    {
        return Use::StaleRevalidating;
    }
    Use::Revalidate
}

/// Whether a stale response may answer a request whose revalidation failed (an upstream
/// error or a 5xx, RFC 5861 §4): `stale-if-error` on either side covers its staleness.
pub fn stale_if_error(
    request: &Directives,
    response: &Directives,
    lifetime: u64,
    age: u64,
) -> bool {
    if response.must_revalidate || response.proxy_revalidate || response.s_maxage.is_some() {
        return false;
    }
    let staleness = age.saturating_sub(lifetime);
    request
        .stale_if_error
        .or(response.stale_if_error)
        .is_some_and(|w| staleness <= w)
}

/// The headers a `304` brings to a stored response (§3.2, §4.3.4): every one of its fields
/// replaces the stored field of that name, but the hop-by-hop ones and `Content-Length` (the
/// stored body's).
pub fn freshen(stored: &mut HeaderMap, not_modified: &HeaderMap) {
    for name in not_modified.keys() {
        if *name == http::header::CONTENT_LENGTH || super::key::hop_by_hop(name) {
            continue;
        }
        stored.remove(name);
        for v in not_modified.get_all(name) {
            stored.append(name.clone(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::time::Duration;

    fn cc(v: &str) -> Directives {
        Directives::parse([v.as_bytes()])
    }

    fn headers(list: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in list {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn date(secs: u64) -> String {
        httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(secs))
    }

    const T: u64 = 1_700_000_000;

    #[test]
    fn lifetime_is_s_maxage_then_max_age_then_expires_then_a_heuristic() {
        let rules = CacheRules::default();
        let h = headers(&[("date", &date(T)), ("expires", &date(T + 30))]);
        assert_eq!(lifetime(&cc("s-maxage=10, max-age=20"), &h, T, &rules), 10);
        assert_eq!(lifetime(&cc("max-age=20"), &h, T, &rules), 20);
        assert_eq!(lifetime(&cc(""), &h, T, &rules), 30);
        // An invalid Expires is in the past.
        let bad = headers(&[("date", &date(T)), ("expires", "0")]);
        assert_eq!(lifetime(&cc(""), &bad, T, &rules), 0);
        // Heuristic: 10% of the time since Last-Modified; else default_ttl; off: nothing.
        let lm = headers(&[("date", &date(T)), ("last-modified", &date(T - 1000))]);
        assert_eq!(lifetime(&cc(""), &lm, T, &rules), 100);
        let plain = headers(&[("date", &date(T))]);
        assert_eq!(lifetime(&cc(""), &plain, T, &rules), 0);
        let ttl = CacheRules {
            default_ttl: Duration::from_secs(60),
            ..CacheRules::default()
        };
        assert_eq!(lifetime(&cc(""), &plain, T, &ttl), 60);
        let off = CacheRules {
            heuristic: false,
            default_ttl: Duration::from_secs(60),
            ..CacheRules::default()
        };
        assert_eq!(lifetime(&cc(""), &lm, T, &off), 0);
        // max_ttl bounds everything.
        assert_eq!(lifetime(&cc("max-age=999999"), &h, T, &rules), 86_400);
    }

    #[test]
    fn dates_are_read_in_any_case_and_whatever_their_weekday() {
        let t = parse_date("Thu, 18 Aug 2050 02:01:18 GMT").unwrap();
        let by_httpdate = httpdate::parse_http_date("Thu, 18 Aug 2050 02:01:18 GMT").unwrap();
        let by_httpdate = by_httpdate.duration_since(std::time::UNIX_EPOCH).unwrap();
        assert_eq!(t, by_httpdate.as_secs());
        for same in [
            "THU, 18 AUG 2050 02:01:18 gMT",
            "Mon, 18 Aug 2050 02:01:18 GMT",
            "Thu Aug 18 02:01:18 2050",
        ] {
            assert_eq!(parse_date(same), Some(t), "{same}");
        }
        assert_eq!(
            parse_date("Thu Aug  8 02:01:18 2050"),
            Some(t - 10 * 86_400)
        );
        assert_eq!(
            parse_date("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784_111_777)
        );
        for bad in [
            "Thu, 18 Aug 2050 02:01:18 UTC",
            "Thu, 18 Aug 2050 2:01:18 GMT",
            "Thu, 18 Aug 50 02:01:18 GMT",
            "Thu 18 Aug 2050 02:01:18 GMT",
            "Thu,  18 Aug 2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02.01.18 GMT",
            "Thu, 18-Aug-2050 02:01:18 GMT",
            "0",
            // Not ASCII: refused, never sliced inside a character.
            "Thu, 18 Aug 2050 02:01:1é GMT",
            "Thu, 18 Aug 2050 02:01:18 Gé",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn age_is_the_corrected_initial_age_plus_the_resident_time() {
        let times = Times {
            request: T,
            response: T + 2,
        };
        // Age 10 + the response delay 2 beats the apparent age 0; 5 s in the cache.
        let h = headers(&[("date", &date(T + 2)), ("age", "10")]);
        assert_eq!(current_age(&h, times, T + 7), 17);
        // A Date 100 s old: the apparent age wins.
        let h = headers(&[("date", &date(T - 98))]);
        assert_eq!(current_age(&h, times, T + 2), 100);
        // An Age of a list or with a parameter: its first number.
        for odd in ["7200, 0", "7200;foo=bar"] {
            let h = headers(&[("date", &date(T + 2)), ("age", odd)]);
            assert_eq!(current_age(&h, times, T + 2), 7202, "{odd}");
        }
        let h = headers(&[("date", &date(T + 2)), ("age", "7200.0")]);
        assert_eq!(current_age(&h, times, T + 2), 2, "a float is ignored");
    }

    #[test]
    fn what_a_shared_cache_may_store() {
        let rules = CacheRules::default();
        let none = HeaderMap::new();
        let ok = StatusCode::OK;
        assert!(storable(
            ok,
            &cc(""),
            false,
            &cc("max-age=1"),
            &none,
            1,
            &rules
        ));
        assert!(!storable(
            ok,
            &cc("no-store"),
            false,
            &cc("max-age=1"),
            &none,
            1,
            &rules
        ));
        assert!(!storable(
            ok,
            &cc(""),
            false,
            &cc("no-store"),
            &none,
            1,
            &rules
        ));
        assert!(!storable(
            ok,
            &cc(""),
            false,
            &cc("private, max-age=1"),
            &none,
            1,
            &rules
        ));
        // Authorization: only when the response allows a shared cache.
        assert!(!storable(
            ok,
            &cc(""),
            true,
            &cc("max-age=1"),
            &none,
            1,
            &rules
        ));
        for allow in [
            "public, max-age=1",
            "s-maxage=1",
            "must-revalidate, max-age=1",
        ] {
            assert!(storable(ok, &cc(""), true, &cc(allow), &none, 1, &rules));
        }
        // A status the rules do not store: only with an explicit lifetime; a refusal never.
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        let lm = headers(&[("last-modified", "Thu, 01 Jan 2015 00:00:00 GMT")]);
        assert!(!storable(status, &cc(""), false, &cc(""), &lm, 1, &rules));
        assert!(storable(
            status,
            &cc(""),
            false,
            &cc("max-age=1"),
            &none,
            1,
            &rules
        ));
        let refused = StatusCode::TOO_MANY_REQUESTS;
        assert!(!storable(
            refused,
            &cc(""),
            false,
            &cc("max-age=1"),
            &none,
            1,
            &rules
        ));
        // Vary: *; nothing to serve it by.
        let star = headers(&[("vary", "accept, *")]);
        assert!(!storable(
            ok,
            &cc(""),
            false,
            &cc("max-age=1"),
            &star,
            1,
            &rules
        ));
        assert!(!storable(ok, &cc(""), false, &cc(""), &none, 0, &rules));
        let etag = headers(&[("etag", "\"a\"")]);
        assert!(storable(ok, &cc(""), false, &cc(""), &etag, 0, &rules));
        let cookie = headers(&[("set-cookie", "a=b")]);
        assert!(!storable(
            ok,
            &cc(""),
            false,
            &cc("max-age=1"),
            &cookie,
            1,
            &rules
        ));
        assert!(storable(
            ok,
            &cc(""),
            false,
            &cc("public, max-age=1"),
            &cookie,
            1,
            &rules
        ));
    }

    #[test]
    fn request_and_response_directives_decide_the_use() {
        let r = cc("");
        assert_eq!(usable(&cc(""), &r, 10, 5), Use::Fresh);
        assert_eq!(usable(&cc(""), &r, 10, 10), Use::Revalidate);
        assert_eq!(usable(&cc("no-cache"), &r, 10, 5), Use::Revalidate);
        assert_eq!(usable(&cc(""), &r, 10, 5), Use::Fresh);
        assert_eq!(usable(&cc(""), &cc("no-cache"), 10, 5), Use::Revalidate);
        assert_eq!(usable(&cc("max-age=3"), &r, 10, 5), Use::Revalidate);
        assert_eq!(usable(&cc("min-fresh=6"), &r, 10, 5), Use::Revalidate);
        assert_eq!(usable(&cc("min-fresh=5"), &r, 10, 5), Use::Fresh);
        // Stale: max-stale allows it, unless the response must be revalidated.
        assert_eq!(usable(&cc("max-stale"), &r, 10, 50), Use::Stale);
        assert_eq!(usable(&cc("max-stale=5"), &r, 10, 50), Use::Revalidate);
        assert_eq!(usable(&cc("max-stale=40"), &r, 10, 50), Use::Stale);
        let mr = cc("must-revalidate");
        assert_eq!(usable(&cc("max-stale"), &mr, 10, 50), Use::Revalidate);
        let swr = cc("max-age=10, stale-while-revalidate=30");
        assert_eq!(usable(&cc(""), &swr, 10, 30), Use::StaleRevalidating);
        assert_eq!(usable(&cc(""), &swr, 10, 41), Use::Revalidate);
        let sie = cc("max-age=10, stale-if-error=60");
        assert!(stale_if_error(&cc(""), &sie, 10, 60));
        assert!(!stale_if_error(&cc(""), &sie, 10, 71));
        assert!(!stale_if_error(&cc(""), &cc("max-age=10"), 10, 11));
    }

    #[test]
    fn a_304_freshens_the_stored_fields_but_the_framing() {
        let mut stored = headers(&[
            ("etag", "\"1\""),
            ("cache-control", "max-age=1"),
            ("content-length", "5"),
            ("x-kept", "a"),
        ]);
        let nm = headers(&[
            ("cache-control", "max-age=60"),
            ("content-type", "text/new"),
            ("content-length", "0"),
            ("x-new", "b"),
            ("connection", "close"),
        ]);
        freshen(&mut stored, &nm);
        assert_eq!(stored["cache-control"], "max-age=60");
        assert_eq!(stored["content-length"], "5");
        assert_eq!(stored["x-kept"], "a");
        assert_eq!(stored["x-new"], "b");
        assert_eq!(stored["content-type"], "text/new");
        assert!(!stored.contains_key("connection"));
    }
}
