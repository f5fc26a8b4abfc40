//! Expiry timers: holders are dropped when their time passes, with no client action.
//!
//! A timer is armed only where waiting for Redis's own key expiry would not do: when clients
//! wait (they must be served the moment a holder expires) or when several holders expire at
//! different times (each reader alone). A lone holder with nobody waiting needs none: the key's
//! Redis expiry is that holder's expiry, and Redis removing the key is the same event (see
//! `settle::on_unlink`), which saves a timer per lock.
//!
//! Each lock value has at most one live timer, armed for its earliest holder expiry. A later
//! deadline (EXTEND, a re-entry) leaves the armed timer alone: it fires early, finds nothing
//! due and re-arms, which is cheaper than stopping and recreating a timer on every extend.
//! Timers are not persisted or replicated; a loaded or moved value is re-armed when its key
//! is settled. Replicas never arm timers: the master sends them the expiry.
//!
//! This file and `keys` import each other: that is the domain's recursion (a commit arms a
//! timer, a timer firing commits), and the only import cycle of the crate.

use std::time::Duration;

use redis_module::{Context, ContextFlags};

use crate::keys::LockKey;
use crate::sys::cluster::{self, Serving};
use crate::sys::context;
use crate::value::{ArmedTimer, LockValue};
use crate::{state, waiters};
use redis_lock_core::Millis;

fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The longest a timer is armed for: 2^30 ms, about 12 days. A later expiry gets a timer that
/// fires early, finds nothing due and re-arms. Redis counts a timer's deadline in microseconds
/// from the current time and hands the wait to its event loop as an `int` of ms, so a far
/// deadline (a crafted expiry of 2^63 ms made it overflow into the past: the timer fired, found
/// nothing due and re-armed in a loop that never let the server answer again) must never reach
/// it, whatever a value holds. Checked values end by 2^49 ms; this bound holds regardless.
const MAX_TIMER_DELAY: Millis = 1 << 30;

/// What a timer carries: the key to look at.
struct Target {
    db: i32,
    key: Box<[u8]>,
    at: Millis,
}

/// Makes sure `value`, stored at (`db`, `key`), has a timer for its earliest expiry.
pub fn arm(ctx: &Context, db: i32, key: &[u8], value: &mut LockValue) {
    // A compact value is a lone plain holder with nobody waiting: no timer (see above).
    if value.is_small() || ctx.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    // A lone exclusive holder with LOCKDELAY also needs one: its key lives until the end of
    // the delay, but the hold itself ends (and is counted and notified) at its expiry.
    let lock = value.lock_mut();
    let needs_timer = !lock.queue().is_empty()
        || lock.holders().len() > 1
        || lock.next_expiry() != lock.last_expiry();
    let due = match lock.next_expiry() {
        Some(due) if needs_timer => due,
        _ => {
            stop(ctx, value);
            return;
        }
    };
    let hash = key_hash(key);
    if let Some(t) = value.timer() {
        if t.at <= due && t.db == db && t.key_hash == hash {
            return;
        }
    }
    stop(ctx, value);
    let now = context::now_ms();
    // When the timer fires: `due`, or earlier when that is far off.
    let at = due.min(now.saturating_add(MAX_TIMER_DELAY));
    let delay = at.saturating_sub(now);
    let target = Target {
        db,
        key: key.into(),
        at,
    };
    let id = ctx.create_timer(Duration::from_millis(delay), fire, target);
    value.set_timer(ArmedTimer {
        id,
        at,
        db,
        key_hash: hash,
    });
}

/// How long a timer waits before it looks again at a key whose slot this node does not serve.
const UNSERVED_RETRY: Millis = 1_000;

/// Arms `value`'s timer [`UNSERVED_RETRY`] from now, whatever its holders' expiries.
fn arm_retry(ctx: &Context, db: i32, key: &[u8], value: &mut LockValue) {
    stop(ctx, value);
    let at = context::now_ms().saturating_add(UNSERVED_RETRY);
    let target = Target {
        db,
        key: key.into(),
        at,
    };
    let id = ctx.create_timer(Duration::from_millis(UNSERVED_RETRY), fire, target);
    value.set_timer(ArmedTimer {
        id,
        at,
        db,
        key_hash: key_hash(key),
    });
}

fn stop(ctx: &Context, value: &mut LockValue) {
    if let Some(t) = value.take_timer() {
        // The timer may already have fired (it is then gone); either way it is ours no more.
        let _ = ctx.stop_timer::<Target>(t.id);
    }
}

/// How often the deferred timers look again while clients are paused.
const PAUSE_RETRY: Duration = Duration::from_millis(10);

/// Timer callback: runs on the main thread with a context of its own.
fn fire(ctx: &Context, target: Target) {
    crate::sys::guard::guard_silent("expiry timer", || {
        // While clients are paused the server keeps the dataset constant (a failover waits for
        // replicas to catch up): expiry and hand-over wait for the pause to end. A due timer
        // joins one list that a single poll timer fires when the pause is over (one timer
        // per key looking again every few ms would keep the server busy).
        if context::writes_paused() {
            let first = state::with_deferred_timers(|d| {
                d.push((target.db, target.key, target.at));
                d.len() == 1
            });
            if first {
                ctx.create_timer(PAUSE_RETRY, fire_deferred, ());
            }
            return;
        }
        fire_now(ctx, &target);
    });
}

/// The poll timer of the timers deferred by a pause.
fn fire_deferred(ctx: &Context, _: ()) {
    crate::sys::guard::guard_silent("deferred expiry timers", || {
        if context::writes_paused() {
            ctx.create_timer(PAUSE_RETRY, fire_deferred, ());
            return;
        }
        let original_db = context::selected_db(ctx);
        for (db, key, at) in state::with_deferred_timers(std::mem::take) {
            fire_now(ctx, &Target { db, key, at });
        }
        context::select_db(ctx, original_db);
    });
}

/// Expires the holders due at `target` and serves the waiters, if the timer is still the
/// value's own. The value's record of its timer matches by deadline and key, so a deferred
/// timer still counts as it.
fn fire_now(ctx: &Context, target: &Target) {
    if !context::select_db(ctx, target.db) {
        return;
    }
    // A replica takes expiry from its master: a timer armed while this server was a master
    // (and deferred through a failover's pause) does nothing but forget itself, so that a
    // promotion arms a new one.
    let replica = ctx.get_flags().contains(ContextFlags::SLAVE);
    let mut key = if replica {
        LockKey::open_read(ctx, &target.key)
    } else {
        LockKey::open(ctx, &target.key)
    };
    let Ok(Some(value)) = key.existing() else {
        return;
    };
    // Only the value's own live timer may act; a stale one (the value was replaced, or
    // re-armed earlier) does nothing.
    match value.timer() {
        Some(t)
            if t.at == target.at && t.db == target.db && t.key_hash == key_hash(&target.key) => {}
        _ => return,
    }
    value.take_timer();
    if replica {
        return;
    }
    // In a cluster, only while this node serves the key's slot: no expiry hand-over, no end of
    // a lock delay, in a slot another node serves (or none does, or the cluster is down). The
    // timer looks again later: a slot being imported here becomes this node's when the import
    // ends (its waiters, queued with ASKING, are served then), and the server itself answers
    // clients blocked on keys of a slot it no longer serves (-MOVED, -CLUSTERDOWN). Keys the
    // server deletes there are settled (`settle`).
    if cluster::serving(ctx, &target.key) != Serving::Here {
        arm_retry(ctx, target.db, &target.key, value);
        return;
    }
    key.apply(|lock, step| {
        // A waiter that gave up during a pause left the registry but is still in the value
        // until its key is settled: it must not be granted (nobody would learn of the hold).
        lock.retain_waiters(|id| waiters::is_queued_at(id, target.db, &target.key));
        lock.settle(step)
    });
}
