//! The HTTP client to the ACME directory: hyper over rustls (ring, as the listeners), trusting
//! `ca` when given (a private ACME server) and the system's roots otherwise, HTTPS only, and
//! every request bounded by [`REQUEST_TIMEOUT`] so a directory that accepts and never answers
//! cannot hold an order forever.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::AcmeError;

/// One request to the directory, headers and all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// instant-acme's transport.
pub struct Client {
    inner: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>,
}

impl Client {
    /// A client trusting `ca` (a PEM bundle), or the system's roots.
    pub fn new(ca: Option<&Path>) -> Result<Client, AcmeError> {
        let mut roots = rustls::RootCertStore::empty();
        match ca {
            Some(path) => {
                let bad = |e: String| AcmeError::Certificate(format!("{}: {e}", path.display()));
                for c in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
                    roots
                        .add(c.map_err(|e| bad(e.to_string()))?)
                        .map_err(|e| bad(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(bad("no certificate found".to_owned()));
                }
            }
            None => {
                for c in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(c);
                }
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(crate::tls::crypto::shared())
            .with_safe_default_protocol_versions()
            .map_err(|e| AcmeError::Certificate(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(REQUEST_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client {
            inner: HyperClient::builder(TokioExecutor::new()).build(connector),
        })
    }
}

impl HttpClient for Client {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let fut = self.inner.request(req);
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
                Ok(Ok(rsp)) => Ok(BytesResponse::from(rsp)),
                Ok(Err(e)) => Err(instant_acme::Error::Other(Box::new(e))),
                Err(_) => Err(instant_acme::Error::Other(
                    "the ACME directory did not answer in time".into(),
                )),
            }
        })
    }
}
