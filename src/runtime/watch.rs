//! `[server] watch_config = true`: a reload whenever the config file or a file it names (the
//! consumers file, the admin token file, the TLS certificate and key, upstream CA files, the
//! `[jwt]` JWKS file)
//! changes, as `POST /-/reload` would do it (through the one reload thread, so it is coalesced
//! with other reloads and validated the same way: a bad file is refused and logged, the previous
//! configuration keeps serving).
//!
//! Polled, not notified: every [`WATCH_INTERVAL`] each file is `stat`ed through its symlinks
//! and its identity (device, inode), size and modification time compared with the last look.
//! That sees every way a file is replaced — written in place, renamed over, or, as Kubernetes
//! updates a mounted ConfigMap, the `..data` symlink swapped to a new directory (the file's
//! path never changes, but the inode it resolves to does) — where inotify watches on the
//! path's old inode would go quiet after the first swap. A few `stat`s a second cost nothing.
//! A change is acted on after [`SETTLE`] more without change, so a file written in several
//! steps is read once, whole.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::runtime::reload::Reloader;
use crate::runtime::state::Shared;

/// How often the files are looked at.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a change must hold before the reload.
pub const SETTLE: Duration = Duration::from_millis(200);

/// What is compared of one file: `None` when it cannot be read (missing, mid-swap).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<(u64, u64, u64, i128)>);

fn stamp(path: &Path) -> Stamp {
    Stamp(std::fs::metadata(path).ok().map(|m| {
        let modified = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
        #[cfg(unix)]
        let (dev, ino) = {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        };
        #[cfg(not(unix))]
        let (dev, ino) = (0, 0);
        (dev, ino, m.len(), modified)
    }))
}

/// The files a reload reads: the config file and every file `config` names.
pub fn files_of(config_path: &Path, config: &Config) -> Vec<PathBuf> {
    let mut files = vec![config_path.to_path_buf()];
    if let Some(c) = &config.consumers {
        files.push(c.file.clone());
    }
    if let Some(t) = &config.admin.token_file {
        files.push(t.clone());
    }
    if let Some(t) = &config.server.tls {
        files.extend(t.files());
    }
    files.extend(config.upstreams.iter().filter_map(|u| u.tls.ca.clone()));
    // The JWKS: a key removed from it must stop verifying (issue #34 item 20).
    if let Some(crate::config::JwtKeySource::JwksFile(f)) = config.jwt.as_ref().map(|j| &j.keys) {
        files.push(f.clone());
    }
    files
}

fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    files.iter().map(|f| stamp(f)).collect()
}

/// Watches while the gateway runs (until `stop` changes). Looks only while the configuration
/// serving has `watch_config = true` (a reload may turn it on or off).
pub async fn run(
    shared: Arc<Shared>,
    reloader: Reloader,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(config_path) = shared.config_path.clone() else {
        return;
    };
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What the configuration serving was built from (taken at the first look).
    let mut seen: Option<(Vec<PathBuf>, Vec<Stamp>)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let snap = shared.snapshot.load_full();
        if !snap.config.server.watch_config {
            seen = None;
            continue;
        }
        let files = files_of(&config_path, &snap.config);
        drop(snap);
        let now = stamps(&files);
        let changed = match &seen {
            Some((f, s)) => *f != files || *s != now,
            None => false,
        };
        if !changed {
            seen = Some((files, now));
            continue;
        }
        // Let the writer finish: act once the files have held still for SETTLE.
        let mut settled = now;
        loop {
            tokio::time::sleep(SETTLE).await;
            let again = stamps(&files);
            if again == settled {
                break;
            }
            settled = again;
        }
        let which: Vec<String> = match &seen {
            Some((f, s)) if *f == files => files
                .iter()
                .zip(s.iter().zip(&settled))
                .filter(|(_, (a, b))| a != b)
                .map(|(p, _)| p.display().to_string())
                .collect(),
            _ => vec![config_path.display().to_string()],
        };
        tracing::info!(files = ?which, "watched configuration files changed; reloading");
        seen = Some((files, settled));
        // The reload thread logs and counts the outcome; a refused file is retried at its next
        // change.
        let _ = reloader.request().await;
        // The files the new configuration names (and their stamps) are taken at the next look.
        let snap = shared.snapshot.load_full();
        let files = files_of(&config_path, &snap.config);
        let now = stamps(&files);
        if seen.as_ref().is_some_and(|(f, _)| *f != files) {
            seen = Some((files, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #34 item 20: every file a reload reads is watched, the JWKS file among them.
    #[test]
    fn the_jwks_file_is_watched() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, r#"{"keys":[{"kty":"RSA","kid":"k1","alg":"RS256","use":"sig","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}"#).unwrap();
        let text = format!(
            "[jwt]\njwks_file = {:?}\nalgorithms = [\"RS256\"]\n\n[[routes]]\nname = \"a\"\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n",
            jwks.display().to_string()
        );
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, &text).unwrap();
        let config = Config::load(&path).unwrap();
        let files = files_of(&path, &config);
        assert!(files.contains(&jwks), "{files:?}");
    }
}
