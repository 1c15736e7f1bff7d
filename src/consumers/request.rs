//! A request's consumer: its key read from the configured header or query parameter, hashed,
//! and looked up.

use http::HeaderMap;
use percent_encoding::percent_decode_str;

use super::key::hash_key;
use super::table::{Consumer, ConsumerTable};
use crate::config::KeySource;
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
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Identity<'t>, RepeatedSubject> {
    let hash = match source {
        KeySource::Header(name) => one_header(headers, name)?.map(hash_key),
        KeySource::Query(name) => one_query_param(query, name)?.map(|v| hash_key(&v)),
    };
    Ok(match hash.and_then(|h| table.get(&h)) {
        Some(c) => Identity::Known(c),
        None => Identity::Unknown,
    })
}

/// `query` without the parameter `name` (`strip_key` for a key read from the query); `None`
/// when nothing is left.
pub fn strip_query_param(query: &str, name: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (k, _) = pair.split_once('=').unwrap_or((pair, ""));
            percent_decode_str(k)
                .decode_utf8()
                .map_or(true, |decoded| decoded != name)
        })
        .collect();
    if kept.iter().all(|p| p.is_empty()) {
        None
    } else {
        Some(kept.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::hex;

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
        let mut h = HeaderMap::new();
        assert!(matches!(
            identify(&header, &t, &h, None),
            Ok(Identity::Unknown)
        ));
        h.insert("x-api-key", "s3cret".parse().unwrap());
        assert!(
            matches!(identify(&header, &t, &h, None), Ok(Identity::Known(c)) if &*c.name == "acme")
        );
        h.append("x-api-key", "other".parse().unwrap());
        assert!(identify(&header, &t, &h, None).is_err());

        let query = KeySource::Query("api_key".into());
        let none = HeaderMap::new();
        assert!(matches!(
            identify(&query, &t, &none, Some("a=1&api_key=s3cr%65t")),
            Ok(Identity::Known(_))
        ));
        assert!(matches!(
            identify(&query, &t, &none, Some("api_key=nope")),
            Ok(Identity::Unknown)
        ));
        assert!(identify(&query, &t, &none, Some("api_key=a&api_key=b")).is_err());
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
