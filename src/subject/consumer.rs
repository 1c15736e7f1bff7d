//! The consumer a request was found to be (by `crate::consumers`: its key, its client
//! certificate, or a verified token's claim), as its limits read it: a subject part
//! (`consumer`), shown by name, and the digest its plan's limits count by.

use crate::limiter::SubjectDigest;

/// One consumer.
#[derive(Debug, Clone)]
pub struct Consumer {
    /// Shown in logs, the access log and sent upstream as `X-Consumer`; never a metric label.
    pub name: Box<str>,
    /// Its plan: an index into the configuration's `[[plans]]`.
    pub plan: usize,
    /// What its plan limits count by: the consumer, not the key (a rotated key keeps the count).
    pub subject: SubjectDigest,
    /// Which compiled limits apply: `plan` without overrides, else the number of plans plus its
    /// [`Variant`](crate::consumers::Variant)'s index (an index into a route's `plan_limits`).
    pub limits: usize,
}

impl Consumer {
    /// A consumer a token names, on plan `plan`: counted like the consumers file's consumer of
    /// that name (the same subject).
    pub fn named(name: &str, plan: usize) -> Consumer {
        Consumer {
            name: name.into(),
            plan,
            subject: SubjectDigest::of(b'c', name.as_bytes()),
            // A token's consumer has its plan's limits (overrides are the consumers file's).
            limits: plan,
        }
    }
}
