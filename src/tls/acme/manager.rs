//! The task behind `[server.tls.acme]`: at start it serves what `storage` holds, then orders
//! what is missing or due, one name after another, in the background (the listeners serve from
//! the first moment with what they have). A certificate is due at two thirds of its life
//! ([`renew_at`]); a failed attempt is retried after [`backoff`] while the current certificate
//! keeps serving. Before ordering, a gateway takes the name's lock in `storage`; one that finds
//! it taken waits and then serves what the holder stored, so a fleet sharing `storage` orders
//! each certificate once. Every order is counted in `tollgate_acme_orders_total{result}` and
//! logged.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::{Account, NewAccount};
use tokio::sync::watch;

use super::client::Client;
use super::state::AcmeState;
use super::storage::{Storage, StoredAccount};
use super::{order, AcmeError};
use crate::config::{AcmeConfig, TlsCert};

/// One order, from the first request to the stored certificate.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(180);
/// How soon a gateway that found a name locked by another looks at `storage` again.
const LOCK_POLL: Duration = Duration::from_secs(2);
/// The longest sleep: `storage` is re-read at least this often (a fleet-mate's renewal).
const RECHECK: Duration = Duration::from_secs(600);
/// The first retry after a failure; doubled per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(6 * 3600);

/// The `result` labels of `tollgate_acme_orders_total`.
pub const RESULTS: [&str; 3] = ["issued", "renewed", "failed"];

/// When a certificate valid from `not_before` to `not_after` (Unix seconds) is renewed: at two
/// thirds of its life (Let's Encrypt's 90 days: 30 days before expiry).
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    let life = i128::from(not_after) - i128::from(not_before);
    let at = i128::from(not_before) + life.max(0) * 2 / 3;
    i64::try_from(at).unwrap_or(i64::MAX)
}

/// The wait after `failures` consecutive failures (`failures >= 1`).
pub fn backoff(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(20);
    FIRST_BACKOFF
        .checked_mul(1u32 << shift)
        .map_or(MAX_BACKOFF, |d| d.min(MAX_BACKOFF))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// One name's schedule.
struct Name {
    name: String,
    /// The `notAfter` of the certificate served (0: none yet).
    served_not_after: i64,
    /// The `(notBefore, notAfter)` of the served certificate.
    served: Option<(i64, i64)>,
    /// When to look at it next (Unix seconds).
    next: i64,
    failures: u32,
}

struct Manager {
    cfg: AcmeConfig,
    state: Arc<AcmeState>,
    storage: Storage,
    account: Option<Account>,
}

/// Runs until `stop` flips.
pub async fn run(cfg: AcmeConfig, state: Arc<AcmeState>, mut stop: watch::Receiver<bool>) {
    for result in RESULTS {
        metrics::counter!(crate::metrics::ACME_ORDERS, "result" => result).increment(0);
    }
    let storage = loop {
        match Storage::open(&cfg.storage) {
            Ok(s) => break s,
            Err(e) => {
                tracing::error!(error = %e, "ACME storage unusable; retrying in 60 s");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(60)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    };
    let mut names: Vec<Name> = cfg
        .names
        .iter()
        .map(|n| Name {
            name: n.clone(),
            served_not_after: 0,
            served: None,
            next: 0,
            failures: 0,
        })
        .collect();
    let mut m = Manager {
        cfg,
        state,
        storage,
        account: None,
    };
    for n in &mut names {
        m.pick_up(n);
    }
    loop {
        for n in &mut names {
            if n.next <= unix_now() {
                m.step(n).await;
            }
        }
        let now = unix_now();
        let soonest = names.iter().map(|n| n.next).min().unwrap_or(i64::MAX);
        let wait = u64::try_from(soonest.saturating_sub(now))
            .map_or(Duration::ZERO, Duration::from_secs)
            .min(RECHECK);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

impl Manager {
    /// Serves what `storage` holds for `n` when it is newer than what is served; schedules
    /// the renewal. Returns whether the stored certificate is still good (not due).
    fn pick_up(&self, n: &mut Name) -> bool {
        let path = self.storage.cert_path(&n.name);
        if !path.exists() {
            return false;
        }
        let c = TlsCert {
            cert: path.clone(),
            key: path,
            names: Some(vec![n.name.clone()]),
        };
        let loaded = match super::super::certs::load(&c, &crate::tls::crypto::provider()) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(name = %n.name, error = %e, "stored ACME certificate unusable; ordering a new one");
                return false;
            }
        };
        if loaded.not_after > n.served_not_after {
            self.state.install(&n.name, loaded.key);
            super::super::record_expiry_of(&n.name, loaded.not_after);
            if n.served_not_after == 0 {
                tracing::info!(name = %n.name, not_after = loaded.not_after, "ACME certificate loaded from storage");
            } else {
                tracing::info!(name = %n.name, not_after = loaded.not_after, "ACME certificate picked up from storage");
            }
            n.served_not_after = loaded.not_after;
            n.served = Some((loaded.not_before, loaded.not_after));
        }
        let due = renew_at(loaded.not_before, loaded.not_after);
        n.next = due;
        due > unix_now()
    }

    /// Looks at one name whose time has come.
    async fn step(&mut self, n: &mut Name) {
        if self.pick_up(n) {
            return;
        }
        let lock = match self.storage.lock(&n.name) {
            Ok(Some(l)) => l,
            Ok(None) => {
                tracing::debug!(name = %n.name, "another gateway is ordering this name; waiting for its certificate");
                n.next = unix_now().saturating_add(LOCK_POLL.as_secs().try_into().unwrap_or(2));
                return;
            }
            Err(e) => return self.failed(n, &e),
        };
        // The holder before us may have stored a fresh one just now.
        if self.pick_up(n) {
            return;
        }
        let renewal = n.served.is_some();
        tracing::info!(name = %n.name, renewal, "ordering an ACME certificate");
        let result = tokio::time::timeout(ATTEMPT_TIMEOUT, self.order(&n.name))
            .await
            .unwrap_or(Err(AcmeError::Timeout));
        match result {
            Ok(()) => {
                drop(lock);
                let result = if renewal { "renewed" } else { "issued" };
                metrics::counter!(crate::metrics::ACME_ORDERS, "result" => result).increment(1);
                n.failures = 0;
                if !self.pick_up(n) {
                    // A certificate due at once (a life of seconds): wait at least a backoff step.
                    n.next =
                        unix_now().saturating_add(FIRST_BACKOFF.as_secs().try_into().unwrap_or(30));
                }
                tracing::info!(name = %n.name, result, not_after = n.served_not_after, "ACME certificate installed");
            }
            Err(e) => {
                drop(lock);
                self.failed(n, &e);
            }
        }
    }

    fn failed(&mut self, n: &mut Name, e: &AcmeError) {
        metrics::counter!(crate::metrics::ACME_ORDERS, "result" => "failed").increment(1);
        n.failures = n.failures.saturating_add(1);
        let wait = backoff(n.failures);
        n.next = unix_now().saturating_add(wait.as_secs().try_into().unwrap_or(i64::MAX));
        // The account is looked up again next time (the directory may have forgotten it).
        self.account = None;
        if let AcmeError::Protocol(instant_acme::Error::Api(p)) = e {
            if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:accountDoesNotExist") {
                self.storage.drop_account();
            }
        }
        tracing::warn!(name = %n.name, error = %e, failures = n.failures, retry_in_s = wait.as_secs(),
            serving = n.served.is_some(), "ACME order failed; the current certificate keeps serving");
    }

    /// Orders `name` and stores the result.
    async fn order(&mut self, name: &str) -> Result<(), AcmeError> {
        let account = self.account().await?;
        let issued = order::order(&account, name, self.cfg.challenge, &self.state).await?;
        self.storage
            .save_cert(name, &issued.key_pem, &issued.chain_pem)
    }

    /// The account: cached, else from `storage`, else created (and stored).
    async fn account(&mut self) -> Result<Account, AcmeError> {
        if let Some(a) = &self.account {
            return Ok(a.clone());
        }
        let client = || Client::new(self.cfg.ca.as_deref()).map(Box::new);
        let account = match self.storage.account(&self.cfg.directory) {
            Some(creds) => {
                Account::builder_with_http(client()?)
                    .from_credentials(creds)
                    .await?
            }
            None => {
                let contact: Vec<&str> = self.cfg.contact.iter().map(String::as_str).collect();
                let (account, credentials) = Account::builder_with_http(client()?)
                    .create(
                        &NewAccount {
                            contact: &contact,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        self.cfg.directory.clone(),
                        None,
                    )
                    .await?;
                self.storage.save_account(&StoredAccount {
                    directory: self.cfg.directory.clone(),
                    credentials,
                })?;
                tracing::info!(account = account.id(), "ACME account created");
                account
            }
        };
        self.account = Some(account.clone());
        Ok(account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_at_two_thirds_of_life() {
        assert_eq!(renew_at(0, 90), 60);
        assert_eq!(renew_at(1_000, 1_000 + 90 * 86_400), 1_000 + 60 * 86_400);
        assert_eq!(
            renew_at(100, 50),
            100,
            "a backwards certificate is due at once"
        );
        let extreme = renew_at(i64::MIN, i64::MAX);
        assert!(extreme > i64::MIN && extreme < i64::MAX, "no overflow");
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(30));
        assert_eq!(backoff(2), Duration::from_secs(60));
        assert_eq!(backoff(3), Duration::from_secs(120));
        assert_eq!(backoff(30), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
