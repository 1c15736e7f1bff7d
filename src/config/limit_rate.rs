//! `limit_rate` and `limit_rate_after` on a route or a plan (#38 §2): the pair validated into
//! a [`Pace`] (see [`crate::http::pacing`]). As in nginx, `limit_rate = 0` is "no limit"; here it is
//! also how a plan lifts a route's limit for its consumers (a plan's value, 0 included, wins
//! over the route's).

use std::num::NonZeroU64;

use super::values::ByteSize;
use super::{invalid, ConfigError};
use crate::http::pacing::Pace;

/// The pair at `at` (`routes[0]`, `plans[1]`): `None` when `limit_rate` is absent, `Some(None)`
/// when it is 0 (no limit), else the pace. `limit_rate_after` without `limit_rate` is an error
/// (it would limit nothing).
pub(super) fn validate_limit_rate(
    at: &str,
    rate: Option<ByteSize>,
    after: Option<ByteSize>,
) -> Result<Option<Option<Pace>>, ConfigError> {
    match (rate, after) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(invalid(
            format!("{at}.limit_rate_after"),
            "needs `limit_rate` (the speed past these bytes)",
        )),
        (Some(rate), after) => Ok(Some(NonZeroU64::new(rate.0).map(|rate| Pace {
            rate,
            after: after.map_or(0, |a| a.0),
        }))),
    }
}
