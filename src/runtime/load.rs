//! A configuration with every file it names loaded: the `[server.tls]` certificate and key,
//! the upstream groups' CA files, the access log's directory, and the consumers file. Exactly
//! what `tollgate check` checks, start-up uses and a reload must pass, in one place so that the
//! three can never disagree.
//!
//! `config` validates the file alone (it names no runtime type); this module, above it, hands
//! what it names to the parts that load them (`tls`, `upstream::tls`, `consumers`).

use std::path::Path;
use std::sync::Arc;

use crate::admin::tokens::AdminTokens;
use crate::config::{invalid, AccessTarget, Config, ConfigError};
use crate::consumers::{ConsumerTable, Plans};

/// A validated configuration with its files loaded.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// The consumers of `[consumers] file` (empty without `[consumers]`).
    pub consumers: Arc<ConsumerTable>,
    /// The admin tokens of `[admin] token_file` (`None` without one: the admin API is open).
    pub admin_tokens: Option<Arc<AdminTokens>>,
    /// The keys of `[jwt]` (its JWKS file or secret), when it has one.
    pub jwt: Option<Arc<crate::jwt::JwtKeys>>,
}

/// A configuration built in code, without its files: no consumers.
impl From<Config> for Loaded {
    fn from(config: Config) -> Loaded {
        // `[jwt]`'s keys are loaded all the same (a variable or a file); a failure leaves the
        // verifier without keys, so every token is refused rather than any accepted.
        let jwt = config
            .jwt
            .as_ref()
            .map(|j| crate::jwt::JwtKeys::load(j).ok().map(Arc::new));
        Loaded {
            config,
            consumers: Arc::default(),
            admin_tokens: None,
            jwt: jwt.flatten(),
        }
    }
}

/// Reads and validates the file at `path` and loads every file it names.
pub fn load_and_check(path: &Path) -> Result<Loaded, ConfigError> {
    let config = Config::load(path)?;
    check_files(&config)?;
    let consumers = Arc::new(load_consumers(&config)?);
    let admin_tokens = load_admin_tokens(&config)?.map(Arc::new);
    let jwt = load_jwt(&config)?;
    // `[rls]`'s domains (inline and its YAML files) must compile; the snapshot compiles them
    // again when it is built (after the metrics recorder is installed).
    if let Some(r) = &config.rls {
        crate::rls::Domains::load(r)?;
    }
    Ok(Loaded {
        config,
        consumers,
        admin_tokens,
        jwt,
    })
}

/// Loads the admin tokens `[admin] token_file` names.
fn load_admin_tokens(config: &Config) -> Result<Option<AdminTokens>, ConfigError> {
    let Some(path) = &config.admin.token_file else {
        return Ok(None);
    };
    AdminTokens::load(path)
        .map(Some)
        .map_err(|e| ConfigError::Parse {
            path: path.clone(),
            message: format!("`admin.token_file`: {e}"),
        })
}

/// Loads `[jwt]`'s keys: the JWKS file must parse (at start-up and on every reload: a broken one
/// keeps the running configuration), the secret's variable must be set.
fn load_jwt(config: &Config) -> Result<Option<Arc<crate::jwt::JwtKeys>>, ConfigError> {
    let Some(j) = &config.jwt else {
        return Ok(None);
    };
    let field = match &j.keys {
        crate::config::JwtKeySource::JwksFile(_) => "jwt.jwks_file",
        crate::config::JwtKeySource::SecretEnv(_) => "jwt.secret_env",
    };
    crate::jwt::JwtKeys::load(j)
        .map(|k| Some(Arc::new(k)))
        .map_err(|e| invalid(field, e))
}

/// Loads the consumers file `[consumers] file` names.
fn load_consumers(config: &Config) -> Result<ConsumerTable, ConfigError> {
    let Some(c) = &config.consumers else {
        return Ok(ConsumerTable::default());
    };
    ConsumerTable::load_for(&c.file, Plans::Configured(&config.plans)).map_err(|e| {
        ConfigError::Parse {
            path: c.file.clone(),
            message: e.to_string(),
        }
    })
}

/// Loads the files the configuration names, so a missing or unreadable file is a config error
/// now rather than a failed start-up later.
fn check_files(config: &Config) -> Result<(), ConfigError> {
    if let Some(t) = &config.server.tls {
        crate::tls::load(t, None).map_err(|e| {
            let (field, message) = e.field_and_message();
            invalid(field, message)
        })?;
        if let Some(ca) = t.acme.as_ref().and_then(|a| a.ca.as_deref()) {
            crate::tls::acme::client::Client::new(Some(ca))
                .map_err(|e| invalid("server.tls.acme.ca", e.to_string()))?;
        }
    }
    // The access log is opened by its writer thread, never here: opening a FIFO would block.
    // Its directory must exist, and the path must not be a directory.
    if let AccessTarget::File(p) = &config.log.access {
        if p.is_dir() {
            return Err(invalid(
                "log.access",
                format!("{} is a directory", p.display()),
            ));
        }
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return Err(invalid(
                "log.access",
                format!("the directory of {} does not exist", p.display()),
            ));
        }
    }
    for (i, u) in config.upstreams.iter().enumerate() {
        if u.is_https() {
            crate::upstream::tls::client_config(&u.tls, false)
                .map_err(|e| invalid(format!("upstreams[{i}].tls.ca"), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[consumers]
header = "X-Api-Key"
file = "consumers.toml"

[[plans]]
name = "free"
[[plans.limits]]
name = "per-minute"
algorithm = "gcra"
limit = 60
period = "1m"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://127.0.0.1:3000"
consumers = true
"#;

    #[test]
    fn a_consumers_file_is_loaded_and_its_errors_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("gateway.toml");
        std::fs::write(&cfg, CONFIG).unwrap();
        let e = load_and_check(&cfg).unwrap_err().to_string();
        assert!(e.contains("consumers.toml"), "{e}");
        let hash = crate::hex::encode(&crate::consumers::hash_key(b"k"));
        std::fs::write(
            dir.path().join("consumers.toml"),
            format!("[[consumer]]\nname = \"acme\"\nplan = \"free\"\nkey_sha256 = \"{hash}\"\n"),
        )
        .unwrap();
        let c = load_and_check(&cfg).unwrap();
        assert_eq!(c.consumers.len(), 1);
        std::fs::write(
            dir.path().join("consumers.toml"),
            format!("[[consumer]]\nname = \"acme\"\nplan = \"gold\"\nkey_sha256 = \"{hash}\"\n"),
        )
        .unwrap();
        let e = load_and_check(&cfg).unwrap_err().to_string();
        assert!(e.contains("consumers.toml") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn a_missing_access_log_directory_or_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("gateway.toml");
        let route = "[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:3000\"\n";
        std::fs::write(
            &cfg,
            format!("[log]\naccess = \"nope/access.log\"\n{route}"),
        )
        .unwrap();
        let e = load_and_check(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("log.access") && e.contains("does not exist"),
            "{e}"
        );
        std::fs::write(
            &cfg,
            format!("[server.tls]\ncert = \"no.pem\"\nkey = \"no.key\"\n{route}"),
        )
        .unwrap();
        let e = load_and_check(&cfg).unwrap_err().to_string();
        assert!(e.contains("server.tls"), "{e}");
    }
}
