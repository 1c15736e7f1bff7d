//! The raw file: serde structs that mirror `gateway.toml` one to one, and their defaults.

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::*;
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// `[server]`: the proxy listener, timeouts, TLS, client addresses, the HTTP/1 front.
    #[serde(default)]
    pub(super) server: RawServer,
    /// `[admin]`: the admin listener (metrics, health, reload, explain, top, usage, quotas).
    #[serde(default)]
    pub(super) admin: RawAdmin,
    /// `[store]`: where limit state lives (memory, Redis, Redis Cluster, Redis Sentinel).
    #[serde(default)]
    pub(super) store: RawStore,
    /// `[log]`: the access log.
    #[serde(default)]
    pub(super) log: RawLog,
    /// `[[upstreams]]`: named groups of servers that routes name in `upstream`.
    #[serde(default)]
    pub(super) upstreams: Vec<crate::config::upstream::RawUpstream>,
    /// `[[routes]]`: what is proxied where, with which limits; the most specific matching
    /// route wins (see the manual: Precedence).
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    /// `[consumers]`: API consumers identified by a key (or a token's claim), each on a plan.
    #[serde(default)]
    pub(super) consumers: Option<RawConsumers>,
    /// `[[plans]]`: the limits a consumer's plan gives it on routes with `consumers = true`.
    #[serde(default)]
    pub(super) plans: Vec<RawPlan>,
    /// `[jwt]`: how bearer tokens are verified for routes with `jwt`.
    #[serde(default)]
    pub(super) jwt: Option<super::jwt::RawJwt>,
    /// `[tracing]`: OpenTelemetry traces (off without `otlp_endpoint`).
    #[serde(default)]
    pub(super) tracing: Option<super::traces::RawTracing>,
    /// `[rls]`: Envoy's rate limit service (gRPC `ratelimit.v3`), on the same stores (off
    /// without it).
    #[serde(default)]
    pub(super) rls: Option<super::rls::RawRls>,
    /// `[cache]`: the HTTP cache's bounds and the defaults of `[routes.cache]` (see Caching)
    /// (table; default: 64 MiB, nothing cached without `[routes.cache]`).
    #[serde(default)]
    pub(super) cache: Option<super::cache::RawCache>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    /// The proxy listener (HTTP/1.1, h2c prior knowledge, or TLS with ALPN `h2`/`http/1.1`) (socket
    /// address; default: `"0.0.0.0:8080"`).
    #[serde(default = "default_listen")]
    pub(super) listen: ListenAddr,
    /// Peers whose `X-Forwarded-For` (or, with `forwarded_header = "Forwarded"`, `Forwarded`) is
    /// believed (see Subjects) (list of CIDRs or addresses; default: `[]`).
    #[serde(default)]
    pub(super) trusted_proxies: Vec<Cidr>,
    /// `[server.tls]`: serve TLS (HTTP/2 and HTTP/1.1 by ALPN) with a certificate per name (SNI).
    #[serde(default)]
    pub(super) tls: Option<super::tls::RawTls>,
    /// Time to receive a request head (slowloris protection); also bounds the TLS handshake;
    /// positive, at most `1day` (duration; default: `"10s"`).
    #[serde(default = "default_header_read_timeout")]
    pub(super) header_read_timeout: HumanDuration,
    /// Idle keep-alive connections are closed after this; so is a response body that moves no byte
    /// (upstream silent, or client not reading) for this long, with its upstream connection;
    /// positive, at most `1day` (duration; default: `"60s"`).
    #[serde(default = "default_idle_timeout")]
    pub(super) idle_timeout: HumanDuration,
    /// A request body that sends nothing for this long is abandoned with 408; positive, at most
    /// `1day` (duration; default: `"30s"`).
    #[serde(default = "default_body_read_timeout")]
    pub(super) body_read_timeout: HumanDuration,
    /// On SIGTERM, how long in-flight requests may take before connections are force-closed; at
    /// most `1day` (`"0s"`: close at once) (duration; default: `"30s"`).
    #[serde(default = "default_grace_period")]
    pub(super) grace_period: HumanDuration,
    /// Larger request head → 431 (minimum 8192) (integer; default: `65536`).
    #[serde(default = "default_max_header_bytes")]
    pub(super) max_header_bytes: usize,
    /// Longer request target → 414 (integer; default: `8192`).
    #[serde(default = "default_max_uri_bytes")]
    pub(super) max_uri_bytes: usize,
    /// On a route whose limits read the request body, the most bytes bodies not yet decided
    /// (their start read before the limits, within `max_json_bytes`) may hold on one connection
    /// together (its HTTP/2 streams; an HTTP/1.1 connection has one request at a time): a body
    /// that would take more is refused with 429; the first body a connection holds may always
    /// take its route's `max_json_bytes`. The same on both HTTP/1 fronts (integer (bytes), at
    /// least 1; default: `4194304` (4 MiB)).
    #[serde(default = "default_max_pending_body_bytes_per_connection")]
    #[schemars(range(min = 1))]
    pub(super) max_pending_body_bytes_per_connection: usize,
    /// The same on one worker, every connection's together: a body that would take more is
    /// refused with 503 (the only body a worker holds may always take its route's
    /// `max_json_bytes`). The same on both HTTP/1 fronts (integer (bytes), at least 1; default:
    /// `67108864` (64 MiB)).
    #[serde(default = "default_max_pending_body_bytes_per_worker")]
    #[schemars(range(min = 1))]
    pub(super) max_pending_body_bytes_per_worker: usize,
    /// HTTP/2 streams per connection (integer; default: `256`).
    #[serde(default = "default_h2_max_concurrent_streams")]
    pub(super) h2_max_concurrent_streams: u32,
    // Worker threads, each with its own listener socket; default: the number of cores.
    /// Proxy worker threads (1–1024), each a single-threaded runtime with its own `SO_REUSEPORT`
    /// listener socket and upstream connection pool; the kernel spreads connections over them and a
    /// connection stays on its worker. Changing it needs a restart (integer; default: the number of
    /// cores).
    #[serde(default)]
    pub(super) workers: Option<usize>,
    /// The header that carries the request id (no `_`, not a header the gateway rewrites such as
    /// `Host` or `X-Forwarded-For`) (header name; default: `"X-Request-Id"`).
    #[serde(default)]
    pub(super) request_id_header: RequestIdHeader,
    /// What a `;` path parameter (`/admin;jsessionid=x`) does — Java servlet containers and Spring
    /// strip it before routing, so `/admin;x` is `/admin` to them: `"reject"` answers 400 to a `;`
    /// in the path, raw or encoded (`%3B`); `"strip"` removes each segment's `;…` before routing
    /// and forwards the path without it (an encoded `%3B` is still 400); `"allow"` treats `;` as an
    /// ordinary character, routed on and forwarded as written (only for upstreams that do the
    /// same). See Paths (`"reject"`, `"strip"` or `"allow"`; default: `"reject"`).
    #[serde(default)]
    pub(super) path_params: RawPathParams,
    // A plain listener answering every request with a 308 to the TLS listener.
    /// A plain HTTP/1.1 listener that answers every request with 308 to the same host and target on
    /// the TLS listener (`force-ssl-redirect`; see Fronting an API); needs `[server.tls]`; changing
    /// it needs a restart (socket address).
    #[serde(default)]
    pub(super) http_redirect_listen: Option<ListenAddr>,
    // Reload when the config file or a file it names changes (`crate::runtime::watch`).
    /// Reload by itself when the config file or a file it names (consumers file, `[admin]
    /// token_file`, TLS certificate and key, upstream CA files, `[jwt] jwks_file` — so a key
    /// removed from the JWKS stops verifying) changes — written in place, renamed over, or swapped
    /// in by Kubernetes' `..data` symlink when a mounted ConfigMap or Secret changes. The files are
    /// `stat`ed (through symlinks) every second; a change that has held for 200 ms reloads exactly
    /// as `POST /-/reload` does (one reload thread, coalesced, validated: a bad file is refused,
    /// logged and counted in `tollgate_config_reloads_total{result="failure"}`, and the previous
    /// configuration keeps serving until the next change). Log line: `watched configuration files
    /// changed; reloading` (bool; default: `false`).
    #[serde(default)]
    pub(super) watch_config: bool,
    // Who is calling (`super::subject`): the networks addresses are counted by, and a header
    // a trusted proxy names the client in.
    /// IPv4 clients are counted by this network: `32` is one subject per address; `24` puts a /24
    /// in one bucket (see IP prefixes) (integer 0–32; default: `32`).
    #[serde(default)]
    pub(super) ipv4_prefix: Option<super::subject::Ipv4Prefix>,
    /// IPv6 clients are counted by this network. The default is a /64, not one address: a host
    /// given a /64 (the usual allocation) has 2^64 addresses and could otherwise rotate to a fresh
    /// bucket per request. `128` gives per-address limits back (integer 0–128; default: `64`).
    #[serde(default)]
    pub(super) ipv6_prefix: Option<super::subject::Ipv6Prefix>,
    /// A header a trusted proxy names the client in (`"CF-Connecting-IP"`, `"True-Client-IP"`,
    /// `"X-Real-IP"`): from a peer in `trusted_proxies` its one address is the client, before
    /// `X-Forwarded-For` / `Forwarded`; from any other peer it is ignored. Absent, sent twice or
    /// not an address: the `forwarded_header` walk as usual. Not `X-Forwarded-For` or `Forwarded`
    /// (use `forwarded_header`) (header name).
    #[serde(default)]
    pub(super) real_ip_header: Option<super::subject::RealIpHeader>,
    /// The one header family a trusted proxy names the client in: `X-Forwarded-For`, or RFC 7239
    /// `Forwarded`'s `for=`. The other family is never read, so a client cannot add the one your
    /// proxy does not write and be believed (a client's `X-Forwarded-For` never overrides a proxy's
    /// `Forwarded`). Set it to what your proxy appends (`"X-Forwarded-For"` or `"Forwarded"`;
    /// default: `"X-Forwarded-For"`).
    #[serde(default)]
    pub(super) forwarded_header: super::subject::ForwardedHeader,
    // PROXY protocol (`super::proxy_protocol`).
    /// Connections from `proxy_protocol_from` start with a PROXY protocol header of this version
    /// (`any`: either); its address is the client (PROXY protocol) (`"off"` | `"v1"` | `"v2"` |
    /// `"any"`; default: `"off"`).
    #[serde(default)]
    pub(super) proxy_protocol: super::proxy_protocol::ProxyProtocolMode,
    /// The load balancers that send the header; required with `proxy_protocol`, an error without it
    /// (list of CIDRs or addresses; default: `[]`).
    #[serde(default)]
    pub(super) proxy_protocol_from: Vec<Cidr>,
    /// Time to receive the header; positive, at most `1m` (duration; default: `"5s"`).
    #[serde(default = "super::proxy_protocol::default_timeout")]
    pub(super) proxy_protocol_timeout: HumanDuration,
    // Which HTTP/1 front serves plain-TCP and `http/1.1` TLS connections.
    /// Which front serves HTTP/1.1 (plain TCP, and TLS connections that negotiate `http/1.1`):
    /// `"fast"`, the purpose-built one (`src/http1/`: the head parsed in place, the client's head
    /// forwarded with only the gateway's edits spliced in, the upstream connection driven in the
    /// request's own task with a per-worker pool), or `"hyper"`, hyper's general server and client.
    /// Both answer alike, send the same bytes both ways (`tests/fronts.rs`) and pass the same
    /// tests; `"hyper"` is the fallback. HTTP/2 is always hyper's; what the fast front does not
    /// serve itself (WebSocket and other upgrades, `Expect`, HTTP/1.0, `CONNECT`, absolute-form
    /// targets, any framing but none, one `Content-Length` or one `Transfer-Encoding: chunked`,
    /// anything malformed) is handed, with the bytes already read, to hyper for the rest of that
    /// connection, so it gets exactly the hyper front's answer. So are, for now, requests the fast
    /// front does not carry the features of: every request while `[tracing]` is on, gRPC and
    /// gRPC-Web requests, and requests for a route with header rules, CORS, a `cost_from` limit or
    /// a limit that reads the request body (`json:` subject parts, `reserve = "json:…"`; its own or
    /// its plans') or an HTTP/2 upstream group; when a config has such a route, the fast front
    /// looks each request's route up before serving it. Applies to new connections (`"fast"` or
    /// `"hyper"`; default: `"fast"`).
    #[serde(default)]
    pub(super) http1: RawHttp1,
    /// `[server.compression]`: responses compressed for clients that accept it, on every route
    /// without its own `[routes.compression]` (see Compression) (table; default: none).
    #[serde(default)]
    pub(super) compression: Option<super::compression::RawCompression>,
    /// `[server.http3]`: HTTP/3 over QUIC on the TLS listener's port (UDP), with its
    /// certificates (see HTTP/3) (table; default: off).
    #[serde(default)]
    pub(super) http3: Option<super::http3::RawHttp3>,
}

/// `[server] http1`.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawHttp1 {
    #[default]
    Fast,
    Hyper,
}

/// `[server] path_params`.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawPathParams {
    #[default]
    Reject,
    Strip,
    Allow,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: default_listen(),
            trusted_proxies: Vec::new(),
            tls: None,
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            body_read_timeout: default_body_read_timeout(),
            grace_period: default_grace_period(),
            max_header_bytes: default_max_header_bytes(),
            max_uri_bytes: default_max_uri_bytes(),
            max_pending_body_bytes_per_connection: default_max_pending_body_bytes_per_connection(),
            max_pending_body_bytes_per_worker: default_max_pending_body_bytes_per_worker(),
            h2_max_concurrent_streams: default_h2_max_concurrent_streams(),
            workers: None,
            request_id_header: RequestIdHeader::default(),
            path_params: RawPathParams::default(),
            http_redirect_listen: None,
            watch_config: false,
            ipv4_prefix: None,
            ipv6_prefix: None,
            real_ip_header: None,
            forwarded_header: Default::default(),
            proxy_protocol: Default::default(),
            proxy_protocol_from: Vec::new(),
            proxy_protocol_timeout: super::proxy_protocol::default_timeout(),
            http1: RawHttp1::default(),
            compression: None,
            http3: None,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    /// `GET /metrics`, `GET /healthz`, `GET /readyz`, `POST /-/reload`, `GET /-/top`, `GET
    /// /-/explain`, `GET /-/usage`, `POST /-/quota/reset`, `POST /-/quota/grant` (socket address;
    /// default: `"127.0.0.1:9090"`).
    #[serde(default = "default_admin_listen")]
    pub(super) listen: ListenAddr,
    // The SHA-256 of each admin token, one a line (`crate::admin::tokens`).
    /// Admin tokens, one SHA-256 hex line each (see Admin tokens); relative to the config file.
    /// Without it the admin endpoints are open (path; default: none).
    #[serde(default)]
    pub(super) token_file: Option<PathBuf>,
    // With a token file: whether `/-/explain`, `/-/top` and `/-/usage` need a token too.
    /// With `token_file`: `/-/explain`, `/-/top` and `/-/usage` need a token too (`false`: only
    /// `/-/reload` and `/-/quota/*` do) (bool; default: `true`).
    #[serde(default = "default_true")]
    pub(super) protect_reads: bool,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: default_admin_listen(),
            token_file: None,
            protect_reads: true,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    /// Where limit state lives (`"memory"` | `"redis"` | `"redis_cluster"` | `"redis_sentinel"`;
    /// default: `"memory"`).
    #[serde(default)]
    pub(super) backend: Backend,
    /// The Redis server (`backend = "redis"`); with `redis_sentinel`, the primary's scheme (TLS),
    /// user, password and database — its host and port are the ones the sentinels name (`redis://`
    /// or `rediss://` URL; default: `"redis://127.0.0.1:6379"`).
    #[serde(default)]
    pub(super) url: Option<String>,
    /// Seed nodes (`backend = "redis_cluster"`, required there) (list of URLs).
    #[serde(default)]
    pub(super) urls: Vec<String>,
    /// Per decision; past it the decision is a store error; positive, at most `60s` (duration;
    /// default: `"50ms"`).
    #[serde(default = "default_store_timeout")]
    pub(super) timeout: HumanDuration,
    /// Store error: forward (fail open) or answer 503 (fail closed) (`"allow"` | `"deny"`; default:
    /// `"allow"`).
    #[serde(default)]
    pub(super) on_error: OnError,
    /// First part of every Redis key (string; default: `"tollgate"`).
    #[serde(default = "default_key_prefix")]
    pub(super) key_prefix: String,
    /// In-process store: (limit, subject) pairs kept at most (integer; default: `100000`).
    #[serde(default = "default_max_subjects")]
    pub(super) max_subjects: NonZeroU64,
    /// Redis: answer a denied subject locally until its retry time (at most 1 s) (bool; default:
    /// `true`).
    #[serde(default = "default_deny_cache")]
    pub(super) deny_cache: bool,
    // `backend = "redis_sentinel"`: the sentinels' URLs.
    /// `backend = "redis_sentinel"` (required there): the sentinels, asked in order, each URL with
    /// its own scheme and credentials (list of URLs).
    #[serde(default)]
    pub(super) sentinels: Vec<String>,
    // `backend = "redis_sentinel"`: the name the sentinels monitor the primary under.
    /// `backend = "redis_sentinel"` (required there): the name the sentinels monitor the primary
    /// under (string).
    #[serde(default)]
    pub(super) master_name: Option<String>,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            backend: Backend::Memory,
            url: None,
            urls: Vec::new(),
            timeout: default_store_timeout(),
            on_error: OnError::Allow,
            key_prefix: default_key_prefix(),
            max_subjects: default_max_subjects(),
            deny_cache: default_deny_cache(),
            sentinels: Vec::new(),
            master_name: None,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    /// Where the access log goes; a path (relative to the config file) is appended to, created when
    /// missing, and reopened on `SIGUSR1`; its directory must exist (`"off"` | `"stdout"` | file
    /// path; default: `"off"`).
    #[serde(default = "default_access")]
    pub(super) access: String,
    /// One JSON object per line (`"json"`; default: `"json"`).
    #[serde(default)]
    pub(super) format: LogFormat,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            access: default_access(),
            format: LogFormat::Json,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = one_path_matcher)]
pub(super) struct RawRoute {
    /// Unique; the `route` metric label (letters, digits, `-_.`; `unmatched` is reserved) (string,
    /// required).
    pub(super) name: String,
    /// Segment-aware: `/api` matches `/api` and `/api/x`, not `/apix`; a normalised path (see
    /// Paths: `/caf%C3%A9`, `/x:run`), no `?` or `#`; with no path matcher at all a route matches
    /// every path (string; default: `"/"`).
    #[serde(default)]
    pub(super) path_prefix: Option<String>,
    /// Exactly this normalised path (`/login` matches `/login` only, not `/login/` or
    /// `/login/x`) (string; one of `path`, `path_template`, `path_regex`).
    #[serde(default)]
    pub(super) path: Option<String>,
    /// A regular expression (Rust `regex` syntax) the whole normalised path matches (anchored at
    /// both ends); may be narrowed by a `path_prefix` (string; one of `path`, `path_template`,
    /// `path_regex`).
    #[serde(default)]
    pub(super) path_regex: Option<String>,
    /// A path with captures: `{name}` is one non-empty segment, `{name...}` (last) the rest of
    /// the path; `/users/{id}/orders/{order}`; captures are `path:NAME` subject parts and
    /// `${path.NAME}` in header rules (string; one of `path`, `path_template`, `path_regex`).
    #[serde(default)]
    pub(super) path_template: Option<String>,
    // Required unless `redirect` or `usage = true` (checked by `validate_route`).
    /// The name of an `[[upstreams]]` group, or a URL
    /// `http(s)://host:port[/base]` (a group of one); a base path is prepended to the forwarded
    /// path; no user-info (`user:pw@`), port 1–65535 (string, required unless `redirect` or `usage
    /// = true`).
    #[serde(default)]
    pub(super) upstream: Option<UpstreamRef>,
    /// The upstream's time, then 504: to connect, to take each piece of the request it is sent, and
    /// to send its response head once the request has been sent. The time the client takes to send
    /// its body is not in it (that is `body_read_timeout`'s: 408); positive, at most `1day`
    /// (duration; default: `"30s"`).
    #[serde(default = "default_route_timeout")]
    pub(super) timeout: HumanDuration,
    /// Match only this `Host` / `:authority` (port ignored, case-insensitive); a host name without
    /// a port; one trailing dot is dropped (`example.com.` is `example.com`); `*.example.com`
    /// matches one or more labels before `example.com` (never `example.com` itself),
    /// `{name}.example.com` exactly one, captured as `host:NAME` (string; default: any).
    #[serde(default)]
    pub(super) host: Option<String>,
    /// Match any of these hosts (each as `host`: exact, `*.example.com` or `{name}.example.com`);
    /// not with `host` (list of strings; default: any).
    #[serde(default)]
    pub(super) hosts: Option<Vec<String>>,
    /// `[[routes.headers]]`: every one must match the request's headers as received (`name`,
    /// and one of `value`, `regex`, `present = true`, `absent = true`) (list of tables; default:
    /// none).
    #[serde(default)]
    pub(super) headers: Vec<super::route_match::RawFieldMatch>,
    /// `[[routes.query]]`: every one must match the request's query as received (`name`, and
    /// one of `value`, `regex`, `present = true`, `absent = true`) (list of tables; default:
    /// none).
    #[serde(default)]
    pub(super) query: Vec<super::route_match::RawFieldMatch>,
    /// Higher first: overrides the computed order (most specific host, exact path, templates,
    /// regexes, longest prefix, methods, headers, query, file order) among the routes that match
    /// (integer; default: `0`).
    #[serde(default)]
    pub(super) priority: i32,
    /// Match only these methods (list of strings; default: any).
    #[serde(default)]
    pub(super) methods: Option<Vec<String>>,
    /// Forward `/api/x` as `/x` (bool; default: `false`).
    #[serde(default)]
    pub(super) strip_prefix: bool,
    /// Send the client's `Host` upstream instead of the upstream's authority (bool; default:
    /// `false`).
    #[serde(default)]
    pub(super) preserve_host: bool,
    /// Add the rate-limit headers to this route's responses (bool; default: `true`).
    #[serde(default = "default_true")]
    pub(super) rate_limit_headers: bool,
    /// `false`: `path_prefix` matches in any ASCII case (`/ADMIN/x` and `/%41dmin` are this
    /// route's), for upstreams that ignore case (IIS, case-insensitive file systems) — set it on
    /// every limited route in front of such an upstream, or `/ADMIN` goes to a less specific route.
    /// The path is forwarded in the client's case; a `path` subject part counts it in lower case
    /// (one bucket per resource) (bool; default: `true`).
    #[serde(default = "default_true")]
    pub(super) case_sensitive: bool,
    /// Larger bodies → 413 (see Running at the edge) (integer (bytes); default: `10485760`).
    #[serde(default = "default_max_body_size")]
    pub(super) max_body_size: u64,
    // The largest request body read for `json:` subject parts and reservations.
    /// On a route whose limits (its own or its plans') read the request's JSON body (`json:`
    /// subject parts, `reserve = "json:…"`), the largest body read for them before the limits; a
    /// larger body is still forwarded whole, without those fields (Reading the request body)
    /// (integer (bytes), 1 to 67108864 (64 MiB); default: `1048576` (1 MiB)).
    #[serde(default)]
    pub(super) max_json_bytes: super::values::MaxJsonBytes,
    /// `[[routes.limits]]`: the route's limits; a request must pass every one.
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
    // Requests need a known consumer; its plan's limits apply here too.
    /// Requests need a known consumer (API products): its plan's limits apply here together with
    /// the route's own, all-or-nothing; needs `[consumers]` (bool; default: `false`).
    #[serde(default)]
    pub(super) consumers: bool,
    // Fronting (`crate::fronting`): header rules, CORS, rewrite, redirect.
    /// Header rules (tables).
    #[serde(default)]
    #[schemars(with = "Option<super::schema::RequestRules>")]
    pub(super) request_headers: Option<crate::fronting::RequestRules>,
    /// Header rules (tables).
    #[serde(default)]
    #[schemars(with = "Option<super::schema::ResponseRules>")]
    pub(super) response_headers: Option<crate::fronting::ResponseRules>,
    /// CORS (table).
    #[serde(default)]
    #[schemars(with = "Option<super::schema::Cors>")]
    pub(super) cors: Option<crate::fronting::Cors>,
    /// Rewrite the forwarded path: `match` a regular expression (Rust `regex` syntax) on the
    /// normalised path, `to` the new path with `$1`, `${1}`, `${name}` for groups and `$$` for `$`;
    /// not with `strip_prefix`. See Rewrites (`{ match, to }`).
    #[serde(default)]
    #[schemars(with = "Option<super::schema::Rewrite>")]
    pub(super) rewrite: Option<crate::fronting::Rewrite>,
    /// A redirect route: no `upstream`; the gateway answers `status` (301, 302, 307 or 308; default
    /// 308) with `Location: to`, where `to` may use `$host`, `$path`, `$request_uri`. See Redirects
    /// (`{ to, status }`).
    #[serde(default)]
    #[schemars(with = "Option<super::schema::Redirect>")]
    pub(super) redirect: Option<crate::fronting::Redirect>,
    // Answered by the gateway: the calling consumer's usage (the `quota` module).
    /// Answered by the gateway with the calling consumer's usage of its limits, never forwarded
    /// (Usage, reset and grant); needs `consumers = true` and no `upstream` (bool; default:
    /// `false`).
    #[serde(default)]
    pub(super) usage: bool,
    // Access lists (`super::subject::AccessList`).
    /// Only clients in these networks may use the route; anyone else gets 403 problem+json (Access
    /// lists); an empty list is an error (list of CIDRs or addresses; default: everyone).
    #[serde(default)]
    pub(super) allow: Option<Vec<Cidr>>,
    /// Clients in these networks get 403, whatever `allow` says (list of CIDRs or addresses;
    /// default: `[]`).
    #[serde(default)]
    pub(super) deny: Option<Vec<Cidr>>,
    // `"required"` or `"optional"`: a bearer token verified by `[jwt]`.
    /// Verify a bearer token with `[jwt]`: `required` answers 401
    /// without one; `optional` serves a request without a token (its `jwt:` parts are missing); a
    /// bad token is 401 on both (`"required"` | `"optional"`).
    #[serde(default)]
    pub(super) jwt: Option<super::jwt::JwtMode>,
    /// `"required"`: a request on a connection without a verified client certificate (an
    /// `"optional"` `[server.tls.client_auth]` listener) gets 403 problem+json, before the
    /// limits and the upstream; needs `[server.tls.client_auth]` (`"required"`; default: none).
    #[serde(default)]
    pub(super) client_cert: Option<super::tls::ClientCertDemand>,
    /// The shape of this route's refusals by a limit (a limit's own `refusal` wins): `{ status,
    /// body, content_type }` (The refusal's shape) (table; default: 429 problem+json).
    #[serde(default)]
    pub(super) refusal: Option<super::refusal::RawRefusal>,
    /// `[routes.compression]`: this route's responses compressed for clients that accept it, in
    /// place of `[server.compression]` (see Compression) (table; default: the server's).
    #[serde(default)]
    pub(super) compression: Option<super::compression::RawCompression>,
    /// `[routes.cache]`: this route's responses cached (RFC 9111, see Caching), over
    /// `[cache]`'s defaults (table; default: not cached).
    #[serde(default)]
    pub(super) cache: Option<super::cache::RawRouteCache>,
    /// The speed at which each response's body is sent to its client, as nginx's `limit_rate`:
    /// bytes per second, per response; `0`: no limit; a plan's value wins for its consumers
    /// (Bandwidth: `limit_rate`) (bytes: an integer or `"64k"`, `"1m"`; default: no limit).
    #[serde(default)]
    pub(super) limit_rate: Option<super::values::ByteSize>,
    /// With `limit_rate`: the body bytes sent at full speed before the limit applies, as nginx's
    /// `limit_rate_after` (bytes: an integer or `"64k"`, `"1m"`; default: `0`).
    #[serde(default)]
    pub(super) limit_rate_after: Option<super::values::ByteSize>,
}

/// A route matches its path by one of `path`, `path_template`, `path_regex` (a `path_prefix`
/// may narrow only a `path_regex`), and names its hosts in `host` or `hosts`: rules across keys,
/// said with draft-07's `not`/`required`.
fn one_path_matcher(schema: &mut schemars::Schema) {
    let pairs = [
        ["path", "path_prefix"],
        ["path_template", "path_prefix"],
        ["path", "path_regex"],
        ["path", "path_template"],
        ["path_regex", "path_template"],
        ["host", "hosts"],
        ["strip_prefix", "path"],
        ["strip_prefix", "path_template"],
    ];
    let rules: Vec<serde_json::Value> = pairs
        .iter()
        .map(|[a, b]| {
            if *a == "strip_prefix" {
                // `strip_prefix = false` beside them is harmless; `true` is refused.
                serde_json::json!({"not": {"required": [a, b], "properties": {"strip_prefix": {"const": true}}}})
            } else {
                serde_json::json!({"not": {"required": [a, b]}})
            }
        })
        .collect();
    schema.insert("allOf".into(), serde_json::Value::Array(rules));
}

/// A limit's `limit` may be 0 only on a byte limit (`unit = "bytes"`, a budget of no byte): a
/// rule across two keys, said with draft-07's `if`/`then`.
fn zero_only_in_bytes(schema: &mut schemars::Schema) {
    schema.insert(
        "if".into(),
        serde_json::json!({
            "not": {"required": ["unit"], "properties": {"unit": {"const": "bytes"}}}
        }),
    );
    schema.insert(
        "then".into(),
        serde_json::json!({"properties": {"limit": {"minimum": 1}}}),
    );
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = zero_only_in_bytes)]
pub(super) struct RawLimit {
    /// Unique within the route; the `limit` metric label (string, required).
    pub(super) name: String,
    /// `fixed_window`, `sliding_window`, `sliding_log`, `token_bucket`, `gcra`, `leaky_bucket`, or
    /// `concurrency` (requests in flight: Requests in flight) (required).
    pub(super) algorithm: Algorithm,
    /// L: units per period (positive integer, required; `0` only with `unit = "bytes"`: a
    /// budget of no byte, which refuses every request whose exchange could carry a counted body).
    pub(super) limit: u64,
    // Required unless `calendar` is set (checked by `validate_limit`).
    /// P: a whole number of milliseconds, at least `1ms`, at most `1y` (365.25 days) (duration,
    /// required unless `calendar`).
    #[serde(default)]
    pub(super) period: Option<HumanDuration>,
    // Required on routes, refused on plans (whose subject is the consumer).
    /// `ip`, `header:NAME`, `query:NAME`, `global`, `method`, `path`, `host`, `cookie:NAME`,
    /// `consumer`, `jwt:CLAIM`, `json:PATH` (a string of the request's JSON body: `json:model`) or
    /// `tls:fingerprint`/`tls:subject_cn`/`tls:san_dns`/`tls:san_uri` (the client certificate's);
    /// or a list of them (`["consumer", "json:model"]`): one count per combination (Subjects)
    /// (string or list, required).
    #[serde(default)]
    pub(super) subject: Option<super::subject::SubjectSpec>,
    /// Instead of `period`, `fixed_window` only: windows aligned to UTC calendar days, weeks
    /// (Monday 00:00 to Monday) or months (28–31 days); see Calendar quotas (`"day"` | `"week"` |
    /// `"month"`).
    #[serde(default)]
    #[schemars(with = "Option<super::schema::Calendar>")]
    pub(super) calendar: Option<tollgate_limit::calendar::Calendar>,
    // `calendar = "month"`: the billing day windows start on (1–28).
    /// `calendar = "month"` only: the billing day monthly windows start on (the 15th to the 15th)
    /// (integer 1–28; default: `1`).
    #[serde(default)]
    #[schemars(range(min = super::limit::MIN_ANCHOR_DAY, max = super::limit::MAX_ANCHOR_DAY))]
    pub(super) anchor_day: Option<i64>,
    // `calendar = "day" | "week"`: the windows' offset from UTC (`"-05:00"`).
    /// `calendar = "day"` or `"week"` only: windows start at midnight (Monday midnight) at this
    /// offset from UTC, within ±14:00 (`"-05:00"`) (`"±HH:MM"`; default: `"+00:00"`).
    #[serde(default)]
    pub(super) utc_offset: Option<String>,
    /// Plans only: `"global"` (the default) or `"route"`.
    #[serde(default)]
    pub(super) scope: Option<Scope>,
    /// B: bucket size (token_bucket, gcra: default L) or queue length (leaky_bucket: default 0);
    /// not allowed on the window algorithms (integer; default: see below).
    #[serde(default)]
    pub(super) burst: Option<u64>,
    /// C: units each request takes (positive integer; default: `1`).
    #[serde(default)]
    pub(super) cost: Option<NonZeroU64>,
    /// Shadow limits are evaluated and counted but never reject or delay (`"enforce"` | `"shadow"`;
    /// default: `"enforce"`).
    #[serde(default)]
    pub(super) mode: Mode,
    /// A `header:`/`query:`/`cookie:`/`host`/`consumer`/`jwt:`/`json:`/`tls:` subject (or such a part of a
    /// list) absent: count the client address in its place, or answer 401 naming the part (400 for
    /// a `json:` part: the body is malformed for the route); an error on subjects no request can
    /// lack (`"ip"` | `"reject"`; default: `"ip"`).
    #[serde(default)]
    pub(super) on_missing: OnMissing,
    // Limits that look at the response (`super::response`).
    /// Charge only upstream responses with these statuses (`"401"`, `401`) or classes (`"4xx"`),
    /// after the response (Limits that look at the response) (list of statuses).
    #[serde(default)]
    pub(super) count_status: Option<Vec<super::response::RawStatus>>,
    /// Charge the integer in this upstream response header, after the response (missing or
    /// malformed: `cost`; above the capacity: clamped) (header name).
    #[serde(default)]
    pub(super) cost_header: Option<String>,
    /// Remove `cost_header` from the response to the client; only with `cost_header` (bool;
    /// default: `false`).
    #[serde(default)]
    pub(super) strip_cost_header: Option<bool>,
    // The cost read from the response body or trailers (`super::cost_from`).
    /// Charge the cost read from the response body or trailers when the body ends:
    /// `"json:usage.total_tokens"` (a dotted path into a JSON body, or into each event of a
    /// `text/event-stream`), `"trailer:NAME"`, or a list of up to 8 `{ path = "…", weight = N }`
    /// (weight 1–1000000, default 1) whose weighted sum is the cost (Token limits) (source, or list
    /// of sources).
    #[serde(default)]
    pub(super) cost_from: Option<super::cost_from::RawCostFrom>,
    // Units reserved before the request, settled after the response (`super::response`).
    /// With `cost_from` or `cost_header`: units taken when the request is admitted (it needs that
    /// many left), settled to the real cost after the response — the difference charged or given
    /// back (Reservations); `"json:max_tokens"`: the integer at that path of the request's JSON
    /// body, at least `cost`, at most `reserve_max` (`cost` when the body has none); not on
    /// `sliding_log` (positive integer, or `"json:PATH"`).
    #[serde(default)]
    pub(super) reserve: Option<super::response::RawReserve>,
    // With `reserve = "json:…"`: the most one request reserves.
    /// The most one request reserves, whatever its body asks; between `cost` and the limit's
    /// capacity; only with `reserve = "json:…"` (positive integer; required with
    /// `reserve = "json:…"`).
    #[serde(default)]
    pub(super) reserve_max: Option<u64>,
    // What the limit counts (`super::response::validate_bytes`).
    /// What the limit counts: requests, or body bytes charged after the response (Byte limits);
    /// `"bytes"` not on `concurrency` or `leaky_bucket`, nor with `cost_header`, `cost_from` or
    /// `reserve` (`"requests"` | `"bytes"`; default: `"requests"`).
    #[serde(default)]
    pub(super) unit: super::response::Unit,
    /// With `unit = "bytes"`: whose body bytes count: the response's as sent to the client, the
    /// request's as sent to the upstream, or both (`"response"` | `"request"` | `"both"`;
    /// default: `"response"`).
    #[serde(default)]
    pub(super) bytes: Option<super::response::CountedBytes>,
    // Where the limit's state lives (`super::fleet`).
    /// Where the limit's count lives: the `[store]`, or this gateway's own memory whatever the
    /// backend (A local tier); also on `[[plans.limits]]` (`"shared"` | `"local"`; default:
    /// `"shared"`).
    #[serde(default)]
    pub(super) store: super::fleet::LimitStore,
    /// A shared limit on Redis: every request asks Redis, or units are leased and spent locally
    /// (Leases); `fixed_window`, `token_bucket` and `gcra` only; not with `store = "local"`,
    /// `count_status`, `cost_header` or `cost_from`; also on `[[plans.limits]]` (`"exact"` |
    /// `"lease"`; default: `"exact"`).
    #[serde(default)]
    pub(super) sync: super::fleet::Sync,
    /// `sync = "lease"`: unused units go back at the latest this long after the lease's last use;
    /// at least `1ms`, at most `10s` (duration; default: `"250ms"`).
    #[serde(default)]
    pub(super) lease_ttl: Option<HumanDuration>,
    /// `sync = "lease"`: the most units one lease holds; between `cost` and the quota (positive
    /// integer; default: a twentieth of the quota (at least `cost`)).
    #[serde(default)]
    pub(super) lease_max: Option<u64>,
    // Overrides of `[server] ipv4_prefix` / `ipv6_prefix` for this limit.
    /// This limit's own prefixes for `ip` subjects and parts (and an address counted for a missing
    /// part) (integer; default: `[server]`'s).
    #[serde(default)]
    pub(super) ipv4_prefix: Option<super::subject::Ipv4Prefix>,
    /// This limit's own prefixes for `ip` subjects and parts (and an address counted for a missing
    /// part) (integer; default: `[server]`'s).
    #[serde(default)]
    pub(super) ipv6_prefix: Option<super::subject::Ipv6Prefix>,
    // Whom the limit does not apply to.
    /// Requests this limit does not apply to: CIDRs or addresses (the client address) and
    /// `"consumer:NAME"` (routes with `consumers = true`); counted as `decision="exempt"`
    /// (Exemptions) (list).
    #[serde(default)]
    pub(super) exempt: Option<Vec<super::subject::ExemptEntry>>,
    /// A subject this limit refuses this many times within its period is refused outright for
    /// `ban_for` (Penalty box) (positive integer; with `ban_for`).
    #[serde(default)]
    pub(super) ban_after: Option<std::num::NonZeroU32>,
    /// How long a ban lasts; at least `1s`, at most `1y` (duration; with `ban_after`).
    #[serde(default)]
    pub(super) ban_for: Option<HumanDuration>,
    /// The limit read from the caller's identity, per request: `"jwt:CLAIM"` (a claim of the
    /// verified token) or `"header:NAME"` (read only from a peer in `[server] trusted_proxies`);
    /// the configured `limit` when absent or not a positive integer; `[[routes.limits]]` only
    /// (Limits set by the caller) (string).
    #[serde(default)]
    pub(super) limit_from: Option<String>,
    /// With `limit_from`: the most any caller's limit may be (a larger value is clamped to it); at
    /// least `limit` (positive integer; required with `limit_from`).
    #[serde(default)]
    pub(super) limit_max: Option<NonZeroU64>,
    /// The shape of this limit's refusals, over the route's `refusal`: `{ status, body,
    /// content_type }` (The refusal's shape) (table; default: the route's, or 429 problem+json).
    #[serde(default)]
    pub(super) refusal: Option<super::refusal::RawRefusal>,
}

pub(super) fn default_access() -> String {
    "off".to_owned()
}
pub(super) fn default_listen() -> ListenAddr {
    ListenAddr(SocketAddr::from(([0, 0, 0, 0], 8080)))
}
pub(super) fn default_admin_listen() -> ListenAddr {
    ListenAddr(SocketAddr::from(([127, 0, 0, 1], 9090)))
}
pub(super) fn default_header_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
pub(super) fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
pub(super) fn default_body_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
pub(super) fn default_grace_period() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
pub(super) fn default_max_header_bytes() -> usize {
    64 * 1024
}
pub(super) fn default_max_uri_bytes() -> usize {
    8 * 1024
}
pub(super) fn default_max_pending_body_bytes_per_connection() -> usize {
    crate::front::pending::PendingBounds::DEFAULT.per_connection
}
pub(super) fn default_max_pending_body_bytes_per_worker() -> usize {
    crate::front::pending::PendingBounds::DEFAULT.per_worker
}
pub(super) fn default_h2_max_concurrent_streams() -> u32 {
    256
}
pub(super) fn default_store_timeout() -> HumanDuration {
    HumanDuration(Duration::from_millis(50))
}
pub(super) fn default_key_prefix() -> String {
    "tollgate".to_owned()
}
pub(super) fn default_max_subjects() -> NonZeroU64 {
    NonZeroU64::new(100_000).unwrap_or(NonZeroU64::MIN)
}
pub(super) fn default_deny_cache() -> bool {
    true
}
pub(super) fn default_route_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
pub(super) fn default_true() -> bool {
    true
}
pub(super) fn default_max_body_size() -> u64 {
    10 * 1024 * 1024
}

/// `[consumers]` as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsumers {
    /// The request header that carries the key; set this or `query` (exactly one), or neither with
    /// `jwt_claim` (consumers from tokens only) (header name).
    #[serde(default)]
    pub(super) header: Option<String>,
    /// The query parameter that carries the key (percent-decoded; read after `&` or `;` and with
    /// its name in any ASCII case, as for a `query:` subject, and with `strip_key` removed in every
    /// such spelling) (string).
    #[serde(default)]
    pub(super) query: Option<String>,
    /// The consumers file, relative to the config file; read at start-up, by `tollgate check`, and
    /// on every reload (path, required).
    pub(super) file: PathBuf,
    /// A request without a known key: 401, or the limits of that plan counted per client address
    /// (`"reject"` or a plan name; default: `"reject"`).
    #[serde(default = "default_on_unknown")]
    pub(super) on_unknown: String,
    /// Remove the key (the header, or the query parameter from the forwarded query) before
    /// forwarding (bool; default: `false`).
    #[serde(default)]
    pub(super) strip_key: bool,
    // Consumers (and their plans) from verified tokens' claims.
    /// Consumers from verified tokens (routes with `jwt`): this claim (`"sub"`, a dotted path for a
    /// nested one) names the consumer. A request with a token is that consumer; one without (an
    /// `optional` route) is identified by its API key as usual. A consumer named by a token is
    /// counted as the consumers file's consumer of that name (one budget, whichever way it calls)
    /// and is sent upstream as `X-Consumer` (claim name).
    #[serde(default)]
    pub(super) jwt_claim: Option<String>,
    /// With `jwt_claim`: this claim names the consumer's plan (a `[[plans]]` name), so a token's
    /// consumer need not be in the consumers file. Without it (or when the claim names no plan),
    /// the consumer must be in the file and its plan is the file's. A name that is missing, not a
    /// string or number, longer than 128 bytes, or neither in the file nor with a known plan is an
    /// unknown consumer (`on_unknown`) (claim name).
    #[serde(default)]
    pub(super) plan_claim: Option<String>,
}

fn default_on_unknown() -> String {
    "reject".to_owned()
}

/// `[[plans]]` as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    /// Unique; the `plan` metric label (letters, digits, `-_.`) (string, required).
    pub(super) name: String,
    /// `[[plans.limits]]`: the same keys as `[[routes.limits]]`,
    /// `calendar` included, plus `scope`. The subject is the consumer; a `subject` adds parts to
    /// it: `subject = ["path"]` counts per consumer and path, `["method", "ip"]` per consumer,
    /// method and address (`global` is an error) (list; default: `[]`).
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
    /// The speed at which each response's body is sent to this plan's consumers, in place of
    /// the route's `limit_rate` (`0`: no limit, even on a route with one) (bytes: an integer or
    /// `"64k"`, `"1m"`; default: the route's).
    #[serde(default)]
    pub(super) limit_rate: Option<super::values::ByteSize>,
    /// With `limit_rate`: the body bytes sent at full speed first (bytes; default: `0`).
    #[serde(default)]
    pub(super) limit_rate_after: Option<super::values::ByteSize>,
}
