//! Upstream server groups (`[[upstreams]]`, configured in `config::upstream`): balancing,
//! passive and active health, and the connections to their servers (plain or TLS). One planner runs a
//! request's attempts for every front ([`attempts`]); its failures are typed ([`Failure`]).

pub mod attempts;
pub mod balance;
pub mod checker;
pub mod connect;
pub mod failure;
pub mod group;
pub mod health;
pub mod pool;
pub mod tls;

pub use self::attempts::{
    may_send_again, AttemptOutcome, AttemptSpans, Failed, Plan, SendOnce, Stop, To,
};
pub use self::connect::{ConnectError, GroupClient, SentBody};
pub use self::failure::Failure;
pub use self::group::{write_metrics, Attempt, Carried, Group, InFlight, Pick, Tried};
pub use crate::config::upstream::{Balance, UpstreamConfig};
