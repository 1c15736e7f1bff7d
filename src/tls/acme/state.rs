//! What the ACME task shares with the listeners. The certificates issued are read by the SNI
//! resolver on every handshake, so they sit behind an `ArcSwap` (a lookup takes no lock and
//! allocates nothing); the challenge answers are read only by the ACME server's validation
//! requests, so a plain mutex does. A published challenge is withdrawn by its guard's `Drop`,
//! so an order that fails or is cancelled leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use rustls::sign::CertifiedKey;

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Shared between the ordering task, the SNI resolver and the plain listener.
#[derive(Default)]
pub struct AcmeState {
    /// Name → the certificate obtained for it.
    issued: ArcSwap<HashMap<String, Arc<CertifiedKey>>>,
    /// HTTP-01: token → key authorization.
    tokens: Mutex<HashMap<String, Arc<str>>>,
    /// TLS-ALPN-01: name → the self-signed certificate carrying the key authorization's digest.
    alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for AcmeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcmeState")
            .field("issued", &self.issued.load().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AcmeState {
    /// The certificate obtained for `name` (lower case, no trailing dot), if any.
    pub fn issued(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.issued.load().get(name).cloned()
    }

    /// Serves `key` for `name` from the next handshake on.
    pub fn install(&self, name: &str, key: Arc<CertifiedKey>) {
        self.issued.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(name.to_owned(), key.clone());
            m
        });
    }

    /// The key authorization for an HTTP-01 `token`, while its order runs.
    pub fn http_token(&self, token: &str) -> Option<Arc<str>> {
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .cloned()
    }

    /// The TLS-ALPN-01 certificate for `name`, while its order runs.
    pub fn alpn_cert(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.alpn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Publishes an HTTP-01 answer until the guard is dropped.
    pub fn publish_token(self: &Arc<Self>, token: String, key_auth: &str) -> Published {
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), Arc::from(key_auth));
        Published {
            state: self.clone(),
            what: What::Token(token),
        }
    }

    /// Publishes a TLS-ALPN-01 certificate until the guard is dropped.
    pub fn publish_alpn(self: &Arc<Self>, name: String, key: Arc<CertifiedKey>) -> Published {
        self.alpn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.clone(), key);
        Published {
            state: self.clone(),
            what: What::Alpn(name),
        }
    }
}

enum What {
    Token(String),
    Alpn(String),
}

/// A published challenge answer, withdrawn on drop.
pub struct Published {
    state: Arc<AcmeState>,
    what: What,
}

impl Drop for Published {
    fn drop(&mut self) {
        match &self.what {
            What::Token(t) => {
                self.state
                    .tokens
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(t);
            }
            What::Alpn(n) => {
                self.state
                    .alpn
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_token_is_withdrawn_when_its_guard_drops() {
        let s = Arc::new(AcmeState::default());
        let g = s.publish_token("tok".into(), "tok.thumb");
        assert_eq!(s.http_token("tok").as_deref(), Some("tok.thumb"));
        assert!(s.http_token("other").is_none());
        drop(g);
        assert!(s.http_token("tok").is_none());
    }
}
