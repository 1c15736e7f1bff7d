//! Which proxy worker is asking, handed down as a value (never found in a thread-local): the
//! stores keep per-worker parts (the Redis store's connection and batcher, the deny cache) and
//! pick them by it.

/// A proxy worker's identity, or none (admin, reload, tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerId(Option<usize>);

impl WorkerId {
    /// Off the workers.
    pub const NONE: WorkerId = WorkerId(None);

    /// Proxy worker `i`.
    pub fn new(i: usize) -> WorkerId {
        WorkerId(Some(i))
    }

    /// The worker's index, if it is one.
    pub fn index(self) -> Option<usize> {
        self.0
    }

    /// Which of `n` per-worker parts this one uses: one per worker (wrapping) and the last
    /// for everything off the workers.
    pub fn slot(self, n: usize) -> usize {
        match self.0 {
            Some(w) if n > 1 => w % (n - 1),
            _ => n.saturating_sub(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_share_all_but_the_last_slot() {
        assert_eq!(WorkerId::NONE.slot(3), 2);
        assert_eq!(WorkerId::new(0).slot(3), 0);
        assert_eq!(WorkerId::new(3).slot(3), 1);
        assert_eq!(WorkerId::new(5).slot(1), 0);
        assert_eq!(WorkerId::NONE.slot(0), 0);
    }
}
