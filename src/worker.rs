//! Which proxy worker the current thread is, for what is kept per worker outside the server
//! (the Redis store's connection and batcher). The server sets it on each worker thread.

use std::cell::Cell;

thread_local! {
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks the current thread as proxy worker `i`.
pub fn set_index(i: usize) {
    INDEX.with(|c| c.set(Some(i)));
}

/// The current thread's worker index; `None` off the workers (admin, reload, tests).
pub fn index() -> Option<usize> {
    INDEX.with(Cell::get)
}
