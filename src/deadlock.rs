//! Deadlock detection, the Redis side: a lock request with WAIT that would have to wait is
//! refused when waiting would close a cycle (SPEC.md, "Deadlock detection"). The search is in
//! the core (`redis_lock_core::check_request`, backwards from the requester within a budget of
//! visits); this file answers its questions from the module's indexes: which keys with waiters
//! an owner holds (`contention`), which requests it has queued (the waiter registry's by-owner
//! index), and what each key holds.
//!
//! It runs only for a request that cannot be granted at once and would queue: a request that
//! is granted, refused without WAIT, or made inside MULTI or a script costs nothing more.
//! Semaphore requests are left out, as SPEC.md says.
//!
//! Tenants (SPEC.md, "Tenants (ACL)"): the search sees only keys the requesting user may read
//! (the requested key itself, which the command already names, is in reach). A key out of
//! reach is as if it held nothing and nobody waited there, so a cycle through it is not
//! found, and the reply (refused or not, and the error's fixed text) tells nothing about it.
//! The indexes are filtered as they are walked, and every entry walked counts against the
//! budget, kept or not: an owner whose first entries are out of reach is not taken for one
//! that holds or waits for nothing, and a walk stopped by the budget is a cut.
//!
//! Bounded cost (SPEC.md, "Bounded cost"): a check makes at most `lock.deadlock-budget`
//! visits; one that runs out lets the request wait as if no cycle were found, counted in
//! `deadlock_checks_cut_total`.

use std::collections::HashMap;

use redis_lock_core::{check_request, Listing, Lock, Mode, Verdict, WaitGraph, WaiterId, Who};
use redis_module::Context;

use crate::contention::Filed;
use crate::keys::LockKey;
use crate::state::DbKey;
use crate::sys::acl::Caller;
use crate::sys::context;
use crate::{contention, waiters};

/// The module's indexes and keys, seen by one check of one user.
struct Graph<'c> {
    ctx: &'c Context,
    caller: Caller,
    /// The requested key: in reach whatever the patterns say (the command names it).
    request_key: DbKey,
    /// What the user may read, per key looked at in this check.
    readable: HashMap<DbKey, bool>,
}

impl Graph<'_> {
    fn in_reach(&mut self, place: &DbKey) -> bool {
        if *place == self.request_key {
            return true;
        }
        if let Some(known) = self.readable.get(place) {
            return *known;
        }
        let ok = self.caller.may_read(&place.1);
        self.readable.insert(place.clone(), ok);
        ok
    }
}

impl Graph<'_> {
    /// Does `owner` hold `key` (in reach)? One hashed lookup in its holders.
    fn holds(&mut self, key: &DbKey, owner: Who<'_>) -> bool {
        self.with_lock(key, |lock| {
            lock.holders()
                .get(owner.owner)
                .is_some_and(|h| owner.holds(h))
        })
        .unwrap_or(false)
    }
}

impl WaitGraph for Graph<'_> {
    type Key = DbKey;

    fn held_by(&mut self, owner: Who<'_>, max: usize) -> Listing<DbKey> {
        // Keys nobody queues on lead nowhere, nor wide keys where the owner holds nothing:
        // left out (looked at, and charged, all the same).
        let entries = contention::held_keys(owner, max);
        contention::listing(entries, |(k, filed)| match filed {
            Filed::Narrow => waiters::has_queue(k) && self.in_reach(k),
            Filed::Wide => self.holds(k, owner),
        })
    }

    fn queued_by(&mut self, owner: Who<'_>, max: usize) -> Listing<(DbKey, WaiterId)> {
        waiters::queued_of(owner, max, |k| self.in_reach(k))
    }

    fn with_lock<R>(&mut self, key: &DbKey, f: impl FnOnce(&Lock) -> R) -> Option<R> {
        if !self.in_reach(key) || !context::select_db(self.ctx, key.0) {
            return None;
        }
        let mut lock_key = LockKey::open_read(self.ctx, &key.1);
        match lock_key.existing() {
            Ok(Some(value)) => Some(f(&value.view())),
            _ => None,
        }
    }
}

/// Could a request of `requester` close a cycle at all: does it hold some key someone waits
/// for (as far as the index tells within its look limits, see `contention::holds_contended`)?
/// The test that lets almost every request skip the walk. Reads other keys, possibly in other
/// databases; the selected database is restored.
pub fn may_close_cycle(ctx: &Context, requester: Who<'_>) -> bool {
    let original_db = context::selected_db(ctx);
    let holds_at = |place: &DbKey| {
        if !context::select_db(ctx, place.0) {
            return false;
        }
        let mut lock_key = LockKey::open_read(ctx, &place.1);
        match lock_key.existing() {
            Ok(Some(value)) => value
                .view()
                .holders()
                .get(requester.owner)
                .is_some_and(|h| requester.holds(h)),
            _ => false,
        }
    };
    let maybe = contention::holds_contended(requester, waiters::has_queue, holds_at);
    context::select_db(ctx, original_db);
    maybe
}

/// Would a request of `requester` in `mode` on `key` (in the selected database; its lock is
/// `lock`), which cannot be granted at once, close a cycle within the requesting user's reach? Reads other keys,
/// possibly in other databases; the selected database is restored. `budget`: the most visits
/// the check may make.
pub fn check_here(
    ctx: &Context,
    requester: Who<'_>,
    mode: Mode,
    key: &[u8],
    lock: &Lock,
    budget: usize,
) -> Verdict {
    let Some(caller) = Caller::of_current(ctx) else {
        // The user was deleted while connected: it may read nothing, so nothing is followed.
        return Verdict::NoCycle;
    };
    let original_db = context::selected_db(ctx);
    let request_key: DbKey = (original_db, key.into());
    let mut graph = Graph {
        ctx,
        caller,
        request_key: request_key.clone(),
        readable: HashMap::new(),
    };
    let (verdict, _) = check_request(&mut graph, requester, mode, &request_key, lock, budget);
    context::select_db(ctx, original_db);
    verdict
}
