//! The running gateway: its life cycle ([`gateway`]), the configuration loaded with every file it
//! names ([`load`]), the hot-swappable snapshot every worker reads ([`state`]), reloads and the
//! watch that asks for them.

pub mod gateway;
pub mod load;
pub mod reload;
pub mod state;
#[cfg(feature = "test-clock")]
pub mod test_clock;
pub mod watch;
