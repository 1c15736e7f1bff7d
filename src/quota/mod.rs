//! Quotas as an API business runs them: what a consumer has used and has left ([`usage`]),
//! and support's corrections, reset and grant ([`adjust`]).
//!
//! A consumer's limits are its plan's, as compiled on the routes it may call: a `scope =
//! "global"` limit is one count for the whole API (listed once, without a route), a `scope =
//! "route"` one is a count per route (listed per route). Routes' own limits count by address,
//! header or globally, not by consumer, and are not listed. Both the caller's usage route and
//! the admin API's `/-/usage` read through the store's evaluate path, charging nothing.
//!
//! A plan's limit with parts (`subject = ["json:model"]`, `["path"]`) counts one key per
//! consumer and combination, under a hash of the values: usage lists each key the gateway
//! counted (remembered per limit and consumer, `crate::limiter::seen_keys`), and support names
//! one by its part values (`model=m1`).

mod usage;

pub use self::usage::{
    find, keys_of, limits_of, nameable, names, rows, usage, usage_body, Key, Listed, Named,
};
