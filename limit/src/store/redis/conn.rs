//! Opening a connection to one Redis server: TCP (or TLS for `rediss://`), then `AUTH` and
//! `SELECT` as the URL asks, within `[store] timeout`.

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::resp::{self, Command, Reply};
use crate::store::{StoreError, StoreErrorKind};

/// A byte stream to Redis (plain TCP or TLS).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where and how to connect, parsed once from the URL.
#[derive(Clone)]
pub struct Target {
    host: String,
    port: u16,
    tls: Option<(
        rustls::pki_types::ServerName<'static>,
        tokio_rustls::TlsConnector,
    )>,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// How long connecting and the handshake may take.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .field("db", &self.db)
            .finish()
    }
}

fn err(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
    StoreError::new(kind, message)
}

impl Target {
    /// Parses a `redis://` or `rediss://` URL (user, password and database included).
    pub fn parse(url: &str, timeout: Duration) -> Result<Target, StoreError> {
        let info = url
            .into_connection_info()
            .map_err(|e| err(StoreErrorKind::Other, format!("bad Redis URL: {e}")))?;
        let (host, port, tls) = match info.addr() {
            ConnectionAddr::Tcp(h, p) => (h.clone(), *p, None),
            ConnectionAddr::TcpTls { host, port, .. } => {
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| err(StoreErrorKind::Other, format!("bad Redis TLS host: {e}")))?;
                (host.clone(), *port, Some((name, tls_connector()?)))
            }
            _ => {
                return Err(err(
                    StoreErrorKind::Other,
                    "only redis:// and rediss:// (TCP) URLs are supported",
                ))
            }
        };
        let r = info.redis_settings();
        Ok(Target {
            host,
            port,
            tls,
            username: r.username().map(str::to_owned),
            password: r.password().map(str::to_owned),
            db: r.db(),
            connect_timeout: timeout.max(Duration::from_millis(500)),
        })
    }

    /// The same scheme, credentials and database at another address (the primary a sentinel
    /// names).
    pub fn at(&self, host: &str, port: u16) -> Result<Target, StoreError> {
        let tls = match &self.tls {
            Some((_, connector)) => {
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| err(StoreErrorKind::Other, format!("bad Redis TLS host: {e}")))?;
                Some((name, connector.clone()))
            }
            None => None,
        };
        Ok(Target {
            host: host.to_owned(),
            port,
            tls,
            ..self.clone()
        })
    }

    /// `host:port`, for logs.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Connects and runs the handshake; `nodelay` sets `TCP_NODELAY`.
    pub async fn connect(&self, nodelay: bool) -> Result<Box<dyn Io>, StoreError> {
        match tokio::time::timeout(self.connect_timeout, self.open(nodelay)).await {
            Ok(r) => r,
            Err(_) => Err(err(
                StoreErrorKind::Timeout,
                format!("no connection within {:?}", self.connect_timeout),
            )),
        }
    }

    async fn open(&self, nodelay: bool) -> Result<Box<dyn Io>, StoreError> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| err(StoreErrorKind::Connect, e.to_string()))?;
        let _ = tcp.set_nodelay(nodelay);
        let mut io: Box<dyn Io> = match &self.tls {
            Some((name, connector)) => Box::new(
                connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| err(StoreErrorKind::Connect, format!("TLS: {e}")))?,
            ),
            None => Box::new(tcp),
        };
        if let Some(password) = &self.password {
            let mut c = Command::default();
            c.arg(b"AUTH");
            if let Some(user) = &self.username {
                c.arg(user.as_bytes());
            }
            c.arg(password.as_bytes());
            handshake(&mut io, &c, "AUTH").await?;
        }
        if self.db != 0 {
            let mut c = Command::default();
            c.arg(b"SELECT");
            c.arg(self.db.to_string().as_bytes());
            handshake(&mut io, &c, "SELECT").await?;
        }
        Ok(io)
    }
}

impl Target {
    /// Connects, sends `c` and returns its reply (an error reply included), within the connect
    /// timeout: for the rare calls that do not go through a lane (support's corrections).
    pub async fn call_once(&self, c: &Command) -> Result<Reply, StoreError> {
        let call = async {
            let mut io = self.connect(true).await?;
            ask(&mut io, c, "call").await
        };
        match tokio::time::timeout(self.connect_timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(err(
                StoreErrorKind::Timeout,
                format!("no answer within {:?}", self.connect_timeout),
            )),
        }
    }
}

/// Sends one command and expects `+OK`.
async fn handshake(io: &mut Box<dyn Io>, c: &Command, what: &str) -> Result<(), StoreError> {
    match ask(io, c, what).await? {
        Reply::Text(_) => Ok(()),
        Reply::Error(e) => Err(err(StoreErrorKind::Server, format!("{what}: {e}"))),
        _ => Err(err(
            StoreErrorKind::Other,
            format!("{what}: unexpected reply"),
        )),
    }
}

/// Checks that the server at the other end of `io` is a primary (`INFO replication` says
/// `role:master`): a sentinel's answer may be a moment old, and a demoted primary refuses
/// writes. A server that refuses `INFO` (an ACL without it) is taken at the sentinel's word.
pub async fn check_primary(io: &mut Box<dyn Io>, timeout: Duration) -> Result<(), StoreError> {
    let mut c = Command::default();
    c.arg(b"INFO");
    c.arg(b"replication");
    let reply = tokio::time::timeout(timeout, ask(io, &c, "INFO"))
        .await
        .map_err(|_| err(StoreErrorKind::Timeout, "INFO: no answer"))??;
    match reply {
        Reply::Text(info) if !info.lines().any(|l| l.trim_end() == "role:master") => Err(err(
            StoreErrorKind::Connect,
            "the server the sentinels name is not a primary (yet)",
        )),
        _ => Ok(()),
    }
}

/// Sends one command and reads its reply (a simple or bulk string, an error, an integer).
async fn ask(io: &mut Box<dyn Io>, c: &Command, what: &str) -> Result<Reply, StoreError> {
    let mut out = Vec::new();
    c.write_to(&mut out);
    io.write_all(&out)
        .await
        .map_err(|e| err(StoreErrorKind::Connect, e.to_string()))?;
    let mut buf = Vec::with_capacity(256);
    let mut ints = Vec::new();
    loop {
        match resp::parse(&buf, &mut ints) {
            Ok(Some((reply, _))) => return Ok(reply),
            Ok(None) => {}
            Err(e) => return Err(err(StoreErrorKind::Other, e.to_string())),
        }
        let n = io
            .read_buf(&mut buf)
            .await
            .map_err(|e| err(StoreErrorKind::Connect, e.to_string()))?;
        if n == 0 {
            return Err(err(
                StoreErrorKind::Connect,
                format!("{what}: the connection closed"),
            ));
        }
    }
}

/// TLS to Redis with the platform's trust roots.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(StoreErrorKind::Other, format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// What a lane connects to: one server, or the primary the sentinels name.
#[derive(Debug)]
pub enum Endpoint {
    Fixed(Target),
    /// `template` gives the primary's scheme, credentials and database.
    Sentinel {
        template: Target,
        sentinel: Arc<super::sentinel::Sentinel>,
    },
}

impl Endpoint {
    /// Connects (for a sentinel: to the primary it names, checked to be one).
    pub async fn connect(&self, nodelay: bool) -> Result<Box<dyn Io>, StoreError> {
        match self {
            Endpoint::Fixed(t) => t.connect(nodelay).await,
            Endpoint::Sentinel { template, sentinel } => {
                let (host, port) = sentinel.primary().await?;
                let target = template.at(&host, port)?;
                tracing::debug!(primary = %target.addr(), "connecting to the primary the sentinels name");
                let mut io = target.connect(nodelay).await?;
                check_primary(&mut io, target.connect_timeout).await?;
                Ok(io)
            }
        }
    }

    /// The server to send a one-off call to (support's corrections): the fixed one, or the
    /// primary the sentinels name now.
    pub async fn primary_target(&self) -> Result<Target, StoreError> {
        match self {
            Endpoint::Fixed(t) => Ok(t.clone()),
            Endpoint::Sentinel { template, sentinel } => {
                let (host, port) = sentinel.primary().await?;
                template.at(&host, port)
            }
        }
    }

    /// Changes at each switch of the primary (Sentinel only).
    pub fn switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Endpoint::Fixed(_) => None,
            Endpoint::Sentinel { sentinel, .. } => Some(sentinel.switches()),
        }
    }

    /// Whether a `READONLY` reply means "ask where the primary is now" (Sentinel only).
    pub fn follows_failover(&self) -> bool {
        matches!(self, Endpoint::Sentinel { .. })
    }
}

/// Waits for the next change of `switches`; forever when there is none to wait for.
pub async fn switched(switches: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    match switches {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}
