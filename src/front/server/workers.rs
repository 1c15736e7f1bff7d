//! Thread per core: `[server] workers` threads, each a single-threaded tokio runtime with its
//! own `SO_REUSEPORT` listener socket and its own [`Handler`] (and so its own upstream pool).
//! The kernel spreads new connections over the sockets; a connection never leaves the worker
//! that accepted it, so the request path has no cross-thread wake-up and no shared pool lock.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::{listener, Handler};
use crate::runtime::state::Shared;

/// The proxy listener's sockets, one per worker, all bound to one address.
#[derive(Debug)]
pub struct Listeners {
    addr: SocketAddr,
    sockets: Vec<std::net::TcpListener>,
}

impl Listeners {
    /// The bound address (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `workers` sockets to `addr` (the first picks the port when `addr` has port 0).
pub fn bind(addr: SocketAddr, workers: usize) -> io::Result<Listeners> {
    let first = reuseport_listener(addr)?;
    let addr = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..workers.max(1) {
        sockets.push(reuseport_listener(addr)?);
    }
    Ok(Listeners { addr, sockets })
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Runs one worker per socket until `stop` turns true (or its sender is dropped) and every
/// worker has drained. `make` builds each worker's handler (given its index) on the worker's
/// own thread.
pub async fn serve<H, F>(
    listeners: Listeners,
    shared: Arc<Shared>,
    make: F,
    stop: watch::Receiver<bool>,
) where
    H: Handler,
    F: Fn(usize) -> H + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let mut done = Vec::new();
    for (i, socket) in listeners.sockets.into_iter().enumerate() {
        let (finished, wait) = oneshot::channel::<bool>();
        let (shared, make, stop) = (shared.clone(), make.clone(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("tollgate-worker-{i}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(worker = i, error = %e, "cannot start a worker runtime");
                        return;
                    }
                };
                let handler = make(i);
                let ctx = handler.clone();
                let drained = runtime.block_on(async move {
                    match TcpListener::from_std(socket) {
                        Ok(l) => listener::serve(l, shared, handler, stop).await,
                        Err(e) => {
                            tracing::error!(worker = i, error = %e, "cannot use the listener");
                            true
                        }
                    }
                });
                // The slot releases and charges of the last requests are tasks of this runtime:
                // they finish first (bounded; a lost release is a Redis lease that expires).
                runtime.block_on(ctx.settled(std::time::Duration::from_secs(1)));
                // Connections still open after the grace period end with the runtime.
                drop(runtime);
                let _ = finished.send(drained);
            });
        match spawned {
            Ok(_) => done.push(wait),
            Err(e) => tracing::error!(worker = i, error = %e, "cannot start a worker thread"),
        }
    }
    let mut drained = true;
    for wait in done {
        drained &= wait.await.unwrap_or(false);
    }
    if drained {
        tracing::info!("all connections drained");
    }
}
