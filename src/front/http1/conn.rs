//! The fast front's connection loop: reads request heads (in order: a pipelined request waits
//! in the buffer until the one before it is answered), runs each through the pipeline, sends
//! the admitted ones upstream ([`super::exchange`]) and renders the pipeline's answers; keeps
//! the connection alive, enforces the header and idle timeouts, and closes at a drain.
//!
//! A head it does not serve (see [`super::parse::Fallback`]) ends the loop with a
//! [`Handoff`]: the connection and every byte read of it, for hyper to serve from there on.

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio::time::Instant;

use super::deadline::Deadline;
use super::exchange::Fast;
use super::parse::{scan, Head, Parsed};
use super::session::{ClientConn, Front, Next};
use crate::pipeline::cycle::{self, Ground};
use crate::pipeline::Peer;

/// How long a connection closed with unread input keeps reading and discarding, so the
/// client can still read the answer (as the hyper front's connections do).
const LINGER: Duration = Duration::from_secs(2);

/// The client side of a connection.
#[derive(Clone, Debug)]
pub struct Client {
    pub peer: SocketAddr,
    /// The peer's address as a header value (`X-Forwarded-For`).
    pub peer_ip: HeaderValue,
    pub tls: bool,
    /// The verified client certificate's facts (mTLS), worked out once at the handshake.
    pub client_cert: Option<std::sync::Arc<crate::tls::peer::PeerCert>>,
    /// `Alt-Svc` on every response (`[server.http3]`, TLS connections only).
    pub alt_svc: Option<HeaderValue>,
}

/// The connection's timers and head limit.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub idle: Duration,
    pub header: Duration,
    pub max_head: usize,
}

/// A connection handed to hyper: the IO and the bytes read but not served.
pub struct Handoff<T> {
    pub io: T,
    pub read: Bytes,
}

/// Serves `io` until it closes, idles out or drains (`None`), or meets a request it hands to
/// hyper (`Some`).
pub async fn serve<T>(
    front: &Front,
    io: T,
    client: &Client,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
) -> Option<Handoff<T>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut c = ClientConn::new(io);
    c.alt_svc = client.alt_svc.clone();
    let mut timer = Deadline::default();
    // What this connection's bodies not yet decided hold (`crate::front::pending`).
    let pending = std::sync::atomic::AtomicUsize::new(0);
    let opened = Instant::now();
    let mut last_active = opened;
    let mut first = true;
    let mut watching = true;
    loop {
        // A head: from the first byte (or the connection's start, for its first request) it
        // must be complete within `header`; with nothing read, the connection may idle.
        let mut head_since =
            (!c.buf.is_empty() || first).then(|| if first { opened } else { Instant::now() });
        let layout = loop {
            if !c.buf.is_empty() {
                match scan(&c.buf) {
                    Parsed::Complete(l) if l.len <= limits.max_head => break l,
                    // hyper answers an oversized head (431) and closes.
                    Parsed::Complete(_) => {
                        counted("head_too_large");
                        return Some(Handoff {
                            io: c.io,
                            read: c.buf.freeze(),
                        });
                    }
                    Parsed::Fallback(why) => {
                        tracing::trace!(?why, "request handed to hyper");
                        counted("protocol");
                        return Some(Handoff {
                            io: c.io,
                            read: c.buf.freeze(),
                        });
                    }
                    Parsed::Partial if c.buf.len() > limits.max_head => {
                        // hyper answers the oversized head (431) and closes.
                        counted("head_too_large");
                        return Some(Handoff {
                            io: c.io,
                            read: c.buf.freeze(),
                        });
                    }
                    Parsed::Partial => {}
                }
            }
            let draining = *stop.borrow();
            if draining && c.buf.is_empty() {
                return None;
            }
            let idle_due = last_active + limits.idle;
            let due = match head_since {
                Some(since) => (since + limits.header).min(idle_due),
                None => idle_due,
            };
            tokio::select! {
                read = c.read_more() => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {
                        last_active = Instant::now();
                        head_since.get_or_insert(last_active);
                    }
                },
                changed = stop.changed(), if !draining && watching => {
                    // The drain's sender gone: nothing will say "drain" any more.
                    watching = changed.is_ok();
                }
                () = timer.until(due) => {
                    tracing::debug!(peer = %client.peer, "connection timed out waiting for a request head");
                    return None;
                }
            }
        };
        first = false;
        let bytes = c.buf.split_to(layout.len).freeze();
        let Some(head) = Head::parse(bytes.clone(), layout) else {
            // A target `httparse` takes and `http`'s URI parser does not (`/>`): hyper's to
            // answer (400), with every byte as read.
            counted("protocol");
            return Some(hand_off(c, &bytes));
        };
        let next = request(front, (&mut c, &mut timer, &pending), client, head, stop).await;
        last_active = Instant::now();
        match next {
            // A large body's buffer is not kept for the life of the connection.
            Next::KeepAlive => c.shrink(),
            Next::Hyper(why) => {
                tracing::trace!(why, "request handed to hyper");
                counted(why);
                return Some(hand_off(c, &bytes));
            }
            Next::Close { linger } => {
                let _ = c.io.flush().await;
                // The close starts at once (a FIN right after the answer, as hyper's); the
                // unread input is then drained for a while (staged closure, RFC 9112 §9.6) so
                // that it does not turn the close into a reset that loses the answer.
                if linger {
                    let _ = c.io.shutdown().await;
                    let _ = tokio::time::timeout(LINGER, async {
                        let mut sink = [0u8; 8192];
                        while let Ok(n) = c.io.read(&mut sink).await {
                            if n == 0 {
                                break;
                            }
                        }
                    })
                    .await;
                }
                let _ = c.io.shutdown().await;
                return None;
            }
        }
    }
}

/// Counts a connection handed to hyper (`why`: a reason of [`crate::metrics::HTTP1_HANDOFFS`]).
fn counted(why: &'static str) {
    metrics::counter!(crate::metrics::HTTP1_HANDOFFS, "reason" => why).increment(1);
}

/// The connection for hyper, with a head already split off (`head`) and every byte read after it.
fn hand_off<T>(c: ClientConn<T>, head: &[u8]) -> Handoff<T> {
    let mut read = BytesMut::with_capacity(head.len() + c.buf.len());
    read.extend_from_slice(head);
    read.extend_from_slice(&c.buf);
    Handoff {
        io: c.io,
        read: read.freeze(),
    }
}

/// One request: the hyper front's when its route needs it, else the one life cycle
/// ([`crate::pipeline::cycle`]) on this front.
async fn request<T>(
    front: &Front,
    (c, timer, pending): (&mut ClientConn<T>, &mut Deadline, &AtomicUsize),
    client: &Client,
    head: Head,
    stop: &watch::Receiver<bool>,
) -> Next
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let started = std::time::Instant::now();
    let shared = &*front.shared;
    let snap = shared.snapshot.load_full();
    // The route is looked up once: to decide who serves the request, and for the pipeline.
    let routed = match crate::pipeline::serve(&snap, &head) {
        crate::pipeline::Serve::Hyper(why) => return Next::Hyper(why),
        crate::pipeline::Serve::Here(routed) => routed,
    };
    let peer = Peer {
        ip: client.peer.ip(),
        ip_value: &client.peer_ip,
        tls: client.tls,
        client_cert: client.client_cert.as_deref(),
    };
    let mut codec = Fast::new(front, (c, timer, pending), &head, stop, &snap);
    let ground = Ground {
        shared,
        snap: &snap,
        ctx: &front.ctx,
    };
    cycle::run(&mut codec, &head, ground, &peer, routed, started).await
}
