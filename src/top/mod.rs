//! "Who is being throttled": the `tollgate top` terminal view of the admin API's `/-/top`, over
//! each limit's bounded heavy-hitters sketch of the subjects it denies ([`DeniedTop`], kept by
//! the limit itself: `limiter::denied_top`).

mod table;

pub use self::table::{fetch, render, run, TopError};
pub use crate::limiter::denied_top::{
    Denied, DeniedTop, Who, BUCKETS, BUCKET_SECS, CAPACITY, WINDOW_SECS,
};
