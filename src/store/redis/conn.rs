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
            send_and_read(&mut io, c, "call").await
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
    match send_and_read(io, c, what).await? {
        Reply::Text(_) => Ok(()),
        Reply::Error(e) => Err(err(StoreErrorKind::Server, format!("{what}: {e}"))),
        _ => Err(err(
            StoreErrorKind::Other,
            format!("{what}: unexpected reply"),
        )),
    }
}

/// Sends one command and reads its one reply (an integer array's items are dropped).
async fn send_and_read(io: &mut Box<dyn Io>, c: &Command, what: &str) -> Result<Reply, StoreError> {
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
