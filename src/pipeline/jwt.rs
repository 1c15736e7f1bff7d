//! The token phase of a route with `jwt`: the bearer token read (RFC 6750: `Authorization:
//! Bearer`, or `[jwt] header` / `query`), verified ([`crate::jwt::Verifier`], cached per
//! worker), and its claims handed to the limits (`jwt:CLAIM` subjects). A missing token on a
//! `required` route and a bad token on any is a 401, counted by reason; it is never forwarded.

use std::sync::Arc;

use http::header::AUTHORIZATION;

use super::answer::ProxyError;
use crate::config::{JwtConfig, JwtMode, TokenSource};
use crate::http::head::{header_str, RequestHead};
use crate::jwt::{Rejection, Verified, Verifier};
use crate::routing::Route;
use tollgate_limit::worker::WorkerId;

/// The request's token: `Ok(None)` when it carries none, an error when it carries one in a form
/// that cannot be read (sent twice, not text, not a bearer token in `Authorization`'s place).
pub fn token_of<'h>(
    cfg: &'h JwtConfig,
    head: &'h impl RequestHead,
) -> Result<Option<std::borrow::Cow<'h, str>>, Rejection> {
    let name = match &cfg.header {
        TokenSource::Bearer => &AUTHORIZATION,
        TokenSource::Header(h) => h,
    };
    let mut values = head.header_values(name);
    if let Some(v) = values.next() {
        if values.next().is_some() {
            return Err(Rejection::Malformed);
        }
        let v = header_str(v).ok_or(Rejection::Malformed)?.trim();
        // The scheme ends at the first space or tab (RFC 9110 §11.4: any case; a tab or several
        // spaces are read as one by servers behind, so they are here: a token so spelt is
        // verified, never passed on as an anonymous request's, issue #34 item 18).
        let token = match v.split_once([' ', '\t']) {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            // `Authorization` with another scheme (Basic): no bearer token.
            _ if cfg.header == TokenSource::Bearer => return query_token(cfg, head),
            _ => v,
        };
        return if token.is_empty() {
            Err(Rejection::Malformed)
        } else {
            Ok(Some(std::borrow::Cow::Borrowed(token)))
        };
    }
    query_token(cfg, head)
}

fn query_token<'h>(
    cfg: &'h JwtConfig,
    head: &'h impl RequestHead,
) -> Result<Option<std::borrow::Cow<'h, str>>, Rejection> {
    let Some(name) = &cfg.query else {
        return Ok(None);
    };
    match crate::subject::one_query_param(head.query(), name) {
        Err(_) => Err(Rejection::Malformed),
        Ok(None) => Ok(None),
        Ok(Some(bytes)) => match bytes {
            std::borrow::Cow::Borrowed(b) => std::str::from_utf8(b)
                .map(|s| Some(std::borrow::Cow::Borrowed(s)))
                .map_err(|_| Rejection::Malformed),
            std::borrow::Cow::Owned(b) => String::from_utf8(b)
                .map(|s| Some(std::borrow::Cow::Owned(s)))
                .map_err(|_| Rejection::Malformed),
        },
    }
}

/// The verified claims of the request on `route` (`None`: no `jwt` on the route, or no token on
/// an `optional` one). Under admission (`worker`), a refusal is counted in
/// `tollgate_jwt_rejected_total` and the token verified through the worker's cache and its
/// client's bad-token throttle; evaluate-only (`None`), the same answer, counting nothing.
pub fn verify(
    cfg: Option<&JwtConfig>,
    verifier: Option<&Verifier>,
    route: &Route,
    head: &impl RequestHead,
    client: std::net::IpAddr,
    worker: Option<WorkerId>,
) -> Result<Option<Arc<Verified>>, ProxyError> {
    let Some(mode) = route.jwt else {
        return Ok(None);
    };
    let reject = |r: Rejection| {
        if worker.is_some() {
            metrics::counter!(crate::metrics::JWT_REJECTED, "route" => route.name.to_string(), "reason" => r.as_str())
                .increment(1);
        }
        ProxyError::Token(r)
    };
    // Validation refuses `jwt` on a route without `[jwt]`; a snapshot built without keys
    // refuses every token.
    let (Some(cfg), Some(verifier)) = (cfg, verifier) else {
        return Err(reject(Rejection::UnknownKey));
    };
    match token_of(cfg, head).map_err(reject)? {
        None if mode == JwtMode::Optional => Ok(None),
        None => Err(reject(Rejection::Missing)),
        Some(token) => match worker {
            Some(worker) => verifier.verify(&token, client, worker),
            None => verifier.verify_uncounted(&token, client),
        }
        .map(Some)
        .map_err(reject),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::OwnedHead;
    use std::time::Duration;

    fn cfg(header: TokenSource, query: Option<&str>) -> JwtConfig {
        JwtConfig {
            keys: crate::config::JwtKeySource::SecretEnv("S".into()),
            algorithms: vec![jsonwebtoken::Algorithm::HS256],
            issuer: None,
            audience: None,
            leeway: Duration::ZERO,
            header,
            query: query.map(str::to_owned),
            cache_size: 0,
            max_bad_tokens: 0,
        }
    }

    fn head(headers: &[(&str, &str)], query: Option<&str>) -> OwnedHead {
        let mut h = OwnedHead {
            query: query.map(str::to_owned),
            ..OwnedHead::default()
        };
        for (k, v) in headers {
            h.headers.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn tokens_are_read_as_rfc_6750_says() {
        let bearer = cfg(TokenSource::Bearer, Some("access_token"));
        let t = |h: &OwnedHead| token_of(&bearer, h).map(|t| t.map(|t| t.into_owned()));
        assert_eq!(
            t(&head(&[("authorization", "Bearer abc")], None)),
            Ok(Some("abc".into()))
        );
        assert_eq!(
            t(&head(&[("authorization", "bearer   abc ")], None)),
            Ok(Some("abc".into()))
        );
        assert_eq!(t(&head(&[], None)), Ok(None));
        // Another scheme is no bearer token; the query may still carry one.
        assert_eq!(t(&head(&[("authorization", "Basic dTpw")], None)), Ok(None));
        assert_eq!(
            t(&head(
                &[("authorization", "Basic dTpw")],
                Some("access_token=q")
            )),
            Ok(Some("q".into()))
        );
        assert_eq!(
            t(&head(&[], Some("a=1&access_token=q%2E1"))),
            Ok(Some("q.1".into()))
        );
        // Twice, or empty: malformed.
        assert_eq!(
            t(&head(
                &[("authorization", "Bearer a"), ("authorization", "Bearer b")],
                None
            )),
            Err(Rejection::Malformed)
        );
        assert_eq!(
            t(&head(&[], Some("access_token=a&access_token=b"))),
            Err(Rejection::Malformed)
        );
        // `Bearer` alone is no token.
        assert_eq!(t(&head(&[("authorization", "Bearer ")], None)), Ok(None));
        // Issue #34 item 18: every spelling of the scheme — a tab, several spaces, any case.
        for v in [
            "Bearer\tabc",
            "bearer \t abc",
            "BEARER\t\tabc",
            "Bearer  abc",
        ] {
            assert_eq!(
                t(&head(&[("authorization", v)], None)),
                Ok(Some("abc".into())),
                "{v:?}"
            );
        }
        // A scheme that only starts with "Bearer" is another scheme.
        assert_eq!(
            t(&head(&[("authorization", "Bearerx abc")], None)),
            Ok(None)
        );
        let named = cfg(
            TokenSource::Header(http::HeaderName::from_static("x-token")),
            None,
        );
        let n = |h: &OwnedHead| token_of(&named, h).map(|t| t.map(|t| t.into_owned()));
        assert_eq!(
            n(&head(&[("x-token", "abc")], None)),
            Ok(Some("abc".into()))
        );
        assert_eq!(
            n(&head(&[("x-token", "Bearer abc")], None)),
            Ok(Some("abc".into()))
        );
        assert_eq!(n(&head(&[("authorization", "Bearer abc")], None)), Ok(None));
    }
}
