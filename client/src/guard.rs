//! The held lock: tokens, validity, extend, release (also on drop), and the watchdog.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{drift, Acquire, LockError, Mode, Outcome, Servers};

/// Why a watchdog gave up a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLock {
    pub key: String,
    /// What each instance answered to the last extend.
    pub causes: Vec<(String, Outcome)>,
}

type LostCallback = Arc<dyn Fn(&LostLock) + Send + Sync>;

/// Keeps a lease alive: extends it every `fraction` of its ttl (default 1/3) until the guard
/// drops, and reports the lock as lost (callback, channel, and [`LockGuard::is_lost`]) when a
/// majority answers that the owner no longer holds it, or when its validity runs out without a
/// successful extend.
#[derive(Clone)]
pub struct Watchdog {
    fraction: f64,
    on_lost: Option<LostCallback>,
    notify: Option<Sender<LostLock>>,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::new()
    }
}

impl Watchdog {
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

struct State {
    servers: Arc<Servers>,
    key: String,
    owner: String,
    mode: Mode,
    ttl: Duration,
    /// (instance index, token) for every instance that granted.
    tokens: Vec<(usize, u64)>,
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
    released: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl State {
    /// Extends on every instance; Ok with the new deadline when a majority still holds it.
    fn extend(&self) -> Result<Instant, (bool, Vec<(String, Outcome)>)> {
        let started = Instant::now();
        let outcomes = self.servers.extend(&self.key, &self.owner, self.ttl);
        let elapsed = started.elapsed();
        let ok = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Granted(_)))
            .count();
        let refused = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Refused(_)))
            .count();
        let n = outcomes.len();
        if ok >= self.servers.quorum {
            if let Some(v) = self.ttl.checked_sub(elapsed + drift(self.ttl)) {
                let deadline = started + elapsed + v;
                *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = deadline;
                return Ok(deadline);
            }
        }
        // Definitely lost when too many instances say the owner holds nothing there.
        let definite = n - refused < self.servers.quorum;
        Err((definite, self.servers.named(outcomes)))
    }

    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_lost(&self, lost: LostLock, watchdog: &Watchdog) {
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(f) = &watchdog.on_lost {
            f(&lost);
        }
        if let Some(tx) = &watchdog.notify {
            let _ = tx.send(lost);
        }
    }

    fn release(&self) -> Vec<Outcome> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        self.servers.release(&self.key, &self.owner)
    }
}

/// A held lock. Dropping it stops its watchdog and releases it (best effort; a lease that
/// cannot be released ends at its ttl).
pub struct LockGuard {
    state: Arc<State>,
    watchdog: Option<JoinHandle<()>>,
}

impl LockGuard {
    pub(crate) fn new(
        servers: Arc<Servers>,
        key: &str,
        owner: String,
        request: Acquire,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
    ) -> Self {
        let state = Arc::new(State {
            servers,
            key: key.to_string(),
            owner,
            mode: request.mode,
            ttl: request.ttl,
            tokens,
            valid_until: Mutex::new(valid_until),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let watchdog = request.watchdog.map(|w| {
            let state = Arc::clone(&state);
            std::thread::spawn(move || run_watchdog(&state, &w))
        });
        LockGuard { state, watchdog }
    }

    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The random owner token this guard holds the lock under.
    pub fn owner(&self) -> &str {
        &self.state.owner
    }

    pub fn mode(&self) -> Mode {
        self.state.mode
    }

    /// The fencing token, for a lock on one server. A quorum lock has one token per granting
    /// server and they are not comparable across servers, so this is `None` there: see
    /// [`LockGuard::tokens`].
    pub fn fencing_token(&self) -> Option<u64> {
        match (&self.state.tokens[..], self.state.servers.instances.len()) {
            ([(_, t)], 1) => Some(*t),
            _ => None,
        }
    }

    /// (server, token) for every server that granted the lock. A protected resource that
    /// checks tokens must compare tokens from the same server.
    pub fn tokens(&self) -> Vec<(String, u64)> {
        self.state
            .tokens
            .iter()
            .filter_map(|(i, t)| {
                self.state
                    .servers
                    .instances
                    .get(*i)
                    .map(|s| (s.name().to_string(), *t))
            })
            .collect()
    }

    /// How much longer the lock is certainly held (zero once expired or lost).
    pub fn validity(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// True once the watchdog found the lock lost (or its validity ran out without an extend).
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::SeqCst)
    }

    /// Extends the lease to a full ttl from now (on a majority of servers).
    pub fn extend(&self) -> Result<Duration, LockError> {
        match self.state.extend() {
            Ok(deadline) => Ok(deadline.saturating_duration_since(Instant::now())),
            Err((true, causes)) => Err(LockError::Held { causes }),
            Err((false, causes)) => Err(LockError::Unreachable { causes }),
        }
    }

    /// Releases the lock everywhere. An error lists servers that could not be reached (their
    /// hold ends at its ttl).
    pub fn release(mut self) -> Result<(), LockError> {
        self.stop_watchdog();
        let outcomes = self.state.release();
        if outcomes
            .iter()
            .any(|o| matches!(o, Outcome::Unreachable(_)))
        {
            return Err(LockError::Unreachable {
                causes: self.state.servers.named(outcomes),
            });
        }
        Ok(())
    }

    fn stop_watchdog(&mut self) {
        if let Some(handle) = self.watchdog.take() {
            *self.state.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.state.wake.notify_all();
            let _ = handle.join();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        self.state.release();
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.state.key)
            .field("mode", &self.state.mode)
            .field("tokens", &self.state.tokens)
            .field("validity", &self.validity())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// The watchdog thread: sleeps `fraction * ttl` (or until stopped), extends, repeats.
fn run_watchdog(state: &State, watchdog: &Watchdog) {
    let period = state
        .ttl
        .mul_f64(watchdog.fraction)
        .max(Duration::from_millis(1));
    let mut next = Instant::now() + period;
    loop {
        {
            let mut stopped = state.stop.lock().unwrap_or_else(|e| e.into_inner());
            while !*stopped {
                let now = Instant::now();
                if now >= next {
                    break;
                }
                stopped = match state.wake.wait_timeout(stopped, next - now) {
                    Ok((guard, _)) => guard,
                    Err(e) => e.into_inner().0,
                };
            }
            if *stopped {
                return;
            }
        }
        match state.extend() {
            Ok(_) => next = Instant::now() + period,
            Err((definite, causes)) => {
                if definite || Instant::now() >= state.valid_until() {
                    state.mark_lost(
                        LostLock {
                            key: state.key.clone(),
                            causes,
                        },
                        watchdog,
                    );
                    return;
                }
                // Not conclusive (servers unreachable) and still valid: try again sooner.
                next = Instant::now() + period / 4;
            }
        }
    }
}
