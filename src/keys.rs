//! Opening a lock key and committing what an operation did to it.
//!
//! Every path that changes a lock (a command, the expiry timer, a waiter's timeout or
//! disconnect, the rescue of waiters after a delete) ends in [`LockKey::commit`], so the
//! follow-up work is the same everywhere: hand granted waiters their replies, count and notify,
//! delete the key when the lock is empty, otherwise set the key's Redis expiry to the last
//! holder's and arm the timer for the first.
//!
//! The one import cycle of the crate starts here, on purpose: a commit arms a timer
//! (`timers::arm`), and a timer that fires commits through this file again (`timers::fire`).

use redis_module::{Context, RedisError, RedisString};

use crate::errors::KEY_NOT_CREATED;
use crate::stats::Gauges;
use crate::sys::context;
use crate::sys::key::{KeyKind, RawKey};
use crate::value::{LockType, LockValue, LOCK_TYPE};
use crate::{bound, contention, errors, eviction, replication, stats, timers, waiters};
use redis_lock_core::{Event, Lock, Millis, Step};

/// The key's name: the command's own argument when there is one (no copy), else a new string.
enum Name<'a> {
    Arg(&'a RedisString),
    Owned(RedisString),
}

impl Name<'_> {
    fn get(&self) -> &RedisString {
        match self {
            Name::Arg(s) => s,
            Name::Owned(s) => s,
        }
    }
}

pub struct LockKey<'a> {
    ctx: &'a Context,
    name: Name<'a>,
    db: i32,
    raw: RawKey<LockType>,
    /// Propagate changes as LOCK.SYNC (off while applying a LOCK.SYNC itself: Redis forwards
    /// the master's stream to sub-replicas on its own).
    replicate: bool,
}

impl<'a> LockKey<'a> {
    /// Opens `name` for writing in the context's selected database.
    pub fn open(ctx: &'a Context, name: &[u8]) -> Self {
        Self::open_mode(ctx, Name::Owned(ctx.create_string(name)), true)
    }

    /// Opens `name` for reading only in the context's selected database.
    pub fn open_read(ctx: &'a Context, name: &[u8]) -> Self {
        Self::open_mode(ctx, Name::Owned(ctx.create_string(name)), false)
    }

    /// Opens the key a command names, for writing.
    pub fn open_arg(ctx: &'a Context, name: &'a RedisString) -> Self {
        Self::open_mode(ctx, Name::Arg(name), true)
    }

    /// Opens the key a command names, for reading only (LOCK.INFO, which also runs on
    /// replicas).
    pub fn open_arg_read(ctx: &'a Context, name: &'a RedisString) -> Self {
        Self::open_mode(ctx, Name::Arg(name), false)
    }

    fn open_mode(ctx: &'a Context, name: Name<'a>, write: bool) -> Self {
        let raw = RawKey::open(ctx, name.get(), &LOCK_TYPE, write);
        LockKey {
            ctx,
            db: context::selected_db(ctx),
            name,
            raw,
            replicate: true,
        }
    }

    pub fn kind(&self) -> KeyKind {
        self.raw.kind()
    }

    /// The lock stored in the key; `None` when the key does not exist; WRONGTYPE when it holds
    /// something else.
    /// The database the key was opened in.
    pub fn db(&self) -> i32 {
        self.db
    }

    pub fn existing(&mut self) -> Result<Option<&mut LockValue>, RedisError> {
        match self.raw.kind() {
            KeyKind::Empty => Ok(None),
            KeyKind::Value => Ok(self.raw.value()),
            KeyKind::Other => Err(RedisError::WrongType),
        }
    }

    /// The lock stored in the key, creating a free one if the key does not exist.
    pub fn existing_or_new(&mut self) -> Result<&mut LockValue, RedisError> {
        if self.raw.kind() == KeyKind::Empty
            && !self.raw.set_value(Box::new(LockValue::new(Lock::new())))
        {
            return Err(RedisError::Str(KEY_NOT_CREATED));
        }
        self.existing()?.ok_or(RedisError::Str(KEY_NOT_CREATED))
    }

    pub fn set_replicate(&mut self, replicate: bool) {
        self.replicate = replicate;
    }

    /// Runs `op` on the lock as it is, with no clock: for applying a master's effect (LOCK.SYNC),
    /// which must not expire or grant anything by this server's own decision.
    pub fn apply_exact(&mut self, op: impl FnOnce(&mut Lock)) {
        self.change(|lock, _| op(lock));
    }

    /// Runs `op` on the lock with a fresh [`Step`] (the current time and the module's fencing
    /// counter), then commits. Returns `op`'s result, or `None` if the key holds no lock.
    pub fn apply<R>(&mut self, op: impl FnOnce(&mut Lock, &mut Step<'_>) -> R) -> Option<R> {
        let now = context::now_ms();
        // With lock.refuse-when-evictable, no grant while the server can evict: a waiter
        // whose turn comes gets the error instead (the direct commands refuse before this).
        let refuse = eviction::grants_refused();
        self.change(|lock, events| {
            stats::with_fences(|fences| {
                let mut step = Step {
                    now,
                    fences,
                    events,
                    refuse,
                };
                op(lock, &mut step)
            })
        })
    }

    /// Runs `op` on the lock (it reports events into the list it is given), then commits.
    /// `None` if the key holds no lock.
    fn change<R>(&mut self, op: impl FnOnce(&mut Lock, &mut Vec<Event>) -> R) -> Option<R> {
        let mut events = Vec::new();
        let value = self.raw.value()?;
        let before = value.gauges();
        // A vacant or compact value is worked on as a lock on the stack and stored back
        // (memory per lock is a published figure, and this keeps the full form's allocation
        // off the common path); only a lock that no longer fits becomes the full form.
        let r = match value.unpack_small() {
            Some(mut lock) => {
                let r = op(&mut lock, &mut events);
                if value.store_small(&lock) {
                    self.commit(events, before, Some(&lock));
                } else {
                    value.store(lock);
                    self.commit(events, before, None);
                }
                r
            }
            None => {
                let r = op(value.lock_mut(), &mut events);
                self.commit(events, before, None);
                r
            }
        };
        Some(r)
    }

    /// Sends a keyspace notification of the module class for this key.
    pub fn notify(&self, event: &std::ffi::CStr) {
        context::notify_module_event(self.ctx, event, self.name.get());
    }

    /// Finishes an operation: serves granted waiters, counts and notifies what happened,
    /// propagates every changed holder, then deletes the key if the lock is empty or updates its
    /// expiry and timer. `before` is the lock's INFO figures before the change.
    ///
    /// `small` is the lock when it was worked on outside the value (which then already holds
    /// it, vacant or compact); `None` reads it from the value.
    fn commit(&mut self, events: Vec<Event>, before: Gauges, small: Option<&Lock>) {
        let mut changed: Vec<Box<[u8]>> = Vec::with_capacity(events.len());
        let mut delay_ended = false;
        let mut unbound: Vec<u64> = Vec::new();
        for event in events {
            match event {
                Event::Granted {
                    waiter,
                    token,
                    owner,
                    ..
                } => {
                    waiters::deliver_grant(waiter, token);
                    stats::count_grant();
                    self.notify(c"lock.acquire");
                    changed.push(owner);
                }
                // Its turn came while grants are refused: it gets the error and leaves.
                Event::Refused { waiter, reason } => {
                    waiters::refuse(waiter, errors::refusal_reason(reason));
                }
                Event::Expired { owner, .. } => {
                    stats::count_expirations(1);
                    self.notify(c"lock.expire");
                    changed.push(owner);
                }
                Event::Disconnected { owner, .. } => {
                    stats::count_disconnect();
                    self.notify(c"lock.disconnect");
                    changed.push(owner);
                }
                Event::DelayStarted { .. } => self.notify(c"lock.delay"),
                Event::DelayEnded => delay_ended = true,
                Event::BoundEnded { conn } => unbound.push(conn),
                Event::Updated { owner } => changed.push(owner),
                Event::HoldEnded { held_ms } => stats::count_hold_end(held_ms),
            }
        }
        let Some(value) = self.raw.value() else {
            return;
        };
        let lock: &Lock = match small {
            Some(lock) => lock,
            None => value.lock_mut(),
        };
        // A lock left empty is deleted below: one DEL tells replicas and the AOF, instead of a
        // LOCK.SYNC per owner that ended (the module-wide counter has not moved: ending holds
        // issues no token). Per key, this was about a tenth of ending a closed connection's
        // bound holds.
        let emptied = lock.is_empty();
        if self.replicate && !changed.is_empty() && !emptied {
            changed.sort();
            changed.dedup();
            // Removals first, so a replica never sees a writer beside the readers it replaces.
            changed.sort_by_key(|o| lock.holders().get(o).is_some());
            for owner in &changed {
                let holder = lock.holders().get(owner);
                let key = self.name.get().as_slice();
                replication::replicate_owner(self.ctx, key, owner, holder, lock);
                // Applying a master's LOCK.SYNC (replicate off) indexes nothing: a replica
                // never ends bound holds on its own.
                if let Some(conn) = holder.and_then(|h| h.options.bound_to()) {
                    bound::index(conn, self.db, key);
                }
            }
        }
        if !unbound.is_empty() {
            bound::forget_ended(&unbound, self.db, self.name.get().as_slice(), lock);
        }
        let after = Gauges::of(lock);
        // Only locks that have or had waiters (see `contention`): nothing for any other.
        if contention::is_waited(&before) || contention::is_waited(&after) {
            let key = self.name.get().as_slice();
            contention::update(self.db, key, lock, &before, &after);
        }
        stats::update_gauges(before, after);
        if emptied {
            // The owners that ended (above), or a lock-delay that ran out with nobody to serve:
            // replicas delete the key on the master's word, like any expired key.
            if self.replicate && (delay_ended || !changed.is_empty()) {
                context::replicate1(self.ctx, c"DEL", self.name.get().as_slice());
            }
            self.raw.delete();
            return;
        }
        let last: Option<Millis> = lock.last_expiry();
        timers::arm(self.ctx, self.db, self.name.get().as_slice(), value);
        // Back to the compact form when the lock is one plain holder again (after the timer
        // is settled: a value with a timer stays full).
        value.pack();
        if let Some(at) = last {
            self.raw.set_abs_expire(at);
        }
    }
}
