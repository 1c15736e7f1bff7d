//! A request's consumer: its key read from the configured header or query parameter, hashed,
//! and looked up; without a key, its connection's verified client certificate (`cert_sha256`).
//!
//! Precedence: a request that carries a key is identified by that key alone, known or not —
//! the key is the more specific credential (one partner certificate commonly fronts several
//! applications, each with its own key and plan), and a key that is sent is a claim to be
//! checked, never overridden by the connection. A certificate no consumer has is not a claim:
//! with no key, the request is as one without a key (`on_unknown`).

use super::key::hash_key;
use super::table::ConsumerTable;
use crate::config::KeySource;
use crate::http::head::RequestHead;
use crate::subject::{one_header, one_query_param, Consumer, RepeatedSubject};
use crate::tls::peer::PeerCert;

/// Who a request says it is.
#[derive(Debug, Clone, Copy)]
pub enum Identity<'t> {
    /// A key (or, without a key, a client certificate) of a consumer in the table.
    Known(&'t Consumer),
    /// No key, an empty one, or a key no consumer has (and no certificate a consumer has).
    Unknown,
}

/// Finds the consumer of a request: by its key, or, when it sends none, by the verified client
/// certificate of its connection (`cert`). A key sent twice (two headers, or the parameter
/// twice) is refused, as for limit subjects: the upstream might read the other one.
pub fn identify<'t>(
    source: &KeySource,
    table: &'t ConsumerTable,
    head: &impl RequestHead,
    cert: Option<&PeerCert>,
) -> Result<Identity<'t>, RepeatedSubject> {
    let hash = match source {
        KeySource::Header(name) => one_header(head, name)?.map(hash_key),
        KeySource::Query(name) => one_query_param(head.query(), name)?.map(|v| hash_key(&v)),
        KeySource::TokenOnly => None,
    };
    let found = match hash {
        Some(h) => table.get(&h),
        // A connection without a certificate pays this one branch.
        None => cert.and_then(|c| table.by_cert(&c.sha256)),
    };
    Ok(match found {
        Some(c) => Identity::Known(c),
        None => Identity::Unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;
    use crate::http::head::OwnedHead;

    fn q(query: &str) -> OwnedHead {
        OwnedHead {
            query: Some(query.to_owned()),
            ..OwnedHead::default()
        }
    }
    use crate::subject::strip_query_param;

    fn table() -> ConsumerTable {
        let text = format!(
            "[[consumer]]\nname = \"acme\"\nplan = \"p\"\nkey_sha256 = \"{}\"\n",
            hex::encode(&hash_key(b"s3cret"))
        );
        ConsumerTable::parse(&text, &["p"]).unwrap()
    }

    #[test]
    fn a_key_is_read_from_the_header_or_the_query() {
        let t = table();
        let header = KeySource::Header(http::HeaderName::from_static("x-api-key"));
        let mut h = OwnedHead::default();
        assert!(matches!(
            identify(&header, &t, &h, None),
            Ok(Identity::Unknown)
        ));
        h.headers.insert("x-api-key", "s3cret".parse().unwrap());
        assert!(
            matches!(identify(&header, &t, &h, None), Ok(Identity::Known(c)) if &*c.name == "acme")
        );
        h.headers.append("x-api-key", "other".parse().unwrap());
        assert!(identify(&header, &t, &h, None).is_err());

        let query = KeySource::Query("api_key".into());
        assert!(matches!(
            identify(&query, &t, &q("a=1&api_key=s3cr%65t"), None),
            Ok(Identity::Known(_))
        ));
        assert!(matches!(
            identify(&query, &t, &q("api_key=nope"), None),
            Ok(Identity::Unknown)
        ));
        assert!(identify(&query, &t, &q("api_key=a&api_key=b"), None).is_err());
    }

    /// Hardening III #2: every spelling an upstream may read as the key is the key (before, each
    /// was "no key" and reached the upstream unseen).
    #[test]
    fn a_query_key_is_read_after_semicolons_and_in_any_case() {
        let t = table();
        let query = KeySource::Query("api_key".into());
        for text in [
            "x=1;api_key=s3cret",
            "API_KEY=s3cret",
            "a=1&Api_Key=s3cret",
            "api%5Fkey=s3cret",
            "x=1;API%5fKEY=s3cret;y",
        ] {
            assert!(
                matches!(identify(&query, &t, &q(text), None), Ok(Identity::Known(_))),
                "{text}"
            );
        }
        // Two spellings at once are two keys: refused, whichever the upstream would read.
        assert!(identify(&query, &t, &q("api_key=s3cret;API_KEY=other"), None).is_err());
        assert!(identify(&query, &t, &q("api_key=s3cret&API_KEY=s3cret"), None).is_err());
        assert_eq!(
            strip_query_param("x=1;API_KEY=k&b=2;c", "api_key").as_deref(),
            Some("x=1&b=2;c")
        );
        assert_eq!(
            strip_query_param("Api_Key=k;a=1;b=2", "api_key").as_deref(),
            Some("a=1;b=2")
        );
        assert_eq!(strip_query_param("api_key=k;API_key=j&", "api_key"), None);
    }

    #[test]
    fn strip_key_removes_only_that_parameter() {
        assert_eq!(
            strip_query_param("a=1&api_key=k&b=2", "api_key").as_deref(),
            Some("a=1&b=2")
        );
        assert_eq!(strip_query_param("api_key=k", "api_key"), None);
        assert_eq!(
            strip_query_param("api_keyx=1", "api_key").as_deref(),
            Some("api_keyx=1")
        );
    }
}
