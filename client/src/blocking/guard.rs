//! The sync face's guard: a [`Hold`] (the protocol's view of the lease), the guard's bound
//! connections if any, and its watchdog thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bound::{BoundLink, Links};
use super::servers::Servers;
use crate::proto::hold::Hold;
use crate::proto::lease::Verdict;
use crate::proto::reply::{extend_outcome, release_outcome};
use crate::proto::watchdog::{extend_period, next_extend_in};
use crate::{Acquire, LockError, LossCause, Mode, Outcome, Watchdog};

/// How often the watchdog of a bound guard checks its connections between extends (a probe
/// reads the socket without blocking: no request is sent).
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) struct State {
    servers: Arc<Servers>,
    pub(crate) hold: Hold,
    /// A bound guard's connections (see [`super::bound`]).
    links: Option<Links>,
    /// Where a loss is reported (once), if the request had a watchdog.
    watchdog: Option<Watchdog>,
    reported: AtomicBool,
    released: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl State {
    fn is_lost(&self) -> bool {
        self.check_links();
        self.hold.is_lost(Instant::now())
    }

    /// A bound guard: probes its connections, and records the loss once fewer than a quorum
    /// of them are open (the servers ended the hold there).
    fn check_links(&self) {
        let Some(links) = &self.links else {
            return;
        };
        if links.probe() < self.servers.quorum {
            self.lost(LossCause::ConnectionClosed, links.dead(&self.servers));
        }
    }

    /// A watcher's re-read of the key on server `i`: records and reports a loss it shows.
    pub(crate) fn check_info(&self, i: usize, info: &Option<crate::LockInfo>) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        // A bound hold whose connection closed: that is the cause (the server deleted the key
        // because of it).
        self.check_links();
        if self.hold.check_info(i, info).is_some() {
            self.report();
        }
    }

    /// Records a loss found outside a request of the guard (its connections, a watcher), and
    /// reports it once.
    pub(crate) fn lost(&self, cause: LossCause, causes: Vec<(String, Outcome)>) {
        if self.hold.lose(cause, causes) {
            self.report();
        }
    }

    /// Reports the recorded loss through the watchdog's callback and channel, once, unless the
    /// guard is being released; wakes the watchdog thread so it ends.
    pub(crate) fn report(&self) {
        self.wake.notify_all();
        if *self.stop.lock().unwrap_or_else(|e| e.into_inner()) {
            return;
        }
        let Some(lost) = self.hold.lease().loss(Instant::now()).cloned() else {
            return;
        };
        if self.reported.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(w) = &self.watchdog {
            // Not on the caller's thread, which may be the loss watcher's (a slow callback
            // must not hold up the replies of every other request on its link).
            let (watchdog, loss) = (w.clone(), lost.clone());
            let spawned = std::thread::Builder::new()
                .name("redis-lock-lost".into())
                .spawn(move || watchdog.report(loss));
            if spawned.is_err() {
                // No thread to be had: report here rather than not at all.
                w.report(lost);
            }
        }
    }

    /// `cmd` to every server of the hold (over its bound connections for a bound guard):
    /// each reply, and whether too few bound connections are left for a quorum. With `enough`
    /// (pooled connections only), the answer comes once that many servers replied.
    fn send(
        &self,
        cmd: &redis::Cmd,
        enough: Option<usize>,
    ) -> (Vec<Result<redis::Value, Outcome>>, bool) {
        match (&self.links, enough) {
            (Some(links), _) => {
                let replies = links.run(&self.servers, cmd);
                (replies, links.alive() < self.servers.quorum)
            }
            (None, Some(enough)) => (self.servers.run_until(cmd, enough), false),
            (None, None) => (self.servers.run(cmd, None), false),
        }
    }

    /// A verdict that needs a closer look reads `LOCK.INFO` on that server.
    fn settle<T>(&self, verdict: Verdict<T>, outcomes: &[Outcome]) -> Result<T, LockError> {
        let r = match verdict {
            Verdict::Done(r) => r,
            Verdict::Diagnose(i) => {
                let info = self
                    .servers
                    .own_info(i, &self.hold.key, &self.hold.owner)
                    .ok();
                self.hold.diagnosed(info, outcomes)
            }
        };
        if matches!(r, Err(LockError::Lost(_))) {
            self.report();
        }
        r
    }

    /// Extends on every server for `ttl` (see [`LockGuard::extend`]).
    fn extend(&self, ttl: Duration) -> Result<Duration, LockError> {
        let sent = Instant::now();
        self.hold.lease().before_extend(sent)?;
        let (replies, closed) = self.send(&self.hold.extend_cmd(ttl), None);
        let outcomes: Vec<Outcome> = replies.into_iter().map(extend_outcome).collect();
        let verdict = self
            .hold
            .lease()
            .extended(&outcomes, closed, sent, ttl, Instant::now());
        self.settle(verdict, &outcomes)
    }

    /// Releases the hold everywhere (over the bound connections, which then close: the
    /// release comes first, so no lock-delay starts).
    fn release(&self) -> Result<(), LockError> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.servers.unwatch(self);
        let (replies, closed) = self.send(&self.hold.release_cmd(), Some(self.servers.quorum));
        if let Some(links) = &self.links {
            links.close();
        }
        let outcomes: Vec<Outcome> = replies.into_iter().map(release_outcome).collect();
        let verdict = self
            .hold
            .lease()
            .released(&outcomes, closed, Instant::now());
        self.settle(verdict, &outcomes)
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
    pub(crate) state: Arc<State>,
    watchdog: Option<JoinHandle<()>>,
}

impl LockGuard {
    /// `links`: for a bound guard, the connection each server granted on (`None` where it did
    /// not grant).
    // The parts of a grant, each from a different step of the acquire.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        servers: Arc<Servers>,
        key: &str,
        owner: String,
        request: Acquire,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
        links: Option<Vec<Option<BoundLink>>>,
        since: &[u64],
    ) -> Self {
        let hold = Hold::new(key, owner, &request, tokens, servers.names(), valid_until);
        let state = Arc::new(State {
            servers,
            hold,
            links: links.map(Links::new),
            watchdog: request.watchdog.clone(),
            reported: AtomicBool::new(false),
            released: AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        state.servers.watch(&state, since);
        let watchdog = request.watchdog.map(|w| {
            let state = Arc::clone(&state);
            std::thread::spawn(move || run_watchdog(&state, &w))
        });
        LockGuard { state, watchdog }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.state.hold.key
    }

    /// The owner this guard holds the lock (or permit) under: a random token of its own, or
    /// the one given with [`Acquire::owner`].
    pub fn owner(&self) -> &str {
        &self.state.hold.owner
    }

    /// How many holds this guard's owner has of the key on the (first granting) server, read
    /// with `LOCK.INFO`: 1 for a guard of its own random owner, more when guards of one
    /// explicit owner ([`Acquire::owner`], [`crate::OwnerIdentity::Fixed`]) re-entered it; 0
    /// once the hold is gone.
    pub fn hold_count(&self) -> Result<u64, LockError> {
        let hold = &self.state.hold;
        Ok(self
            .state
            .servers
            .own_info(hold.first_server(), &hold.key, &hold.owner)?
            .map_or(0, |info| info.hold_count(&hold.owner)))
    }

    /// Write, read, or a permit of a semaphore (with its capacity).
    pub fn mode(&self) -> Mode {
        self.state.hold.mode
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
        self.state.hold.fencing_token()
    }

    /// (server, token) for every server that granted the lock. A protected resource that
    /// checks tokens must compare tokens from the same server.
    pub fn tokens(&self) -> Vec<(String, u64)> {
        self.state.hold.named_tokens()
    }

    /// How much longer the lock is certainly held (zero once expired or lost).
    pub fn validity(&self) -> Duration {
        self.state.check_links();
        self.state.hold.validity(Instant::now())
    }

    /// True once the lock may no longer be held: from the moment its validity runs out without
    /// a confirmed extend (checked against the clock on every call), once the client's loss
    /// watcher found the hold gone on the server (deleted, expired there, taken, overwritten:
    /// within milliseconds, see the [crate documentation](crate#loss)), or once an extend was
    /// refused. For a bound guard, also once fewer than a quorum of its connections are open:
    /// every call checks them, without blocking and without a round trip. Once true, it stays
    /// true. Check it right before acting under the lock's protection.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// The loss, once the lock is lost: how, and when it was noticed.
    pub fn loss(&self) -> Option<crate::LostLock> {
        self.state.check_links();
        self.state.hold.lease().loss(Instant::now()).cloned()
    }

    /// Extends the lease to a full ttl from now (on a majority of servers). Fails with
    /// [`LockError::Lost`] when the lock is lost (a majority says this owner no longer holds
    /// it, a bound guard's connections closed, or the validity ran out before the extend was
    /// confirmed: the guard is then lost for good), and `Unreachable` when too few servers
    /// answered (the lease keeps its current validity).
    pub fn extend(&self) -> Result<Duration, LockError> {
        self.state.extend(self.state.hold.ttl())
    }

    /// As [`LockGuard::extend`], with a new ttl: this extend and the watchdog's later ones ask
    /// for `ttl` (checked as an acquire's ttl is, before anything is sent).
    pub fn extend_for(&self, ttl: Duration) -> Result<Duration, LockError> {
        crate::proto::request::check_ttl(ttl)?;
        self.state.extend(ttl)
    }

    /// Releases the lock (or the permit) everywhere. Succeeds only if the lock was held until
    /// the release: a lock that was lost (deleted, taken, expired, its bound connection
    /// closed) fails with [`LockError::Lost`], which says how and when; a release too few
    /// servers answered fails with `Unreachable` (their hold ends at its ttl).
    pub fn release(mut self) -> Result<(), LockError> {
        self.finish()
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
    fn finish(&mut self) -> Result<(), LockError> {
        *self.state.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.state.wake.notify_all();
        let result = self.state.release();
        if let Some(handle) = self.watchdog.take() {
            let _ = handle.join();
        }
        if let Some(links) = &self.state.links {
            // A connection the watchdog was using came back closed; this is for certainty.
            links.close();
        }
        result
    }
}

impl Drop for LockGuard {
    /// Releases the lock (best effort; see [`LockGuard::release`] for the bounds): it never
    /// waits for another request of the same client, such as a blocking acquire in another
    /// thread.
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.state.hold.key)
            .field("mode", &self.state.hold.mode)
            .field("tokens", &self.state.hold.tokens)
            .field("bound", &self.is_bound())
            .field("validity", &self.validity())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// The watchdog thread: sleeps `fraction * ttl` (or until stopped, or until a loss wakes it),
/// extends, repeats. It also wakes when the validity runs out, to report the loss then even if
/// the last extend failed inconclusively (servers unreachable), and, for a bound guard, every
/// [`PROBE_INTERVAL`] to check its connections.
fn run_watchdog(state: &State, watchdog: &Watchdog) {
    let probe_every = state
        .links
        .as_ref()
        .map(|_| PROBE_INTERVAL.min(extend_period(state.hold.ttl(), watchdog)));
    let mut next = Instant::now() + extend_period(state.hold.ttl(), watchdog);
    let mut probe_at = probe_every.map(|p| Instant::now() + p);
    loop {
        {
            let mut stopped = state.stop.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if *stopped {
                    return;
                }
                let now = Instant::now();
                if state.hold.is_lost(now) {
                    break;
                }
                let mut until = next.min(state.hold.valid_until());
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
            state.report();
            return;
        }
        if let Some(p) = probe_every {
            probe_at = Some(Instant::now() + p);
        }
        if Instant::now() < next {
            continue; // only a probe of a bound guard's connections
        }
        let result = state.extend(state.hold.ttl());
        if state.hold.is_lost(Instant::now()) {
            state.report();
            return;
        }
        let period = extend_period(state.hold.ttl(), watchdog);
        next = Instant::now() + next_extend_in(period, result.is_ok());
    }
}
