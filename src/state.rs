//! All module-wide mutable state, in one place: what is not in any key. Each feature file
//! owns the logic that changes its part; this file only holds the data and its structures.
//!
//! Redis runs module code on its main thread only (fork children get their own copy), so
//! thread-local cells are enough; no borrow is ever held across a call into Redis.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasherDefault;

use redis_lock_core::{FenceCounter, Mode, UserId, Waiter, WaiterId, Who};

use crate::sys::blocked::{BlockedClient, BlockedClientId};

/// A key of one database.
pub type DbKey = (i32, Box<[u8]>);

thread_local! {
    /// Clients blocked in the module (`waiters`, `blocking`).
    static WAITERS: RefCell<Registry> = RefCell::new(Registry::default());
    /// The id of the connection Redis most recently announced as closing (`blocking`).
    static CLOSING: Cell<u64> = const { Cell::new(0) };
    /// Keys to settle (`settle`).
    static DIRTY: RefCell<BTreeSet<DbKey>> = const { RefCell::new(BTreeSet::new()) };
    /// Keys that Redis removed because their last holder's expiry passed before our timer
    /// fired, with how many holders expired: counted and notified when the key is settled.
    static EXPIRED: RefCell<BTreeMap<DbKey, u64>> = const { RefCell::new(BTreeMap::new()) };
    /// Is a settle pass scheduled?
    static SETTLE_SCHEDULED: Cell<bool> = const { Cell::new(false) };
    /// Where each connection may have bound holds (`bound`): a hint, checked against the
    /// value when used, so an entry left behind by a deleted or moved key costs a lookup only.
    static BOUND: RefCell<HashMap<u64, BTreeSet<DbKey>>> = RefCell::new(HashMap::new());
    /// Connections whose bound holds are to end at the next settle of their keys (`bound`).
    static GONE: RefCell<HashSet<u64>> = RefCell::new(HashSet::new());
    /// The keys of closed connections that had many bound holds, one set per connection, moved
    /// here whole when the connection closed and settled a slice at a time (`settle`).
    static CLOSED: RefCell<Vec<BTreeSet<DbKey>>> = const { RefCell::new(Vec::new()) };
    /// The ACL users seen so far, by name: their numbers (`users`).
    static USERS: RefCell<HashMap<Box<[u8]>, UserId>> = RefCell::new(HashMap::new());
    /// The user each connection was last seen running as (`users`): a connection id is never
    /// reused while the server runs.
    static USER_OF: RefCell<HashMap<u64, UserId, BuildHasherDefault<IdHasher>>> =
        RefCell::new(HashMap::default());
    /// Holders of lock keys that have waiters (`contention`).
    static CONTENDED: RefCell<Contended> = RefCell::new(Contended::default());
    /// What the current load refused (`stats::refuse_load`): the first refused key's log line.
    static REFUSED_LOAD: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The module-wide source of fencing tokens (`stats`; persisted as RDB aux data).
    static FENCES: Cell<FenceCounter> = const { Cell::new(FenceCounter::new_const()) };
    /// The INFO figures (`stats`).
    static COUNTERS: Counters = const { Counters::new() };
    /// Eviction (`eviction`): what it needs between the data type's unlink and the server's
    /// `evicted` notification that follows it, and what it last told the log.
    static EVICTION: RefCell<EvictionState> = const { RefCell::new(EvictionState::new()) };
}

/// What `eviction` keeps.
pub struct EvictionState {
    /// The last lock key whose non-empty value left the keyspace (the unlink callback): an
    /// `evicted` notification for this key means the eviction removed a lock.
    pub last_unlinked: Option<DbKey>,
    /// Evicted lock keys not yet notified (`lock.evicted` is sent when the key is settled).
    pub to_notify: BTreeMap<DbKey, usize>,
    /// Could the server evict keys when the module last looked (at load, on a config change
    /// or a role change)?
    pub could_evict: bool,
}

impl EvictionState {
    const fn new() -> Self {
        EvictionState {
            last_unlinked: None,
            to_notify: BTreeMap::new(),
            could_evict: false,
        }
    }
}

pub fn with_eviction<R>(f: impl FnOnce(&mut EvictionState) -> R) -> R {
    EVICTION.with(|e| f(&mut e.borrow_mut()))
}

pub fn with_waiters<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    WAITERS.with(|r| f(&mut r.borrow_mut()))
}

pub fn closing() -> u64 {
    CLOSING.with(|c| c.get())
}

pub fn set_closing(client_id: u64) {
    CLOSING.with(|c| c.set(client_id));
}

pub fn with_dirty<R>(f: impl FnOnce(&mut BTreeSet<DbKey>) -> R) -> R {
    DIRTY.with(|d| {
        let mut dirty = d.borrow_mut();
        let r = f(&mut dirty);
        ANY_DIRTY.store(!dirty.is_empty(), std::sync::atomic::Ordering::Relaxed);
        r
    })
}

/// Is `DIRTY` non-empty? A plain static, read by every lock command before it opens its key,
/// so the common path (nothing to settle) costs one load, not a thread-local borrow.
static ANY_DIRTY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn any_dirty() -> bool {
    ANY_DIRTY.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn with_bound<R>(f: impl FnOnce(&mut HashMap<u64, BTreeSet<DbKey>>) -> R) -> R {
    BOUND.with(|b| f(&mut b.borrow_mut()))
}

pub fn with_gone<R>(f: impl FnOnce(&mut HashSet<u64>) -> R) -> R {
    GONE.with(|g| f(&mut g.borrow_mut()))
}

/// Is `CLOSED` non-empty? A plain static, read by every lock command (see `ANY_SERIALIZED`).
static ANY_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn any_closed() -> bool {
    ANY_CLOSED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs `f` with the key sets of closed connections still to settle (oldest first; `f`
/// drops the sets it empties).
pub fn with_closed<R>(f: impl FnOnce(&mut Vec<BTreeSet<DbKey>>) -> R) -> R {
    CLOSED.with(|c| {
        let mut sets = c.borrow_mut();
        let r = f(&mut sets);
        ANY_CLOSED.store(!sets.is_empty(), std::sync::atomic::Ordering::Relaxed);
        r
    })
}

pub fn with_user_of<R>(
    f: impl FnOnce(&mut HashMap<u64, UserId, BuildHasherDefault<IdHasher>>) -> R,
) -> R {
    USER_OF.with(|u| f(&mut u.borrow_mut()))
}

/// Hashes a connection id (issued by the server in order, not chosen by clients) with one
/// multiplication: SipHash would cost more than the rest of the lookup.
#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub fn with_users<R>(f: impl FnOnce(&mut HashMap<Box<[u8]>, UserId>) -> R) -> R {
    USERS.with(|u| f(&mut u.borrow_mut()))
}

/// The key an owner (user and name, see `Who`) is filed under in the by-owner indexes: the
/// user's number, then the name.
pub fn who_key(who: Who<'_>) -> Box<[u8]> {
    let mut k = Vec::with_capacity(who.owner.len().saturating_add(2));
    k.extend_from_slice(&who.user.to_be_bytes());
    k.extend_from_slice(who.owner);
    k.into()
}

pub fn with_contended<R>(f: impl FnOnce(&mut Contended) -> R) -> R {
    CONTENDED.with(|c| f(&mut c.borrow_mut()))
}

/// Which owners hold a lock key that has waiters (see `contention`).
#[derive(Default)]
pub struct Contended {
    /// The narrow waited keys each owner holds, by [`who_key`].
    pub by_owner: HashMap<Box<[u8]>, Held>,
    /// Each narrow waited key (at most `contention::SMALL` holders), with the owners
    /// ([`who_key`]) filed for it in `by_owner`.
    pub narrow: HashMap<DbKey, Vec<Box<[u8]>>>,
    /// Each wide waited key (more holders), with the users it is filed under in `wide_by_user`.
    pub wide: HashMap<DbKey, Vec<UserId>>,
    /// The wide waited keys where each user has some hold.
    pub wide_by_user: HashMap<UserId, BTreeSet<DbKey>>,
    /// The fence of each key with waiters, as of its last change: what LOCK.INFO shows while
    /// the key cannot be read (its TTL passed during a client pause, see `commands::info`).
    /// By database, then key: looked up by a borrowed name, with no key copy.
    pub fences: HashMap<i32, HashMap<Box<[u8]>, u64>>,
}

/// The indexed keys of one owner: most owners hold one (no set allocated for it).
pub enum Held {
    One(DbKey),
    Many(BTreeSet<DbKey>),
}

pub fn with_expired<R>(f: impl FnOnce(&mut BTreeMap<DbKey, u64>) -> R) -> R {
    EXPIRED.with(|e| f(&mut e.borrow_mut()))
}

thread_local! {
    /// The timer armed to wake the event loop at the earliest waiter deadline, with when it
    /// fires (module clock, ms) (`deadlines`).
    static WAKE: Cell<Option<(redis_module::RedisModuleTimerID, u64)>> = const { Cell::new(None) };
}

/// Sets the deadline wake-up timer; returns the one there was.
pub fn replace_wake(
    wake: Option<(redis_module::RedisModuleTimerID, u64)>,
) -> Option<(redis_module::RedisModuleTimerID, u64)> {
    WAKE.with(|w| w.replace(wake))
}

/// The deadline wake-up timer, if one is armed.
pub fn wake() -> Option<(redis_module::RedisModuleTimerID, u64)> {
    WAKE.with(|w| w.get())
}

/// Sets whether a settle pass is scheduled; returns what it was.
pub fn replace_settle_scheduled(scheduled: bool) -> bool {
    SETTLE_SCHEDULED.with(|s| s.replace(scheduled))
}

pub fn with_refused_load<R>(f: impl FnOnce(&mut Option<String>) -> R) -> R {
    REFUSED_LOAD.with(|r| f(&mut r.borrow_mut()))
}

/// Runs `f` with the module's fencing counter, its legacy setting as `lock.legacy-tokens` is
/// now (the config is the one place that setting lives).
pub fn with_fences<R>(f: impl FnOnce(&mut FenceCounter) -> R) -> R {
    FENCES.with(|cell| {
        let mut fences = cell.get();
        fences.set_legacy(crate::config::legacy_tokens());
        let r = f(&mut fences);
        cell.set(fences);
        r
    })
}

pub fn with_counters<R>(f: impl FnOnce(&Counters) -> R) -> R {
    COUNTERS.with(f)
}

/// Where a blocked waiter is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitState {
    Queued,
    /// Granted; the token is replied when Redis calls the reply callback.
    Granted {
        token: u64,
    },
    /// The key now holds another type.
    WrongType,
    /// The key now holds another kind (lock or semaphore) or capacity: this error is replied.
    Refused {
        message: &'static str,
    },
}

/// One blocked waiter: its handle and what it asked for.
pub struct Entry {
    /// The handle, while the client is still blocked by us (queued): taken by its unblock.
    pub client: Option<BlockedClient>,
    /// The handle's identity, which Redis's callbacks report.
    pub client_handle_id: BlockedClientId,
    /// Redis's id of the blocked connection (never reused while the server runs).
    pub client_id: u64,
    /// When it was queued (module clock, ms): for LOCK.INFO and the wait-time figures.
    pub queued_at: u64,
    /// When its WAIT timeout passes (module clock, ms; 0 = never): see `deadlines`.
    pub deadline: u64,
    pub db: i32,
    pub key: Box<[u8]>,
    pub waiter: Waiter,
    pub state: WaitState,
    /// The ACL user that sent the request, for `lock.max-waiters-per-user` (`None` for a
    /// client without a user).
    pub user: Option<Box<[u8]>>,
}

/// Every client blocked in the module, by waiter id, by handle and by key.
#[derive(Default)]
pub struct Registry {
    pub next_id: u64,
    pub entries: HashMap<WaiterId, Entry>,
    pub by_client: HashMap<BlockedClientId, WaiterId>,
    /// Queued waiters per (db, key), to serve them again when their key goes away.
    pub by_key: HashMap<(i32, Box<[u8]>), BTreeSet<WaiterId>>,
    /// Queued lock waiters (not semaphore ones) per owner (its user and name, by
    /// [`who_key`]), for deadlock detection.
    pub by_owner: HashMap<Box<[u8]>, BTreeSet<WaiterId>>,
    /// Every key with queued waiters, by its first (oldest) waiter's id: LOCK.QUEUES BY AGE
    /// and INFO's oldest wait read it in order instead of looking at every key.
    pub by_age: BTreeSet<(WaiterId, DbKey)>,
    /// The same keys by queue length, longest first (ties: the oldest first waiter).
    pub by_length: BTreeSet<(Reverse<u64>, WaiterId, DbKey)>,
    /// The same keys by name, then database: LOCK.QUEUES PREFIX walks the prefix's range.
    pub by_name: BTreeSet<(Box<[u8]>, i32)>,
    /// Blocked clients per ACL user (queued, or granted with the reply pending), for
    /// `lock.max-waiters-per-user`.
    pub by_user: HashMap<Box<[u8]>, usize>,
    /// Queued waiters with a WAIT timeout, by deadline: the first is when the event loop must
    /// wake (`deadlines`).
    pub by_deadline: BTreeSet<(u64, WaiterId)>,
}

impl Registry {
    /// Records a new queued entry in every index.
    pub fn insert(&mut self, id: WaiterId, entry: Entry) {
        self.by_client.insert(entry.client_handle_id, id);
        let place: DbKey = (entry.db, entry.key.clone());
        let before = self.queue_rank(&place);
        self.by_key.entry(place.clone()).or_default().insert(id);
        self.rerank(place, before);
        if let Some(user) = &entry.user {
            *self.by_user.entry(user.clone()).or_default() += 1;
        }
        if entry.deadline != 0 {
            self.by_deadline.insert((entry.deadline, id));
        }
        if entry.waiter.mode != Mode::Permit {
            self.by_owner
                .entry(who_key(entry.waiter.who()))
                .or_default()
                .insert(id);
        }
        self.entries.insert(id, entry);
    }

    /// Takes a waiter that leaves the queue out of the by-key and by-owner indexes.
    /// `owner`: the waiter's [`who_key`].
    fn unindex(&mut self, id: WaiterId, db: i32, key: &[u8], owner: &[u8], deadline: u64) {
        if deadline != 0 {
            self.by_deadline.remove(&(deadline, id));
        }
        let k = (db, Box::<[u8]>::from(key));
        let before = self.queue_rank(&k);
        if let Some(set) = self.by_key.get_mut(&k) {
            set.remove(&id);
            if set.is_empty() {
                self.by_key.remove(&k);
            }
        }
        self.rerank(k, before);
        if let Some(set) = self.by_owner.get_mut(owner) {
            set.remove(&id);
            if set.is_empty() {
                self.by_owner.remove(owner);
            }
        }
    }

    /// A key's queue length and first waiter, as `by_age` and `by_length` file it.
    fn queue_rank(&self, place: &DbKey) -> Option<(u64, WaiterId)> {
        let ids = self.by_key.get(place)?;
        let first = ids.first()?;
        Some((u64::try_from(ids.len()).unwrap_or(u64::MAX), *first))
    }

    /// Files `place` again in `by_age` and `by_length` after its queue changed from `before`.
    fn rerank(&mut self, place: DbKey, before: Option<(u64, WaiterId)>) {
        let after = self.queue_rank(&place);
        if before == after {
            return;
        }
        match (&before, &after) {
            (None, Some(_)) => {
                self.by_name.insert((place.1.clone(), place.0));
            }
            (Some(_), None) => {
                self.by_name.remove(&(place.1.clone(), place.0));
            }
            _ => {}
        }
        if let Some((len, first)) = before {
            self.by_age.remove(&(first, place.clone()));
            self.by_length.remove(&(Reverse(len), first, place.clone()));
        }
        if let Some((len, first)) = after {
            self.by_age.insert((first, place.clone()));
            self.by_length.insert((Reverse(len), first, place));
        }
    }

    pub fn remove(&mut self, id: WaiterId) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.by_client.remove(&entry.client_handle_id);
        if let Some(user) = &entry.user {
            if let Some(n) = self.by_user.get_mut(user) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.by_user.remove(user);
                }
            }
        }
        if entry.state == WaitState::Queued {
            self.unindex(
                id,
                entry.db,
                &entry.key,
                &who_key(entry.waiter.who()),
                entry.deadline,
            );
        }
        Some(entry)
    }

    /// How many clients are queued on `place`.
    pub fn queue_len(&self, place: &DbKey) -> u64 {
        self.by_key
            .get(place)
            .map_or(0, |ids| u64::try_from(ids.len()).unwrap_or(u64::MAX))
    }

    /// How long the first waiter of a queue has waited at `now`, ms.
    pub fn age_of(&self, first: WaiterId, now: u64) -> u64 {
        self.entries
            .get(&first)
            .map_or(0, |e| now.saturating_sub(e.queued_at))
    }

    /// The longest wait and the longest queue of the server: the first entries of the two
    /// rankings, so INFO looks at no key.
    pub fn queue_extremes(&self, now: u64) -> (u64, u64) {
        let oldest = self
            .by_age
            .first()
            .map_or(0, |(first, _)| self.age_of(*first, now));
        let longest = self
            .by_length
            .first()
            .map_or(0, |(Reverse(len), _, _)| *len);
        (oldest, longest)
    }

    /// Moves a queued entry to `state` and returns its client handle.
    pub fn resolve(&mut self, id: WaiterId, state: WaitState) -> Option<BlockedClient> {
        let entry = self.entries.get_mut(&id)?;
        if entry.state != WaitState::Queued {
            return None;
        }
        entry.state = state;
        let client = entry.client.take();
        let (db, key, owner) = (entry.db, entry.key.clone(), who_key(entry.waiter.who()));
        let deadline = entry.deadline;
        self.unindex(id, db, &key, &owner, deadline);
        client
    }
}

/// Upper bounds (ms, inclusive) of the wait-time histogram's buckets; a wait above the last one
/// counts only in the total (`+Inf`).
pub const WAIT_BUCKETS_MS: [u64; 10] = [1, 5, 10, 50, 100, 500, 1_000, 5_000, 10_000, 60_000];

/// Upper bounds (ms, inclusive) of the hold-time histogram's buckets: the wait buckets, then 5
/// minutes and an hour, since leases kept alive by a watchdog run long.
pub const HOLD_BUCKETS_MS: [u64; 12] = [
    1, 5, 10, 50, 100, 500, 1_000, 5_000, 10_000, 60_000, 300_000, 3_600_000,
];

/// A histogram of durations (ms) with fixed bucket bounds: how many samples fell in each bucket
/// (each counted once, in the first bucket it fits; INFO shows them cumulative), how many in
/// all (the `+Inf` bucket) and their sum.
pub struct Histogram<const N: usize> {
    pub bounds: [u64; N],
    pub buckets: [Cell<u64>; N],
    pub count: Cell<u64>,
    pub sum: Cell<u64>,
}

impl<const N: usize> Histogram<N> {
    pub const fn new(bounds: [u64; N]) -> Self {
        Histogram {
            bounds,
            buckets: [const { Cell::new(0) }; N],
            count: Cell::new(0),
            sum: Cell::new(0),
        }
    }
}

/// The running totals and current-value figures of `INFO lock`.
pub struct Counters {
    pub grants: Cell<u64>,
    pub timeouts: Cell<u64>,
    pub expirations: Cell<u64>,
    /// Bound holds ended because their connection closed (or the server lost it).
    pub disconnects: Cell<u64>,
    /// Lock requests refused because waiting would have closed a cycle.
    pub deadlocks: Cell<u64>,
    /// Deadlock checks that ran out of `lock.deadlock-budget` (the request then waited).
    pub deadlock_checks_cut: Cell<u64>,
    /// Requests with WAIT refused because a waiter limit was reached (`-MAXWAITERS`).
    pub queue_full: Cell<u64>,
    /// Immediate grants to an owner that already held the lock, a subset of `grants`.
    pub reentries: Cell<u64>,
    /// LOCK.RELEASE calls that dropped or decremented a hold.
    pub releases: Cell<u64>,
    /// LOCK.EXTEND calls that changed a lease.
    pub extends: Cell<u64>,
    /// Grants given back because the waiter's connection closed before the reply reached it.
    pub given_back: Cell<u64>,
    /// Lock keys (held, with waiters or with a pending lock-delay) the server evicted.
    pub evictions: Cell<u64>,
    /// How long granted waiters waited: one sample per grant to a queued waiter, so its
    /// count is the hand-overs (a subset of `grants`).
    pub waits: Histogram<{ WAIT_BUCKETS_MS.len() }>,
    /// How long holds lasted when they ended by release, expiry or disconnect.
    pub holds: Histogram<{ HOLD_BUCKETS_MS.len() }>,
    pub locks_held: Cell<u64>,
    pub readers: Cell<u64>,
    pub writers: Cell<u64>,
    pub waiters: Cell<u64>,
    pub permits: Cell<u64>,
}

impl Counters {
    pub const fn new() -> Self {
        Counters {
            grants: Cell::new(0),
            timeouts: Cell::new(0),
            expirations: Cell::new(0),
            disconnects: Cell::new(0),
            deadlocks: Cell::new(0),
            deadlock_checks_cut: Cell::new(0),
            queue_full: Cell::new(0),
            reentries: Cell::new(0),
            releases: Cell::new(0),
            extends: Cell::new(0),
            given_back: Cell::new(0),
            evictions: Cell::new(0),
            waits: Histogram::new(WAIT_BUCKETS_MS),
            holds: Histogram::new(HOLD_BUCKETS_MS),
            locks_held: Cell::new(0),
            readers: Cell::new(0),
            writers: Cell::new(0),
            waiters: Cell::new(0),
            permits: Cell::new(0),
        }
    }
}

thread_local! {
    /// Lock values with waiters that were serialized (MIGRATE's or DUMP's payload, a SAVE on
    /// the main thread) since the current command started, by address (`moving`).
    static SERIALIZED: RefCell<HashSet<usize>> = RefCell::new(HashSet::new());
    /// Waiters answered TRYAGAIN because MIGRATE moved their key away (`moving`, INFO).
    static MIGRATED_WAITERS: Cell<u64> = const { Cell::new(0) };
}

pub fn with_serialized<R>(f: impl FnOnce(&mut HashSet<usize>) -> R) -> R {
    SERIALIZED.with(|s| f(&mut s.borrow_mut()))
}

/// Is `SERIALIZED` non-empty? Read before every command the server runs, so it is a plain
/// static (one load; a thread-local in a shared library costs a `__tls_get_addr` call). Only
/// the main thread uses it, as it does the thread-locals.
static ANY_SERIALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn any_serialized() -> bool {
    ANY_SERIALIZED.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn set_any_serialized(any: bool) {
    ANY_SERIALIZED.store(any, std::sync::atomic::Ordering::Relaxed);
}

thread_local! {
    /// Keys whose lock value left with holders or waiters in a cluster, to be checked when
    /// settled: did the slot go to another node (`settle`)?
    static UNLINKED: RefCell<BTreeSet<DbKey>> = const { RefCell::new(BTreeSet::new()) };
    /// Lock keys this node gave up because another node (or none) serves their slot (INFO).
    static SLOT_LOSSES: Cell<u64> = const { Cell::new(0) };
}

pub fn with_unlinked<R>(f: impl FnOnce(&mut BTreeSet<DbKey>) -> R) -> R {
    UNLINKED.with(|u| f(&mut u.borrow_mut()))
}

pub fn slot_losses() -> u64 {
    SLOT_LOSSES.with(|m| m.get())
}

pub fn add_slot_losses(n: u64) {
    SLOT_LOSSES.with(|m| m.set(m.get().saturating_add(n)));
}

pub fn migrated_waiters() -> u64 {
    MIGRATED_WAITERS.with(|m| m.get())
}

pub fn add_migrated_waiters(n: u64) {
    MIGRATED_WAITERS.with(|m| m.set(m.get().saturating_add(n)));
}

/// Grants to give back after a pause, per key: (owner, token) of each.
pub type GiveBacks = BTreeMap<DbKey, Vec<(Box<[u8]>, u64)>>;

/// Expiry timers deferred by a pause: (db, key, due).
pub type DeferredTimers = Vec<(i32, Box<[u8]>, u64)>;

thread_local! {
    /// Grants to give back once clients are no longer paused (`settle::give_back`): the
    /// connection closed before its grant's reply was sent, during a pause. Per key: (owner,
    /// token) of each such grant.
    static GIVE_BACK: RefCell<GiveBacks> = const { RefCell::new(BTreeMap::new()) };
    /// Expiry timers that came due while clients were paused (`timers`), as (db, key, due):
    /// one poll timer fires them when the pause ends.
    static DEFERRED_TIMERS: RefCell<DeferredTimers> = const { RefCell::new(Vec::new()) };
}

pub fn with_give_back<R>(f: impl FnOnce(&mut GiveBacks) -> R) -> R {
    GIVE_BACK.with(|g| f(&mut g.borrow_mut()))
}

pub fn with_deferred_timers<R>(f: impl FnOnce(&mut DeferredTimers) -> R) -> R {
    DEFERRED_TIMERS.with(|d| f(&mut d.borrow_mut()))
}
