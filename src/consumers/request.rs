//! A request's consumer: its key read from the configured header or query parameter, hashed,
//! and looked up.

use super::key::hash_key;
use super::table::{Consumer, ConsumerTable};
use crate::config::KeySource;
use crate::head::RequestHead;
use crate::subject::{one_header, one_query_param, RepeatedSubject};

/// Who a request says it is.
#[derive(Debug, Clone, Copy)]
pub enum Identity<'t> {
    /// A key of a consumer in the table.
    Known(&'t Consumer),
    /// No key, an empty one, or a key no consumer has.
    Unknown,
}

/// Finds the consumer of a request. A key sent twice (two headers, or the parameter twice) is
/// refused, as for limit subjects: the upstream might read the other one.
pub fn identify<'t>(
    source: &KeySource,
    table: &'t ConsumerTable,
    head: &impl RequestHead,
) -> Result<Identity<'t>, RepeatedSubject> {
    let hash = match source {
        KeySource::Header(name) => one_header(head, name)?.map(hash_key),
        KeySource::Query(name) => one_query_param(head.query(), name)?.map(|v| hash_key(&v)),
        KeySource::TokenOnly => None,
    };
    Ok(match hash.and_then(|h| table.get(&h)) {
        Some(c) => Identity::Known(c),
        None => Identity::Unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::hex;
    use crate::head::OwnedHead;

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
            hex(&hash_key(b"s3cret"))
        );
        ConsumerTable::parse(&text, &["p"]).unwrap()
    }

    #[test]
    fn a_key_is_read_from_the_header_or_the_query() {
        let t = table();
        let header = KeySource::Header(http::HeaderName::from_static("x-api-key"));
        let mut h = OwnedHead::default();
        assert!(matches!(identify(&header, &t, &h), Ok(Identity::Unknown)));
        h.headers.insert("x-api-key", "s3cret".parse().unwrap());
        assert!(matches!(identify(&header, &t, &h), Ok(Identity::Known(c)) if &*c.name == "acme"));
        h.headers.append("x-api-key", "other".parse().unwrap());
        assert!(identify(&header, &t, &h).is_err());

        let query = KeySource::Query("api_key".into());
        assert!(matches!(
            identify(&query, &t, &q("a=1&api_key=s3cr%65t")),
            Ok(Identity::Known(_))
        ));
        assert!(matches!(
            identify(&query, &t, &q("api_key=nope")),
            Ok(Identity::Unknown)
        ));
        assert!(identify(&query, &t, &q("api_key=a&api_key=b")).is_err());
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
                matches!(identify(&query, &t, &q(text)), Ok(Identity::Known(_))),
                "{text}"
            );
        }
        // Two spellings at once are two keys: refused, whichever the upstream would read.
        assert!(identify(&query, &t, &q("api_key=s3cret;API_KEY=other")).is_err());
        assert!(identify(&query, &t, &q("api_key=s3cret&API_KEY=s3cret")).is_err());
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
