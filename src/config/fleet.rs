//! The keys of a limit that say where its count lives in a fleet of gateways: `store`
//! (`"shared"`, the `[store]`, or `"local"`, this gateway's own memory).

use serde::Deserialize;

/// `[[routes.limits]] store`: where the limit's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitStore {
    /// The `[store]` (shared by every gateway when it is Redis).
    #[default]
    Shared,
    /// This gateway's own memory, whatever `[store] backend` says: each gateway counts alone.
    Local,
}

impl LimitStore {
    /// The name in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitStore::Shared => "shared",
            LimitStore::Local => "local",
        }
    }
}

/// A limit's fleet settings, with defaults resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fleet {
    pub store: LimitStore,
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const ROUTE: &str = "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n";

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new(".")).map_err(|e| e.to_string())
    }

    #[test]
    fn store_local_on_route_and_plan_limits() {
        let text = format!(
            "{ROUTE}[[routes.limits]]\nname = \"burst\"\nalgorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\nsubject = \"ip\"\nstore = \"local\"\n\
             [[routes.limits]]\nname = \"quota\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"\n\
             [[plans]]\nname = \"gold\"\n[[plans.limits]]\nname = \"p\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\nstore = \"local\"\n"
        );
        let c = parse(&text).unwrap();
        let limits = &c.routes[0].limits;
        assert_eq!(limits[0].fleet.store, LimitStore::Local);
        assert_eq!(limits[1].fleet.store, LimitStore::Shared, "the default");
        assert_eq!(c.plans[0].limits[0].limit.fleet.store, LimitStore::Local);
    }

    #[test]
    fn an_unknown_store_names_the_value_and_line() {
        let e = parse(&format!(
            "{ROUTE}[[routes.limits]]\nname = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\nstore = \"nearby\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("nearby") && e.contains("line 11"), "{e}");
    }
}
