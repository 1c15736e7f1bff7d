use std::net::IpAddr;

use http::header::HeaderName;
use ipnet::IpNet;

use super::resolve::hash_network;
use super::*;
use crate::config::{ForwardedHeader, OnMissing, Prefixes, SubjectSpec};
use crate::limiter::{Shown, SubjectDigest};

use crate::http::head::OwnedHead;

fn headers(pairs: &[(&str, &str)]) -> OwnedHead {
    let mut h = OwnedHead::default();
    for (k, v) in pairs {
        h.headers.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn with_query(h: &OwnedHead, query: &str) -> OwnedHead {
    OwnedHead {
        query: Some(query.to_owned()),
        ..h.clone()
    }
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

const PEER: &str = "10.0.0.5";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_per_thread_memo_of_address_digests_is_exact() {
    // Many more networks than slots, in both families and several prefixes, asked twice in
    // an order that makes slots collide: each answer is the network's own digest.
    let p = Prefixes { v4: 32, v6: 64 };
    let nets: Vec<IpAddr> = (0..300u32)
        .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i * 7)))
        .chain((0..300u128).map(|i| {
            IpAddr::from(std::net::Ipv6Addr::from(
                (0x2001_0db8u128 << 96) + (i << 64) + i,
            ))
        }))
        .collect();
    for round in 0..2 {
        for (k, &a) in nets.iter().enumerate() {
            let want = hash_network(p.network(a));
            assert_eq!(ip_digest_in(a, p), want, "round {round}, address {k}");
            assert_eq!(ip_digest_in(a, p), want, "asked again");
        }
    }
    let whole = Prefixes { v4: 32, v6: 128 };
    let a = ip("2001:db8::1");
    assert_ne!(ip_digest_in(a, p), ip_digest_in(a, whole));
}

#[test]
fn untrusted_peer_ignores_forwarded_headers() {
    let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(client_ip(ip(PEER), &h, &[]), ip(PEER));
    assert_eq!(
        client_ip(ip(PEER), &h, &nets(&["192.168.0.0/16"])),
        ip(PEER)
    );
}

#[test]
fn trusted_peer_walks_from_the_right() {
    let trusted = nets(&["10.0.0.0/8"]);
    let h = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.1.1.1")]);
    assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("1.2.3.4"));
    let h = headers(&[
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "1.2.3.4"),
    ]);
    assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("1.2.3.4"));
    let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
    assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("10.9.9.9"));
}

#[test]
fn forwarded_rfc7239() {
    let trusted = nets(&["10.0.0.0/8"]);
    let h = headers(&[(
        "forwarded",
        "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https",
    )]);
    let of = |h: &OwnedHead| client_of(ip(PEER), h, &trusted, None, ForwardedHeader::Forwarded);
    assert_eq!(
        of(&h),
        Client {
            ip: ip("2001:db8::1"),
            derived: true
        }
    );
    // Issue #34 item 17: under `Forwarded`, a client's X-Forwarded-For decides nothing.
    let h = headers(&[("forwarded", "for=6.6.6.6"), ("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(of(&h).ip, ip("6.6.6.6"));
    // Issue #34 item 15: `unknown`, an obfuscated name or no `for=` at all: not derived.
    for bad in ["for=unknown", "for=_hidden", "proto=https"] {
        let h = headers(&[("forwarded", bad)]);
        assert_eq!(
            of(&h),
            Client {
                ip: ip(PEER),
                derived: false
            },
            "{bad}"
        );
    }
}

/// Issue #34 item 15: what cannot be derived is marked so (the proxy's address, which then
/// matches no allow list or exemption); a junk hop left of the client is never reached.
#[test]
fn underivable_clients_are_marked() {
    let trusted = nets(&["10.0.0.0/8"]);
    let of = |v: &str| {
        client_of(
            ip(PEER),
            &headers(&[("x-forwarded-for", v)]),
            &trusted,
            None,
            ForwardedHeader::XForwardedFor,
        )
    };
    let many = vec!["1.2.3.4"; 65].join(",");
    for bad in ["junk", "010.1.1.1", "1.2.3.4, junk", "", many.as_str()] {
        assert_eq!(
            of(bad),
            Client {
                ip: ip(PEER),
                derived: false
            },
            "{bad:?}"
        );
    }
    assert_eq!(
        of("junk, 1.2.3.4"),
        Client {
            ip: ip("1.2.3.4"),
            derived: true
        }
    );
    assert_eq!(
        client_of(
            ip(PEER),
            &headers(&[]),
            &trusted,
            None,
            ForwardedHeader::XForwardedFor
        ),
        Client {
            ip: ip(PEER),
            derived: true
        },
        "the proxy's own request"
    );
}

#[test]
fn malformed_or_huge_falls_back_to_peer() {
    let trusted = nets(&["10.0.0.0/8"]);
    for bad in ["1.2.3.4, garbage", "", "unknown", "999.1.1.1"] {
        let h = headers(&[("x-forwarded-for", bad)]);
        assert_eq!(client_ip(ip(PEER), &h, &trusted), ip(PEER), "{bad:?}");
    }
    let huge = vec!["1.2.3.4"; 5000].join(",");
    let h = headers(&[("x-forwarded-for", &huge)]);
    assert_eq!(client_ip(ip(PEER), &h, &trusted), ip(PEER));
}

#[test]
fn subjects() {
    let h = headers(&[("x-api-key", "k1")]);
    let c = ip("1.2.3.4");
    let a = subject_of(
        &SubjectSpec::Header(HeaderName::from_static("x-api-key")),
        &h,
        c,
    );
    assert_eq!(a, Ok(Some(SubjectDigest::of(b'h', b"k1"))));
    assert_eq!(
        subject_of(
            &SubjectSpec::Header(HeaderName::from_static("x-other")),
            &h,
            c
        ),
        Ok(None)
    );
    assert_eq!(
        subject_of(
            &SubjectSpec::Query("key".into()),
            &with_query(&h, "a=1&key=k%31"),
            c
        ),
        Ok(Some(SubjectDigest::of(b'q', b"k1")))
    );
    assert_eq!(
        subject_of(
            &SubjectSpec::Query("key".into()),
            &with_query(&h, "keyx=1"),
            c
        ),
        Ok(None)
    );
    assert_ne!(ip_digest(ip("1.2.3.4")), ip_digest(ip("1.2.3.5")));
}

#[test]
fn repeated_subjects_are_refused() {
    let c = ip("1.2.3.4");
    let key = SubjectSpec::Header(HeaderName::from_static("x-api-key"));
    let h = headers(&[("x-api-key", "z"), ("x-api-key", "a")]);
    assert_eq!(subject_of(&key, &h, c), Err(RepeatedSubject));
    let h = headers(&[("x-api-key", "z"), ("x-api-key", "z")]);
    assert_eq!(subject_of(&key, &h, c), Err(RepeatedSubject));
    // One comma-separated value is one value.
    let h = headers(&[("x-api-key", "z, a")]);
    assert!(matches!(subject_of(&key, &h, c), Ok(Some(_))));
    let q = SubjectSpec::Query("key".into());
    let none = OwnedHead::default();
    for query in [
        "key=z&key=a",
        "key=z&k%65y=a",
        "key&key=a",
        "key=z&x=1&key=",
    ] {
        assert_eq!(
            subject_of(&q, &with_query(&none, query), c),
            Err(RepeatedSubject),
            "{query}"
        );
    }
    assert!(matches!(
        subject_of(&q, &with_query(&none, "key=z&keys=a"), c),
        Ok(Some(_))
    ));
}

fn facts(client: &str) -> Facts<'static> {
    Facts {
        client: ip(client),
        derived: true,
        host: Some("api.example"),
        path: "/v1/x",
        route: None,
        consumer: None,
        claims: None,
        body: None,
        peer_trusted: false,
        peer_cert: None,
    }
}

#[test]
fn the_global_subject_keeps_its_digest() {
    // Hashed once per process now; the same digest as ever (it names Redis keys).
    let h = headers(&[]);
    for _ in 0..2 {
        let r = resolve(
            &SubjectSpec::Global,
            OnMissing::Ip,
            Prefixes::default(),
            &h,
            &facts(PEER),
        )
        .unwrap();
        assert_eq!(r.digest, SubjectDigest::of(b'g', b""));
        assert!(!r.by_ip);
    }
}

#[test]
fn prefixes_count_networks_and_keep_whole_ipv4_keys() {
    let p = Prefixes::default();
    assert_eq!(ip_digest_in(ip("1.2.3.4"), p), ip_digest(ip("1.2.3.4")));
    assert_eq!(
        ip_digest_in(ip("::ffff:1.2.3.4"), p),
        ip_digest(ip("1.2.3.4"))
    );
    assert_eq!(
        ip_digest_in(ip("2001:db8:0:1::1"), p),
        ip_digest_in(ip("2001:db8:0:1:ffff::9"), p)
    );
    assert_ne!(
        ip_digest_in(ip("2001:db8:0:1::1"), p),
        ip_digest_in(ip("2001:db8:0:2::1"), p)
    );
    let whole = Prefixes { v4: 32, v6: 128 };
    assert_ne!(
        ip_digest_in(ip("2001:db8:0:1::1"), whole),
        ip_digest_in(ip("2001:db8:0:1::2"), whole)
    );
    assert_eq!(
        ip_digest_in(ip("2001:db8::1"), whole),
        ip_digest(ip("2001:db8::1"))
    );
}

#[test]
fn named_parts_hash_as_a_request_does() {
    let spec = SubjectSpec::compound(vec![
        SubjectSpec::Header(HeaderName::from_static("x-tenant")),
        SubjectSpec::Path,
    ])
    .unwrap();
    let h = headers(&[("x-tenant", "a")]);
    let r = resolve(
        &spec,
        OnMissing::Reject,
        Prefixes::default(),
        &h,
        &facts("1.2.3.4"),
    );
    let named = parts_digest(&spec, |p| match p {
        SubjectSpec::Header(_) => Some(std::borrow::Cow::Borrowed(&b"a"[..])),
        SubjectSpec::Path => Some(std::borrow::Cow::Borrowed(&b"/v1/x"[..])),
        _ => None,
    });
    assert_eq!(named, Some(r.unwrap().digest));
    assert_eq!(parts_digest(&spec, |_| None), None);
    let shown = counted_parts(&spec, Prefixes::default(), &h, &facts("1.2.3.4"));
    assert_eq!(
        shown[1].json(),
        serde_json::json!({"part": "path", "value": "/v1/x"})
    );
    assert!(matches!(shown[0].value, Shown::Key(_)));
}

#[test]
fn compound_subjects_count_each_combination() {
    let spec = SubjectSpec::compound(vec![
        SubjectSpec::Header(HeaderName::from_static("x-tenant")),
        SubjectSpec::Ip,
    ])
    .unwrap();
    let p = Prefixes::default();
    let at = |tenant: Option<&str>, client: &str, on_missing| {
        let h = match tenant {
            Some(t) => headers(&[("x-tenant", t)]),
            None => OwnedHead::default(),
        };
        resolve(&spec, on_missing, p, &h, &facts(client))
    };
    let a = at(Some("a"), "1.2.3.4", OnMissing::Ip).unwrap();
    assert!(!a.by_ip);
    assert_eq!(at(Some("a"), "1.2.3.4", OnMissing::Ip).unwrap(), a);
    assert_ne!(at(Some("b"), "1.2.3.4", OnMissing::Ip).unwrap(), a);
    assert_ne!(at(Some("a"), "1.2.3.5", OnMissing::Ip).unwrap(), a);
    // Missing: the address in its place (not a tenant's bucket), or 401.
    let m = at(None, "1.2.3.4", OnMissing::Ip).unwrap();
    assert_ne!(m, a);
    assert_ne!(m.digest, ip_digest(ip("1.2.3.4")));
    assert_eq!(
        at(None, "1.2.3.4", OnMissing::Reject),
        Err(SubjectError::Missing("header:x-tenant".into()))
    );
    // A part's bytes cannot slide into the next part.
    let two = SubjectSpec::compound(vec![
        SubjectSpec::Header(HeaderName::from_static("a")),
        SubjectSpec::Header(HeaderName::from_static("b")),
    ])
    .unwrap();
    let d = |a: &str, b: &str| {
        resolve(
            &two,
            OnMissing::Reject,
            p,
            &headers(&[("a", a), ("b", b)]),
            &facts("1.1.1.1"),
        )
        .unwrap()
    };
    assert_ne!(d("ab", "c"), d("a", "bc"));
    // Repeated parts are refused.
    let h = headers(&[("x-tenant", "a"), ("x-tenant", "b")]);
    assert_eq!(
        resolve(&spec, OnMissing::Ip, p, &h, &facts("1.1.1.1")),
        Err(SubjectError::Repeated("header:x-tenant".into()))
    );
}

#[test]
fn json_parts_are_strings_of_the_body() {
    let spec = SubjectSpec::compound(vec![
        SubjectSpec::Header(HeaderName::from_static("x-key")),
        SubjectSpec::parse_one("json:model").unwrap(),
    ])
    .unwrap();
    let paths: Vec<Box<[Box<str>]>> = vec![vec![Box::from("model")].into()];
    let h = headers(&[("x-key", "k")]);
    let p = Prefixes::default();
    let at = |doc: Option<&str>, on_missing| {
        let fields = doc.map(|d| crate::body_cost::json_fields::extract(&paths, d.as_bytes()));
        let f = Facts {
            body: fields.as_ref(),
            ..facts("1.2.3.4")
        };
        resolve(&spec, on_missing, p, &h, &f)
    };
    let a = at(Some(r#"{"model":"a"}"#), OnMissing::Ip).unwrap();
    assert_eq!(
        at(Some(r#"{"model":"a","x":1}"#), OnMissing::Ip).unwrap(),
        a
    );
    assert_ne!(at(Some(r#"{"model":"b"}"#), OnMissing::Ip).unwrap(), a);
    // Not a string, empty, absent, not JSON, not read: missing, counted by address or 400.
    let missing = at(None, OnMissing::Ip).unwrap();
    for doc in [
        r#"{"model":7}"#,
        r#"{"model":""}"#,
        "{}",
        "nope",
        r#"{"model":["a"]}"#,
    ] {
        assert_eq!(at(Some(doc), OnMissing::Ip).unwrap(), missing, "{doc}");
        assert_eq!(
            at(Some(doc), OnMissing::Reject),
            Err(SubjectError::MissingInBody("json:model".into())),
            "{doc}"
        );
    }
    assert_ne!(missing, a);
    // Shown hashed, never as written.
    let fields = crate::body_cost::json_fields::extract(&paths, br#"{"model":"secret-model"}"#);
    let f = Facts {
        body: Some(&fields),
        ..facts("1.2.3.4")
    };
    let shown = shown_parts(&spec, p, &h, &f);
    assert!(matches!(shown[1].value, Shown::Key(_)), "{shown:?}");
    assert!(!shown[1].json().to_string().contains("secret"));
}

#[test]
fn cookies_and_shown_parts() {
    let h = headers(&[("cookie", "a=1; sid=\"s3cret\""), ("cookie", "b=2")]);
    assert_eq!(one_cookie(&h, "sid"), Ok(Some(&b"s3cret"[..])));
    assert_eq!(one_cookie(&h, "zz"), Ok(None));
    let h2 = headers(&[("cookie", "sid=1"), ("cookie", "sid=2")]);
    assert_eq!(one_cookie(&h2, "sid"), Err(RepeatedSubject));
    let spec = SubjectSpec::compound(vec![
        SubjectSpec::Cookie("sid".into()),
        SubjectSpec::Method,
        SubjectSpec::Host,
        SubjectSpec::Ip,
    ])
    .unwrap();
    let shown = shown_parts(&spec, Prefixes { v4: 24, v6: 64 }, &h, &facts("1.2.3.4"));
    let json: Vec<String> = shown.iter().map(|p| p.json().to_string()).collect();
    assert!(!json.concat().contains("s3cret"), "{json:?}");
    assert_eq!(json[1], r#"{"part":"method","value":"GET"}"#);
    assert_eq!(json[2], r#"{"part":"host","value":"api.example"}"#);
    assert_eq!(json[3], r#"{"part":"ip","value":"1.2.3.0/24"}"#);
}

/// Issue #34 item 17: by default `X-Forwarded-For` alone decides; a `Forwarded` header (which
/// a client can add as easily) never does.
#[test]
fn forwarded_is_not_believed_by_default() {
    let trusted = nets(&["10.0.0.0/8"]);
    let h = headers(&[("forwarded", "for=6.6.6.6")]);
    assert_ne!(client_ip(ip(PEER), &h, &trusted), ip("6.6.6.6"));
}

/// Issue #34 item 21: a `query:` part is read as upstreams read a query value: `+` is a
/// space, as `%20` is.
#[test]
fn query_parts_read_plus_as_space() {
    let q = SubjectSpec::Query("model".into());
    let none = OwnedHead::default();
    let c = ip("1.2.3.4");
    let plus = subject_of(&q, &with_query(&none, "model=big+one"), c);
    let pct = subject_of(&q, &with_query(&none, "model=big%20one"), c);
    assert_eq!(plus, pct);
    assert_eq!(plus, Ok(Some(SubjectDigest::of(b'q', b"big one"))));
    // An encoded `+` stays a plus.
    assert_eq!(
        subject_of(&q, &with_query(&none, "model=a%2Bb"), c),
        Ok(Some(SubjectDigest::of(b'q', b"a+b")))
    );
}

#[test]
fn real_ip_header_only_from_trusted_peers() {
    let name = HeaderName::from_static("cf-connecting-ip");
    let trusted = nets(&["10.0.0.0/8"]);
    let h = headers(&[
        ("cf-connecting-ip", "203.0.113.9"),
        ("x-forwarded-for", "1.2.3.4"),
    ]);
    assert_eq!(
        client_ip_with(ip(PEER), &h, &trusted, Some(&name)),
        ip("203.0.113.9")
    );
    assert_eq!(
        client_ip_with(ip("192.0.2.1"), &h, &trusted, Some(&name)),
        ip("192.0.2.1")
    );
    assert_eq!(client_ip_with(ip(PEER), &h, &trusted, None), ip("1.2.3.4"));
    // Garbage or two values: the usual walk.
    let h = headers(&[("cf-connecting-ip", "nope"), ("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(
        client_ip_with(ip(PEER), &h, &trusted, Some(&name)),
        ip("1.2.3.4")
    );
    let h = headers(&[
        ("cf-connecting-ip", "5.5.5.5"),
        ("cf-connecting-ip", "6.6.6.6"),
    ]);
    assert_eq!(
        client_ip_with(ip(PEER), &h, &trusted, Some(&name)),
        ip(PEER)
    );
}
