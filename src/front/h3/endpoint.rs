//! The QUIC listener: one quinn endpoint on its own thread and runtime (a QUIC endpoint is one
//! UDP socket: connections are told apart by their connection ids, not by the kernel, so it is
//! not split over the workers' `SO_REUSEPORT` sockets — a migrated connection's packets could
//! land on another worker). quinn-udp uses GSO and GRO where the kernel has them.
//!
//! What it decides before any request: whether a new connection must prove its address first
//! (a QUIC Retry, [`RetryMode`]), the handshake's deadline (`header_read_timeout`), early data
//! (0-RTT) and the client certificate (verified again, as a resumed TCP session's is: quinn
//! does not say whether a session was resumed, so every connection's chain is). Memory is
//! bounded whatever the client's windows: the stream and connection receive windows, the send
//! window, the Initials queued and the bytes they may buffer are all set here.
//!
//! Each request runs in its own task through the one life cycle, [`super::codec::H3`]; its
//! subject address is the connection's address when its head arrived (after a migration, the
//! new one).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::HeaderValue;
use rustls::server::danger::ClientCertVerifier;
use tokio::sync::{mpsc, watch};

use super::body::RecvBody;
use super::codec::H3;
use crate::config::{Http3Config, RetryMode, TlsConfig};
use crate::front::hyper::body::{BodyFault, PeekBody};
use crate::front::hyper::{drop_underscored, UpstreamClient};
use crate::front::pending::PendingBodies;
use crate::pipeline::cycle::{self, Ground};
use crate::pipeline::{Flavor, Peer, WorkerCtx};
use crate::runtime::state::Shared;
use crate::tls::peer::PeerCert;

/// `retry = "under_load"`: past this many handshakes in progress, new connections must prove
/// their address first (a flood of Initials from spoofed addresses costs one Retry packet each,
/// no connection state).
pub const UNDER_LOAD_HANDSHAKES: usize = 64;
/// How long a request whose head says nothing of a body waits for the body's start (its end, first data or
/// trailers) before it is decided: twice the connection's RTT, within these bounds.
pub const SETTLE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(200));
/// The window a stream's request body gets (as HTTP/2's `H2_STREAM_WINDOW`).
pub const STREAM_WINDOW: u32 = 256 << 10;
/// The window a connection's request bodies get together (as HTTP/2's).
pub const CONNECTION_WINDOW: u32 = 1 << 20;
/// What one connection may have queued to send (unacknowledged included).
pub const SEND_WINDOW: u64 = 2 << 20;
/// Connection attempts queued before the accept loop takes them; more are refused.
const MAX_INCOMING: usize = 1024;
/// What one queued attempt may buffer (its Initial and 0-RTT packets), and all of them.
const INCOMING_BUFFER: u64 = 64 << 10;
const INCOMING_BUFFER_TOTAL: u64 = 8 << 20;

/// Why the QUIC listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum H3Error {
    #[error("cannot listen on {addr} (server.http3, UDP): {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("server.http3: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("server.http3: {0}")]
    Quic(String),
}

/// The QUIC listener bound, not yet serving.
pub struct Bound {
    socket: std::net::UdpSocket,
    addr: SocketAddr,
    endpoint: quinn::EndpointConfig,
    server: quinn::ServerConfig,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    config: Http3Config,
}

impl Bound {
    /// The UDP address (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `Alt-Svc` value the TCP listener advertises this listener with.
    pub fn alt_svc(&self) -> HeaderValue {
        let v = format!("h3=\":{}\"; ma=86400", self.addr.port());
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("clear"))
    }
}

/// quinn's server configuration: the TLS listener's certificates for QUIC
/// ([`crate::tls::load_quic`]) and the transport's bounds.
pub fn server_config(
    tls: &TlsConfig,
    acme: Option<Arc<crate::tls::acme::AcmeState>>,
    h3: &Http3Config,
) -> Result<(quinn::ServerConfig, Option<Arc<dyn ClientCertVerifier>>), H3Error> {
    let loaded = crate::tls::load_quic(tls, acme, h3.early_data)?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(loaded.server)
        .map_err(|e| H3Error::Quic(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(quinn::VarInt::from_u32(h3.max_concurrent_streams))
        // The client's control and QPACK streams (and a few to spare for grease).
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(8))
        .stream_receive_window(quinn::VarInt::from_u32(STREAM_WINDOW))
        .receive_window(quinn::VarInt::from_u32(CONNECTION_WINDOW))
        .send_window(SEND_WINDOW)
        .datagram_receive_buffer_size(None)
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(h3.idle_timeout)
                .map_err(|_| H3Error::Quic("idle_timeout is out of range".to_owned()))?,
        ));
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(h3.max_udp_payload);
    t.mtu_discovery_config(Some(mtu));
    server
        .transport_config(Arc::new(t))
        .max_incoming(MAX_INCOMING)
        .incoming_buffer_size(INCOMING_BUFFER)
        .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL);
    Ok((server, loaded.verifier))
}

/// Binds the UDP socket (`[server.http3] listen`, else `tcp`: the TLS listener's bound
/// address) and builds the configuration.
pub fn bind(
    h3: &Http3Config,
    tcp: SocketAddr,
    tls: &TlsConfig,
    acme: Option<Arc<crate::tls::acme::AcmeState>>,
) -> Result<Bound, H3Error> {
    let addr = h3.listen.unwrap_or(tcp);
    let socket =
        std::net::UdpSocket::bind(addr).map_err(|source| H3Error::Bind { addr, source })?;
    let addr = socket
        .local_addr()
        .map_err(|source| H3Error::Bind { addr, source })?;
    let mut endpoint = quinn::EndpointConfig::default();
    endpoint
        .max_udp_payload_size(h3.max_udp_payload)
        .map_err(|e| H3Error::Quic(e.to_string()))?;
    let (server, verifier) = server_config(tls, acme, h3)?;
    Ok(Bound {
        socket,
        addr,
        endpoint,
        server,
        verifier,
        config: h3.clone(),
    })
}

/// What the listener's connections share.
struct Worker {
    shared: Arc<Shared>,
    /// The upstream client of routes' own URLs (groups use worker 0's pooled clients).
    client: UpstreamClient<RecvBody>,
    ctx: WorkerCtx,
    /// The bytes undecided request bodies hold on this listener.
    pending: AtomicUsize,
    /// Handshakes in progress (`retry = "under_load"`).
    handshaking: AtomicUsize,
    /// The client certificate verifier of the current configuration (swapped on reload).
    verifier: ArcSwapOption<Arc<dyn ClientCertVerifier>>,
    config: Http3Config,
}

/// One connection's state its requests share.
struct Conn {
    quic: quinn::Connection,
    /// Resolves to `true` once the handshake is complete (a connection accepted without
    /// early data starts complete).
    complete: watch::Receiver<bool>,
    client_cert: OnceLock<Option<Arc<PeerCert>>>,
    pending_bodies: AtomicUsize,
}

/// Runs the listener on its own thread until `stop` turns true, then drains for up to the
/// grace period. `done` is told when it is over.
pub fn spawn(
    bound: Bound,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    done: tokio::sync::oneshot::Sender<()>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("tollgate-h3".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the HTTP/3 runtime");
                    return;
                }
            };
            let ctx = WorkerCtx::new(tollgate_limit::worker::WorkerId::NONE);
            runtime.block_on(serve(bound, shared, ctx.clone(), stop));
            runtime.block_on(ctx.settled(Duration::from_secs(1)));
            drop(runtime);
            let _ = done.send(());
        })
        .map(|_| ())
}

async fn serve(bound: Bound, shared: Arc<Shared>, ctx: WorkerCtx, mut stop: watch::Receiver<bool>) {
    let Bound {
        socket,
        addr,
        endpoint,
        server,
        verifier,
        config,
    } = bound;
    let endpoint = match quinn::Endpoint::new(
        endpoint,
        Some(server),
        socket,
        Arc::new(quinn::TokioRuntime),
    ) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, %addr, "cannot start the HTTP/3 listener");
            return;
        }
    };
    tracing::info!(%addr, "HTTP/3 listener (QUIC) started");
    let worker = Arc::new(Worker {
        shared,
        client: crate::front::hyper::upstream_client(),
        ctx,
        pending: AtomicUsize::new(0),
        handshaking: AtomicUsize::new(0),
        verifier: ArcSwapOption::from(verifier.map(Arc::new)),
        config,
    });
    // A reload of `[server.tls]` (SIGHUP, `POST /-/reload`, a watched file) reaches new QUIC
    // connections too; open ones keep the configuration they started with.
    if let Some(tls) = &worker.shared.tls {
        let (endpoint, worker_ref, stop) =
            (endpoint.clone(), Arc::downgrade(&worker), stop.clone());
        let acme = tls.acme().cloned();
        tls.on_reload(Box::new(move |t| {
            let Some(worker) = worker_ref.upgrade() else {
                return;
            };
            if *stop.borrow() {
                return;
            }
            match server_config(t, acme.clone(), &worker.config) {
                Ok((server, verifier)) => {
                    endpoint.set_server_config(Some(server));
                    worker.verifier.store(verifier.map(Arc::new));
                }
                Err(e) => tracing::warn!(error = %e, "HTTP/3 listener keeps its TLS configuration"),
            }
        }));
    }
    let (live, mut drained) = mpsc::channel::<()>(1);
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
            _ = stop.changed() => break,
        };
        admit(incoming, &worker, &live, &stop);
    }
    // New connections are refused from here; those open get GOAWAY and finish their requests.
    endpoint.set_server_config(None);
    drop(live);
    let grace = worker.shared.snapshot.load().config.server.grace_period;
    let _ = tokio::time::timeout(grace, drained.recv()).await;
    endpoint.close(quinn::VarInt::from_u32(0), b"shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
}

/// A connection attempt: sent a Retry (its address not yet proven, and `retry` asks for it),
/// or accepted and handed to its own task.
fn admit(
    incoming: quinn::Incoming,
    worker: &Arc<Worker>,
    live: &mpsc::Sender<()>,
    stop: &watch::Receiver<bool>,
) {
    let handshaking = worker.handshaking.load(Ordering::Relaxed);
    if must_retry(
        worker.config.retry,
        handshaking,
        incoming.remote_address_validated(),
    ) {
        metrics::counter!(crate::metrics::QUIC_RETRIES).increment(1);
        if let Err(e) = incoming.retry() {
            e.into_incoming().ignore();
        }
        return;
    }
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "QUIC connection attempt failed");
            return;
        }
    };
    worker.handshaking.fetch_add(1, Ordering::Relaxed);
    let handshaking = Handshaking(worker.clone());
    tokio::spawn(connection(
        connecting,
        worker.clone(),
        handshaking,
        live.clone(),
        stop.clone(),
    ));
}

/// Whether a connection attempt gets a Retry rather than a handshake: its address is not
/// proven yet, and `retry` asks for proof always, or now (`handshaking` in progress, past
/// [`UNDER_LOAD_HANDSHAKES`]).
fn must_retry(mode: RetryMode, handshaking: usize, validated: bool) -> bool {
    !validated
        && match mode {
            RetryMode::Always => true,
            RetryMode::Never => false,
            RetryMode::UnderLoad => handshaking >= UNDER_LOAD_HANDSHAKES,
        }
}

/// A handshake in progress (counted for `retry = "under_load"` until dropped).
struct Handshaking(Arc<Worker>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.handshaking.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    connecting: quinn::Connecting,
    worker: Arc<Worker>,
    handshaking: Handshaking,
    _live: mpsc::Sender<()>,
    mut stop: watch::Receiver<bool>,
) {
    let deadline = worker
        .shared
        .snapshot
        .load()
        .config
        .server
        .header_read_timeout;
    let (quic, complete) = if worker.config.early_data {
        // 0.5-RTT: requests may arrive before the handshake completes (early data); each is
        // told whether it did (`complete`).
        match connecting.into_0rtt() {
            Ok((quic, accepted)) => {
                let (tx, rx) = watch::channel(false);
                let q = quic.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(deadline, accepted).await {
                        Ok(_) if q.close_reason().is_none() => {
                            let _ = tx.send(true);
                        }
                        _ => q.close(quinn::VarInt::from_u32(0), b"handshake timed out"),
                    }
                    drop(handshaking);
                });
                (quic, rx)
            }
            Err(connecting) => match handshake(connecting, deadline).await {
                Some(q) => (q, watch::channel(true).1),
                None => return,
            },
        }
    } else {
        let quic = handshake(connecting, deadline).await;
        drop(handshaking);
        match quic {
            Some(q) => (q, watch::channel(true).1),
            None => return,
        }
    };
    let conn = Arc::new(Conn {
        quic: quic.clone(),
        complete,
        client_cert: OnceLock::new(),
        pending_bodies: AtomicUsize::new(0),
    });
    let server = &worker.shared.snapshot.load().config.server;
    let max_field_section = u64::try_from(server.max_header_bytes).unwrap_or(u64::MAX);
    let built = h3::server::builder()
        .max_field_section_size(max_field_section)
        // Reserved frame and setting types exercise a client's tolerance; not a proxy's job.
        .send_grease(false)
        .build::<_, Bytes>(h3_quinn::Connection::new(quic))
        .await;
    let mut h3c = match built {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "HTTP/3 connection setup failed");
            return;
        }
    };
    let (requests, mut finished) = mpsc::channel::<()>(1);
    let mut draining = *stop.borrow_and_update();
    if draining {
        let _ = h3c.shutdown(0).await;
    }
    loop {
        tokio::select! {
            accepted = h3c.accept() => match accepted {
                Ok(Some(resolver)) => {
                    // Early data: the stream was accepted before the handshake completed —
                    // read here, as the stream is accepted (as quinn's own `is_0rtt`; the flag
                    // can only lag behind the handshake, never run ahead of it).
                    let early = !*conn.complete.borrow();
                    tokio::spawn(request(
                        resolver,
                        early,
                        conn.clone(),
                        worker.clone(),
                        requests.clone(),
                    ));
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP/3 connection ended");
                    break;
                }
            },
            _ = stop.changed(), if !draining => {
                draining = true;
                // GOAWAY: the requests accepted so far are served, no more.
                let _ = h3c.shutdown(0).await;
            }
        }
    }
    // The h3 connection closes the QUIC connection when dropped: only once its requests are
    // done.
    drop(requests);
    let _ = finished.recv().await;
}

/// The handshake, within `deadline`.
async fn handshake(connecting: quinn::Connecting, deadline: Duration) -> Option<quinn::Connection> {
    match tokio::time::timeout(deadline, connecting).await {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "QUIC handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("QUIC handshake timed out");
            None
        }
    }
}

impl Conn {
    /// The client's verified certificate: verified again with the listener's verifier (see
    /// the module comment); `Err`: the chain does not pass (the connection is closed).
    fn client_cert(&self, worker: &Worker) -> Result<Option<Arc<PeerCert>>, ()> {
        if let Some(c) = self.client_cert.get() {
            return Ok(c.clone());
        }
        let verifier = worker.verifier.load();
        let Some(verifier) = verifier.as_deref() else {
            return Ok(self.client_cert.get_or_init(|| None).clone());
        };
        let chain = self.quic.peer_identity().and_then(|id| {
            id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        });
        let chain = chain.as_deref().map(Vec::as_slice);
        if crate::tls::accept::resumed(verifier.as_ref(), chain, rustls::pki_types::UnixTime::now())
            .is_err()
        {
            self.quic.close(
                quinn::VarInt::from_u32(0x0101),
                b"client certificate refused",
            );
            return Err(());
        }
        let cert = chain
            .and_then(|c| c.first())
            .and_then(|leaf| PeerCert::of(leaf))
            .map(Arc::new);
        Ok(self.client_cert.get_or_init(|| cert).clone())
    }
}

/// One request: its head read (within `header_read_timeout`), then the life cycle.
async fn request(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    early: bool,
    conn: Arc<Conn>,
    worker: Arc<Worker>,
    _live: mpsc::Sender<()>,
) {
    let snap = worker.shared.snapshot.load_full();
    let server = &snap.config.server;
    let Ok(Ok((req, stream))) =
        tokio::time::timeout(server.header_read_timeout, resolver.resolve_request()).await
    else {
        return;
    };
    let started = Instant::now();
    // Early data (0-RTT) can be replayed: a request that is not idempotent is refused with 425
    // (the client sends it again after the handshake); an idempotent one waits for the
    // handshake, which a replay never completes.
    let too_early = early && !super::codec::idempotent(req.method());
    if early && !too_early {
        let mut complete = conn.complete.clone();
        let waited =
            tokio::time::timeout(server.header_read_timeout, complete.wait_for(|c| *c)).await;
        if !matches!(waited, Ok(Ok(_))) {
            return;
        }
    }
    let client_cert = if too_early {
        None
    } else {
        match conn.client_cert(&worker) {
            Ok(c) => c,
            Err(()) => return,
        }
    };
    let (send, recv) = stream.split();
    let (mut parts, ()) = req.into_parts();
    let length = content_length(&parts.headers);
    let refused = match (&length, &parts.method) {
        (Err(()), _) => Some("the content-length is not one number"),
        (_, &http::Method::CONNECT) => Some("CONNECT is not supported"),
        _ => None,
    };
    let declared = length.ok().flatten();
    let mut body = RecvBody::new(recv, declared);
    body.peek(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    // A request whose head says nothing of a body (no length, no type: a GET) has none when
    // its stream ends right after the head — in the same packet or one just after (hyperium's
    // h3 client sends the FIN apart): its start is waited for, briefly ([`SETTLE`]: the request
    // is decided, and seen by its limits, then whatever comes), so that such a request is sent
    // upstream without a body (not as an empty chunked one), may go to another server when an
    // attempt fails, and declares no body, as on the TCP fronts.
    if declared.is_none()
        && refused.is_none()
        && !parts.headers.contains_key(http::header::CONTENT_TYPE)
        && !body.settled()
    {
        let wait = (conn.quic.rtt() * 2)
            .clamp(SETTLE.0, SETTLE.1)
            .min(server.body_read_timeout);
        let _ = tokio::time::timeout(wait, body.settle()).await;
    }
    // A stream that ended with its head declares no body, as an HTTP/1 request without a
    // length does: the head says so (`content-length: 0`) to what reads only the head (a byte
    // budget of 0 on request bytes); not sent upstream.
    let said_empty = declared.is_none()
        && http_body::Body::is_end_stream(&body)
        && !parts.headers.contains_key(http::header::TRANSFER_ENCODING);
    if said_empty {
        parts
            .headers
            .insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    let accept_encoding = parts
        .headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .cloned()
        .collect();
    drop_underscored(&mut parts.headers);
    let pending = PendingBodies {
        connection: &conn.pending_bodies,
        worker: &worker.pending,
        bounds: server.pending_bodies,
    };
    let mut codec = H3 {
        shared: &worker.shared,
        client: &worker.client,
        worker: 0,
        refused,
        flavor: Flavor::of(&parts),
        accept_encoding,
        body: Some(PeekBody::new(body, server.body_read_timeout, pending)),
        body_timeout: server.body_read_timeout,
        idle: server.idle_timeout,
        fault: BodyFault::default(),
        going: None,
        send,
        head: parts.method == http::Method::HEAD,
        too_early,
        quic: conn.quic.clone(),
        said_empty,
    };
    // The address the request arrived from (after a migration, the new one).
    let peer_addr = conn.quic.remote_address();
    let ip_value = HeaderValue::from_str(&peer_addr.ip().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
    let peer = Peer {
        ip: peer_addr.ip(),
        ip_value: &ip_value,
        tls: true,
        client_cert: client_cert.as_deref(),
    };
    let ground = Ground {
        shared: &worker.shared,
        snap: &snap,
        ctx: &worker.ctx,
    };
    cycle::run(&mut codec, parts, ground, &peer, None, started).await;
}

/// The request's `content-length`: `Ok(None)` without one, `Err` when it is not one number
/// (several that differ, or not a number).
fn content_length(headers: &http::HeaderMap) -> Result<Option<u64>, ()> {
    let mut length = None;
    for v in headers.get_all(http::header::CONTENT_LENGTH) {
        for part in v.to_str().map_err(|_| ())?.split(',') {
            let n: u64 = part.trim().parse().map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_is_asked_of_unproven_addresses_as_the_mode_says() {
        for validated in [false, true] {
            assert_eq!(must_retry(RetryMode::Always, 0, validated), !validated);
            assert!(!must_retry(RetryMode::Never, 10_000, validated));
            assert!(!must_retry(
                RetryMode::UnderLoad,
                UNDER_LOAD_HANDSHAKES - 1,
                validated
            ));
            assert_eq!(
                must_retry(RetryMode::UnderLoad, UNDER_LOAD_HANDSHAKES, validated),
                !validated
            );
        }
    }

    #[test]
    fn a_content_length_is_one_number() {
        let mut h = http::HeaderMap::new();
        assert_eq!(content_length(&h), Ok(None));
        h.append("content-length", HeaderValue::from_static("5"));
        assert_eq!(content_length(&h), Ok(Some(5)));
        h.append("content-length", HeaderValue::from_static("5, 5"));
        assert_eq!(content_length(&h), Ok(Some(5)));
        h.append("content-length", HeaderValue::from_static("6"));
        assert_eq!(content_length(&h), Err(()));
        let mut h = http::HeaderMap::new();
        h.append("content-length", HeaderValue::from_static("-1"));
        assert_eq!(content_length(&h), Err(()));
    }
}
