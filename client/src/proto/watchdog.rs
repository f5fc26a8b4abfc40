//! The watchdog's settings and the schedule of its extends (the faces run it: a thread per
//! guard in the sync client, a task in the async one).

use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use super::error::LostLock;

type LostCallback = Arc<dyn Fn(&LostLock) + Send + Sync>;

/// Keeps a lease alive: extends it every `fraction` of its ttl (default 1/3) until the guard
/// drops, and reports the lock as lost (callback and channel, once) as soon as the client
/// knows: its loss watcher found the hold gone on the server (within milliseconds, see
/// [loss](crate#loss)), an extend was refused, or the validity ran out without a confirmed
/// extend. Its extends go over the client's short-command connection, which never waits for a
/// blocking acquire of the same client. [`LockGuard::is_lost`](crate::LockGuard::is_lost) does
/// not wait for the watchdog: it turns true the moment validity runs out, even while the
/// watchdog's extend is still waiting for an answer. The callback runs on a thread of its own
/// (sync client) or a task (async client), never on the watcher's.
///
/// For a bound guard ([`Acquire::bind`](crate::Acquire::bind)) the extends go over the guard's
/// own connections, and between them the watchdog checks those connections every 100 ms
/// (without sending anything): it reports the loss as soon as fewer than a quorum of them are
/// open.
#[derive(Clone)]
pub struct Watchdog {
    pub(crate) fraction: f64,
    on_lost: Option<LostCallback>,
    notify: Option<Sender<LostLock>>,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::new()
    }
}

impl Watchdog {
    /// Reports a loss through the callback and the channel (the caller makes sure it is once).
    pub(crate) fn report(&self, lost: LostLock) {
        if let Some(f) = &self.on_lost {
            f(&lost);
        }
        if let Some(tx) = &self.notify {
            let _ = tx.send(lost);
        }
    }

    /// A watchdog extending every third of the ttl, reporting nowhere (see
    /// [`Watchdog::on_lost`], [`Watchdog::notify`]).
    pub fn new() -> Self {
        Watchdog {
            fraction: 1.0 / 3.0,
            on_lost: None,
            notify: None,
        }
    }

    /// Extend every `fraction` of the ttl (clamped to 0.05..=0.9).
    pub fn fraction(mut self, fraction: f64) -> Self {
        self.fraction = if fraction.is_finite() {
            fraction.clamp(0.05, 0.9)
        } else {
            1.0 / 3.0
        };
        self
    }

    /// Calls `f` (from the watchdog thread) when the lock is lost.
    pub fn on_lost(mut self, f: impl Fn(&LostLock) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(f));
        self
    }

    /// Sends a [`LostLock`] on `tx` when the lock is lost.
    pub fn notify(mut self, tx: Sender<LostLock>) -> Self {
        self.notify = Some(tx);
        self
    }
}

/// What a watchdog does after an extend: when to extend next.
pub(crate) fn next_extend_in(period: Duration, last_ok: bool) -> Duration {
    if last_ok {
        period
    } else {
        // Not conclusive (servers unreachable) and still valid: try again sooner.
        (period / 4).max(Duration::from_millis(1))
    }
}

/// How often a watchdog extends a lease of `ttl`.
pub(crate) fn extend_period(ttl: Duration, watchdog: &Watchdog) -> Duration {
    ttl.mul_f64(watchdog.fraction).max(Duration::from_millis(1))
}

/// The request with a default [`Watchdog`] when it has none (for the `using` helpers).
pub(crate) fn with_watchdog(request: super::request::Acquire) -> super::request::Acquire {
    if request.watchdog.is_none() {
        request.watchdog(Watchdog::new())
    } else {
        request
    }
}
