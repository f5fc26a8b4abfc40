//! The async face's loss watcher (see [`crate::proto::watch`] for the decisions): the client's
//! shared connection speaks RESP3 with broadcast tracking and `NOLOOP`, its pushes arrive on a
//! channel read by one task per connection, and each invalidation of a watched key is followed
//! by a `LOCK.INFO` over the same connection whose answer the key's guards judge.
//! Registrations are sent by one task per client, in the order they were decided (a
//! replacement of the set must not overtake an addition decided before it).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use redis::{Cmd, PushInfo, PushKind};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::conn::{is_io, Conn, Inner, Target};
use super::guard::GuardState;
use crate::proto::reply::info_cmd;
use crate::proto::watch::{
    invalidated_keys, register_cmds, reread_info, tracking_on, Register, Watched,
};

/// While guards are held and the shared connection is down, how often it is reopened.
const REOPEN_EVERY: Duration = Duration::from_millis(500);

/// The watcher of one client: which guards watch which key.
#[derive(Default)]
pub(crate) struct Watcher {
    state: Mutex<State>,
}

/// A registration to send, then the re-reads that follow it ([`Register::rereads`]).
struct Job {
    cmds: Vec<Cmd>,
    then_reread: Vec<String>,
}

#[derive(Default)]
struct State {
    watched: Watched<GuardState>,
    /// Tracking is not available on this server (refused, for example by an ACL): the
    /// watcher stays off and losses are found by extends and validity alone.
    off: bool,
    /// The registrar task's queue (started with the first job).
    jobs: Option<UnboundedSender<Job>>,
    /// A task is reopening the shared connection.
    reopening: bool,
    /// A timer task is waiting for the next due re-read.
    timer: bool,
}

impl Watcher {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn watches(&self) -> bool {
        matches!(self.target, Target::Single(_)) && !self.watcher.state().off
    }

    /// The watcher's push count, taken before a request that may grant.
    pub(crate) fn pushes(&self) -> u64 {
        self.watcher.state().watched.core.pushes()
    }

    /// Queues a registration (and the re-reads after it) for the registrar task, with the
    /// watcher state locked: a registration is queued under the same lock as it was decided,
    /// so the registrar sends them in the order they were decided.
    fn queue_locked(
        self: &Arc<Self>,
        state: &mut State,
        register: &Register,
        granted: Option<&str>,
    ) {
        let cmds = register_cmds(register);
        let then_reread = register.rereads(granted);
        if cmds.is_empty() && then_reread.is_empty() {
            return;
        }
        let sender = match &state.jobs {
            Some(tx) if !tx.is_closed() => tx.clone(),
            _ => {
                let (tx, rx) = unbounded_channel();
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(registrar(Arc::downgrade(self), rx));
                    }
                    Err(_) => return,
                }
                state.jobs = Some(tx.clone());
                tx
            }
        };
        let _ = sender.send(Job { cmds, then_reread });
    }

    /// The server refused tracking: losses are then found by extends and validity, as
    /// without a watcher.
    fn watcher_off(&self) {
        self.watcher.state().off = true;
    }

    /// A new guard of `key` on server `i` of its guard, granted to a request sent when the
    /// watcher's push count was `since`. A key not covered yet is registered and then
    /// re-read (the re-read also covers the moment between the grant and the registration,
    /// or a push of the key that came before the guard was watched).
    pub(crate) fn watch(
        self: &Arc<Self>,
        key: &str,
        i: usize,
        guard: &Arc<GuardState>,
        since: u64,
    ) {
        if !self.watches() {
            return;
        }
        let mut state = self.watcher.state();
        if let Some(register) = state.watched.watch(key, i, guard, &guard.hold.owner, since) {
            self.queue_locked(&mut state, &register, Some(key));
        }
    }

    /// A guard of `key` is done (released or dropped).
    pub(crate) fn unwatch(self: &Arc<Self>, key: &str, guard: &GuardState) {
        if !self.watches() {
            return;
        }
        let mut state = self.watcher.state();
        let register = state.watched.unwatch(key, guard);
        if register != Register::Nothing {
            self.queue_locked(&mut state, &register, None);
        }
    }

    /// A (re)opened shared connection: registers every prefix again and re-reads every watched
    /// key (changes while it was down were not pushed).
    pub(crate) async fn connected(self: &Arc<Self>, conn: &mut Conn) {
        if !self.watches() {
            return;
        }
        let (set, keys) = {
            let mut state = self.watcher.state();
            (state.watched.core.connected(), state.watched.core.keys())
        };
        if !set.is_empty() {
            match conn.query(&tracking_on(&set)).await {
                Ok(_) => {}
                Err(e) if !is_io(&e) => {
                    self.watcher_off();
                    return;
                }
                Err(_) => return,
            }
        }
        for key in keys {
            self.spawn_reread(key);
        }
    }

    /// The shared connection failed while guards may be held: forget it and reopen it (which
    /// re-registers and re-reads their keys), every [`REOPEN_EVERY`] until it is up.
    pub(crate) fn reopen_soon(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut state = self.watcher.state();
            if state.reopening || !state.watched.core.has_keys() {
                return;
            }
            state.reopening = true;
        }
        let weak = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                let Some(me) = weak.upgrade() else { return };
                *me.shared.lock().await = None;
                let done = !me.watcher.state().watched.core.has_keys()
                    || me.short(&redis::cmd("PING")).await.is_ok();
                if done {
                    me.watcher.state().reopening = false;
                    return;
                }
                drop(me);
                tokio::time::sleep(REOPEN_EVERY).await;
            }
        });
    }

    fn spawn_reread(self: &Arc<Self>, key: String) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let me = Arc::clone(self);
            rt.spawn(async move { me.reread(&key).await });
        }
    }

    /// `LOCK.INFO key OWNER owner` for each owner among the key's guards (a plain
    /// `LOCK.INFO key` on a server whose module predates `OWNER`), each judged by that
    /// owner's guards; then the keys whose re-read is due.
    async fn reread(self: &Arc<Self>, key: &str) {
        let (number, owners) = {
            let mut state = self.watcher.state();
            let owners = state.watched.owners(key);
            if owners.is_empty() {
                state.watched.core.read(key);
                return;
            }
            (state.watched.next_read(), owners)
        };
        let reads: Vec<Option<String>> = if self.info_form.plain_only() {
            vec![None]
        } else {
            owners.into_iter().map(Some).collect()
        };
        let mut unanswered = false;
        let mut listed = Some(0);
        for owner in reads {
            let reply = match &owner {
                Some(o) => self.short(&self.info_form.cmd(key, o)).await,
                None => self.short(&info_cmd(key)).await,
            };
            // An older module refuses `OWNER`: the key is due again, read in the plain form.
            if owner.is_some() && self.info_form.refused(&reply) {
                unanswered = true;
                listed = None;
                break;
            }
            unanswered |= matches!(reply, Err(crate::Outcome::Unreachable(_)));
            let info = reread_info(reply);
            listed = match (listed, &info) {
                (Some(n), Some(i)) => Some(n + i.as_ref().map_or(0, |i| i.holders.len())),
                _ => None,
            };
            let guards = self
                .watcher
                .state()
                .watched
                .judged(key, number, owner.as_deref());
            if let Some(info) = info {
                for (i, guard) in guards {
                    guard.check_info(i, &info);
                }
            }
        }
        self.watcher
            .state()
            .watched
            .core
            .read_with(key, listed, unanswered);
        // A key changed again while this read was out is due now, or after its spacing.
        let due = self.watcher.state().watched.core.due_now(Instant::now());
        for key in due {
            self.spawn_reread(key);
        }
        self.arm_timer();
    }

    /// Re-reads the keys whose spacing is over when it is, from a timer task (one at a time).
    fn arm_timer(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let at = {
            let mut state = self.watcher.state();
            let Some(at) = state.watched.core.next_due() else {
                return;
            };
            if state.timer {
                return;
            }
            state.timer = true;
            at
        };
        let weak = Arc::downgrade(self);
        rt.spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            let Some(me) = weak.upgrade() else { return };
            let due = {
                let mut state = me.watcher.state();
                state.timer = false;
                state.watched.core.due_now(Instant::now())
            };
            for key in due {
                me.spawn_reread(key);
            }
            me.arm_timer();
        });
    }
}

/// The registrar task of one client: sends each registration in order (one pipeline), then,
/// once it was answered, the re-reads that follow it.
async fn registrar(inner: Weak<Inner>, mut jobs: UnboundedReceiver<Job>) {
    while let Some(job) = jobs.recv().await {
        let Some(me) = inner.upgrade() else {
            return;
        };
        if !job.cmds.is_empty() {
            match me.pipeline(&job.cmds).await {
                Ok(()) => {}
                // The server refused tracking (an ACL, say): the watcher goes off.
                Err(true) => {
                    me.watcher_off();
                    continue;
                }
                // Not known to have reached the server: a new connection registers
                // everything again and re-reads every held key.
                Err(false) => me.reopen_soon(),
            }
        }
        for key in job.then_reread {
            me.spawn_reread(key);
        }
    }
}

/// The task that reads one shared connection's pushes, for as long as it lives.
pub(crate) async fn read_pushes(inner: Weak<Inner>, mut pushes: UnboundedReceiver<PushInfo>) {
    loop {
        let due = inner
            .upgrade()
            .and_then(|i| i.watcher.state().watched.core.next_due());
        let push = match due {
            Some(at) => {
                tokio::select! {
                    p = pushes.recv() => p,
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {
                        let Some(me) = inner.upgrade() else { return };
                        let keys = me.watcher.state().watched.core.due_now(Instant::now());
                        for key in keys {
                            me.spawn_reread(key);
                        }
                        continue;
                    }
                }
            }
            None => pushes.recv().await,
        };
        let Some(push) = push else {
            return;
        };
        let Some(me) = inner.upgrade() else {
            return;
        };
        if push.kind == PushKind::Disconnection {
            me.reopen_soon();
            continue;
        }
        let Some(keys) = invalidated_keys(push.kind == PushKind::Invalidate, &push.data) else {
            continue;
        };
        let now_keys = {
            let mut state = me.watcher.state();
            let now_keys = state.watched.core.invalidated(keys, Instant::now());
            if let Some(register) = state.watched.core.noisy() {
                me.queue_locked(&mut state, &register, None);
            }
            now_keys
        };
        for key in now_keys {
            me.spawn_reread(key);
        }
        me.arm_timer();
    }
}
