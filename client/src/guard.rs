//! The held lock or semaphore permit: tokens, validity, extend, release (also on drop), and the
//! watchdog.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bound::{BoundLink, Links};
use crate::{drift, extend_cmd, extend_outcome, release_cmd, release_one_cmd, release_outcome};
use crate::{Acquire, LockError, Mode, Outcome, Servers};

/// How often the watchdog of a bound guard checks its connections between extends (a probe
/// reads the socket without blocking: no request is sent).
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Why a watchdog gave up a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLock {
    /// The key of the lost lock.
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
///
/// For a bound guard ([`Acquire::bind`]) the extends go over the guard's own connections, and
/// between them the watchdog checks those connections every 100 ms (without sending anything):
/// it reports the loss as soon as fewer than a quorum of them are open.
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

struct State {
    servers: Arc<Servers>,
    key: String,
    owner: String,
    mode: Mode,
    ttl: Duration,
    /// Release all of the owner's holds (`ALL`): the owner is this guard's alone (random).
    /// Otherwise (an explicit owner, [`Acquire::owner`]) one hold.
    release_all: bool,
    /// (instance index, token) for every instance that granted.
    tokens: Vec<(usize, u64)>,
    /// A bound guard's connections (see [`crate::bound`]).
    links: Option<Links>,
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
        self.check_links();
        self.lease().lost(Instant::now())
    }

    /// A bound guard: probes its connections, and records the loss once fewer than a quorum
    /// of them are open (the servers ended the hold there).
    fn check_links(&self) {
        let Some(links) = &self.links else {
            return;
        };
        if self.lease().loss.is_some() {
            return;
        }
        if links.probe() < self.servers.quorum {
            let mut lease = self.lease();
            if lease.loss.is_none() {
                lease.loss = Some(LockError::Disconnected {
                    causes: links.dead(&self.servers),
                });
            }
        }
    }

    /// What the recorded loss names, if there is one.
    fn loss_causes(&self) -> Option<Vec<(String, Outcome)>> {
        self.lease().loss.as_ref().map(|l| l.causes().to_vec())
    }

    /// Extends on every instance; Ok with the new deadline when a majority still holds it.
    /// Errors: `Held` (a majority says the owner holds nothing: lost), `Disconnected` (a bound
    /// guard: fewer than a quorum of its connections are open, lost), `Expired` (validity ran
    /// out before an extend was confirmed: lost), `Unreachable` (not conclusive, still valid).
    /// A bound guard extends over its own connections (see [`Links::run`]).
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
        let outcomes = match &self.links {
            Some(links) => links
                .run(&self.servers, &extend_cmd(&self.key, &self.owner, self.ttl))
                .into_iter()
                .map(extend_outcome)
                .collect(),
            None => self.servers.extend(&self.key, &self.owner, self.ttl),
        };
        let elapsed = started.elapsed();
        let ok = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Granted(_)))
            .count();
        // Servers where the owner certainly holds nothing any more: it answered so, or (bound)
        // the hold's connection is gone.
        let gone = outcomes
            .iter()
            .enumerate()
            .filter(|(i, o)| o.is_refusal() || self.links.as_ref().is_some_and(|l| !l.is_alive(*i)))
            .count();
        let disconnected = self
            .links
            .as_ref()
            .is_some_and(|l| l.alive() < self.servers.quorum);
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
        if n - gone < self.servers.quorum {
            let loss = if disconnected {
                LockError::Disconnected { causes }
            } else {
                LockError::Held { causes }
            };
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
        watchdog.report(LostLock {
            key: self.key.clone(),
            causes,
        });
    }

    fn release(&self) -> Vec<Outcome> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        let Some(links) = &self.links else {
            return self
                .servers
                .release(&self.key, &self.owner, self.release_all);
        };
        // Released over each bound connection (or, while the watchdog uses it, over a pooled
        // one), then the connections close: the release comes first, so no lock-delay starts.
        let release = if self.release_all {
            release_cmd(&self.key, &self.owner)
        } else {
            release_one_cmd(&self.key, &self.owner)
        };
        let results = links.run(&self.servers, &release);
        let outcomes = results
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                // No answer on a connection that is still open: not confirmed. Everywhere
                // else the hold is gone (released, or ended with its connection).
                Err(Outcome::Unreachable(e)) if links.is_alive(i) => Outcome::Unreachable(e),
                Err(Outcome::Unreachable(_)) => Outcome::Granted(0),
                r => release_outcome(r),
            })
            .collect();
        links.close();
        outcomes
    }
}

/// A held lock, or one held semaphore permit ([`Acquire::permit`]). Dropping it stops its
/// watchdog and releases it (best effort, bounded by the per-instance timeout; a lease that
/// cannot be released ends at its ttl).
///
/// The guard holds under its own random owner token ([`LockGuard::owner`]), so its release
/// ends exactly its own hold (for a semaphore: its one permit); with an explicit owner
/// ([`Acquire::owner`]) it drops one hold of that owner.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    state: Arc<State>,
    watchdog: Option<JoinHandle<()>>,
}

impl LockGuard {
    /// `links`: for a bound guard, the connection each server granted on (`None` where it did
    /// not grant).
    pub(crate) fn new(
        servers: Arc<Servers>,
        key: &str,
        owner: String,
        request: Acquire,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
        links: Option<Vec<Option<BoundLink>>>,
    ) -> Self {
        let state = Arc::new(State {
            servers,
            key: key.to_string(),
            owner,
            mode: request.mode,
            ttl: request.ttl,
            release_all: request.release_all(),
            tokens,
            links: links.map(Links::new),
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

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The owner this guard holds the lock (or permit) under: a random token of its own, or
    /// the one given with [`Acquire::owner`].
    pub fn owner(&self) -> &str {
        &self.state.owner
    }

    /// How many holds this guard's owner has of the key on the (first granting) server, read
    /// with `LOCK.INFO`: 1 for a guard of its own random owner, more when guards of one
    /// explicit owner ([`Acquire::owner`], [`crate::OwnerIdentity::Fixed`]) re-entered it; 0
    /// once the hold is gone.
    pub fn hold_count(&self) -> Result<u64, LockError> {
        let i = self.state.tokens.first().map_or(0, |(i, _)| *i);
        Ok(self
            .state
            .servers
            .info(i, &self.state.key)?
            .map_or(0, |info| info.hold_count(&self.state.owner)))
    }

    /// Write, read, or a permit of a semaphore (with its capacity).
    pub fn mode(&self) -> Mode {
        self.state.mode
    }

    /// Whether the hold is bound to this guard's connections ([`Acquire::bind`]).
    pub fn is_bound(&self) -> bool {
        self.state.links.is_some()
    }

    /// The fencing token, for a lock (or permit) on one server. For a permit it is the token of
    /// the grant: every permit of a semaphore key gets a new, greater one, except one granted to
    /// an owner that already held permits of it (an explicit owner), which gets its token again.
    /// Up to `capacity` permits are held at once, so a permit's token orders the grants but
    /// does not single out one holder as a lock's does. A quorum lock has one token per granting
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
        self.state.check_links();
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
    /// said this owner no longer holds it. For a bound guard, also once fewer than a quorum of
    /// its connections are open: every call checks them, without blocking and without a round
    /// trip (see the [crate documentation](crate#bound-holds)). Once true, it stays true. Check
    /// it right before acting under the lock's protection.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Extends the lease to a full ttl from now (on a majority of servers). Fails with `Held`
    /// when a majority says this owner no longer holds the lock, `Disconnected` when a bound
    /// guard's connections to too many servers closed, `Expired` when the validity ran out
    /// before the extend was confirmed (the guard is then lost for good), and `Unreachable`
    /// when too few servers answered (the lease keeps its current validity).
    pub fn extend(&self) -> Result<Duration, LockError> {
        self.state
            .extend()
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// Releases the lock (or the permit) everywhere. An error lists servers that could not be
    /// reached (their hold ends at its ttl).
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
        if let Some(links) = &self.state.links {
            // A connection the watchdog was using came back closed; this is for certainty.
            links.close();
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
            .field("bound", &self.is_bound())
            .field("validity", &self.validity())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// The watchdog thread: sleeps `fraction * ttl` (or until stopped), extends, repeats. It also
/// wakes when the validity runs out, to report the loss then even if the last extend failed
/// inconclusively (servers unreachable), and, for a bound guard, every [`PROBE_INTERVAL`] to
/// check its connections.
fn run_watchdog(state: &State, watchdog: &Watchdog) {
    let period = state
        .ttl
        .mul_f64(watchdog.fraction)
        .max(Duration::from_millis(1));
    let probe_every = state.links.as_ref().map(|_| PROBE_INTERVAL.min(period));
    let mut next = Instant::now() + period;
    let mut probe_at = probe_every.map(|p| Instant::now() + p);
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
                let mut until = next.min(state.valid_until());
                if let Some(at) = probe_at {
                    until = until.min(at);
                }
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
            let causes = state
                .loss_causes()
                .filter(|c| !c.is_empty())
                .unwrap_or(last_causes);
            state.report_lost(causes, watchdog);
            return;
        }
        if let Some(p) = probe_every {
            probe_at = Some(Instant::now() + p);
        }
        if Instant::now() < next {
            continue; // only a probe of a bound guard's connections
        }
        match state.extend() {
            Ok(_) => next = Instant::now() + period,
            // Not conclusive and still valid: try again sooner.
            Err(LockError::Unreachable { causes }) if !state.is_lost() => {
                last_causes = causes;
                next = Instant::now() + period / 4;
            }
            Err(e) => {
                let causes = e.causes().to_vec();
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
