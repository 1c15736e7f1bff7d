//! `POST /-/cache/purge` (admin): removes stored responses by key — the URL a request names,
//! `scheme://host/path?query`, every caller's copy of it (whatever the route's extra key parts)
//! — by path prefix (`/path`: every host's responses whose path starts with it), or by tag
//! (every response whose `[cache] tag_header` field listed the tag when it was stored).

use serde::Deserialize;

use super::key::{path_of, url_of};
use super::phase::Cache;

/// The body of a purge.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Purge {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    tag: Option<String>,
}

/// Runs the purge `body` asks for on `cache` (`None`: no route caches): the status and the
/// JSON reply (`{"purged": N}`: the keys removed from either tier). With a disk tier, wait for
/// [`Cache::loaded`] first: a file not yet read at start would escape.
pub fn purge(cache: Option<&Cache>, body: &[u8]) -> (http::StatusCode, String) {
    use http::StatusCode;
    let bad = |m: &str| {
        (
            StatusCode::BAD_REQUEST,
            serde_json::json!({ "error": m }).to_string(),
        )
    };
    let Ok(p) = serde_json::from_slice::<Purge>(body) else {
        return bad(
            r#"expected {"key": "scheme://host/path?query"}, {"prefix": "/path"} or {"tag": "T"}"#,
        );
    };
    let Some(cache) = cache else {
        return (StatusCode::OK, r#"{"purged":0}"#.to_owned());
    };
    let purged = match (p.key, p.prefix, p.tag) {
        (Some(k), None, None) => {
            let k = lower_host(&k);
            cache.remove_where(|stored, _| url_of(stored) == k)
        }
        (None, Some(prefix), None) if prefix.starts_with('/') => {
            cache.remove_where(|stored, _| path_of(stored).starts_with(&prefix))
        }
        (None, Some(_), None) => return bad("a prefix is a path: it starts with '/'"),
        (None, None, Some(tag)) => {
            let tag = tag.trim();
            if tag.is_empty() || tag.contains([',', ' ', '\t']) {
                return bad("a tag is one tag: not empty, no comma or space");
            }
            cache.remove_where(|_, tags| tags.iter().any(|t| &**t == tag))
        }
        _ => return bad(r#"expected one of "key", "prefix" and "tag""#),
    };
    (StatusCode::OK, format!(r#"{{"purged":{purged}}}"#))
}

/// A URL with its scheme and host in lower case (as keys hold them).
fn lower_host(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (host, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    format!(
        "{}://{}{}",
        scheme.to_ascii_lowercase(),
        host.to_ascii_lowercase(),
        path
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::store::Entry;
    use crate::config::CacheConfig;

    fn entry() -> Entry {
        Entry {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::new(),
            times: crate::cache::freshness::Times {
                request: 0,
                response: 0,
            },
            lifetime: 10,
            directives: Default::default(),
            vary: Vec::new(),
            tags: Box::default(),
        }
    }

    fn tagged(tags: &str) -> Entry {
        let mut e = entry();
        e.headers.insert(
            "cache-tag",
            http::HeaderValue::from_str(tags).expect("a field value"),
        );
        e
    }

    #[test]
    fn purge_by_tag_removes_every_response_that_lists_it() {
        let cache = Cache::new(&CacheConfig::default());
        cache.store.insert("http://a/1".into(), tagged("a"));
        cache.store.insert("http://a/2".into(), tagged("b, a"));
        cache.store.insert("http://a/3".into(), tagged("b ab"));
        cache.store.insert("http://a/4".into(), entry());
        let (s, body) = purge(Some(&cache), br#"{"tag":"a"}"#);
        assert_eq!((s.as_u16(), body.as_str()), (200, r#"{"purged":2}"#));
        assert!(cache.store.get("http://a/1").is_none());
        assert!(cache.store.get("http://a/2").is_none());
        // `ab` is another tag; an untagged response stays.
        assert!(cache.store.get("http://a/3").is_some());
        assert!(cache.store.get("http://a/4").is_some());
        assert_eq!(purge(Some(&cache), br#"{"tag":"b"}"#).1, r#"{"purged":1}"#);
        for bad in [
            &br#"{"tag":""}"#[..],
            br#"{"tag":"a,b"}"#,
            br#"{"tag":"a","prefix":"/"}"#,
        ] {
            assert_eq!(purge(Some(&cache), bad).0.as_u16(), 400);
        }
        // Another tag field.
        let config = CacheConfig {
            tag_header: http::HeaderName::from_static("surrogate-key"),
            ..CacheConfig::default()
        };
        let cache = Cache::new(&config);
        let mut e = entry();
        e.headers
            .insert("surrogate-key", http::HeaderValue::from_static("k1 k2"));
        cache.store.insert("http://a/5".into(), e);
        cache.store.insert("http://a/6".into(), tagged("k2"));
        assert_eq!(purge(Some(&cache), br#"{"tag":"k2"}"#).1, r#"{"purged":1}"#);
        assert!(cache.store.get("http://a/6").is_some());
    }

    #[test]
    fn purge_by_url_and_by_prefix() {
        let cache = Cache::new(&CacheConfig::default());
        for k in [
            "http://a/x?1",
            "http://a/x?1\u{1}tenant",
            "http://a/x/y",
            "http://b/z",
        ] {
            cache.store.insert(k.into(), entry());
        }
        let (s, body) = purge(Some(&cache), br#"{"key":"http://A/x?1"}"#);
        assert_eq!((s.as_u16(), body.as_str()), (200, r#"{"purged":2}"#));
        let (_, body) = purge(Some(&cache), br#"{"prefix":"/x"}"#);
        assert_eq!(body, r#"{"purged":1}"#);
        assert!(cache.store.get("http://b/z").is_some());
        assert_eq!(purge(Some(&cache), b"{}").0.as_u16(), 400);
        assert_eq!(purge(Some(&cache), br#"{"prefix":"x"}"#).0.as_u16(), 400);
        assert_eq!(purge(None, br#"{"prefix":"/"}"#).1, r#"{"purged":0}"#);
    }
}
