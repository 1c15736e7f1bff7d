//! Upstream server groups (`[[upstreams]]`): their configuration, balancing, passive and active
//! health, and the connections to their servers (plain or TLS). The proxy's retry loop
//! (`proxy::retry`) uses them; a route with a plain `http://` URL never touches this module.

pub mod balance;
pub mod checker;
pub mod config;
pub mod connect;
pub mod group;
pub mod health;
pub mod tls;

pub use self::config::{Balance, UpstreamConfig};
pub use self::connect::{ConnectError, GroupClient};
pub use self::group::{Attempt, Carried, Group, InFlight, Pick, Tried};
