//! The cap on connections for waiting acquires of one server (`max_wait_connections`): a
//! counting semaphore whose waiters are served in arrival order, each for at most its wait.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::LockError;

pub(crate) struct WaitSlots {
    limit: usize,
    state: Mutex<Slots>,
    freed: Condvar,
}

struct Slots {
    in_use: usize,
    /// Tickets of the callers waiting for a slot, in arrival order.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// One slot, given back on drop.
pub(crate) struct Slot<'a> {
    slots: &'a WaitSlots,
}

impl WaitSlots {
    pub(crate) fn new(limit: usize) -> Self {
        WaitSlots {
            limit: limit.max(1),
            state: Mutex::new(Slots {
                in_use: 0,
                queue: VecDeque::new(),
                next_ticket: 0,
            }),
            freed: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, Slots> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot, waiting (behind the callers that came first) at most `wait` for one:
    /// [`LockError::WaitLimit`] when none came free in time.
    pub(crate) fn take(&self, wait: Duration) -> Result<Slot<'_>, LockError> {
        let deadline = Instant::now().checked_add(wait);
        let mut state = self.state();
        let ticket = state.next_ticket;
        state.next_ticket = state.next_ticket.wrapping_add(1);
        state.queue.push_back(ticket);
        loop {
            if state.queue.front() == Some(&ticket) && state.in_use < self.limit {
                state.queue.pop_front();
                state.in_use += 1;
                // The next in line may fit too.
                self.freed.notify_all();
                return Ok(Slot { slots: self });
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                state.queue.retain(|t| *t != ticket);
                self.freed.notify_all();
                return Err(LockError::WaitLimit { limit: self.limit });
            }
            state = match self.freed.wait_timeout(state, left) {
                Ok((s, _)) => s,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.slots.state();
        state.in_use = state.in_use.saturating_sub(1);
        drop(state);
        self.slots.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_and_come_back() {
        let slots = WaitSlots::new(2);
        let a = slots.take(Duration::ZERO).unwrap();
        let _b = slots.take(Duration::ZERO).unwrap();
        assert!(matches!(
            slots.take(Duration::from_millis(20)),
            Err(LockError::WaitLimit { limit: 2 })
        ));
        drop(a);
        assert!(slots.take(Duration::ZERO).is_ok());
    }

    #[test]
    fn a_waiting_caller_gets_the_slot_freed_by_another_thread() {
        let slots = std::sync::Arc::new(WaitSlots::new(1));
        let held = std::sync::Arc::clone(&slots);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let slot = held.take(Duration::ZERO).unwrap();
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            drop(slot);
        });
        rx.recv().unwrap();
        assert!(slots.take(Duration::from_secs(10)).is_ok());
        t.join().unwrap();
    }
}
