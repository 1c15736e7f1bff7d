//! One order for one name (RFC 8555 §7.4): publish the challenge answer (an HTTP-01 token, or
//! a TLS-ALPN-01 certificate, RFC 8737), tell the server it is ready, wait for the order, have
//! instant-acme make a fresh ECDSA P-256 key and CSR, and fetch the chain. The published answer
//! is withdrawn by its guard whatever happens (success, refusal, timeout, cancellation).

use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::sign::CertifiedKey;

use super::state::{AcmeState, Published};
use super::AcmeError;
use crate::config::AcmeChallenge;

/// What an order brings back, as PEM.
pub struct Issued {
    pub key_pem: String,
    pub chain_pem: String,
}

/// How long to poll the order's state: pebble answers within a second, Let's Encrypt within a
/// few.
fn polling() -> RetryPolicy {
    RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .backoff(1.5)
        .timeout(Duration::from_secs(60))
}

/// Orders a certificate for `name` on `account`.
pub async fn order(
    account: &Account,
    name: &str,
    challenge: AcmeChallenge,
    state: &Arc<AcmeState>,
) -> Result<Issued, AcmeError> {
    let ids = [Identifier::Dns(name.to_owned())];
    let mut order = account.new_order(&NewOrder::new(&ids)).await?;
    let mut published: Vec<Published> = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(a) = authorizations.next().await {
        let mut a = a?;
        match a.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            s => return Err(AcmeError::Order(format!("authorization is {s:?}"))),
        }
        let kind = match challenge {
            AcmeChallenge::Http01 => ChallengeType::Http01,
            AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        };
        let mut ch = a
            .challenge(kind.clone())
            .ok_or_else(|| AcmeError::Order(format!("offers no {kind:?} challenge")))?;
        let key_auth = ch.key_authorization();
        published.push(match challenge {
            AcmeChallenge::Http01 => state.publish_token(ch.token.clone(), key_auth.as_str()),
            AcmeChallenge::TlsAlpn01 => state.publish_alpn(
                name.to_owned(),
                alpn_certificate(name, key_auth.digest().as_ref())?,
            ),
        });
        ch.set_ready().await?;
    }
    let status = order.poll_ready(&polling()).await?;
    if status != OrderStatus::Ready {
        return Err(AcmeError::Order(format!("is {status:?}, not ready")));
    }
    let key_pem = order.finalize().await?;
    let chain_pem = order.poll_certificate(&polling()).await?;
    drop(published);
    Ok(Issued { key_pem, chain_pem })
}

/// The TLS-ALPN-01 certificate (RFC 8737 §3): self-signed for `name`, with the
/// `acmeIdentifier` extension holding the SHA-256 of the key authorization.
fn alpn_certificate(name: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, AcmeError> {
    let bad = |e: rcgen::Error| AcmeError::Certificate(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(bad)?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(bad)?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(bad)?;
    let der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| AcmeError::Certificate(e.to_owned()))?;
    let signer = crate::tls::crypto::provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| AcmeError::Certificate(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signer,
    )))
}
