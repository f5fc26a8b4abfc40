//! The async face's guard: a [`Hold`] (the protocol's view of the lease), a bound hold's own
//! connection if any, the lost signal, the watchdog task, and the release on drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Value};
use tokio::sync::watch;

use super::client::AsyncLockClient;
use super::conn::{is_io, on_all, unreachable, Conn};
use crate::proto::hold::Hold;
use crate::proto::lease::Verdict;
use crate::proto::reply::{error_outcome, extend_outcome, release_outcome, WAIT_REPLY_MARGIN};
use crate::proto::watchdog::{extend_period, next_extend_in};
use crate::{Acquire, LockError, LossCause, LostLock, Mode, Outcome, Watchdog};

pub(crate) struct GuardState {
    /// The servers (one for an [`AsyncLockClient`], N for an [`super::AsyncRedlock`]).
    pub(crate) clients: Arc<[AsyncLockClient]>,
    pub(crate) hold: Hold,
    released: AtomicBool,
    /// Set to true, once, when the lock is known lost.
    lost: watch::Sender<bool>,
    /// A bound hold's connection (one server only); `None` inside once it closed.
    bound: Option<tokio::sync::Mutex<Option<Conn>>>,
    /// Where a loss is reported (once), if the request had a watchdog.
    watchdog: Option<Watchdog>,
    reported: AtomicBool,
}

impl GuardState {
    /// `cmd` on every server (shared connections; with `enough`, the answer comes once that
    /// many servers replied, the others finish in the background), or on a bound hold's own
    /// connection. The flag says the bound connection is closed (the server ended the hold
    /// with it).
    async fn send(&self, cmd: Cmd, enough: Option<usize>) -> (Vec<Result<Value, Outcome>>, bool) {
        let Some(bound) = &self.bound else {
            let n = self.clients.len();
            return (
                on_all(&self.clients, vec![Some(cmd); n], enough).await,
                false,
            );
        };
        let mut slot = bound.lock().await;
        let Some(conn) = slot.as_mut() else {
            let closed = Outcome::Unreachable("the bound connection is closed".into());
            return (vec![Err(closed)], true);
        };
        let limit = self
            .clients
            .first()
            .map_or(WAIT_REPLY_MARGIN, |c| c.inner.timeout + WAIT_REPLY_MARGIN);
        match tokio::time::timeout(limit, conn.query(&cmd)).await {
            Ok(Ok(v)) => (vec![Ok(v)], false),
            Ok(Err(e)) if !is_io(&e) => (vec![Err(error_outcome(&e))], false),
            Ok(Err(e)) => {
                *slot = None;
                (vec![Err(unreachable(&e))], true)
            }
            // A slow server is no reason to close the connection (that would end the hold).
            Err(_) => (
                vec![Err(Outcome::Unreachable(
                    crate::proto::reply::NO_REPLY.into(),
                ))],
                false,
            ),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        let lost = self.hold.is_lost(Instant::now());
        if lost {
            self.signal();
        }
        lost
    }

    /// Fires the lost signal and reports the loss through the watchdog, once.
    fn signal(&self) {
        self.lost.send_replace(true);
        if self.released.load(Ordering::SeqCst) || self.reported.swap(true, Ordering::SeqCst) {
            return;
        }
        let lost = self.hold.lease().loss(Instant::now()).cloned();
        if let (Some(w), Some(lost)) = (&self.watchdog, lost) {
            w.report(lost);
        }
    }

    /// A watcher's re-read of the key on server `i`: records and signals a loss it shows.
    pub(crate) fn check_info(self: &Arc<Self>, i: usize, info: &Option<crate::LockInfo>) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        let Some(cause) = self.hold.loss_in_info(i, info) else {
            return;
        };
        let causes = self.hold.info_causes(i, cause);
        if self.bound.is_none() {
            self.lost(cause, causes);
            return;
        }
        // A bound hold: if its connection is what closed, that is the cause to report (the
        // server deleted the key because of it).
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let closed = match &me.bound {
                Some(bound) => {
                    let (replies, closed) = me.send(redis::cmd("PING"), None).await;
                    drop(replies);
                    closed || bound.lock().await.is_none()
                }
                None => false,
            };
            if closed {
                me.lost(LossCause::ConnectionClosed, Vec::new());
            } else {
                me.lost(cause, causes);
            }
        });
    }

    /// Stops watching the key (the guard is done).
    fn unwatch(&self) {
        for client in self.clients.iter() {
            client.inner.unwatch(&self.hold.key, self);
        }
    }

    /// Records a loss found outside the guard's own requests (a watcher, a closed bound
    /// connection).
    pub(crate) fn lost(&self, cause: LossCause, causes: Vec<(String, Outcome)>) {
        if self.hold.lose(cause, causes) {
            self.signal();
        }
    }

    /// A verdict that needs a closer look reads `LOCK.INFO` on that server.
    async fn settle<T>(&self, verdict: Verdict<T>, outcomes: &[Outcome]) -> Result<T, LockError> {
        let r = match verdict {
            Verdict::Done(r) => r,
            Verdict::Diagnose(i) => {
                let info = match self.clients.get(i) {
                    Some(c) => c.own_info(&self.hold.key, &self.hold.owner).await.ok(),
                    None => None,
                };
                self.hold.diagnosed(info, outcomes)
            }
        };
        if matches!(r, Err(LockError::Lost(_))) {
            self.signal();
        }
        r
    }

    /// `LOCK.EXTEND` for `ttl` on every server (see [`AsyncLockGuard::extend`]).
    async fn extend(&self, ttl: Duration) -> Result<Duration, LockError> {
        let sent = Instant::now();
        self.hold.lease().before_extend(sent)?;
        let (replies, closed) = self.send(self.hold.extend_cmd(ttl), None).await;
        let outcomes: Vec<Outcome> = replies.into_iter().map(extend_outcome).collect();
        let verdict = self
            .hold
            .lease()
            .extended(&outcomes, closed, sent, ttl, Instant::now());
        self.settle(verdict, &outcomes).await
    }

    /// Releases the hold (once): over the bound connection, which then closes (the release
    /// first, so no lock-delay starts), or on every server, answered once a quorum released.
    pub(crate) async fn release(&self) -> Result<(), LockError> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.unwatch();
        let quorum = self.hold.quorum();
        let (replies, closed) = self.send(self.hold.release_cmd(), Some(quorum)).await;
        if let Some(bound) = &self.bound {
            let conn = bound.lock().await.take();
            drop(conn);
        }
        let outcomes: Vec<Outcome> = replies.into_iter().map(release_outcome).collect();
        let verdict = self
            .hold
            .lease()
            .released(&outcomes, closed, Instant::now());
        self.settle(verdict, &outcomes).await
    }

    /// The release when no runtime will run it (the guard dropped outside one, or the runtime
    /// shutting down): over blocking connections, each bounded by its client's timeout.
    fn release_blocking(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        self.unwatch();
        let cmd = self.hold.release_cmd();
        for (i, client) in self.clients.iter().enumerate() {
            if self.hold.tokens.iter().any(|(j, _)| *j == i) {
                client.inner.release_blocking(&cmd);
            }
        }
    }
}

/// Runs a release on the runtime; if the runtime drops the task before it finished (it is
/// shutting down: the end of `#[tokio::main]`, of a `#[tokio::test]`), the release is done
/// there and then over a blocking connection, so the hold does not outlive the process. For a
/// dropped guard (`unanswered_too`) the same is done when the release went out but got no
/// answer: during a shutdown the shared connection's driver may be gone before the release.
struct ReleaseOnDrop {
    state: Option<Arc<GuardState>>,
    unanswered_too: bool,
}

impl ReleaseOnDrop {
    async fn run(mut self) -> Result<(), LockError> {
        let released = match &self.state {
            Some(state) => state.release().await,
            None => Ok(()),
        };
        let unanswered = matches!(released, Err(LockError::Unreachable { .. }));
        if !(unanswered && self.unanswered_too) {
            self.state = None;
        }
        released
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            // Not finished: a release that was in flight may have reached the server; a
            // second one is harmless (the hold is the guard's own, or one hold is asked).
            state.released.store(false, Ordering::SeqCst);
            state.release_blocking();
        }
    }
}

/// A held lock or semaphore permit of an [`AsyncLockClient`] (or a lock of an
/// [`super::AsyncRedlock`]). Released by [`AsyncLockGuard::release`], or on drop: by a task
/// spawned on the runtime (the drop itself does not block), and if that runtime shuts down
/// before the task ran (the guard was alive at the end of `#[tokio::main]`), by a blocking
/// release during the shutdown, so the hold never outlives the process. A [`Watchdog`] of the
/// request runs as a task until then.
#[must_use = "dropping the guard releases the lock at once"]
pub struct AsyncLockGuard {
    pub(crate) state: Arc<GuardState>,
    watchdog: Option<tokio::task::JoinHandle<()>>,
    lost: watch::Receiver<bool>,
}

impl AsyncLockGuard {
    // The parts of a grant, each from a different step of the acquire.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        clients: Arc<[AsyncLockClient]>,
        key: &str,
        owner: String,
        request: Acquire,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
        bound: Option<Conn>,
        since: Vec<u64>,
    ) -> Self {
        let (tx, rx) = watch::channel(false);
        let names = clients.iter().map(|c| c.inner.name.clone()).collect();
        let state = Arc::new(GuardState {
            hold: Hold::new(key, owner, &request, tokens, names, valid_until),
            clients,
            released: AtomicBool::new(false),
            lost: tx,
            bound: bound.map(|c| tokio::sync::Mutex::new(Some(c))),
            watchdog: request.watchdog.clone(),
            reported: AtomicBool::new(false),
        });
        for (i, client) in state.clients.iter().enumerate() {
            if state.hold.tokens.iter().any(|(j, _)| *j == i) {
                let since = since.get(i).copied().unwrap_or(0);
                client.inner.watch(key, i, &state, since);
            }
        }
        let watchdog = match (tokio::runtime::Handle::try_current(), request.watchdog) {
            (Ok(rt), Some(w)) => Some(rt.spawn(run_watchdog(Arc::clone(&state), w))),
            _ => None,
        };
        AsyncLockGuard {
            state,
            watchdog,
            lost: rx,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.state.hold.key
    }

    /// The owner this guard holds under (random, or the request's or client's owner).
    pub fn owner(&self) -> &str {
        &self.state.hold.owner
    }

    /// Write, read, or a permit of a semaphore.
    pub fn mode(&self) -> Mode {
        self.state.hold.mode
    }

    /// Whether the hold is bound to this guard's own connection ([`Acquire::bind`]).
    pub fn is_bound(&self) -> bool {
        self.state.bound.is_some()
    }

    /// The grant's fencing token, for a lock (or permit) on one server; `None` for a Redlock,
    /// whose servers' tokens are not comparable (see [`AsyncLockGuard::tokens`]).
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.hold.fencing_token()
    }

    /// (server, token) for every server that granted the lock.
    pub fn tokens(&self) -> Vec<(String, u64)> {
        self.state.hold.named_tokens()
    }

    /// How much longer the lock is certainly held (zero once expired or lost).
    pub fn validity(&self) -> Duration {
        self.state.is_lost();
        self.state.hold.validity(Instant::now())
    }

    /// True once the lock may no longer be held: its validity ran out without a confirmed
    /// extend, the client's loss watcher found the hold gone on the server, or an extend was
    /// refused. Stays true.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// The loss, once the lock is lost: how, and when it was noticed.
    pub fn loss(&self) -> Option<LostLock> {
        self.state.hold.lease().loss(Instant::now()).cloned()
    }

    /// A signal that fires once the lock is lost (see [`LostSignal`]).
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            state: Arc::clone(&self.state),
            rx: self.lost.clone(),
        }
    }

    /// How many holds this guard's owner has of the key (`LOCK.INFO` on the first server that
    /// granted): 1 for a random owner, more when guards of one explicit owner re-entered it, 0
    /// once the hold is gone.
    pub async fn hold_count(&self) -> Result<u64, LockError> {
        let hold = &self.state.hold;
        let Some(client) = self.state.clients.get(hold.first_server()) else {
            return Ok(0);
        };
        Ok(client
            .own_info(&hold.key, &hold.owner)
            .await?
            .map_or(0, |info| info.hold_count(&hold.owner)))
    }

    /// Renews the lease for another ttl; returns the new validity. [`LockError::Lost`] (the
    /// guard is then lost for good) when the servers say the owner holds nothing, a bound
    /// connection closed, or validity ran out first; `Unreachable` is not conclusive.
    pub async fn extend(&self) -> Result<Duration, LockError> {
        self.state.extend(self.state.hold.ttl()).await
    }

    /// As [`AsyncLockGuard::extend`], with a new ttl: this extend and the watchdog's later ones
    /// ask for `ttl` (checked as an acquire's ttl is, before anything is sent).
    pub async fn extend_for(&self, ttl: Duration) -> Result<Duration, LockError> {
        crate::proto::request::check_ttl(ttl)?;
        self.state.extend(ttl).await
    }

    /// Stops the watchdog and releases the hold (one hold for an explicit owner). Succeeds only
    /// if the lock was held until the release: a lost lock fails with [`LockError::Lost`],
    /// which says how and when. For a quorum lock the answer comes once a majority released.
    pub async fn release(mut self) -> Result<(), LockError> {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        // If this future is dropped before the release is answered (a timeout, a `select!`),
        // the release is done then over a blocking connection: never left to the ttl.
        let release = ReleaseOnDrop {
            state: Some(Arc::clone(&self.state)),
            unanswered_too: false,
        };
        release.run().await
    }
}

impl Drop for AsyncLockGuard {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        if self.state.released.load(Ordering::SeqCst) {
            return;
        }
        let task = ReleaseOnDrop {
            state: Some(Arc::clone(&self.state)),
            unanswered_too: true,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = task.run().await;
                });
            }
            // No runtime here: the release is done now (dropping the task does it).
            Err(_) => drop(task),
        }
    }
}

impl std::fmt::Debug for AsyncLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLockGuard")
            .field("key", &self.state.hold.key)
            .field("owner", &self.state.hold.owner)
            .field("mode", &self.state.hold.mode)
            .field("tokens", &self.state.hold.tokens)
            .finish()
    }
}

/// Fires once the lock of a guard is lost: the loss watcher or an extend found the owner no
/// longer holds it (the key was deleted, the hold expired or was taken over, a bound connection
/// closed), or its validity ran out without a confirmed extend. Cheap to clone; every clone
/// sees the same signal.
#[derive(Clone)]
pub struct LostSignal {
    state: Arc<GuardState>,
    rx: watch::Receiver<bool>,
}

impl LostSignal {
    /// Whether the lock is lost now.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// The key of the lock.
    pub fn key(&self) -> &str {
        &self.state.hold.key
    }

    /// The fencing token of the grant (one server; `None` for a Redlock).
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.hold.fencing_token()
    }

    /// The loss, once the lock is lost.
    pub fn loss(&self) -> Option<LostLock> {
        self.state.hold.lease().loss(Instant::now()).cloned()
    }

    /// Completes once the lock is lost (at once if it already is). Never completes while the
    /// lock is held: `select!` on it next to the work.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        loop {
            if self.state.is_lost() {
                return;
            }
            let deadline = tokio::time::Instant::from_std(self.state.hold.valid_until());
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The guard is gone: nothing will extend the lease any more.
                        tokio::time::sleep_until(deadline).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// The watchdog task: extends every `fraction` of the ttl; after an inconclusive (unreachable)
/// extend, tries again sooner; wakes at the end of validity or at a loss, reports it (once)
/// and ends.
async fn run_watchdog(state: Arc<GuardState>, watchdog: Watchdog) {
    let mut rx = state.lost.subscribe();
    let mut next = extend_period(state.hold.ttl(), &watchdog);
    loop {
        let left = state
            .hold
            .valid_until()
            .saturating_duration_since(Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(next.min(left)) => {}
            _ = rx.changed() => {}
        }
        if state.released.load(Ordering::SeqCst) {
            return;
        }
        if state.is_lost() {
            return;
        }
        let result = state.extend(state.hold.ttl()).await;
        if state.released.load(Ordering::SeqCst) || state.is_lost() {
            return;
        }
        next = next_extend_in(extend_period(state.hold.ttl(), &watchdog), result.is_ok());
    }
}
