//! The reference model for the lock core: the rules of SPEC.md written as plainly as
//! possible (vectors scanned linearly), and a driver that runs an operation sequence on both
//! [`Lock`] and the model, comparing them step by step and checking the safety invariants
//! after every step. Used by the property test (`model_tests`) and the cargo-fuzz target
//! (`fuzz/`), so both hunt with the same oracle.
//!
//! Version 2 options are in: an acquire may be bound to one of a few connections (`BIND`) and
//! carry a lock-delay (`LOCKDELAY`), and a connection may close ([`Op::Disconnect`]).
//!
//! Semaphores are in ([`Op::Permit`]): the same key may hold a lock, then (once it is gone) a
//! semaphore, then a lock again, and a request of the wrong kind or capacity is refused. The
//! model keeps the key's kind as a field of its own, set by the request that creates the key
//! and forgotten when the key goes away, rather than deriving it from the holders.

use std::collections::{HashMap, HashSet};

use super::*;

/// Owners are `o0`..`o4`.
pub const OWNERS: u8 = 5;

/// Connections a hold may be bound to are `0..CONNS`.
pub const CONNS: u64 = 3;

macro_rules! ensure {
    ($cond:expr) => {
        if !$cond {
            return Err(format!("failed: {}", stringify!($cond)));
        }
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr $(,)?) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{} != {}: {:?} vs {:?}", stringify!($a), stringify!($b), a, b));
        }
    }};
    ($a:expr, $b:expr, $($fmt:tt)+) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{:?} vs {:?}: {}", a, b, format!($($fmt)+)));
        }
    }};
}

#[derive(Clone, Debug)]
pub enum Op {
    Acquire {
        owner: u8,
        mode: Mode,
        ttl: Millis,
        wait: bool,
        /// `BIND`: the connection (`0..CONNS`) the request comes from, if it binds.
        bind: Option<u64>,
        /// `LOCKDELAY` (0 = none).
        lock_delay: Millis,
    },
    Release {
        owner: u8,
        all: bool,
    },
    Extend {
        owner: u8,
        ttl: Millis,
    },
    /// Time passes, then the expiry timer fires.
    Advance {
        ms: Millis,
    },
    /// The n-th (modulo) queued waiter times out or disconnects.
    Cancel {
        nth: usize,
    },
    /// Connection `conn` closes: the holds bound to it end ([`Lock::end_bound`]).
    Disconnect {
        conn: u64,
    },
    /// From now on every grant is refused (`on`), as while the server can evict lock keys
    /// with `lock.refuse-when-evictable`, or grants are allowed again.
    Refuse {
        on: bool,
    },
    /// LOCK.SEMACQUIRE: one permit of a semaphore of `capacity` (the key's, or on purpose
    /// another).
    Permit {
        owner: u8,
        capacity: u32,
        ttl: Millis,
        wait: bool,
        bind: Option<u64>,
        /// A LOCKDELAY handed to the core with the request (parsing refuses it on
        /// LOCK.SEMACQUIRE): a permit must never get it.
        lock_delay: Millis,
    },
}

/// What one run exercised (see [`run_with_stats`]), summed over runs by the coverage test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub ops: u64,
    pub permit_requests: u64,
    /// Permits granted at once to an owner that held none.
    pub permits_direct: u64,
    /// Permits granted at once to an owner that held some (nobody queued, one free).
    pub extra_permits_direct: u64,
    /// Permits granted to queued waiters (count 1 or more).
    pub permits_from_queue: u64,
    /// Of those, to an owner that already held permits.
    pub extra_permits_from_queue: u64,
    /// Permits granted to waiters by a release of one permit (the owner keeps others).
    pub served_by_partial_release: u64,
    pub permits_queued: u64,
    pub permits_busy: u64,
    /// Permit requests on a lock key (WrongKind).
    pub permits_on_locks: u64,
    /// Lock requests on a semaphore key (WrongKind).
    pub locks_on_semaphores: u64,
    pub capacity_mismatch: u64,
    /// A key that became a semaphore after being a lock, or a lock after being a semaphore.
    pub kind_switches: u64,
    /// Steps that ended with every permit of the semaphore held.
    pub full: u64,
    /// Permit holders that expired or were disconnected.
    pub permit_holds_ended: u64,
    /// Requests refused at once because grants were refused (either reason).
    pub refused_direct: u64,
    /// Waiters refused when their turn came, because the counter was at its end.
    pub refused_exhausted: u64,
    /// Waiters refused when their turn came, because every grant was refused.
    pub refused_evictable: u64,
    /// Waiters granted from the queue while the counter was at its end (a re-entry or an
    /// extra permit, which needs no token).
    pub granted_at_end: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct MHolder {
    owner: u8,
    mode: Mode,
    /// The semaphore's capacity for a permit, 0 for a lock.
    capacity: u32,
    /// Reentrancy count, or permits held.
    count: u64,
    expires_at: Millis,
    token: u64,
    bound_to: Option<u64>,
    /// Always 0 for a reader.
    lock_delay: Millis,
}

#[derive(Clone, Debug, PartialEq)]
struct MWaiter {
    id: u64,
    owner: u8,
    mode: Mode,
    /// The capacity a permit request named, 0 for a lock request.
    capacity: u32,
    ttl: Millis,
    bound_to: Option<u64>,
    lock_delay: Millis,
}

/// What the lock reports besides direct answers ([`Event`] without `Updated`).
#[derive(Clone, Debug, PartialEq)]
enum MEvent {
    Granted {
        id: u64,
        owner: u8,
        mode: Mode,
        token: u64,
        count: u64,
        expires_at: Millis,
    },
    Expired {
        owner: u8,
        mode: Mode,
    },
    Disconnected {
        owner: u8,
        mode: Mode,
    },
    DelayStarted {
        until: Millis,
    },
    DelayEnded,
    Refused {
        id: u64,
        reason: Refusal,
    },
}

/// The reference: the rules of SPEC.md written as plainly as possible.
struct Model {
    /// What the key is: set by the request that creates it, kept while it exists (holders,
    /// waiters or a lock-delay), forgotten when it goes away ([`Model::forget_if_gone`]).
    kind: Kind,
    holders: Vec<MHolder>,
    queue: Vec<MWaiter>,
    last_token: u64,
    /// The end of the pending lock-delay, 0 when none. Every operation first ends a delay
    /// that is over ([`Model::expire`]), so while it is not 0 nobody may be granted.
    delay_until: Millis,
    /// Everything reported since the driver last looked, in order.
    events: Vec<MEvent>,
    /// Every grant is refused ([`Op::Refuse`]).
    refusing: bool,
    /// The last token the counter may issue.
    end: u64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            kind: Kind::Fresh,
            holders: Vec::new(),
            queue: Vec::new(),
            last_token: 0,
            delay_until: 0,
            events: Vec::new(),
            refusing: false,
            end: MAX_EXACT_TOKEN,
        }
    }
}

impl Model {
    fn holding(&self, owner: u8) -> Option<usize> {
        self.holders.iter().position(|h| h.owner == owner)
    }

    fn all_read(&self) -> bool {
        self.holders.iter().all(|h| h.mode == Mode::Read)
    }

    fn new_hold(&mut self, w: &MWaiter, now: Millis) -> u64 {
        self.last_token += 1;
        self.holders.push(MHolder {
            owner: w.owner,
            mode: w.mode,
            capacity: if w.mode == Mode::Permit {
                w.capacity
            } else {
                0
            },
            count: 1,
            expires_at: now + w.ttl,
            token: self.last_token,
            bound_to: w.bound_to,
            // LOCKDELAY is for exclusive holds only.
            lock_delay: if w.mode == Mode::Write {
                w.lock_delay
            } else {
                0
            },
        });
        self.last_token
    }

    /// Permits held: the sum of the holders' counts.
    fn permits_held(&self) -> u64 {
        self.holders.iter().map(|h| h.count).sum()
    }

    /// The key went away (no holder, nobody queued, no delay): the next request decides what
    /// it is.
    fn forget_if_gone(&mut self) {
        if self.holders.is_empty() && self.queue.is_empty() && self.delay_until == 0 {
            self.kind = Kind::Fresh;
        }
    }

    /// Grants `w` now: one more count (permit) for an owner that holds, with its expiry reset
    /// and its token kept; else a new hold. Returns the token and the count. Refused when
    /// every grant is, or when a new hold would need a token past the counter's end.
    fn grant(&mut self, w: &MWaiter, now: Millis) -> Result<(u64, u64), Refusal> {
        if self.refusing {
            return Err(Refusal::Evictable);
        }
        match self.holding(w.owner) {
            // A re-entry or an extra permit: the hold keeps the options it was created with.
            Some(i) => {
                let h = &mut self.holders[i];
                h.count += 1;
                h.expires_at = now + w.ttl;
                Ok((h.token, h.count))
            }
            None if self.last_token >= self.end => Err(Refusal::TokensExhausted),
            None => Ok((self.new_hold(w, now), 1)),
        }
    }

    fn head_grantable(&self) -> bool {
        let Some(w) = self.queue.first() else {
            return false;
        };
        if self.delay_until != 0 {
            return false;
        }
        let own = self.holding(w.owner).map(|i| &self.holders[i]);
        match w.mode {
            Mode::Write => {
                self.holders.is_empty()
                    || (self.holders.len() == 1 && own.is_some_and(|h| h.mode == Mode::Write))
            }
            Mode::Read => {
                self.holders.is_empty()
                    || self.all_read()
                    || own.is_some_and(|h| h.mode == Mode::Write)
            }
            // A free permit; the head's own permits count like anyone's.
            Mode::Permit => self.permits_held() < u64::from(w.capacity),
        }
    }

    fn serve(&mut self, now: Millis) {
        while self.head_grantable() {
            let w = self.queue.remove(0);
            match self.grant(&w, now) {
                Ok((token, count)) => self.events.push(MEvent::Granted {
                    id: w.id,
                    owner: w.owner,
                    mode: w.mode,
                    token,
                    count,
                    expires_at: now + w.ttl,
                }),
                Err(reason) => self.events.push(MEvent::Refused { id: w.id, reason }),
            }
        }
    }

    /// Nobody may be granted before `until` (an exclusive hold with LOCKDELAY ended).
    fn start_delay(&mut self, until: Millis) {
        if until > self.delay_until {
            self.delay_until = until;
            self.events.push(MEvent::DelayStarted { until });
        }
    }

    /// Drops the holders whose expiry has passed (earliest first), ends a delay that is over,
    /// serves the queue. A delay counts from the expiry, not from now.
    fn expire(&mut self, now: Millis) {
        let mut due: Vec<MHolder> = self
            .holders
            .iter()
            .filter(|h| h.expires_at <= now)
            .cloned()
            .collect();
        due.sort_by_key(|h| (h.expires_at, h.owner));
        self.holders.retain(|h| h.expires_at > now);
        for h in due {
            self.events.push(MEvent::Expired {
                owner: h.owner,
                mode: h.mode,
            });
            if h.mode == Mode::Write && h.lock_delay > 0 {
                self.start_delay(h.expires_at + h.lock_delay);
            }
        }
        if self.delay_until != 0 && self.delay_until <= now {
            self.delay_until = 0;
            self.events.push(MEvent::DelayEnded);
        }
        self.serve(now);
        self.forget_if_gone();
    }

    fn acquire(&mut self, w: MWaiter, wait: bool, now: Millis) -> Acquired {
        self.expire(now);
        match self.kind {
            Kind::Semaphore(_) => return Acquired::WrongKind,
            Kind::Fresh | Kind::Lock => self.kind = Kind::Lock,
        }
        if let Some(i) = self.holding(w.owner) {
            // A re-entry: options are ignored.
            let h = &mut self.holders[i];
            if h.mode == Mode::Read && w.mode == Mode::Write {
                return Acquired::Deadlock;
            }
            if self.refusing {
                return Acquired::Refused(Refusal::Evictable);
            }
            let h = &mut self.holders[i];
            h.count += 1;
            h.expires_at = now + w.ttl;
            return Acquired::Granted {
                token: h.token,
                count: h.count,
            };
        }
        let fits = self.delay_until == 0
            && (self.holders.is_empty() || (w.mode == Mode::Read && self.all_read()));
        if self.queue.is_empty() && fits {
            return match self.grant(&w, now) {
                Ok((token, count)) => Acquired::Granted { token, count },
                Err(reason) => {
                    self.forget_if_gone();
                    Acquired::Refused(reason)
                }
            };
        }
        if wait {
            self.queue.push(w);
            Acquired::Queued
        } else {
            // Never on a fresh key, but the key must not stay made.
            self.forget_if_gone();
            Acquired::Busy
        }
    }

    /// One permit: granted when one is free and nobody is queued (an owner that holds some
    /// waits its turn like anyone), else queued or busy.
    fn permit(&mut self, w: MWaiter, wait: bool, now: Millis) -> Acquired {
        self.expire(now);
        match self.kind {
            Kind::Lock => return Acquired::WrongKind,
            Kind::Semaphore(c) if c != w.capacity => return Acquired::CapacityMismatch,
            Kind::Semaphore(_) | Kind::Fresh => self.kind = Kind::Semaphore(w.capacity),
        }
        if self.queue.is_empty() && self.permits_held() < u64::from(w.capacity) {
            return match self.grant(&w, now) {
                Ok((token, count)) => Acquired::Granted { token, count },
                Err(reason) => {
                    self.forget_if_gone();
                    Acquired::Refused(reason)
                }
            };
        }
        if wait {
            self.queue.push(w);
            Acquired::Queued
        } else {
            // Never on a fresh key (a permit is free there), but the key must not stay made.
            self.forget_if_gone();
            Acquired::Busy
        }
    }

    /// A release never leaves a lock-delay. Whatever it frees (a lock, or one permit of
    /// several) goes to the queue at once.
    fn release(&mut self, owner: u8, all: bool, now: Millis) -> Result<u64, NotOwner> {
        self.expire(now);
        let i = self.holding(owner).ok_or(NotOwner)?;
        let h = &mut self.holders[i];
        h.count = if all { 0 } else { h.count - 1 };
        let left = h.count;
        if left == 0 {
            self.holders.remove(i);
        }
        self.serve(now);
        self.forget_if_gone();
        Ok(left)
    }

    fn extend(&mut self, owner: u8, ttl: Millis, now: Millis) -> Result<Millis, NotOwner> {
        self.expire(now);
        let i = self.holding(owner).ok_or(NotOwner)?;
        self.holders[i].expires_at = now + ttl;
        Ok(now + ttl)
    }

    fn cancel(&mut self, id: u64, now: Millis) {
        self.queue.retain(|w| w.id != id);
        self.expire(now);
        self.serve(now);
        self.forget_if_gone();
    }

    /// Connection `conn` closed: every hold bound to it ends as by RELEASE ALL, except that an
    /// exclusive one with LOCKDELAY leaves a delay from now. Returns how many holds ended.
    fn disconnect(&mut self, conn: u64, now: Millis) -> usize {
        self.expire(now);
        let mut ending: Vec<MHolder> = self
            .holders
            .iter()
            .filter(|h| h.bound_to == Some(conn))
            .cloned()
            .collect();
        ending.sort_by_key(|h| h.owner);
        self.holders.retain(|h| h.bound_to != Some(conn));
        for h in &ending {
            self.events.push(MEvent::Disconnected {
                owner: h.owner,
                mode: h.mode,
            });
            if h.mode == Mode::Write && h.lock_delay > 0 {
                self.start_delay(now + h.lock_delay);
            }
        }
        self.serve(now);
        self.forget_if_gone();
        ending.len()
    }

    /// When the timer must fire: the end of the delay, or the earliest holder's expiry.
    fn next_expiry(&self) -> Option<Millis> {
        if self.delay_until != 0 {
            return Some(self.delay_until);
        }
        self.holders.iter().map(|h| h.expires_at).min()
    }

    /// The key's Redis expiry: the end of the delay, or the latest holder's expiry plus the
    /// delay it would leave.
    fn last_expiry(&self) -> Option<Millis> {
        if self.delay_until != 0 {
            return Some(self.delay_until);
        }
        self.holders
            .iter()
            .map(|h| h.expires_at + h.lock_delay)
            .max()
    }
}

fn owner_bytes(o: u8) -> [u8; 2] {
    [b'o', b'0' + o]
}

/// The options a new hold gets from a request: LOCKDELAY is dropped for a shared one.
fn hold_options(mode: Mode, asked: HoldOptions) -> HoldOptions {
    HoldOptions {
        user: crate::UNKNOWN_USER,
        bound_to: asked.bound_to,
        lock_delay: if mode == Mode::Write {
            asked.lock_delay
        } else {
            0
        },
    }
}

/// Checks the safety invariants of the real lock.
pub fn check_invariants(lock: &Lock, now: Millis) -> Result<(), String> {
    let holders: Vec<_> = lock.holders().iter().collect();
    let writers = holders
        .iter()
        .filter(|(_, h)| h.mode == Mode::Write)
        .count();
    ensure!(writers <= 1, "two writers: {holders:?}");
    if writers == 1 {
        ensure_eq!(
            holders.len(),
            1,
            "a writer beside another holder: {:?}",
            holders
        );
    }
    for (owner, h) in &holders {
        ensure!(h.count >= 1, "{owner:?} count 0");
        ensure!(h.expires_at > now, "{owner:?} outlived its expiry");
        if h.mode != Mode::Write {
            ensure_eq!(
                h.options.get().lock_delay,
                0,
                "{owner:?} holds {:?} with a delay",
                h.mode
            );
        }
    }

    // Semaphores: permits only beside permits of the same capacity, never more than it.
    let sum: u64 = holders.iter().map(|(_, h)| h.count).sum();
    ensure_eq!(
        lock.holders().total_count(),
        sum,
        "total_count is not the sum of the counts: {holders:?}"
    );
    let permits = holders
        .iter()
        .filter(|(_, h)| h.mode == Mode::Permit)
        .count();
    if permits > 0 {
        ensure_eq!(
            permits,
            holders.len(),
            "permits beside lock holders: {:?}",
            holders
        );
    }
    for (owner, h) in &holders {
        if h.mode == Mode::Permit {
            let capacity = holders[0].1.capacity;
            ensure!(
                h.capacity == capacity && capacity >= 1,
                "{owner:?} holds a permit of capacity {} beside capacity {capacity}",
                h.capacity
            );
            ensure!(
                sum <= u64::from(capacity),
                "{sum} permits held of {capacity}: {holders:?}"
            );
        } else {
            ensure_eq!(h.capacity, 0, "{owner:?} holds a lock with a capacity");
        }
    }

    // The key's kind: what its holders are, else its waiters, else a lock while a delay is
    // pending; every waiter agrees with it.
    let kind = lock.kind();
    match holders.first() {
        Some((_, h)) if h.mode == Mode::Permit => {
            ensure_eq!(kind, Kind::Semaphore(h.capacity), "kind of a semaphore")
        }
        Some(_) => ensure_eq!(kind, Kind::Lock, "kind of a held lock"),
        None if lock.queue().is_empty() && lock.delay_until() == 0 => {
            ensure_eq!(kind, Kind::Fresh, "kind of an empty key")
        }
        None if lock.queue().is_empty() => ensure_eq!(kind, Kind::Lock, "kind with a delay"),
        None => {}
    }
    for (id, w) in lock.queue().iter() {
        let fits = match kind {
            Kind::Semaphore(c) => w.mode == Mode::Permit && w.capacity == c,
            Kind::Lock => w.mode != Mode::Permit && w.capacity == 0,
            Kind::Fresh => false,
        };
        ensure!(
            fits,
            "waiter {} ({:?}, capacity {}) queued on a key of kind {kind:?}",
            id.0,
            w.mode,
            w.capacity
        );
    }
    let delay = lock.delay_until();
    if delay != 0 {
        ensure!(holders.is_empty(), "lock-delay beside holders: {holders:?}");
        ensure!(
            delay > now,
            "lock-delay until {delay} still pending at {now}"
        );
        ensure!(
            !lock.is_empty(),
            "a lock with a pending delay counts as empty"
        );
    }
    if let Some((_, head)) = lock.queue().head() {
        ensure!(
            !holders.is_empty() || delay != 0,
            "waiters queued behind a free lock"
        );
        let own = lock.holders().get(&head.owner);
        let grantable = match head.mode {
            Mode::Write => own.is_some_and(|h| h.mode == Mode::Write),
            Mode::Read => {
                lock.mode() == Some(Mode::Read) || own.is_some_and(|h| h.mode == Mode::Write)
            }
            Mode::Permit => lock.holders().total_count() < u64::from(head.capacity),
        };
        ensure!(!grantable, "queue head left waiting although grantable");
    }
    Ok(())
}

/// Sorts each run of consecutive `Disconnected` events, and each run of consecutive `Expired`
/// events, by owner: holds that end in one operation (at one connection's close, or all due
/// at one look at the clock) may be reported in any order, which nothing downstream observes
/// (the module sorts the owners it replicates, and a keyspace event names only the key).
fn sort_simultaneous_ends(events: &mut [MEvent]) {
    let key = |e: &MEvent| match e {
        MEvent::Disconnected { owner, .. } => Some((0, *owner)),
        MEvent::Expired { owner, .. } => Some((1, *owner)),
        _ => None,
    };
    let mut start = 0;
    while start < events.len() {
        let kind = key(&events[start]).map(|k| k.0);
        let mut end = start;
        while end < events.len() && kind.is_some() && key(&events[end]).map(|k| k.0) == kind {
            end += 1;
        }
        events[start..end].sort_by_key(key);
        start = end.max(start + 1);
    }
}

/// Runs `ops` on a [`Lock`] and on the model; `Err` describes the first divergence or broken
/// invariant.
pub fn run(ops: &[Op]) -> Result<(), String> {
    run_with_stats(ops, &mut Stats::default())
}

/// [`run`], adding what the run exercised to `stats`.
pub fn run_with_stats(ops: &[Op], stats: &mut Stats) -> Result<(), String> {
    run_from(ops, 0, stats)
}

/// [`run_with_stats`] with a fencing counter that has already issued `start` (close to its
/// end, so that runs reach it).
pub fn run_from(ops: &[Op], start: u64, stats: &mut Stats) -> Result<(), String> {
    let mut lock = Lock::new();
    let mut fences = FenceCounter::default();
    let _ = fences.observe(start);
    let mut model = Model {
        last_token: start,
        end: fences.end(),
        ..Model::default()
    };
    let mut refused_ids = HashSet::new();
    let mut now: Millis = 100;
    let mut next_id = 1u64;
    let mut max_token = 0u64;
    let mut last_granted_id = 0u64;
    let mut granted_ids = HashSet::new();
    let mut cancelled = HashSet::new();
    // The options each queued request's hold must get, by waiter id.
    let mut asked: HashMap<u64, HoldOptions> = HashMap::new();
    // The options every hold was created with, by its token: they never change.
    let mut created: HashMap<u64, HoldOptions> = HashMap::new();
    // Each holder's token as the replies and events tell it: a new hold brings a fresh one, a
    // re-entry or an extra permit the owner's own; it must match the lock's holders.
    let mut tokens: HashMap<u8, u64> = HashMap::new();
    // The last kind the key had (Fresh is skipped), to count the switches.
    let mut last_kind = Kind::Fresh;

    for (n, op) in ops.iter().cloned().enumerate() {
        let delay_before = lock.delay_until();
        let mut events = Vec::new();
        let mut step = Step {
            now,
            fences: &mut fences,
            events: &mut events,
            refuse: model.refusing.then_some(Refusal::Evictable),
        };
        stats.ops += 1;
        // A grant in reply: the owner, token, count and the options a new hold must have.
        let mut direct = None;
        // A release that left the owner holding (one permit of several freed).
        let mut partial_release = false;
        match op {
            Op::Acquire {
                owner,
                mode,
                ttl,
                wait,
                bind,
                lock_delay,
            } => {
                let id = wait.then(|| {
                    next_id += 1;
                    next_id
                });
                let options = HoldOptions {
                    user: crate::UNKNOWN_USER,
                    bound_to: bind,
                    lock_delay,
                };
                let req = Request {
                    owner: &owner_bytes(owner),
                    mode,
                    ttl,
                    options,
                    capacity: 0,
                };
                let got = lock.request(req, id.map(WaiterId), &mut step);
                let waiter = MWaiter {
                    id: id.unwrap_or(0),
                    owner,
                    mode,
                    capacity: 0,
                    ttl,
                    bound_to: bind,
                    lock_delay,
                };
                let want = model.acquire(waiter, wait, now);
                ensure_eq!(got, want, "op {n}: {op:?}");
                match got {
                    Acquired::Granted { token, count } => {
                        direct = Some((owner, token, count, hold_options(mode, options)));
                    }
                    Acquired::Queued => {
                        if let Some(id) = id {
                            asked.insert(id, hold_options(mode, options));
                        }
                    }
                    Acquired::WrongKind => stats.locks_on_semaphores += 1,
                    Acquired::Refused(_) => stats.refused_direct += 1,
                    _ => {}
                }
            }
            Op::Permit {
                owner,
                capacity,
                ttl,
                wait,
                bind,
                lock_delay,
            } => {
                stats.permit_requests += 1;
                let id = wait.then(|| {
                    next_id += 1;
                    next_id
                });
                let options = HoldOptions {
                    user: crate::UNKNOWN_USER,
                    bound_to: bind,
                    lock_delay,
                };
                let req = Request {
                    owner: &owner_bytes(owner),
                    mode: Mode::Permit,
                    ttl,
                    options,
                    capacity,
                };
                let got = lock.request(req, id.map(WaiterId), &mut step);
                let waiter = MWaiter {
                    id: id.unwrap_or(0),
                    owner,
                    mode: Mode::Permit,
                    capacity,
                    ttl,
                    bound_to: bind,
                    lock_delay,
                };
                let want = model.permit(waiter, wait, now);
                ensure_eq!(got, want, "op {n}: {op:?}");
                match got {
                    Acquired::Granted { token, count } => {
                        if count == 1 {
                            stats.permits_direct += 1;
                        } else {
                            stats.extra_permits_direct += 1;
                        }
                        direct = Some((owner, token, count, hold_options(Mode::Permit, options)));
                    }
                    Acquired::Queued => {
                        stats.permits_queued += 1;
                        if let Some(id) = id {
                            asked.insert(id, hold_options(Mode::Permit, options));
                        }
                    }
                    Acquired::Busy => stats.permits_busy += 1,
                    Acquired::WrongKind => stats.permits_on_locks += 1,
                    Acquired::CapacityMismatch => stats.capacity_mismatch += 1,
                    Acquired::Refused(_) => stats.refused_direct += 1,
                    Acquired::Deadlock | Acquired::CountOverflow => {}
                }
            }
            Op::Release { owner, all } => {
                let got = lock.release(&owner_bytes(owner), all, &mut step);
                ensure_eq!(got, model.release(owner, all, now), "op {n}: {op:?}");
                match got {
                    // The owner's hold is gone (it had not expired: it answered).
                    Ok(0) => {
                        tokens.remove(&owner);
                    }
                    Ok(_) => partial_release = true,
                    Err(NotOwner) => {}
                }
            }
            Op::Extend { owner, ttl } => {
                let got = lock.extend(&owner_bytes(owner), ttl, &mut step);
                ensure_eq!(got, model.extend(owner, ttl, now), "op {n}: {op:?}");
            }
            Op::Advance { ms } => {
                now += ms;
                step.now = now;
                lock.expire(&mut step);
                model.expire(now);
            }
            Op::Cancel { nth } => {
                let ids: Vec<WaiterId> = lock.queue().iter().map(|(id, _)| id).collect();
                if !ids.is_empty() {
                    let id = ids[nth % ids.len()];
                    ensure!(lock.cancel_waiter(id, &mut step).is_some());
                    model.cancel(id.0, now);
                    cancelled.insert(id.0);
                }
            }
            Op::Disconnect { conn } => {
                let got = lock.end_bound(|c| c == conn, &mut step);
                ensure_eq!(got, model.disconnect(conn, now), "op {n}: {op:?}");
            }
            Op::Refuse { on } => model.refusing = on,
        }
        let exhausted = fences.exhausted();

        // Walk the events in order, following the lock-delay they report: no grant while it
        // is pending, no end before its time, and it ends up where the lock says.
        let mut pending = delay_before;
        let mut new_holds = Vec::new();
        let mut reported = Vec::new();
        for e in &events {
            match e {
                Event::Granted {
                    waiter,
                    owner,
                    mode,
                    token,
                    count,
                    expires_at,
                } => {
                    ensure!(
                        pending == 0,
                        "op {n}: waiter {} granted at {now} during a lock-delay until {pending}",
                        waiter.0
                    );
                    ensure!(waiter.0 > last_granted_id, "grant out of queue order");
                    last_granted_id = waiter.0;
                    ensure!(granted_ids.insert(waiter.0), "waiter granted twice");
                    ensure!(!cancelled.contains(&waiter.0), "cancelled waiter granted");
                    ensure!(!refused_ids.contains(&waiter.0), "refused waiter granted");
                    if exhausted && *count > 1 {
                        stats.granted_at_end += 1;
                    }
                    let o = owner[1] - b'0';
                    if *count == 1 {
                        ensure!(*token > max_token, "token did not increase");
                        max_token = *token;
                        let options = asked
                            .get(&waiter.0)
                            .copied()
                            .ok_or_else(|| format!("unknown waiter {} granted", waiter.0))?;
                        new_holds.push((*token, options));
                        ensure!(
                            tokens.insert(o, *token).is_none(),
                            "op {n}: o{o} granted a new hold while holding"
                        );
                    } else {
                        ensure_eq!(
                            tokens.get(&o),
                            Some(token),
                            "op {n}: o{o}'s token changed with count {count}"
                        );
                    }
                    if *mode == Mode::Permit {
                        stats.permits_from_queue += 1;
                        if *count > 1 {
                            stats.extra_permits_from_queue += 1;
                        }
                        if partial_release {
                            stats.served_by_partial_release += 1;
                        }
                    }
                    reported.push(MEvent::Granted {
                        id: waiter.0,
                        owner: owner[1] - b'0',
                        mode: *mode,
                        token: *token,
                        count: *count,
                        expires_at: *expires_at,
                    });
                }
                Event::Expired { owner, mode } | Event::Disconnected { owner, mode } => {
                    let o = owner[1] - b'0';
                    ensure!(
                        tokens.remove(&o).is_some(),
                        "op {n}: o{o} ended a hold it did not have"
                    );
                    if *mode == Mode::Permit {
                        stats.permit_holds_ended += 1;
                    }
                    reported.push(match e {
                        Event::Expired { .. } => MEvent::Expired {
                            owner: o,
                            mode: *mode,
                        },
                        _ => MEvent::Disconnected {
                            owner: o,
                            mode: *mode,
                        },
                    });
                }
                Event::DelayStarted { until } => {
                    ensure!(
                        *until > pending,
                        "op {n}: delay until {until} started while one until {pending} is pending"
                    );
                    pending = *until;
                    reported.push(MEvent::DelayStarted { until: *until });
                }
                Event::DelayEnded => {
                    ensure!(
                        pending != 0 && pending <= now,
                        "op {n}: delay until {pending} ended at {now}"
                    );
                    pending = 0;
                    reported.push(MEvent::DelayEnded);
                }
                Event::Refused { waiter, reason } => {
                    ensure!(
                        waiter.0 > last_granted_id,
                        "op {n}: waiter {} refused out of queue order",
                        waiter.0
                    );
                    last_granted_id = waiter.0;
                    ensure!(
                        refused_ids.insert(waiter.0) && !granted_ids.contains(&waiter.0),
                        "op {n}: waiter {} answered twice",
                        waiter.0
                    );
                    ensure!(!cancelled.contains(&waiter.0), "cancelled waiter refused");
                    match reason {
                        Refusal::TokensExhausted => {
                            ensure!(exhausted, "op {n}: refused for a counter not at its end");
                            stats.refused_exhausted += 1;
                        }
                        Refusal::Evictable => stats.refused_evictable += 1,
                    }
                    reported.push(MEvent::Refused {
                        id: waiter.0,
                        reason: *reason,
                    });
                }
                Event::Updated { .. } | Event::BoundEnded { .. } | Event::HoldEnded { .. } => {}
            }
        }
        if let Some((owner, token, count, options)) = direct {
            ensure!(
                pending == 0,
                "op {n}: granted directly at {now} during a lock-delay until {pending}"
            );
            if count == 1 {
                ensure!(token > max_token, "token did not increase");
                max_token = token;
                new_holds.push((token, options));
                ensure!(
                    tokens.insert(owner, token).is_none(),
                    "op {n}: o{owner} granted a new hold while holding"
                );
            } else {
                ensure_eq!(
                    tokens.get(&owner),
                    Some(&token),
                    "op {n}: o{owner}'s token changed with count {count}"
                );
            }
        }
        ensure_eq!(
            pending,
            lock.delay_until(),
            "op {n}: the delay events disagree with the lock"
        );
        sort_simultaneous_ends(&mut reported);
        let mut expected = std::mem::take(&mut model.events);
        sort_simultaneous_ends(&mut expected);
        ensure_eq!(reported, expected, "op {n}: {op:?}, events");

        // Every hold has the options its request asked for (a bound waiter's its own
        // connection), and keeps them through re-entries.
        for (token, options) in new_holds {
            ensure!(
                created.insert(token, options).is_none(),
                "token {token} granted twice"
            );
        }
        for (owner, h) in lock.holders().iter() {
            let want = created
                .get(&h.token)
                .ok_or_else(|| format!("{owner:?} holds token {} never granted", h.token))?;
            ensure_eq!(
                h.options.get(),
                *want,
                "op {n}: options of {} (token {})",
                String::from_utf8_lossy(owner),
                h.token
            );
        }

        // Same holders, queue, delay and expiries as the model.
        let mut got: Vec<MHolder> = lock
            .holders()
            .iter()
            .map(|(o, h)| MHolder {
                owner: o[1] - b'0',
                mode: h.mode,
                capacity: h.capacity,
                count: h.count,
                expires_at: h.expires_at,
                token: h.token,
                bound_to: h.options.get().bound_to,
                lock_delay: h.options.get().lock_delay,
            })
            .collect();
        got.sort_by_key(|h| h.owner);
        let mut want = model.holders.clone();
        want.sort_by_key(|h| h.owner);
        ensure_eq!(got, want, "op {n}: {op:?}, holders");
        let queue: Vec<MWaiter> = lock
            .queue()
            .iter()
            .map(|(id, w)| MWaiter {
                id: id.0,
                owner: w.owner[1] - b'0',
                mode: w.mode,
                capacity: w.capacity,
                ttl: w.ttl,
                bound_to: w.options.bound_to,
                lock_delay: w.options.lock_delay,
            })
            .collect();
        ensure_eq!(queue, model.queue, "op {n}: {op:?}, queue");
        ensure_eq!(lock.kind(), model.kind, "op {n}: {op:?}, kind");
        let held: HashMap<u8, u64> = lock
            .holders()
            .iter()
            .map(|(o, h)| (o[1] - b'0', h.token))
            .collect();
        ensure_eq!(held, tokens, "op {n}: {op:?}, the holders' tokens");
        match (last_kind, model.kind) {
            (_, Kind::Fresh) => {}
            (Kind::Lock, Kind::Semaphore(_)) | (Kind::Semaphore(_), Kind::Lock) => {
                stats.kind_switches += 1;
                last_kind = model.kind;
            }
            _ => last_kind = model.kind,
        }
        if let Kind::Semaphore(c) = model.kind {
            if model.permits_held() == u64::from(c) {
                stats.full += 1;
            }
        }
        ensure_eq!(
            lock.delay_until(),
            model.delay_until,
            "op {n}: {op:?}, delay"
        );
        ensure_eq!(
            lock.next_expiry(),
            model.next_expiry(),
            "op {n}: next_expiry"
        );
        ensure_eq!(
            lock.last_expiry(),
            model.last_expiry(),
            "op {n}: last_expiry"
        );
        ensure_eq!(
            lock.is_empty(),
            model.holders.is_empty() && model.queue.is_empty() && model.delay_until == 0,
            "op {n}: is_empty"
        );
        check_invariants(&lock, now).map_err(|e| format!("op {n}: {op:?}: {e}"))?;
    }
    Ok(())
}

/// Decodes fuzzer bytes into operations (4 bytes per operation: kind, owner, flags, value).
/// An acquire's flags byte holds its mode (bit 0), WAIT (bit 1), BIND (bits 2-3: 0 none, else
/// connection 0..3) and LOCKDELAY (bits 4-7: 0 below 8, else 5 to 40 ms). A permit request's
/// holds WAIT and BIND alike, a LOCKDELAY of 20 ms that must be ignored (bit 0), and the
/// capacity (bits 4-5: 2, 2, 1 or 3; so a key's capacity is mostly 2 and sometimes another is
/// asked for).
pub fn decode(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .map(|c| {
            let (kind, a, b, d) = (c[0] % 14, c[1], c[2], c[3]);
            let bind = match (b >> 2) & 3 {
                0 => None,
                conn => Some(u64::from(conn - 1)),
            };
            let owner = a % OWNERS;
            let mode = if b & 1 == 0 { Mode::Write } else { Mode::Read };
            match kind {
                0..=3 => Op::Acquire {
                    owner,
                    mode,
                    ttl: 1 + u64::from(d % 60),
                    wait: b & 2 != 0,
                    bind,
                    lock_delay: match b >> 4 {
                        0..=7 => 0,
                        x => 5 * u64::from(x - 7),
                    },
                },
                4..=6 => Op::Release {
                    owner,
                    all: b & 4 != 0,
                },
                7 => Op::Extend {
                    owner,
                    ttl: 1 + u64::from(d % 60),
                },
                8 | 9 => Op::Advance {
                    ms: u64::from(d % 40),
                },
                10 => Op::Cancel {
                    nth: usize::from(d),
                },
                11 => Op::Disconnect {
                    conn: u64::from(d) % CONNS,
                },
                _ => Op::Permit {
                    owner,
                    capacity: match (b >> 4) & 3 {
                        0 | 1 => 2,
                        2 => 1,
                        _ => 3,
                    },
                    ttl: 1 + u64::from(d % 60),
                    wait: b & 2 != 0,
                    bind,
                    lock_delay: if b & 1 != 0 { 20 } else { 0 },
                },
            }
        })
        .collect()
}
