//! The `storage` directory: `account.json` (the ACME account's key and URL, with the directory
//! it belongs to), `<name>.pem` (a certificate's private key and chain in one file, so a
//! reader never pairs a new key with an old chain) and `<name>.lock` while a gateway orders
//! that name. Files are written to a temporary name and renamed, so a gateway sharing the
//! directory reads the old file or the new one, never half of one; private files are 0600.
//!
//! The lock is a file created with `create_new` (atomic on local file systems and on NFSv3+):
//! the gateway that creates it orders, the others wait and then read what it stored. A lock
//! older than [`STALE_LOCK`] is taken to be left by a gateway that died and is removed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::AcmeError;

/// A lock file older than this was left by a gateway that died mid-order (an order takes
/// seconds; [`super::manager::ATTEMPT_TIMEOUT`] bounds it).
pub const STALE_LOCK: Duration = Duration::from_secs(600);

/// What `account.json` holds.
#[derive(Serialize, Deserialize)]
pub struct StoredAccount {
    /// The directory URL the account was created on: another directory needs another account.
    pub directory: String,
    pub credentials: instant_acme::AccountCredentials,
}

/// The `storage` directory.
pub struct Storage {
    dir: PathBuf,
}

fn io(path: &Path, error: std::io::Error) -> AcmeError {
    AcmeError::Storage {
        path: path.display().to_string(),
        error,
    }
}

impl Storage {
    /// Creates the directory when missing.
    pub fn open(dir: &Path) -> Result<Storage, AcmeError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        Ok(Storage {
            dir: dir.to_path_buf(),
        })
    }

    fn account_path(&self) -> PathBuf {
        self.dir.join("account.json")
    }

    /// The stored account for `directory`, if there is one that parses.
    pub fn account(&self, directory: &str) -> Option<instant_acme::AccountCredentials> {
        let text = std::fs::read_to_string(self.account_path()).ok()?;
        match serde_json::from_str::<StoredAccount>(&text) {
            Ok(a) if a.directory == directory => Some(a.credentials),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, path = %self.account_path().display(), "ACME account file unreadable; a new account will be created");
                None
            }
        }
    }

    pub fn save_account(&self, account: &StoredAccount) -> Result<(), AcmeError> {
        let path = self.account_path();
        let json =
            serde_json::to_vec_pretty(account).map_err(|e| io(&path, std::io::Error::other(e)))?;
        write_private(&path, &json)
    }

    /// Forgets the account (the directory no longer knows it).
    pub fn drop_account(&self) {
        let _ = std::fs::remove_file(self.account_path());
    }

    /// Where `name`'s key and chain are stored (`name` is a checked DNS name: no `/`).
    pub fn cert_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub fn save_cert(&self, name: &str, key_pem: &str, chain_pem: &str) -> Result<(), AcmeError> {
        let mut both = String::with_capacity(key_pem.len() + chain_pem.len() + 1);
        both.push_str(key_pem);
        if !key_pem.ends_with('\n') {
            both.push('\n');
        }
        both.push_str(chain_pem);
        write_private(&self.cert_path(name), both.as_bytes())
    }

    /// Takes `<what>.lock`: `None` while another gateway holds it.
    pub fn lock(&self, what: &str) -> Result<Option<Lock>, AcmeError> {
        let path = self.dir.join(format!("{what}.lock"));
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(Some(Lock { path }));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let age = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|m| SystemTime::now().duration_since(m).ok());
                    match age {
                        Some(age) if age > STALE_LOCK => {
                            tracing::warn!(path = %path.display(), age_s = age.as_secs(), "removing a stale ACME lock");
                            let _ = std::fs::remove_file(&path);
                        }
                        _ => return Ok(None),
                    }
                }
                Err(e) => return Err(io(&path, e)),
            }
        }
        Ok(None)
    }
}

/// A held lock file, removed on drop.
pub struct Lock {
    path: PathBuf,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename; mode 0600 on Unix.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AcmeError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let result = opts
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(path, e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_holder_at_a_time_and_a_stale_lock_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(&dir.path().join("acme")).unwrap();
        let held = s.lock("a.test").unwrap().expect("free");
        assert!(s.lock("a.test").unwrap().is_none(), "held by another");
        assert!(s.lock("b.test").unwrap().is_some(), "per name");
        drop(held);
        let held = s.lock("a.test").unwrap().expect("released on drop");
        std::mem::forget(held); // a gateway that died
        let f = std::fs::File::options()
            .write(true)
            .open(dir.path().join("acme/a.test.lock"))
            .unwrap();
        f.set_modified(SystemTime::now() - STALE_LOCK - Duration::from_secs(1))
            .unwrap();
        assert!(s.lock("a.test").unwrap().is_some(), "stale");
    }

    #[test]
    fn key_and_chain_are_one_private_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(dir.path()).unwrap();
        s.save_cert("a.test", "KEY", "CHAIN\n").unwrap();
        let p = s.cert_path("a.test");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "KEY\nCHAIN\n");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
