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
//!
//! A pass stops after [`SLICE`] of work and goes on in the next turn of the event loop, so
//! however many keys wait (a connection that held 100,000 bound holds closed), other clients
//! are served in between. A connection with many bound holds hands its whole set of keys over
//! when it closes ([`mark_closed`], no per-key work in the close event); a lock command on one
//! of them before its turn settles that key first, like any dirty key.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redis_module::{Context, RedisString};

use crate::keys::LockKey;
use crate::state;
use crate::sys::cluster::{self, Serving};
use crate::sys::context;
use crate::sys::events::{wake_soon, SoonHandler};
use crate::sys::key::KeyKind;
use crate::value::LockValue;
use crate::{bound, contention, errors, eviction, moving, stats, waiters};
use redis_lock_core::Lock;

/// Marks (`db`, `key`) for settling and makes sure a settle pass is scheduled.
pub fn mark_dirty(db: i32, key: &[u8]) {
    state::with_dirty(|d| d.insert((db, key.into())));
    schedule();
}

/// A closing connection's bound holds on up to this many keys are marked dirty one by one;
/// a larger set is handed over whole (each lock command then looks it up: with sets of this
/// size or more, there are few of them).
const FEW_KEYS: usize = 64;

/// How long one settle pass runs at most before the rest waits for the next turn of the event
/// loop (plus the one key it is settling; a key costs microseconds unless it has very many
/// holders).
const SLICE: Duration = Duration::from_micros(250);

/// A pass looks at its [`SLICE`] budget after this many keys (a key costs about a µs).
const SLICE_CHECK_EVERY: u32 = 8;

/// The keys where a closed connection held bound holds: settled (its holds ended) by the
/// coming passes, or earlier by a lock command on one of them.
pub fn mark_closed(keys: BTreeSet<state::DbKey>) {
    if keys.is_empty() {
        return;
    }
    if keys.len() <= FEW_KEYS {
        state::with_dirty(|d| d.extend(keys));
    } else {
        state::with_closed(|sets| sets.push(keys));
    }
    schedule();
}

/// Schedules a settle pass on the next turn of the event loop (once).
pub fn schedule() {
    schedule_after(Duration::ZERO);
}

/// How often a settle pass looks again while clients are paused.
const PAUSE_RETRY: Duration = Duration::from_millis(10);

/// How often a settle pass looks again at keys it could not settle because the cluster was
/// down.
const CLUSTER_DOWN_RETRY: Duration = Duration::from_millis(100);

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
    // In a cluster the server also deletes keys itself when their slot went to another node
    // (a "dirty slot", FLUSHSLOT): the settle pass asks who serves the slot now and counts
    // the loss if it is not this node. (Not for MIGRATE, handled above.)
    if cluster::enabled() && (had_waiters || holders > 0) {
        state::with_unlinked(|u| u.insert((db, key.into())));
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

/// The pass after a slice. A timer armed from a timer callback waits at least 1 ms (Redis
/// rounds the wait of its module timers up to whole milliseconds), which would leave the
/// server idle between slices; instead the loop is woken at once, and the timer armed then
/// (outside any timer callback) is due on that same turn, after the clients' own events.
pub struct NextSlice;

impl SoonHandler for NextSlice {
    fn soon() {
        match context::detached_context() {
            Some(ctx) => {
                ctx.create_timer(Duration::ZERO, run_timer, ());
            }
            None => {
                state::replace_settle_scheduled(false);
            }
        }
    }
}

/// Some keys are left after a slice: the next pass runs on the next turn of the event loop.
fn continue_next_turn(ctx: &Context) {
    // Taken as scheduled: keys marked dirty meanwhile arm nothing of their own.
    state::replace_settle_scheduled(true);
    if !wake_soon::<NextSlice>() {
        ctx.create_timer(Duration::ZERO, run_timer, ());
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

/// Settles dirty keys, then keys of closed connections, for at most [`SLICE`]; schedules the
/// next pass if some are left. A replica settles nothing: it has no waiters and takes expiry
/// from its master; a promotion marks every lock key dirty again.
pub fn run_all(ctx: &Context) {
    if ctx.get_flags().contains(redis_module::ContextFlags::SLAVE) {
        state::with_unlinked(|u| u.clear());
        state::with_dirty(|d| d.clear());
        state::with_closed(|c| c.clear());
        state::with_expired(|e| e.clear());
        state::with_give_back(|g| g.clear());
        eviction::forget_pending();
        bound::forget_gone();
        return;
    }
    let started = Instant::now();
    let original_db = context::selected_db(ctx);
    let mut lost = Lost::default();
    let mut more = false;
    // One clock read per slice for the keys' own times, and the slice's budget looked at every
    // few keys: per key, both were about 7 % of closing a connection with 100,000 bound holds.
    context::with_now_frozen(|| {
        let mut selected = original_db;
        let mut settled: u32 = 0;
        while let Some((closed, (db, key))) = next_key() {
            if db == selected || context::select_db(ctx, db) {
                selected = db;
                if closed {
                    lost.add(end_closed(ctx, db, &key));
                } else {
                    lost.add(settle(ctx, db, &key));
                }
            }
            settled = settled.wrapping_add(1);
            if settled % SLICE_CHECK_EVERY == 0 && started.elapsed() >= SLICE {
                more = true;
                break;
            }
        }
    });
    context::select_db(ctx, original_db);
    lost.log(ctx);
    if more {
        continue_next_turn(ctx);
    } else {
        // Every key of a closed connection was marked dirty or handed over when it closed,
        // and is settled by now.
        bound::forget_gone();
    }
}

/// The next key a pass settles: a dirty one, else one of a closed connection (`true`).
fn next_key() -> Option<(bool, state::DbKey)> {
    if let Some(key) = state::with_dirty(|d| d.pop_first()) {
        return Some((false, key));
    }
    if !state::any_closed() {
        return None;
    }
    state::with_closed(|sets| {
        while let Some(first) = sets.first_mut() {
            if let Some(key) = first.pop_first() {
                return Some((true, key));
            }
            sets.remove(0);
        }
        None
    })
}

/// Ends the bound holds of closed connections on (`db`, `key`), a key that is not dirty (a
/// dirty key is settled in full first, by the pass or by a command): only that, and serving
/// its queue. A key in a hash slot this node does not serve gets the full settle, which grants
/// nothing there. Returns what was given up to another node, as [`settle`] does.
fn end_closed(ctx: &Context, db: i32, key: &[u8]) -> (u64, u64) {
    if cluster::serving(ctx, key) != Serving::Here {
        return settle(ctx, db, key);
    }
    let mut lock_key = LockKey::open(ctx, key);
    if let Ok(Some(_)) = lock_key.existing() {
        lock_key.apply(|lock: &mut Lock, step| {
            lock.retain_waiters(|id| waiters::is_queued_at(id, db, key));
            bound::end_gone(lock, step);
        });
    }
    (0, 0)
}

/// Whether (`db`, `key`) waits to be settled (no key copy while nothing does).
pub fn is_dirty(db: i32, key: &[u8]) -> bool {
    state::any_dirty()
        && state::with_dirty(|d| !d.is_empty() && d.contains(&(db, Box::<[u8]>::from(key))))
}

/// Opens the key of a lock command that changes it, settled: what Redis did to the key behind
/// the module's back is dealt with first, so the command sees the key as its waiters do. The
/// one way every such command opens its key (LOCK.ACQUIRE, RWREAD, SEMACQUIRE, RELEASE,
/// EXTEND).
///
/// Opening the key may itself remove it: a holder's TTL that passed before the module's timer
/// ran is expired by the server on this lookup, and the key's waiters are taken out to be
/// served again ([`on_unlink`] marks it dirty). They came before this command, so the key is
/// settled again and reopened: otherwise a request would find an empty key and be granted ahead
/// of them (seen once in tests/semaphore.rs's FIFO run under churn, fixed in c6746d6 where only
/// LOCK.ACQUIRE had the second settle).
pub fn open_settled<'a>(ctx: &'a Context, key: &'a RedisString) -> LockKey<'a> {
    // The common path, nothing to settle anywhere: two loads of plain flags.
    if state::any_dirty() || state::any_closed() {
        run_for(ctx, context::selected_db(ctx), key.as_slice());
    }
    let lock_key = LockKey::open_arg(ctx, key);
    if !state::any_dirty() {
        return lock_key;
    }
    let db = lock_key.db();
    if !is_dirty(db, key.as_slice()) {
        return lock_key;
    }
    drop(lock_key);
    run_for(ctx, db, key.as_slice());
    LockKey::open_arg(ctx, key)
}

/// Settles (`db`, `key`) now if it is dirty or a closed connection held it: called by lock
/// commands before they look at it.
pub fn run_for(ctx: &Context, db: i32, key: &[u8]) {
    // Commands that change keys do not run while clients are paused; if one does, the key is
    // left to the pass after the pause (asked only when some key is dirty: the common path
    // pays nothing).
    let was_dirty = state::with_dirty(|d| {
        !d.is_empty() && !context::writes_paused() && d.remove(&(db, Box::<[u8]>::from(key)))
    });
    if was_dirty || take_closed(db, key) {
        let mut lost = Lost::default();
        lost.add(settle(ctx, db, key));
        lost.log(ctx);
    }
}

/// Takes (`db`, `key`) out of the closed connections' sets; whether one had it. One load of a
/// flag while no such set waits.
fn take_closed(db: i32, key: &[u8]) -> bool {
    if !state::any_closed() || context::writes_paused() {
        return false;
    }
    let wanted: state::DbKey = (db, key.into());
    state::with_closed(|sets| {
        let mut found = false;
        for set in sets.iter_mut() {
            found |= set.remove(&wanted);
        }
        if found {
            sets.retain(|s| !s.is_empty());
        }
        found
    })
}

/// What a settle pass gave up because another node serves the keys' slots: keys, waiters.
#[derive(Default)]
struct Lost {
    keys: u64,
    waiters: u64,
}

impl Lost {
    fn add(&mut self, (keys, waiters): (u64, u64)) {
        self.keys = self.keys.saturating_add(keys);
        self.waiters = self.waiters.saturating_add(waiters);
    }

    /// One log line per pass (a lost slot may hold many lock keys).
    fn log(&self, ctx: &Context) {
        if self.keys > 0 {
            ctx.log_warning(&format!(
                "lock: {} lock key(s) gone from hash slots this node no longer serves \
                 (another node claimed the slot, or it was deleted); their holds are lost \
                 here and {} waiter(s) were answered TRYAGAIN",
                self.keys, self.waiters
            ));
        }
    }
}

/// Settles (`db`, `key`); returns what it gave up to another node: (keys, waiters).
fn settle(ctx: &Context, db: i32, key: &[u8]) -> (u64, u64) {
    let unlinked =
        state::with_unlinked(|u| !u.is_empty() && u.remove(&(db, Box::<[u8]>::from(key))));
    match cluster::serving(ctx, key) {
        Serving::Here => {}
        Serving::Elsewhere => return give_up(ctx, db, key, unlinked),
        Serving::ClusterDown => {
            // Nobody may be served while the cluster is down: the key stays dirty.
            if unlinked {
                state::with_unlinked(|u| u.insert((db, key.into())));
            }
            state::with_dirty(|d| d.insert((db, key.into())));
            schedule_after(CLUSTER_DOWN_RETRY);
            return (0, 0);
        }
    }
    settle_served(ctx, db, key);
    (0, 0)
}

/// Another node (or none) serves (`db`, `key`)'s slot: nothing is granted or made here. Its
/// waiters are answered TRYAGAIN, as after a MIGRATE; what was noted for the key (expiries to
/// count, grants to give back, an eviction) is dropped with it. A lock value still here (a slot
/// deleted with DELSLOTS, a key imported but not yet served) keeps its holds and its timer;
/// only the waiters leave it. Returns (1 if the key is counted as lost, waiters answered).
fn give_up(ctx: &Context, db: i32, key: &[u8], unlinked: bool) -> (u64, u64) {
    let place = (db, Box::<[u8]>::from(key));
    state::with_expired(|e| e.remove(&place));
    state::with_give_back(|g| g.remove(&place));
    let _ = eviction::take_to_notify(db, key);
    let mut lock_key = LockKey::open(ctx, key);
    let value = match lock_key.kind() {
        KeyKind::Value => lock_key.existing().ok().flatten(),
        _ => None,
    };
    let refused = moving::refuse_waiters_unserved(db, key, value);
    // Keys of a slot that an atomic slot migration exported moved (their waiters count as
    // moved away, above); any other key lost its slot.
    let lost = u64::from((unlinked || refused > 0) && !moving::was_exported(key));
    state::add_slot_losses(lost);
    (lost, refused)
}

fn settle_served(ctx: &Context, db: i32, key: &[u8]) {
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
