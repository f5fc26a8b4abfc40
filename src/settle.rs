//! Serving waiters again after Redis moved or removed their key behind the module's back.
//!
//! DEL, UNLINK, expiry, overwrite, RENAME, MOVE, FLUSH*, SWAPDB and loading all change what a
//! key holds without going through a lock command. The data-type and event callbacks that see
//! this may not write to the keyspace themselves, so they only mark the key dirty here; the
//! dirty keys are settled from a zero-delay timer on the next turn of the event loop, and,
//! before that, by any lock command on the same key (so a newcomer never overtakes waiters
//! whose key was just deleted).
//!
//! Settling a key: waiters that the registry says are queued on it but that its value does not
//! list (the value was deleted or moved) rejoin in their arrival places, on a fresh lock if the
//! key is now empty; queue entries that belong elsewhere are dropped; if the key now holds
//! another type, its waiters get WRONGTYPE. Bound holds of connections that have closed end
//! (`bound`). Then the timer and expiry are brought up to date.

use std::time::Duration;

use redis_module::Context;

use crate::keys::LockKey;
use crate::state;
use crate::sys::context;
use crate::sys::key::KeyKind;
use crate::value::LockValue;
use crate::{bound, contention, errors, eviction, moving, stats, waiters};
use redis_lock_core::Lock;

/// Marks (`db`, `key`) for settling and makes sure a settle pass is scheduled.
pub fn mark_dirty(db: i32, key: &[u8]) {
    state::with_dirty(|d| d.insert((db, key.into())));
    schedule();
}

/// Schedules a settle pass on the next turn of the event loop (once).
pub fn schedule() {
    schedule_after(Duration::ZERO);
}

/// How often a settle pass looks again while clients are paused.
const PAUSE_RETRY: Duration = Duration::from_millis(10);

fn schedule_after(delay: Duration) {
    if state::replace_settle_scheduled(true) {
        return;
    }
    match context::detached_context() {
        Some(ctx) => {
            ctx.create_timer(delay, run_timer, ());
        }
        None => {
            state::replace_settle_scheduled(false);
        }
    }
}

/// A lock value is leaving its key. Its waiters are taken out (they wait on the key name, and
/// the registry remembers them); if every holder had expired, this is that expiry. If MIGRATE
/// is moving it to another server, its holders go on there: the waiters here are answered
/// TRYAGAIN instead of being served again (`moving`).
pub fn on_unlink(db: i32, key: &[u8], value: &mut LockValue) {
    let moved_away = moving::is_moved_away(value);
    let had_waiters = value.waiters() > 0;
    if contention::is_waited(&value.gauges()) {
        contention::forget(db, key);
    }
    if had_waiters {
        let before = value.gauges();
        drop(value.lock_mut().take_waiters());
        stats::update_gauges(before, value.gauges());
    }
    let lock = value.view();
    for conn in bound::connections(&lock) {
        bound::forget(conn, db, key);
    }
    if moved_away {
        moving::refuse_waiters(db, key);
        return;
    }
    let holders = lock.holders().len() as u64;
    let all_expired = lock.last_expiry().is_some_and(|t| t <= context::now_ms());
    // Not for the empty value a command deletes after the last release (the common path):
    // evicting it would lose nothing. Nor for one whose holders had all expired: those are
    // counted as expirations, once, however the server removes the key.
    if (had_waiters || holders > 0 || lock.delay_until() != 0) && !(holders > 0 && all_expired) {
        eviction::note_unlinked(db, key);
        // The note lives until the next turn of the event loop (see `eviction::forget_note`).
        schedule();
    }
    if holders > 0 && all_expired {
        // Redis expired the key: its holds ended at their expiries (counted as expirations
        // when the key is settled; their hold times are known now).
        for (_, h) in lock.holders().iter() {
            if h.granted_at != 0 {
                stats::count_hold_end(h.expires_at.saturating_sub(h.granted_at));
            }
        }
        state::with_expired(|e| *e.entry((db, key.into())).or_default() += holders);
    }
    if had_waiters || (holders > 0 && all_expired) {
        mark_dirty(db, key);
    }
}

/// FLUSHDB (`db`) or FLUSHALL (-1): every waited-on key there is settled.
pub fn on_flush(db: i32) {
    let dbs: Vec<i32> = if db < 0 { Vec::new() } else { vec![db] };
    for (db, key) in waiters::waited_keys(&dbs) {
        mark_dirty(db, &key);
    }
}

/// SWAPDB a b: waited-on keys of either database are settled in both.
pub fn on_swapdb(a: i32, b: i32) {
    for (_, key) in waiters::waited_keys(&[a, b]) {
        mark_dirty(a, &key);
        mark_dirty(b, &key);
    }
}

fn run_timer(ctx: &Context, _: ()) {
    crate::sys::guard::guard_silent("settle timer", || {
        state::replace_settle_scheduled(false);
        eviction::forget_note();
        // While clients are paused the dataset stays as it is: a key whose TTL has passed
        // reads as absent but cannot be created anew, and no hand-over may happen. The keys
        // stay dirty and are settled when the pause ends.
        if context::writes_paused() {
            schedule_after(PAUSE_RETRY);
            return;
        }
        run_all(ctx);
    });
}

/// Settles every dirty key. A replica settles nothing: it has no waiters and takes expiry from
/// its master; a promotion marks every lock key dirty again.
pub fn run_all(ctx: &Context) {
    let dirty = state::with_dirty(std::mem::take);
    if ctx.get_flags().contains(redis_module::ContextFlags::SLAVE) {
        state::with_expired(|e| e.clear());
        state::with_give_back(|g| g.clear());
        eviction::forget_pending();
        bound::forget_gone();
        return;
    }
    let original_db = context::selected_db(ctx);
    for (db, key) in dirty {
        if context::select_db(ctx, db) {
            settle(ctx, db, &key);
        }
    }
    context::select_db(ctx, original_db);
    // Every key of a closed connection was marked dirty when it closed, and is settled by now.
    bound::forget_gone();
}

/// Whether (`db`, `key`) waits to be settled (no key copy while nothing does).
pub fn is_dirty(db: i32, key: &[u8]) -> bool {
    state::with_dirty(|d| !d.is_empty() && d.contains(&(db, Box::<[u8]>::from(key))))
}

/// Settles (`db`, `key`) now if it is dirty: called by lock commands before they look at it.
pub fn run_for(ctx: &Context, db: i32, key: &[u8]) {
    // Commands that change keys do not run while clients are paused; if one does, the key is
    // left to the pass after the pause (asked only when some key is dirty: the common path
    // pays nothing).
    let was_dirty = state::with_dirty(|d| {
        !d.is_empty() && !context::writes_paused() && d.remove(&(db, Box::<[u8]>::from(key)))
    });
    if was_dirty {
        settle(ctx, db, key);
    }
}

fn settle(ctx: &Context, db: i32, key: &[u8]) {
    let mut lock_key = LockKey::open(ctx, key);
    let expired = state::with_expired(|e| {
        if e.is_empty() {
            return 0;
        }
        e.remove(&(db, Box::<[u8]>::from(key))).unwrap_or(0)
    });
    if expired > 0 {
        stats::count_expirations(expired);
        for _ in 0..expired {
            lock_key.notify(c"lock.expire");
        }
    }
    let given_back = state::with_give_back(|g| {
        if g.is_empty() {
            return Vec::new();
        }
        g.remove(&(db, Box::<[u8]>::from(key))).unwrap_or_default()
    });
    for (owner, token) in given_back {
        give_back_now(&mut lock_key, &owner, token);
    }
    // The server evicted the key: its holds are gone (waiters are served below).
    for _ in 0..eviction::take_to_notify(db, key) {
        lock_key.notify(c"lock.evicted");
    }
    let waiting = waiters::queued_at(db, key);
    match lock_key.kind() {
        KeyKind::Other => {
            for (id, _) in waiting {
                waiters::refuse_wrong_type(id);
            }
        }
        KeyKind::Empty if waiting.is_empty() => {}
        KeyKind::Empty | KeyKind::Value => {
            if lock_key.existing_or_new().is_err() {
                return;
            }
            lock_key.apply(|lock: &mut Lock, step| {
                lock.retain_waiters(|id| waiters::is_queued_at(id, db, key));
                let missing = waiting
                    .into_iter()
                    .filter(|(id, _)| !lock.queue().contains(*id))
                    .collect();
                for (id, refusal) in lock.requeue(missing, step) {
                    waiters::refuse(id, errors::refusal_text(refusal));
                }
                // After the requeue, so that a waiter granted here is not taken for one that
                // went missing.
                bound::end_gone(lock, step);
                // A bound hold that arrived here under a new name (RENAME, MOVE, SWAPDB) is
                // found here when its connection closes.
                for conn in bound::connections(lock) {
                    bound::index(conn, db, key);
                }
            });
        }
    }
}

/// Gives back the hold a grant created, if the holder is still exactly that grant (its
/// connection closed before the grant's reply was sent). While clients are paused nothing may
/// be written or propagated: it is done by the settle pass after the pause.
pub fn give_back(ctx: &Context, db: i32, key: &[u8], owner: &[u8], token: u64) {
    if context::writes_paused() {
        state::with_give_back(|g| {
            g.entry((db, key.into()))
                .or_default()
                .push((owner.into(), token));
        });
        mark_dirty(db, key);
        return;
    }
    if !context::select_db(ctx, db) {
        return;
    }
    give_back_now(&mut LockKey::open(ctx, key), owner, token);
}

fn give_back_now(lock_key: &mut LockKey, owner: &[u8], token: u64) {
    let still_holds = matches!(lock_key.existing(), Ok(Some(v))
        if v.view().holders().get(owner).is_some_and(|h| h.token == token));
    if still_holds {
        lock_key.apply(|lock, step| lock.release(owner, false, step));
        stats::count_given_back();
        lock_key.notify(c"lock.release");
    }
}
