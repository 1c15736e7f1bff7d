//! Upstream server groups (`[[upstreams]]`, configured in `config::upstream`): balancing,
//! passive and active health, and the connections to their servers (plain or TLS). The proxy's retry loop
//! (`proxy::retry`) uses them; a route with a plain `http://` URL never touches this module.

pub mod balance;
pub mod checker;
pub mod connect;
pub mod group;
pub mod health;
pub mod pool;
pub mod tls;

pub use self::connect::{ConnectError, GroupClient};
pub use self::group::{write_metrics, Attempt, Carried, Group, InFlight, Pick, Tried};
pub use crate::config::upstream::{Balance, UpstreamConfig};
