//! The held lock: tokens, validity, extend, release (also on drop), and the watchdog.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{drift, Acquire, LockError, Mode, Outcome, Servers};

/// Why a watchdog gave up a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLock {
    pub key: String,
    /// What each instance answered to the last failed extend (empty when the validity ran out
    /// before any extend failed).
    pub causes: Vec<(String, Outcome)>,
}

type LostCallback = Arc<dyn Fn(&LostLock) + Send + Sync>;

/// Keeps a lease alive: extends it every `fraction` of its ttl (default 1/3) until the guard
/// drops, and reports the lock as lost (callback and channel, once) when a majority answers that
/// the owner no longer holds it, or when its validity runs out without a confirmed extend.
/// Its extends use a connection of their own: a blocking acquire of the same client never
/// delays them. [`LockGuard::is_lost`] does not wait for the watchdog: it turns true the moment
/// validity runs out, even while the watchdog's extend is still waiting for an answer.
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
    lease: Mutex<Lease>,
    /// The watchdog reported the loss (it does so once).
    reported: AtomicBool,
    released: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// What is known about the lease. `valid_until` only moves forward, and only while it has not
/// passed yet, and `loss` is never cleared: so once the lease is lost it stays lost.
struct Lease {
    /// The latest moment at which the lock is certainly held.
    valid_until: Instant,
    /// Why the lock is known lost before its validity ran out (a majority no longer holds it
    /// for this owner), or that an extend was confirmed only after validity had run out.
    loss: Option<LockError>,
}

impl Lease {
    fn lost(&self, now: Instant) -> bool {
        self.loss.is_some() || now >= self.valid_until
    }
}

impl State {
    fn lease(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn valid_until(&self) -> Instant {
        self.lease().valid_until
    }

    fn is_lost(&self) -> bool {
        self.lease().lost(Instant::now())
    }

    /// Extends on every instance; Ok with the new deadline when a majority still holds it.
    /// Errors: `Held` (a majority says the owner holds nothing: lost), `Expired` (validity ran
    /// out before an extend was confirmed: lost), `Unreachable` (not conclusive, still valid).
    fn extend(&self) -> Result<Instant, LockError> {
        let started = Instant::now();
        {
            let lease = self.lease();
            if let Some(loss) = &lease.loss {
                return Err(loss.clone());
            }
            if started >= lease.valid_until {
                return Err(LockError::Expired { causes: Vec::new() });
            }
        }
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
        let causes = self.servers.named(outcomes);
        let mut lease = self.lease();
        if let Some(loss) = &lease.loss {
            return Err(loss.clone());
        }
        if ok >= self.servers.quorum {
            if Instant::now() >= lease.valid_until {
                // Confirmed too late: between the end of validity and this reply the lock may
                // have been free (or been taken by someone else). It stays lost.
                let loss = LockError::Expired { causes };
                lease.loss = Some(loss.clone());
                return Err(loss);
            }
            // Counted from when the extend was sent, not from its reply.
            if let Some(v) = self.ttl.checked_sub(elapsed + drift(self.ttl)) {
                lease.valid_until = lease.valid_until.max(started + elapsed + v);
                return Ok(lease.valid_until);
            }
        }
        // Definitely lost when too many instances say the owner holds nothing there.
        if n - refused < self.servers.quorum {
            let loss = LockError::Held { causes };
            lease.loss = Some(loss.clone());
            return Err(loss);
        }
        Err(LockError::Unreachable { causes })
    }

    /// Reports the loss through the watchdog's callback and channel, once, unless the guard is
    /// being released (then a NOTOWNER is our own release, not a loss).
    fn report_lost(&self, causes: Vec<(String, Outcome)>, watchdog: &Watchdog) {
        if *self.stop.lock().unwrap_or_else(|e| e.into_inner()) {
            return;
        }
        if self.reported.swap(true, Ordering::SeqCst) {
            return;
        }
        let lost = LostLock {
            key: self.key.clone(),
            causes,
        };
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

/// A held lock. Dropping it stops its watchdog and releases it (best effort, bounded by the
/// per-instance timeout; a lease that cannot be released ends at its ttl).
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
            lease: Mutex::new(Lease {
                valid_until,
                loss: None,
            }),
            reported: AtomicBool::new(false),
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
        let now = Instant::now();
        let lease = self.state.lease();
        if lease.lost(now) {
            return Duration::ZERO;
        }
        lease.valid_until.saturating_duration_since(now)
    }

    /// True once the lock may no longer be held: from the moment its validity runs out without
    /// a confirmed extend (checked against the clock on every call, so it does not depend on the
    /// watchdog thread having noticed, nor on a request in flight), or once a majority of servers
    /// said this owner no longer holds it. Once true, it stays true. Check it right before
    /// acting under the lock's protection.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Extends the lease to a full ttl from now (on a majority of servers). Fails with `Held`
    /// when a majority says this owner no longer holds the lock, `Expired` when the validity ran
    /// out before the extend was confirmed (the guard is then lost for good), and `Unreachable`
    /// when too few servers answered (the lease keeps its current validity).
    pub fn extend(&self) -> Result<Duration, LockError> {
        self.state
            .extend()
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// Releases the lock everywhere. An error lists servers that could not be reached (their
    /// hold ends at its ttl).
    pub fn release(mut self) -> Result<(), LockError> {
        let outcomes = self.finish();
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

    /// Stops the watchdog, releases, and waits for the watchdog thread to end.
    ///
    /// The release is sent at once, without waiting for the watchdog thread first: it may be in
    /// an extend, which runs on a connection of its own, so both proceed side by side (a
    /// NOTOWNER that the extend may get after our release is not reported: the stop flag is
    /// set before the release is sent). Neither waits for any other request of the client (no
    /// connection is shared with a request in flight, see the crate docs), and each is bounded
    /// by the per-instance timeout (plus one for connecting, when no idle connection is left).
    ///
    /// Why synchronous, bounded by the timeout, rather than handed to a background thread: on a
    /// healthy server the lock is free when `drop` / `release` returns, so the next holder (in
    /// this process or another) can take it at once, and a process that exits right after
    /// dropping its guards does not leave them held until their ttl (a background thread would
    /// be killed with the process). The cost is bounded: a dead server refuses the connection
    /// at once, and a paused one costs at most about two timeouts.
    fn finish(&mut self) -> Vec<Outcome> {
        *self.state.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.state.wake.notify_all();
        let outcomes = self.state.release();
        if let Some(handle) = self.watchdog.take() {
            let _ = handle.join();
        }
        outcomes
    }
}

impl Drop for LockGuard {
    /// Releases the lock (best effort; see [`LockGuard::release`] for the bounds): it never
    /// waits for another request of the same client, such as a blocking acquire in another
    /// thread.
    fn drop(&mut self) {
        self.finish();
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

/// The watchdog thread: sleeps `fraction * ttl` (or until stopped), extends, repeats. It also
/// wakes when the validity runs out, to report the loss then even if the last extend failed
/// inconclusively (servers unreachable).
fn run_watchdog(state: &State, watchdog: &Watchdog) {
    let period = state
        .ttl
        .mul_f64(watchdog.fraction)
        .max(Duration::from_millis(1));
    let mut next = Instant::now() + period;
    // What the servers answered to the last failed extend, for the report.
    let mut last_causes = Vec::new();
    loop {
        {
            let mut stopped = state.stop.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if *stopped {
                    return;
                }
                let now = Instant::now();
                let until = next.min(state.valid_until());
                if now >= until {
                    break;
                }
                stopped = match state.wake.wait_timeout(stopped, until - now) {
                    Ok((guard, _)) => guard,
                    Err(e) => e.into_inner().0,
                };
            }
        }
        if state.is_lost() {
            state.report_lost(last_causes, watchdog);
            return;
        }
        match state.extend() {
            Ok(_) => next = Instant::now() + period,
            // Not conclusive and still valid: try again sooner.
            Err(LockError::Unreachable { causes }) if !state.is_lost() => {
                last_causes = causes;
                next = Instant::now() + period / 4;
            }
            Err(e) => {
                let causes = match e {
                    LockError::Held { causes }
                    | LockError::Unreachable { causes }
                    | LockError::Refused { causes }
                    | LockError::Expired { causes } => causes,
                };
                let causes = if causes.is_empty() {
                    last_causes
                } else {
                    causes
                };
                state.report_lost(causes, watchdog);
                return;
            }
        }
    }
}
