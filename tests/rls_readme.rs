//! `[rls]` held to envoyproxy/ratelimit's own word (issue 50, oracle (b)): every example of its
//! README's "Configuration" section and every config of its `test/config`, `examples/ratelimit`
//! and integration-test directories is loaded as a `config_dir` file, and every call its README
//! describes — plus the calls its test configs are written for — gets the answer it gives
//! (code, limit, remaining), through the real gRPC service, on every store, on an injected
//! clock (so a per-second limit is not cut by a second boundary). The configs it refuses are
//! refused here too.
//!
//! The configs below are Tollgate's transcriptions of envoyproxy/ratelimit's files at commit
//! f2fb15770f7fd1c88ca6c3a1b58ee513917ace96 (the source of each is named): the same domains,
//! keys, values and limits, written compactly. Upstream's own files are not kept in this
//! repository; `upstream_files_load_as_is` (ignored: it needs a checkout of envoyproxy/ratelimit
//! named by `TOLLGATE_RLS_UPSTREAM_DIR`) reads them byte for byte, checks that each parses to
//! the same model as its transcription here, and answers the whole table on them.
//!
//! Where Tollgate answers otherwise than envoyproxy/ratelimit by design (a call refused charges
//! none of its descriptors; metric labels never carry a request's values) the row says so.

mod support;

use std::path::Path;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::*;

/// Where upstream has a config: the n-th ```yaml block of its README's "### Examples" section
/// (0-based, in order), or a file of the repository.
#[derive(Clone, Copy, Debug)]
enum Src {
    Readme(usize),
    File(&'static str),
}

/// One call, made `times` times in a row: `descriptors` is `k=v,k2=v2 | k=v` (descriptors split
/// on ` | `, entries on `,`, each on its first `=`); `overall` is `OK` or `OVER`; `want` has one
/// item per descriptor: `<OK|OVER> <limit> <remaining>`, the limit `-` (none), `inf`
/// (`unlimited`: remaining 4294967295) or `N/<s|m|h|d>`, the remaining a number or `*` (not
/// checked); the last call of the run is the one checked for `remaining`, every one for codes.
struct Row {
    times: u32,
    descriptors: &'static str,
    overall: &'static str,
    want: &'static [&'static str],
}

const fn r(
    times: u32,
    descriptors: &'static str,
    overall: &'static str,
    want: &'static [&'static str],
) -> Row {
    Row {
        times,
        descriptors,
        overall,
        want,
    }
}

/// A config loaded alone (one `config_dir` file) and the calls made on it; `metric` lines of
/// `tollgate_rls_decisions_total` that must count (labels that must all be on one line), and
/// `never`: text that must appear nowhere in `/metrics` (a request's values are no label).
struct Case {
    name: &'static str,
    src: Src,
    yaml: &'static str,
    rows: Vec<Row>,
    metric: &'static [&'static [&'static str]],
    never: &'static [&'static str],
}

const NONE: &[&[&str]] = &[];

fn cases() -> Vec<Case> {
    vec![
        // README "Example 1".
        Case {
            name: "readme example 1",
            src: Src::Readme(0),
            yaml: "domain: mongo_cps\ndescriptors:\n\
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}\n\
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}\n",
            rows: vec![
                r(1, "database=users", "OK", &["OK 500/s 499"]),
                r(1, "database=default", "OK", &["OK 500/s 499"]),
                r(1, "database=other", "OK", &["OK - *"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 2": 5 marketing messages a day per number, 100 messages a day per
        // number; one call with both descriptors is their logical OR.
        Case {
            name: "readme example 2",
            src: Src::Readme(1),
            yaml: "domain: messaging\ndescriptors:\n\
  - {key: message_type, value: marketing, descriptors: [{key: to_number, rate_limit: {unit: day, requests_per_unit: 5}}]}\n\
  - {key: to_number, rate_limit: {unit: day, requests_per_unit: 100}}\n",
            rows: vec![
                r(
                    5,
                    "message_type=marketing,to_number=2061111111 | to_number=2061111111",
                    "OK",
                    &["OK 5/d 0", "OK 100/d 95"],
                ),
                r(
                    1,
                    "message_type=marketing,to_number=2061111111 | to_number=2061111111",
                    "OVER",
                    &["OVER 5/d 0", "OK 100/d *"],
                ),
                // Each number has its own 5.
                r(1, "message_type=marketing,to_number=2062222222", "OK", &["OK 5/d 4"]),
                // Tollgate: the refused call charged nothing (envoyproxy/ratelimit: 93).
                r(1, "to_number=2061111111", "OK", &["OK 100/d 94"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 3": 10 a second per address, one address blocked.
        Case {
            name: "readme example 3",
            src: Src::Readme(2),
            yaml: "domain: edge_proxy_per_ip\ndescriptors:\n\
  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}\n\
  - {key: remote_address, value: 50.0.0.5, rate_limit: {unit: second, requests_per_unit: 0}}\n",
            rows: vec![
                r(10, "remote_address=50.0.0.1", "OK", &["OK 10/s 0"]),
                r(1, "remote_address=50.0.0.1", "OVER", &["OVER 10/s 0"]),
                r(1, "remote_address=50.0.0.2", "OK", &["OK 10/s 9"]),
                r(1, "remote_address=50.0.0.5", "OVER", &["OVER 0/s 0"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 4", first config: a request of two tuples does not match one level.
        Case {
            name: "readme example 4 (no match)",
            src: Src::Readme(3),
            yaml: "domain: example4\ndescriptors:\n\
  - {key: key, value: value, rate_limit: {requests_per_unit: 300, unit: second}}\n",
            rows: vec![
                r(1, "key=value,subkey=subvalue", "OK", &["OK - *"]),
                r(1, "key=value", "OK", &["OK 300/s 299"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 4", second config: it matches.
        Case {
            name: "readme example 4 (match)",
            src: Src::Readme(4),
            yaml: "domain: example4\ndescriptors:\n\
  - {key: key, value: value, descriptors: [{key: subkey, rate_limit: {requests_per_unit: 300, unit: second}}]}\n",
            rows: vec![
                r(1, "key=value,subkey=subvalue", "OK", &["OK 300/s 299"]),
                r(1, "key=value", "OK", &["OK - *"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 5": unlimited answers OK with LimitRemaining MaxUint32.
        Case {
            name: "readme example 5",
            src: Src::Readme(5),
            yaml: "domain: internal\ndescriptors:\n\
  - {key: ldap, rate_limit: {unlimited: true}}\n\
  - {key: azure, rate_limit: {unit: minute, requests_per_unit: 100}}\n",
            rows: vec![
                r(3, "ldap=anything", "OK", &["OK inf *"]),
                r(1, "azure=x", "OK", &["OK 100/m 99"]),
            ],
            metric: &[&["domain=\"internal\"", "decision=\"unlimited\""]],
            never: &[],
        },
        // README "Example 6": user-a in shadow mode is never limited (but counted), user-b 20/s.
        Case {
            name: "readme example 6",
            src: Src::Readme(6),
            yaml: r#"domain: example6
descriptors:
  - key: service
    descriptors:
      - {key: user, value: user-a, rate_limit: {requests_per_unit: 10, unit: second}, shadow_mode: true}
      - {key: user, value: user-b, rate_limit: {requests_per_unit: 20, unit: second}}
"#,
            rows: vec![
                r(15, "service=auth-service,user=user-a", "OK", &["OK 10/s 0"]),
                r(20, "service=auth-service,user=user-b", "OK", &["OK 20/s 0"]),
                r(1, "service=auth-service,user=user-b", "OVER", &["OVER 20/s 0"]),
            ],
            metric: &[&[
                "domain=\"example6\"",
                "descriptor=\"service.user_user-a\"",
                "decision=\"shadow\"",
            ]],
            never: &[],
        },
        // README "Example 7": (key_2, value_2), (user, bkthomps) replaces specific_limit when
        // both match one call, and leaves its 5/s alone.
        Case {
            name: "readme example 7",
            src: Src::Readme(7),
            yaml: "domain: example7\ndescriptors:\n\
  - {key: key_1, value: value_1, descriptors: [{key: user, value: bkthomps, rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}}]}\n\
  - {key: key_2, value: value_2, descriptors: [{key: user, value: bkthomps, rate_limit: {replaces: [{name: specific_limit}], requests_per_unit: 10, unit: second}}]}\n",
            rows: vec![
                r(
                    10,
                    "key_1=value_1,user=bkthomps | key_2=value_2,user=bkthomps",
                    "OK",
                    &["OK - *", "OK 10/s 0"],
                ),
                r(
                    1,
                    "key_1=value_1,user=bkthomps | key_2=value_2,user=bkthomps",
                    "OVER",
                    &["OK - *", "OVER 10/s 0"],
                ),
                r(1, "key_1=value_1,user=bkthomps", "OK", &["OK 5/s 4"]),
                r(1, "key_2=value_2,user=bkthomps", "OVER", &["OVER 10/s 0"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 8": detailed_metric; each unspecified value has its own limit.
        Case {
            name: "readme example 8",
            src: Src::Readme(8),
            yaml: "domain: example8\ndescriptors:\n\
  - {key: key1, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}\n\
  - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
            rows: vec![
                r(1, "key1=unspecified_value", "OK", &["OK 10/m 9"]),
                r(1, "key1=unspecified_value2", "OK", &["OK 10/m 9"]),
                r(1, "key1=value1", "OK", &["OK 20/m 19"]),
            ],
            // Tollgate: the label is the configured descriptor, never the request's value.
            metric: &[&["descriptor=\"key1\"", "decision=\"ok\""]],
            never: &["unspecified_value"],
        },
        // README "Example 9": trailing, middle and multiple wildcards (three configs).
        Case {
            name: "readme example 9 (trailing)",
            src: Src::Readme(9),
            yaml: "domain: example9\ndescriptors:\n\
  - {key: key1, value: value*, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
            rows: vec![
                r(1, "key1=value1", "OK", &["OK 20/m 19"]),
                r(1, "key1=value2", "OK", &["OK 20/m 19"]),
                r(1, "key1=valueXYZ", "OK", &["OK 20/m 19"]),
                r(1, "key1=other", "OK", &["OK - *"]),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "readme example 9 (middle)",
            src: Src::Readme(10),
            yaml: "domain: example9\ndescriptors:\n\
  - {key: path, value: /api/*/action, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
            rows: vec![
                r(1, "path=/api/123/action", "OK", &["OK 20/m 19"]),
                r(1, "path=/api/user-id/action", "OK", &["OK 20/m 19"]),
                r(1, "path=/api/123/other", "OK", &["OK - *"]),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "readme example 9 (multiple)",
            src: Src::Readme(11),
            yaml: "domain: example9\ndescriptors:\n\
  - {key: route, value: /api/*/resource/*/action, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
            rows: vec![
                r(1, "route=/api/v1/resource/123/action", "OK", &["OK 20/m 19"]),
                r(1, "route=/api/v2/resource/456/action", "OK", &["OK 20/m 19"]),
                r(1, "route=/api/v1/resource/123/other", "OK", &["OK - *"]),
            ],
            metric: NONE,
            never: &[],
        },
        // README "Example 10": value_to_metric (stats naming only; Tollgate's labels stay the
        // configured path).
        Case {
            name: "readme example 10",
            src: Src::Readme(12),
            yaml: "domain: example10\ndescriptors:\n\
  - {key: route, value_to_metric: true, descriptors: [{key: http_method, value_to_metric: true, descriptors: [{key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}]}]}\n",
            rows: vec![
                r(
                    1,
                    "route=api,http_method=GET,subject_id=123",
                    "OK",
                    &["OK 60/m 59"],
                ),
                r(
                    1,
                    "route=web,http_method=POST,subject_id=456",
                    "OK",
                    &["OK 60/m 59"],
                ),
            ],
            metric: &[&["descriptor=\"route.http_method.subject_id\""]],
            never: &["route_api", "http_method_GET", "route_web"],
        },
        Case {
            name: "readme example 10 (wildcard)",
            src: Src::Readme(13),
            yaml: "domain: example10_wildcard\ndescriptors:\n\
  - {key: user, value_to_metric: true, descriptors: [{key: action, value: read*, value_to_metric: true, descriptors: [{key: resource, rate_limit: {unit: minute, requests_per_unit: 100}}]}]}\n",
            rows: vec![r(
                1,
                "user=alice,action=readfile,resource=documents",
                "OK",
                &["OK 100/m 99"],
            )],
            metric: &[&["descriptor=\"user.action_read*.resource\""]],
            never: &["alice", "readfile"],
        },
        // README "Example 11": share_threshold — files/* share one 10 an hour; files_no_share/*
        // has one per value.
        Case {
            name: "readme example 11",
            src: Src::Readme(14),
            yaml: "domain: example11\ndescriptors:\n\
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}\n\
  - {key: files_no_share, value: files_no_share/*, share_threshold: false, rate_limit: {unit: hour, requests_per_unit: 10}}\n",
            rows: vec![
                r(5, "files=files/a.pdf", "OK", &["OK 10/h 5"]),
                r(5, "files=files/b.csv", "OK", &["OK 10/h 0"]),
                r(1, "files=files/c.txt", "OVER", &["OVER 10/h 0"]),
                r(10, "files_no_share=files_no_share/a.pdf", "OK", &["OK 10/h 0"]),
                r(1, "files_no_share=files_no_share/a.pdf", "OVER", &["OVER 10/h 0"]),
                r(10, "files_no_share=files_no_share/b.csv", "OK", &["OK 10/h 0"]),
            ],
            metric: NONE,
            never: &["a.pdf", "b.csv"],
        },
        // README "Example 11", with value_to_metric: api/* routes share one count per method.
        Case {
            name: "readme example 11 (metrics)",
            src: Src::Readme(15),
            yaml: "domain: example11_metrics\ndescriptors:\n\
  - {key: route, value: api/*, share_threshold: true, value_to_metric: true, descriptors: [{key: method, rate_limit: {unit: minute, requests_per_unit: 60}}]}\n",
            rows: vec![
                r(1, "route=api/v1,method=GET", "OK", &["OK 60/m 59"]),
                r(1, "route=api/v2,method=GET", "OK", &["OK 60/m 58"]),
                r(1, "route=api/v1,method=POST", "OK", &["OK 60/m 59"]),
            ],
            metric: NONE,
            never: &["api/v1", "api/v2"],
        },
        // examples/ratelimit/config/config.yaml: README example 1 again.
        Case {
            name: "examples config.yaml",
            src: Src::File("examples/ratelimit/config/config.yaml"),
            yaml: "---\ndomain: mongo_cps\ndescriptors:\n\
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}\n\
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}\n",
            rows: vec![r(2, "database=users", "OK", &["OK 500/s 498"])],
            metric: NONE,
            never: &[],
        },
        // examples/ratelimit/config/example.yaml: replaces, a blocked value, shadow mode,
        // unlimited, detailed_metric, and quota_mode with metadata.
        Case {
            name: "examples example.yaml",
            src: Src::File("examples/ratelimit/config/example.yaml"),
            yaml: EXAMPLE_YAML,
            rows: vec![
                r(1, "foo=f", "OK", &["OK 2/m 1"]),
                r(1, "foo=f,bar=x", "OK", &["OK 3/m 2"]),
                r(1, "foo=f,bar=bkthomps", "OK", &["OK 1/m 0"]),
                r(1, "foo=f,bar=banned", "OVER", &["OVER 0/m 0"]),
                // `override` replaces banned_limit: the blocked descriptor is dropped.
                r(
                    1,
                    "source_cluster=proxy,destination_cluster=override | foo=f,bar=banned",
                    "OK",
                    &["OK 2/m 1", "OK - *"],
                ),
                r(
                    1,
                    "category=account | source_cluster=proxy,destination_cluster=fake",
                    "OK",
                    &["OK 4/m 3", "OK - *"],
                ),
                r(5, "foo=f,baz=shady", "OK", &["OK 3/m 0"]),
                r(1, "foo=f,bay=x", "OK", &["OK inf *"]),
                r(1, "qux=x", "OK", &["OK inf *"]),
                r(1, "unspec=u1", "OK", &["OK 2/m 1"]),
                // quota_mode: a call is refused only when every quota descriptor of it is over
                // (or a descriptor that is not in quota mode is).
                r(
                    1,
                    "unspec=u1 | service=service_1",
                    "OK",
                    &["OK 2/m 0", "OK 1/m 0"],
                ),
                r(
                    1,
                    "unspec=u1 | service=service_1",
                    "OVER",
                    &["OVER 2/m 0", "OVER 1/m 0"],
                ),
                r(1, "unspec=u2 | service=service_1", "OVER", &["OK 2/m *", "OVER 1/m 0"]),
                // Tollgate: that refused call charged nothing (u2 still has 2).
                r(1, "unspec=u2", "OK", &["OK 2/m 1"]),
                r(
                    1,
                    "service=service_1 | service=service_2",
                    "OK",
                    &["OVER 1/m 0", "OK 2/m 1"],
                ),
                r(
                    1,
                    "service=service_1 | service=service_2",
                    "OK",
                    &["OVER 1/m 0", "OK 2/m 0"],
                ),
                r(
                    1,
                    "service=service_1 | service=service_2",
                    "OVER",
                    &["OVER 1/m 0", "OVER 2/m 0"],
                ),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "test/config basic_config.yaml",
            src: Src::File("test/config/basic_config.yaml"),
            yaml: BASIC_YAML,
            rows: vec![
                r(1, "key1=value1,subkey1=something", "OK", &["OK 5/s 4"]),
                r(1, "key1=value1,subkey1=subvalue1", "OK", &["OK 10/s 9"]),
                r(1, "key1=value1", "OK", &["OK - *"]),
                r(1, "key2=x", "OK", &["OK 20/m 19"]),
                r(1, "key2=value2", "OK", &["OK 30/m 29"]),
                r(1, "key2=value3", "OK", &["OK - *"]),
                r(1, "key3=x", "OK", &["OK 1/h 0"]),
                r(1, "key3=x", "OVER", &["OVER 1/h 0"]),
                r(1, "key4=x", "OK", &["OK 1/d 0"]),
                r(1, "key5=value5", "OK", &["OK 15/d 14"]),
                r(1, "key5=value5,subkey5=subvalue5", "OK", &["OK 25/d 24"]),
                r(1, "key6=x", "OK", &["OK inf *"]),
                r(1, "key7=x", "OK", &["OK 70/m 69"]),
            ],
            metric: &[&["descriptor=\"key4_rate_limit\""]],
            never: &[],
        },
        Case {
            name: "test/config metadata.yaml",
            src: Src::File("test/config/metadata.yaml"),
            yaml: r#"domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
"#,
            rows: vec![
                r(1, "key1=value1,subkey1=a", "OK", &["OK 5/s 4"]),
                r(1, "key2=b", "OK", &["OK 20/m 19"]),
            ],
            metric: NONE,
            never: &["service_with_quota"],
        },
        Case {
            name: "test/config shadowmode_config.yaml",
            src: Src::File("test/config/shadowmode_config.yaml"),
            yaml: "domain: test-domain\ndescriptors:\n\
  - {key: key1, value: value1, descriptors: [{key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}}, {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}, shadow_mode: true}]}\n\
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}, shadow_mode: true}\n\
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}\n",
            rows: vec![
                r(12, "key1=value1,subkey1=subvalue1", "OK", &["OK 10/s 0"]),
                r(5, "key1=value1,subkey1=x", "OK", &["OK 5/s 0"]),
                r(1, "key1=value1,subkey1=x", "OVER", &["OVER 5/s 0"]),
                r(21, "key2=x", "OK", &["OK 20/m 0"]),
                r(30, "key2=value2", "OK", &["OK 30/m 0"]),
                r(1, "key2=value2", "OVER", &["OVER 30/m 0"]),
            ],
            metric: &[&["descriptor=\"key2\"", "decision=\"shadow\""]],
            never: &[],
        },
        Case {
            name: "test/config share_threshold.yaml",
            src: Src::File("test/config/share_threshold.yaml"),
            yaml: SHARE_YAML,
            rows: vec![
                r(1, "files=files/a", "OK", &["OK 100/m 99"]),
                r(1, "files=files/b", "OK", &["OK 100/m 98"]),
                r(1, "nested=parent,files=nested/a", "OK", &["OK 200/m 199"]),
                r(1, "nested=parent,files=nested/b", "OK", &["OK 200/m 198"]),
                r(1, "files=top/a,files=nested/a", "OK", &["OK 300/m 299"]),
                r(1, "files=top/b,files=nested/c", "OK", &["OK 300/m 298"]),
                r(1, "route=api/1,method=GET", "OK", &["OK 60/m 59"]),
                r(1, "route=api/2,method=GET", "OK", &["OK 60/m 58"]),
                r(1, "service=svc/1,endpoint=e", "OK", &["OK 80/m 79"]),
                r(1, "service=svc/2,endpoint=e", "OK", &["OK 80/m 78"]),
                // path/* shared, file/* not: a new file value has its own count.
                r(1, "path=path/a,file=file/x,type=t", "OK", &["OK 120/m 119"]),
                r(1, "path=path/b,file=file/x,type=t", "OK", &["OK 120/m 118"]),
                r(1, "path=path/b,file=file/y,type=t", "OK", &["OK 120/m 119"]),
                r(1, "user=user/1,resource=res/1,action=a", "OK", &["OK 150/m 149"]),
                r(1, "user=user/2,resource=res/2,action=a", "OK", &["OK 150/m 148"]),
                // An explicit value wins over the wildcard, and counts alone.
                r(1, "file=test1", "OK", &["OK 50/m 49"]),
                r(1, "file=test2", "OK", &["OK 100/m 99"]),
                r(1, "file=test3", "OK", &["OK 100/m 98"]),
                r(1, "midpath=/apiXv1", "OK", &["OK 100/m 99"]),
                r(1, "midpath=/api-v1", "OK", &["OK 100/m 98"]),
                r(1, "multiroute=svcAepBrpc", "OK", &["OK 50/m 49"]),
                r(1, "multiroute=svc1ep2rpc", "OK", &["OK 50/m 48"]),
                r(1, "midroute=/api1v2", "OK", &["OK 80/m 79"]),
                r(1, "midroute=/api2v2", "OK", &["OK 80/m 78"]),
                r(1, "tenant=t1prod,resource=res1v2", "OK", &["OK 60/m 59"]),
                r(1, "tenant=t2prod,resource=resXv2", "OK", &["OK 60/m 58"]),
            ],
            metric: NONE,
            never: &["files/a", "user/1"],
        },
        Case {
            name: "test/config wildcard.yaml",
            src: Src::File("test/config/wildcard.yaml"),
            yaml: "domain: test-domain\ndescriptors:\n\
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: noVal, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}\n\
  - {key: nestedWild, value: val1, descriptors: [{key: wild, value: goo*, rate_limit: {unit: minute, requests_per_unit: 20}}]}\n",
            rows: vec![
                r(1, "wild=foo123", "OK", &["OK 20/m 19"]),
                r(1, "wild=foo456", "OK", &["OK 20/m 19"]),
                r(1, "wild=bar", "OK", &["OK - *"]),
                r(1, "noWild=foo", "OK", &["OK 20/m 19"]),
                r(1, "noWild=foo1", "OK", &["OK - *"]),
                r(1, "noVal=anything", "OK", &["OK 20/m 19"]),
                r(1, "midWild=barXYZb", "OK", &["OK 20/m 19"]),
                r(1, "midWild=barXYZc", "OK", &["OK - *"]),
                r(1, "multiWild=foo1bar2baz", "OK", &["OK 10/m 9"]),
                r(1, "multiWild=foo1baz2bar", "OK", &["OK - *"]),
                r(1, "nestedWild=val1,wild=goo1", "OK", &["OK 20/m 19"]),
                r(1, "nestedWild=val1,wild=foo1", "OK", &["OK - *"]),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "test/config merge_domain_key1.yaml",
            src: Src::File("test/config/merge_domain_key1.yaml"),
            yaml: "domain: test-domain\ndescriptors:\n\
  - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 10}}\n",
            rows: vec![r(1, "key1=value1", "OK", &["OK 10/m 9"])],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "test/config merge_domain_key2.yaml",
            src: Src::File("test/config/merge_domain_key2.yaml"),
            yaml: "domain: test-domain\ndescriptors:\n\
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
            rows: vec![r(1, "key2=value2", "OK", &["OK 20/m 19"])],
            metric: NONE,
            never: &[],
        },
        // A domain whose `descriptors:` is null: loads, limits nothing.
        Case {
            name: "test/config duplicate_domain.yaml",
            src: Src::File("test/config/duplicate_domain.yaml"),
            yaml: "domain: test-domain\ndescriptors:\n",
            rows: vec![r(1, "key1=value1", "OK", &["OK - *"])],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "integration another.yaml",
            src: Src::File("test/integration/runtime/current/ratelimit/config/another.yaml"),
            yaml: "domain: another\ndescriptors:\n\
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 10}}\n\
  - {key: key2_local, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: key3_local, rate_limit: {unit: hour, requests_per_unit: 10}}\n\
  - {key: key4, rate_limit: {unit: day, requests_per_unit: 20}}\n\
  - {key: key4_local, rate_limit: {unit: day, requests_per_unit: 20}}\n",
            rows: vec![
                r(1, "key2=x", "OK", &["OK 20/m 19"]),
                r(10, "key3=x", "OK", &["OK 10/h 0"]),
                r(1, "key3=x", "OVER", &["OVER 10/h 0"]),
                r(1, "key4_local=x", "OK", &["OK 20/d 19"]),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "integration basic.yaml",
            src: Src::File("test/integration/runtime/current/ratelimit/config/basic.yaml"),
            yaml: "domain: basic\ndescriptors:\n\
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}\n\
  - {key: key1_local, rate_limit: {unit: second, requests_per_unit: 50}}\n\
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}\n",
            rows: vec![
                r(1, "key1=x", "OK", &["OK 50/s 49"]),
                r(1, "one_per_minute=x", "OK", &["OK 1/m 0"]),
                r(1, "one_per_minute=x", "OVER", &["OVER 1/m 0"]),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "integration share_threshold.yaml",
            src: Src::File(
                "test/integration/runtime/current/ratelimit/config/share_threshold.yaml",
            ),
            yaml: "domain: share-threshold-test\ndescriptors:\n\
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}\n\
  - {key: files_no_share, value: files_no_share/*, rate_limit: {unit: hour, requests_per_unit: 10}}\n",
            rows: vec![
                r(5, "files=files/a.pdf", "OK", &["OK 10/h 5"]),
                r(5, "files=files/b.csv", "OK", &["OK 10/h 0"]),
                r(1, "files=files/c.txt", "OVER", &["OVER 10/h 0"]),
                r(10, "files_no_share=files_no_share/a.pdf", "OK", &["OK 10/h 0"]),
                r(1, "files_no_share=files_no_share/b.csv", "OK", &["OK 10/h 9"]),
            ],
            metric: NONE,
            never: &[],
        },
        Case {
            name: "integration reload.yaml",
            src: Src::File("test/integration/runtime/current/ratelimit/reload.yaml"),
            yaml: "domain: reload\ndescriptors:\n\
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}\n\
  - {key: block, rate_limit: {unit: second, requests_per_unit: 0}}\n\
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}\n",
            rows: vec![
                r(1, "key1=x", "OK", &["OK 50/s 49"]),
                r(1, "block=x", "OVER", &["OVER 0/s 0"]),
            ],
            metric: NONE,
            never: &[],
        },
    ]
}

const EXAMPLE_YAML: &str = r#"---
domain: rl
descriptors:
  - {key: category, value: account, rate_limit: {replaces: [{name: bkthomps}, {name: fake_name}], unit: minute, requests_per_unit: 4}}
  - key: source_cluster
    value: proxy
    descriptors:
      - {key: destination_cluster, value: bkthomps, rate_limit: {replaces: [{name: bkthomps}], unit: minute, requests_per_unit: 2}}
      - {key: destination_cluster, value: mock, rate_limit: {unit: minute, requests_per_unit: 1}}
      - {key: destination_cluster, value: override, rate_limit: {replaces: [{name: banned_limit}], unit: minute, requests_per_unit: 2}}
      - {key: destination_cluster, value: fake, rate_limit: {name: fake_name, unit: minute, requests_per_unit: 2}}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - {key: bar, rate_limit: {unit: minute, requests_per_unit: 3}}
      - {key: bar, value: bkthomps, rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}}
      - {key: bar, value: banned, rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}}
      - {key: baz, rate_limit: {unit: second, requests_per_unit: 1}}
      - {key: baz, value: not-so-shady, rate_limit: {unit: minute, requests_per_unit: 3}}
      - {key: baz, value: shady, rate_limit: {unit: minute, requests_per_unit: 3}, shadow_mode: true}
      - {key: bay, rate_limit: {unlimited: true}}
  - {key: unspec, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: qux, rate_limit: {unlimited: true}}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota:
        name: "service_2"
"#;

const BASIC_YAML: &str = "domain: test-domain\ndescriptors:\n\
  - {key: key1, value: value1, descriptors: [{key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}}, {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}]}\n\
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}\n\
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}\n\
  - {key: key2, value: value3}\n\
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 1}}\n\
  - {key: key4, rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}}\n\
  - {key: key5, value: value5, rate_limit: {unit: day, requests_per_unit: 15}, descriptors: [{key: subkey5, value: subvalue5, rate_limit: {unit: day, requests_per_unit: 25}}]}\n\
  - {key: key6, rate_limit: {unlimited: true}}\n\
  - {key: key7, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 70}}\n";

const SHARE_YAML: &str = "domain: test-domain\ndescriptors:\n\
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}\n\
  - {key: nested, value: parent, descriptors: [{key: files, value: nested/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 200}}]}\n\
  - {key: files, value: top/*, share_threshold: true, descriptors: [{key: files, value: nested/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 300}}]}\n\
  - {key: route, value: api/*, share_threshold: true, value_to_metric: true, descriptors: [{key: method, rate_limit: {unit: minute, requests_per_unit: 60}}]}\n\
  - {key: service, value: svc/*, share_threshold: true, descriptors: [{key: endpoint, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}]}\n\
  - {key: path, value: path/*, share_threshold: true, descriptors: [{key: file, value: file/*, share_threshold: false, descriptors: [{key: type, rate_limit: {unit: minute, requests_per_unit: 120}}]}]}\n\
  - {key: user, value: user/*, share_threshold: true, descriptors: [{key: resource, value: res/*, share_threshold: true, descriptors: [{key: action, rate_limit: {unit: minute, requests_per_unit: 150}}]}]}\n\
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}\n\
  - {key: file, value: test*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}\n\
  - {key: midpath, value: /api*v1, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}\n\
  - {key: multiroute, value: svc*ep*rpc, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 50}}\n\
  - {key: midroute, value: /api*v2, share_threshold: true, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}\n\
  - {key: tenant, value: t*prod, share_threshold: true, descriptors: [{key: resource, value: res*v2, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 60}}]}\n";

/// The configs envoyproxy/ratelimit refuses (its `test/config`), refused here too: one or more
/// files loaded together.
fn refused() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    let one = |path: &'static str, yaml: &'static str| (path, vec![(path, yaml)]);
    vec![
        one(
            "test/config/bad_limit_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1, rate_limit: {unit: foo, requests_per_unit: 5}}\n",
        ),
        one("test/config/bad_yaml.yaml", "'''\n"),
        one(
            "test/config/duplicate_key.yaml",
            "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1}\n  - {key: key1, value: value1}\n",
        ),
        one("test/config/empty_domain.yaml", "descriptors:\n"),
        one(
            "test/config/empty_key.yaml",
            "domain: test-domain\ndescriptors:\n  - {value: value1}\n",
        ),
        one(
            "test/config/misspelled_key.yaml",
            "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1, ratelimit: {unit: day, requests_per_unit: 5}}\n",
        ),
        one(
            "test/config/misspelled_key2.yaml",
            "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1, rate_limit: {unit: day, requestsperunit: 5}}\n",
        ),
        one(
            "test/config/non_map_list.yaml",
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
        ),
        one(
            "test/config/non_string_key.yaml",
            "0.25: test-domain\ndescriptors:\n  - {key: key1, value: value1, rate_limit: {unit: day, requests_per_unit: 5}}\n",
        ),
        one(
            "test/config/replaces_empty.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
        ),
        one(
            "test/config/replaces_self.yaml",
            "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1, descriptors: [{key: subkey1, rate_limit: {name: self, replaces: [{name: self}], unit: second, requests_per_unit: 5}}]}\n",
        ),
        one(
            "test/config/unlimited_with_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - {key: foo, rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}}\n",
        ),
        // Two files of one domain: refused (envoyproxy/ratelimit merges them only with
        // MERGE_DOMAIN_CONFIG, which Tollgate does not have).
        (
            "test/config/merge_domain_key1.yaml + merge_domain_key2.yaml",
            vec![
                (
                    "test/config/merge_domain_key1.yaml",
                    "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 10}}\n",
                ),
                (
                    "test/config/merge_domain_key2.yaml",
                    "domain: test-domain\ndescriptors:\n  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 20}}\n",
                ),
            ],
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Running the table.
// ---------------------------------------------------------------------------------------------

/// `files` (name, text) laid out as a `config_dir`, with a gateway.toml naming it.
struct Laid {
    dir: tempfile::TempDir,
}

impl Laid {
    fn new(files: &[(String, String)]) -> Laid {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("rls")).unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join("rls").join(name), text).unwrap();
        }
        Laid { dir }
    }

    fn config(&self, store: &str, port: u16) -> String {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n{store}\n\n\
             [rls]\nlisten = \"127.0.0.1:{port}\"\nconfig_dir = \"{}\"\n",
            self.dir.path().join("rls").display()
        )
    }

    /// What `tollgate check` says of it.
    fn check(&self) -> Result<(), String> {
        let path = self.dir.path().join("gateway.toml");
        std::fs::write(&path, self.config("backend = \"memory\"", 1)).unwrap();
        tollgate::runtime::load::load_and_check(&path)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

fn file_name(src: Src) -> String {
    match src {
        Src::Readme(n) => format!("readme-{n:02}.yaml"),
        Src::File(p) => p.replace('/', "_"),
    }
}

fn parse_descriptors(s: &str) -> Vec<RateLimitDescriptor> {
    s.split(" | ")
        .map(|d| RateLimitDescriptor {
            entries: d
                .split(',')
                .map(|e| {
                    let (k, v) = e.split_once('=').expect("k=v");
                    Entry {
                        key: k.into(),
                        value: v.into(),
                    }
                })
                .collect(),
            ..RateLimitDescriptor::default()
        })
        .collect()
}

/// What `want` (`<OK|OVER> <limit> <remaining>`) says `got` should be; `None` when it is, else
/// why not.
fn mismatch(
    want: &str,
    got: &envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus,
    last: bool,
) -> Option<String> {
    let parts: Vec<&str> = want.split(' ').collect();
    let [code, limit, remaining] = parts[..] else {
        panic!("bad expectation {want:?}");
    };
    let code = if code == "OK" {
        Code::Ok
    } else {
        Code::OverLimit
    } as i32;
    if got.code != code {
        return Some(format!("code {}", got.code));
    }
    let have = got
        .current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit));
    match limit {
        "-" if have.is_some() => return Some(format!("limit {have:?}, want none")),
        "-" => {}
        "inf" => {
            if got.limit_remaining != u32::MAX {
                return Some(format!("remaining {}, want u32::MAX", got.limit_remaining));
            }
        }
        l => {
            let (n, u) = l.split_once('/').expect("N/unit");
            let unit = match u {
                "s" => Unit::Second,
                "m" => Unit::Minute,
                "h" => Unit::Hour,
                "d" => Unit::Day,
                _ => panic!("unit {u}"),
            } as i32;
            if have != Some((n.parse().expect("a number"), unit)) {
                return Some(format!("limit {have:?}"));
            }
        }
    }
    if last && remaining != "*" && got.limit_remaining.to_string() != remaining {
        return Some(format!("remaining {}", got.limit_remaining));
    }
    None
}

async fn ask(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
    descriptors: &str,
) -> Result<RateLimitResponse, String> {
    c.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors: parse_descriptors(descriptors),
        hits_addend: 0,
    })
    .await
    .map(|r| r.into_inner())
    .map_err(|s| format!("{s:?}"))
}

/// Runs one case on `store` (its text given): every failure, as lines.
async fn run_case(case: &Case, yaml: &str, store: &str, prefix: usize) -> Vec<String> {
    let mut out = Vec::new();
    let laid = Laid::new(&[(file_name(case.src), yaml.to_owned())]);
    if let Err(e) = laid.check() {
        out.push(format!("{}: refused: {e}", case.name));
        return out;
    }
    let domain = tollgate::rls::yaml::parse(yaml).expect("it loaded").domain;
    let port = free_port();
    let store = format!("{store}\nkey_prefix = \"readme{prefix}:\"");
    let gw = gateway_on_clock(&laid.config(&store, port), T0);
    wait_ready(&gw).await;
    let mut c = {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
                Ok(c) => break c,
                Err(e) if std::time::Instant::now() > deadline => panic!("cannot connect: {e}"),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    };
    for (i, row) in case.rows.iter().enumerate() {
        for n in 1..=row.times {
            let last = n == row.times;
            let r = match ask(&mut c, &domain, row.descriptors).await {
                Ok(r) => r,
                Err(e) => {
                    out.push(format!("{} row {i} ({}): {e}", case.name, row.descriptors));
                    break;
                }
            };
            let overall = if row.overall == "OK" {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32;
            let mut why: Vec<String> = Vec::new();
            if r.overall_code != overall {
                why.push(format!("overall {}", r.overall_code));
            }
            for (j, want) in row.want.iter().enumerate() {
                match r.statuses.get(j) {
                    Some(got) => {
                        if let Some(m) = mismatch(want, got, last) {
                            why.push(format!("descriptor {j}: {m} (want {want})"));
                        }
                    }
                    None => why.push(format!("descriptor {j}: no status")),
                }
            }
            if !why.is_empty() {
                out.push(format!(
                    "{} row {i} ({}) call {n} of {}: want {} {:?}; {}",
                    case.name,
                    row.descriptors,
                    row.times,
                    row.overall,
                    row.want,
                    why.join(", ")
                ));
                break;
            }
        }
    }
    let m = gw.metrics().await;
    for labels in case.metric {
        if metric_sum(&m, "tollgate_rls_decisions_total", labels) < 1.0 {
            out.push(format!(
                "{}: no decision counted with {labels:?}",
                case.name
            ));
        }
    }
    for needle in case.never {
        if let Some(line) = m.lines().find(|l| l.contains(needle)) {
            out.push(format!(
                "{}: a request's value {needle:?} is in /metrics: {line}",
                case.name
            ));
        }
    }
    out
}

/// The whole table on `store`, the configs' texts from `text` (the transcription, or
/// upstream's file).
async fn run_table(store: &str, text: impl Fn(&Case) -> String) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        failures.extend(run_case(case, &text(case), store, i).await);
    }
    failures
}

/// Every example and test config answers every call as the table says.
async fn readme_table(kind: Kind) {
    let env = store_env(kind);
    let failures = run_table(&env.store, |c| c.yaml.to_owned()).await;
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

on_every_store!(readme_table);

/// Every config of the table loads (as `tollgate check` loads it), and each one
/// envoyproxy/ratelimit refuses is refused.
#[test]
fn every_config_loads_and_the_bad_ones_are_refused() {
    let mut failures = Vec::new();
    for case in cases() {
        if let Err(e) = Laid::new(&[(file_name(case.src), case.yaml.to_owned())]).check() {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    for (name, files) in refused() {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, y)| (p.replace('/', "_"), (*y).to_owned()))
            .collect();
        if Laid::new(&files).check().is_ok() {
            failures.push(format!(
                "{name}: loaded, but envoyproxy/ratelimit refuses it"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The ```yaml blocks of the README's "### Examples" section, in order.
fn readme_examples(readme: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut on = false;
    let mut block: Option<String> = None;
    for line in readme.lines() {
        if line.starts_with("### Examples") {
            on = true;
        } else if line.starts_with("## ") {
            on = false;
        }
        if !on {
            continue;
        }
        match &mut block {
            Some(b) if line.starts_with("```") => {
                out.push(std::mem::take(b));
                block = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None if line.starts_with("```yaml") => block = Some(String::new()),
            None => {}
        }
    }
    out
}

/// Upstream's own files, byte for byte: `TOLLGATE_RLS_UPSTREAM_DIR` names a checkout of
/// envoyproxy/ratelimit (its README.md, test/config, examples/ratelimit/config,
/// test/integration/runtime). Each config parses to the same model as the table's
/// transcription, every README example and good test config loads, each bad one is refused,
/// and the whole table is answered on them (memory store).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a checkout of envoyproxy/ratelimit: TOLLGATE_RLS_UPSTREAM_DIR"]
async fn upstream_files_load_as_is() {
    let dir = std::env::var("TOLLGATE_RLS_UPSTREAM_DIR").expect("TOLLGATE_RLS_UPSTREAM_DIR");
    let dir = Path::new(&dir);
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let examples = readme_examples(&readme);
    assert_eq!(examples.len(), 16, "the README's examples section changed");
    let upstream = |src: Src| match src {
        Src::Readme(n) => examples[n].clone(),
        Src::File(p) => std::fs::read_to_string(dir.join(p)).expect(p),
    };
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for case in cases() {
        let text = upstream(case.src);
        if let Src::Readme(n) = case.src {
            seen.push(n);
        }
        match (
            tollgate::rls::yaml::parse(&text),
            tollgate::rls::yaml::parse(case.yaml),
        ) {
            (Ok(a), Ok(b)) if format!("{a:?}") == format!("{b:?}") => {}
            (Ok(_), Ok(_)) => failures.push(format!(
                "{}: the transcription differs from upstream's",
                case.name
            )),
            (a, b) => failures.push(format!(
                "{}: upstream {:?}, transcription {:?}",
                case.name,
                a.err(),
                b.err()
            )),
        }
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..16).collect::<Vec<_>>(),
        "every README example is a case"
    );
    for (name, files) in refused() {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, _)| (p.replace('/', "_"), upstream(Src::File(p))))
            .collect();
        if Laid::new(&files).check().is_ok() {
            failures.push(format!(
                "{name}: loaded, but envoyproxy/ratelimit refuses it"
            ));
        }
    }
    // Every YAML file of those directories is in the table, good or bad.
    let mut listed: Vec<String> = cases()
        .iter()
        .filter_map(|c| match c.src {
            Src::File(p) => Some(p.to_owned()),
            Src::Readme(_) => None,
        })
        .chain(
            refused()
                .into_iter()
                .flat_map(|(_, f)| f.into_iter().map(|(p, _)| p.to_owned())),
        )
        .collect();
    listed.sort();
    listed.dedup();
    for sub in [
        "test/config",
        "examples/ratelimit/config",
        "test/integration/runtime/current/ratelimit",
        "test/integration/runtime/current/ratelimit/config",
    ] {
        for e in std::fs::read_dir(dir.join(sub)).expect(sub) {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                let rel = format!("{sub}/{}", p.file_name().unwrap().to_string_lossy());
                if listed.binary_search(&rel).is_err() {
                    failures.push(format!("{rel}: in no row of the table"));
                }
            }
        }
    }
    failures.extend(run_table("backend = \"memory\"", |c| upstream(c.src)).await);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
