//! The async face's loss watcher (see [`crate::proto::watch`] for the decisions): the client's
//! shared connection speaks RESP3 with broadcast tracking and `NOLOOP`, its pushes arrive on a
//! channel read by one task per client, and each invalidation of a watched key is followed by a
//! `LOCK.INFO` over the same connection whose answer the key's guards judge.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use redis::{Cmd, PushInfo, PushKind};
use tokio::sync::mpsc::UnboundedReceiver;

use super::conn::{Inner, Target};
use super::guard::GuardState;
use crate::proto::reply::info_cmd;
use crate::proto::watch::{
    invalidated_keys, register_cmds, reread_info, tracking_on, Register, Watched,
};

/// The watcher of one client: which guards watch which key.
#[derive(Default)]
pub(crate) struct Watcher {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    watched: Watched<GuardState>,
    /// Tracking is not available on this server (refused, for example by an ACL): the
    /// watcher stays off and losses are found by extends and validity alone.
    off: bool,
    /// Registrations to send ahead of the next command on the shared connection.
    pending: Vec<Cmd>,
    /// After them, re-read every watched key (a rebuild: changes in between were not pushed).
    reread_all: bool,
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

    fn queue_tracking(&self, cmds: Vec<Cmd>, reread_all: bool) {
        let mut state = self.watcher.state();
        state.pending.extend(cmds);
        state.reread_all |= reread_all;
    }

    /// Queues `register` and sends it soon (ahead of the next command, or on its own).
    fn send_register(self: &Arc<Self>, register: &Register) {
        let cmds = register_cmds(register);
        if cmds.is_empty() {
            return;
        }
        self.queue_tracking(cmds, false);
        self.flush_tracking();
    }

    /// Sends the queued registrations on their own (from a task).
    fn flush_tracking(self: &Arc<Self>) {
        if self.watcher.state().pending.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let me = Arc::clone(self);
            rt.spawn(async move {
                let _ = me.short(&redis::cmd("PING")).await;
            });
        }
    }

    /// The registrations to send ahead of the next command, if any.
    pub(crate) fn take_tracking(&self) -> Option<(Vec<Cmd>, bool)> {
        let mut state = self.watcher.state();
        if state.pending.is_empty() {
            return None;
        }
        let reread_all = std::mem::take(&mut state.reread_all);
        Some((std::mem::take(&mut state.pending), reread_all))
    }

    /// What the server answered to registrations sent ahead of a command.
    pub(crate) fn tracking_sent(self: &Arc<Self>, ok: bool, reread_all: bool) {
        if !ok {
            self.watcher_off();
            return;
        }
        if reread_all {
            let keys = self.watcher.state().watched.core.keys();
            for key in keys {
                self.spawn_reread(key);
            }
        }
    }

    /// The server refused tracking (or the connection failed while turning it on): losses are
    /// then found by extends and validity, as without a watcher.
    fn watcher_off(&self) {
        self.watcher.state().off = true;
    }

    /// A new guard of `key` on server `i` of its guard. A key not covered yet is registered
    /// and then re-read (the re-read goes out after the registration on the same connection,
    /// and covers the moment between the grant and it).
    pub(crate) fn watch(self: &Arc<Self>, key: &str, i: usize, guard: &Arc<GuardState>) {
        if !self.watches() {
            return;
        }
        let register = self.watcher.state().watched.watch(key, i, guard);
        if let Some(register) = register {
            self.queue_tracking(register_cmds(&register), false);
            self.spawn_reread(key.to_string());
        }
    }

    /// A guard of `key` is done (released or dropped).
    pub(crate) fn unwatch(self: &Arc<Self>, key: &str, guard: &GuardState) {
        if !self.watches() {
            return;
        }
        let register = self.watcher.state().watched.unwatch(key, guard);
        self.send_register(&register);
    }

    /// A (re)opened shared connection: registers every prefix again and re-reads every watched
    /// key (changes while it was down were not pushed). Returns whether tracking is on.
    pub(crate) async fn connected(self: &Arc<Self>, conn: &mut super::conn::Conn) {
        if !self.watches() {
            return;
        }
        let (set, keys) = {
            let mut state = self.watcher.state();
            // What was queued is in the set registered now.
            state.pending.clear();
            state.reread_all = false;
            (state.watched.core.connected(), state.watched.core.keys())
        };
        if !set.is_empty() && conn.query(&tracking_on(&set)).await.is_err() {
            self.watcher_off();
            return;
        }
        for key in keys {
            self.spawn_reread(key);
        }
    }

    fn spawn_reread(self: &Arc<Self>, key: String) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let me = Arc::clone(self);
            rt.spawn(async move { me.reread(&key).await });
        }
    }

    /// `LOCK.INFO key`, judged by the key's guards.
    async fn reread(self: &Arc<Self>, key: &str) {
        let number = self.watcher.state().watched.next_read();
        let reply = self.short(&info_cmd(key)).await;
        let info = reread_info(reply);
        let holders = info
            .as_ref()
            .map(|i| i.as_ref().map_or(0, |i| i.holders.len()));
        let guards = self.watcher.state().watched.judged_by(key, number, holders);
        let Some(info) = info else {
            return;
        };
        for (i, guard) in guards {
            guard.check_info(i, &info);
        }
    }
}

/// The task that reads the shared connection's pushes, for as long as the client lives.
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
            // The next request reopens the connection, which re-registers and re-reads.
            me.forget_shared();
            // While guards are held, reopen it now (which re-reads their keys), trying again
            // every half second while the server cannot be reached.
            let weak = Arc::downgrade(&me);
            tokio::spawn(async move {
                loop {
                    let Some(again) = weak.upgrade() else { return };
                    if again.watcher.state().watched.core.keys().is_empty() {
                        return;
                    }
                    if again.short(&redis::cmd("PING")).await.is_ok() {
                        return;
                    }
                    drop(again);
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            });
            continue;
        }
        let Some(keys) = invalidated_keys(push.kind == PushKind::Invalidate, &push.data) else {
            continue;
        };
        let now_keys = me
            .watcher
            .state()
            .watched
            .core
            .invalidated(keys, Instant::now());
        for key in now_keys {
            me.spawn_reread(key);
        }
    }
}
