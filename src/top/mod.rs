//! "Who is being throttled": per limit, a bounded heavy-hitters sketch of the subjects it denies
//! ([`DeniedTop`]), and the `tollgate top` terminal view of the admin API's `/-/top`.

mod sketch;
mod table;

pub use self::sketch::{Denied, DeniedTop, Who, BUCKETS, BUCKET_SECS, CAPACITY, WINDOW_SECS};
pub use self::table::{fetch, render, run, TopError};
