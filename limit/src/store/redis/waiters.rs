//! Where a queued request waits for its decisions: one slot per waiting request in a table owned
//! by the lane, so handing a reply back allocates nothing (no channel per request).
//!
//! Cancellation-safe: a request future dropped while it waits (its client went away) gives its
//! slot back through [`Wait`]'s `Drop` — at once when its job was not sent yet (the job is taken
//! out of the queue and charges nothing), or when its batch's reply arrives.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use super::script::JobLimits;
use crate::store::{StoreError, StoreErrorKind};
use crate::Decision;

/// What a job asks of Redis.
// `Decide` is the common case and holds its limits inline: boxing them would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Work {
    Decide(JobLimits),
    /// Evaluate only, charging nothing (sent as a call of its own).
    Peek(JobLimits),
    /// Post-response charges and releases (the script's force mode; batched with other settles
    /// only).
    Settle(JobLimits),
    Ping,
}

/// A queued request.
#[derive(Debug)]
pub struct Job {
    pub slot: u32,
    pub work: Work,
}

/// A job's result: its decisions (none for a PING).
pub type Answer = Result<Vec<Decision>, StoreError>;

#[derive(Debug)]
enum Slot {
    Free,
    Waiting(Option<Waker>),
    Done(Answer),
    /// Its request is gone; the slot is freed when the reply arrives.
    Abandoned,
}

/// The lane's state under its one lock: the queue and the slots.
#[derive(Debug, Default)]
pub struct Table {
    /// Jobs not sent yet, in arrival order.
    pub pending: VecDeque<Job>,
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Table {
    /// Queues `work`; returns its slot.
    pub fn push(&mut self, work: Work) -> u32 {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Slot::Waiting(None);
                s
            }
            None => {
                self.slots.push(Slot::Waiting(None));
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.pending.push_back(Job { slot, work });
        slot
    }

    /// Hands `answer` to the job in `slot` (waking its request), or frees an abandoned slot.
    pub fn deliver(&mut self, slot: u32, answer: Answer) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        match std::mem::replace(s, Slot::Done(answer)) {
            Slot::Waiting(w) => {
                if let Some(w) = w {
                    w.wake();
                }
            }
            Slot::Abandoned => self.release(slot),
            // Not waiting: a second answer for one job would be a bug; keep the first.
            other => *s = other,
        }
    }

    /// Fails every queued job with `e`.
    pub fn fail_pending(&mut self, e: &StoreError) {
        while let Some(job) = self.pending.pop_front() {
            self.deliver(job.slot, Err(e.clone()));
        }
    }

    fn release(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = Slot::Free;
            self.free.push(slot);
        }
    }
}

/// Waits for the answer in `slot`.
pub struct Wait<'a> {
    pub table: &'a Mutex<Table>,
    pub slot: Option<u32>,
}

impl Future for Wait<'_> {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let Some(slot) = self.slot else {
            return Poll::Ready(Err(StoreError::new(
                StoreErrorKind::Other,
                "polled after completion",
            )));
        };
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let i = slot as usize;
        match t.slots.get_mut(i) {
            Some(Slot::Waiting(w)) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *w = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Some(s @ Slot::Done(_)) => {
                let Slot::Done(answer) = std::mem::replace(s, Slot::Free) else {
                    unreachable!("matched Done above");
                };
                t.free.push(slot);
                drop(t);
                self.slot = None;
                Poll::Ready(answer)
            }
            _ => {
                drop(t);
                self.slot = None;
                Poll::Ready(Err(StoreError::new(
                    StoreErrorKind::Other,
                    "the store lost a request",
                )))
            }
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = t.pending.iter().position(|j| j.slot == slot) {
            // Not sent yet: it will never be, so it charges nothing.
            t.pending.remove(pos);
            t.release(slot);
            return;
        }
        match t.slots.get(slot as usize) {
            Some(Slot::Done(_)) => t.release(slot),
            Some(Slot::Waiting(_)) => t.slots[slot as usize] = Slot::Abandoned,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Mutex<Table> {
        Mutex::new(Table::default())
    }

    #[tokio::test]
    async fn an_answer_reaches_its_waiter_and_the_slot_is_reused() {
        let t = table();
        let slot = t.lock().unwrap().push(Work::Ping);
        let job = t.lock().unwrap().pending.pop_front().unwrap();
        t.lock().unwrap().deliver(job.slot, Ok(Vec::new()));
        let answer = Wait {
            table: &t,
            slot: Some(slot),
        }
        .await;
        assert!(answer.unwrap().is_empty());
        assert_eq!(t.lock().unwrap().push(Work::Ping), slot, "slot reused");
    }

    #[test]
    fn a_dropped_waiter_unqueues_an_unsent_job() {
        let t = table();
        let slot = t.lock().unwrap().push(Work::Ping);
        drop(Wait {
            table: &t,
            slot: Some(slot),
        });
        let g = t.lock().unwrap();
        assert!(g.pending.is_empty(), "the job was taken out of the queue");
        assert_eq!(g.free, vec![slot]);
    }

    #[test]
    fn a_dropped_waiter_of_a_sent_job_frees_the_slot_on_the_reply() {
        let t = table();
        let slot = t.lock().unwrap().push(Work::Ping);
        let _sent = t.lock().unwrap().pending.pop_front().unwrap();
        drop(Wait {
            table: &t,
            slot: Some(slot),
        });
        assert!(t.lock().unwrap().free.is_empty(), "still in flight");
        t.lock().unwrap().deliver(slot, Ok(Vec::new()));
        assert_eq!(t.lock().unwrap().free, vec![slot]);
    }
}
