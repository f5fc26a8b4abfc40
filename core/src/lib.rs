//! The lock state machine of the redis-lock module: plain Rust, no Redis types, the clock
//! passed in. Beside it, the two codecs that must agree with it: argument parsing ([`parse`])
//! and the `LOCK.SYNC` replication state ([`sync`]). The module, the fuzz targets and the tests
//! all use this crate by name.
//!
//! A [`Lock`] is what one Redis key holds: its holders (each with a mode, a reentrancy count,
//! an absolute expiry and a fencing token) and the FIFO queue of waiters. Every operation
//! takes a [`Step`] carrying the current time, the module's fencing counter and a list that
//! collects what happened besides the direct answer (waiters granted, holders expired). The
//! Redis side turns those [`Event`]s into replies to blocked clients, notifications and
//! statistics; nothing here knows about clients, keys or timers.
//!
//! The grant rule (see [`Lock::grant_waiters`]): the head of the queue is served as soon as it
//! is compatible with the current holders; a reader at the head brings in every reader behind
//! it up to the next queued writer. New requests never overtake the queue, except holders
//! re-entering a lock they already hold.

mod cycle_search;
// The first, exhaustive deadlock check: kept only as the reference the bounded search
// (`cycle_search`) is tested against.
#[cfg(test)]
mod deadlock_reference;
mod holders;
mod indexed;
pub mod parse;
mod queue;
pub mod stored;
pub mod sync;

#[cfg(test)]
mod model_tests;
#[cfg(any(test, feature = "reference"))]
pub mod reference;
#[cfg(test)]
mod tests;

pub use cycle_search::{check_request, Listing, Verdict, WaitGraph};

pub use holders::{Holder, HolderSet, PackedOptions, INLINE_OWNER};
pub use queue::{WaitQueue, Waiter};

/// Milliseconds: a duration or an absolute Unix time, as Redis's `mstime()`.
pub type Millis = u64;

/// Largest accepted ttl or timeout: 2^47 ms (about 4,460 years). Anything larger could
/// overflow an absolute time once added to the clock.
pub const MAX_DURATION: Millis = 1 << 47;
/// Longest accepted owner, in bytes.
pub const MAX_OWNER_LEN: usize = 1024;
/// Latest absolute time (Unix ms) a stored or replicated value may carry as an expiry or the
/// end of a lock-delay: 2^49 ms, about the year 19800. Every time this server computes itself
/// is the clock plus at most [`MAX_DURATION`], twice over for an expiry followed by its
/// lock-delay, so below 2^49 until the year 10889; a larger one can only come from a corrupt or
/// crafted value, and would overflow the server's own time arithmetic (its timers count in
/// microseconds).
pub const MAX_INSTANT: Millis = 1 << 49;
/// Largest hold count a stored or replicated value may carry: counts are replied as RESP
/// (signed 64-bit) integers.
pub const MAX_COUNT: u64 = i64::MAX as u64;

/// Exclusive (write), shared (read), or one permit of a semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Write,
    Read,
    /// A semaphore permit: any number of owners up to the key's capacity, each holding one or
    /// more permits (its count).
    Permit,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Write => "write",
            Mode::Read => "read",
            Mode::Permit => "permit",
        }
    }
}

/// Largest semaphore capacity: 2^31 - 1.
pub const MAX_CAPACITY: u32 = i32::MAX as u32;

/// What a key holds, as far as requests are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Nothing yet: the next request decides.
    Fresh,
    /// An exclusive / read-write lock (holders, waiters or a lock-delay).
    Lock,
    /// A semaphore of this capacity.
    Semaphore(u32),
}

/// What a hold is created with besides its mode and TTL (`BIND`, `LOCKDELAY`). A re-entry
/// never changes them: a hold keeps the options it began with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HoldOptions {
    /// The connection the hold is bound to: the hold ends when it closes ([`Lock::end_bound`]).
    /// Connection ids are the server's; the core only compares them.
    pub bound_to: Option<u64>,
    /// For an exclusive hold: when it ends other than by release (expiry, its connection
    /// closing), nobody is granted the lock for this many ms after.
    pub lock_delay: Millis,
    /// Who asks: the ACL user of the requesting connection, as the server numbers its users
    /// ([`UNKNOWN_USER`] when it is not known). It becomes the hold's [`Holder::user`] (it is
    /// not kept among the hold's options): deadlock detection tells owners apart by user and
    /// name.
    pub user: UserId,
}

/// A server's number for an ACL user (the Redis side interns user names). Deadlock detection
/// takes an owner to be the pair (user, owner name): see [`Who`].
pub type UserId = u16;

/// The user of a hold whose maker is not known (loaded from an RDB file or the AOF, restored,
/// received from a master): the Redis side indexes such holds on nobody's walk.
pub const UNKNOWN_USER: UserId = 0;

/// An owner as deadlock detection sees it: the ACL user that made the hold or request, and
/// the owner name. Two holds under one name made by different users are different owners
/// for detection (though the lock itself treats the name as one owner).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Who<'a> {
    pub user: UserId,
    pub owner: &'a [u8],
}

impl<'a> Who<'a> {
    pub fn new(user: UserId, owner: &'a [u8]) -> Self {
        Who { user, owner }
    }

    /// Does `holder`, held under this owner's name, belong to this owner?
    pub fn holds(&self, holder: &Holder) -> bool {
        holder.user == self.user
    }
}

/// One request for a lock: who, how, for how long, with what options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub owner: &'a [u8],
    pub mode: Mode,
    pub ttl: Millis,
    pub options: HoldOptions,
    /// For [`Mode::Permit`]: the semaphore's capacity (1 to [`MAX_CAPACITY`]); 0 otherwise.
    pub capacity: u32,
}

/// Identifies one queued client. Ids are issued in arrival order, so they order the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(pub u64);

/// The module-wide source of fencing tokens. One counter serves every key, so a token is
/// larger than every token issued before it on this instance, for any key; that survives
/// deleting a key without keeping anything per deleted key.
///
/// It never issues a value twice: at its end ([`FenceCounter::end`]) it issues nothing, and
/// every grant that needs a new token is refused ([`Refusal::TokensExhausted`]) instead of
/// repeating, wrapping or saturating.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceCounter {
    last: u64,
    /// The legacy-tokens setting: tokens may go above [`MAX_EXACT_TOKEN`] (data written by a
    /// pre-release build), up to [`MAX_TOKEN`].
    legacy: bool,
}

/// Tokens are replied as RESP integers (signed 64-bit), so nothing above this is ever
/// accepted or issued, even with the legacy-tokens setting on. Only data written by a
/// pre-release build (whose floor was `unix_ms << 20`, about 2^60.7; see [`legacy_floor`])
/// holds tokens above [`MAX_EXACT_TOKEN`].
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// How many tokens one millisecond of wall-clock time was worth in pre-release builds, as a
/// power of two: their floor at Unix time `t` ms was `t << LEGACY_FLOOR_SHIFT`.
pub const LEGACY_FLOOR_SHIFT: u32 = 20;

/// The pre-release builds' wall-clock floor at Unix time `now_us` (µs): `unix_ms << 20`, about
/// 2^60.7 in 2026, reaching [`MAX_TOKEN`] in the year 2248. A counter in the legacy range
/// (above [`MAX_EXACT_TOKEN`], legacy setting on) jumps to it when the server starts or is
/// promoted, as those builds did, so it never goes below what a pre-release build or an
/// earlier incarnation issued in that range.
pub fn legacy_floor(now_us: Micros) -> u64 {
    (now_us / 1000)
        .checked_mul(1 << LEGACY_FLOOR_SHIFT)
        .map_or(MAX_TOKEN, |f| f.min(MAX_TOKEN))
}

/// Why a grant that the rules would make is refused instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The fencing counter is at its end: a new hold would need a token it cannot issue. Only
    /// grants of a new hold are refused; a re-entry (or an extra permit) keeps its token.
    TokensExhausted,
    /// The server may evict lock keys and the module refuses holds then: every grant is
    /// refused, re-entries included, as the direct commands are.
    Evictable,
}

/// The largest token every client can compare exactly: 2^53 - 1, the largest integer a double
/// (a Lua number in `EVAL`, a JavaScript `Number`, a JSON number) holds without rounding. The
/// wall-clock floor stays below it until the year 2255 (Unix µs 2^53); see [`token_floor`].
pub const MAX_EXACT_TOKEN: u64 = (1 << 53) - 1;

/// Microseconds: an absolute Unix time, the unit of the token floor.
pub type Micros = u64;

/// The wall-clock floor for tokens at Unix time `now_us`, in microseconds: one token per
/// microsecond of wall-clock time. An instance that jumps to its floor when it starts (or is
/// promoted) and then issues fewer tokens than microseconds pass (a Redis thread grants at
/// most a few hundred thousand per second) stays below the floor of any later start, whatever
/// it managed to save or replicate. It is 2^50.6 in 2026 and reaches [`MAX_EXACT_TOKEN`] in
/// the year 2255.
pub fn token_floor(now_us: Micros) -> u64 {
    now_us.min(MAX_TOKEN)
}

impl FenceCounter {
    /// A counter that has issued nothing yet (usable in `const` contexts).
    pub const fn new_const() -> Self {
        FenceCounter {
            last: 0,
            legacy: false,
        }
    }

    /// The last token issued (0 before the first).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Sets the legacy-tokens setting (tokens above [`MAX_EXACT_TOKEN`] accepted and issued).
    pub fn set_legacy(&mut self, legacy: bool) {
        self.legacy = legacy;
    }

    pub fn legacy(&self) -> bool {
        self.legacy
    }

    /// The largest token this counter may hold and issue: [`MAX_EXACT_TOKEN`], or
    /// [`MAX_TOKEN`] with the legacy setting on.
    pub fn end(&self) -> u64 {
        if self.legacy {
            MAX_TOKEN
        } else {
            MAX_EXACT_TOKEN
        }
    }

    /// May a stored or replicated token, fence or counter of `token` be loaded? Above
    /// [`FenceCounter::end`] it is refused where it is loaded: believing it would leave the
    /// counter where it cannot issue (or, for data of a pre-release build without the legacy
    /// setting, above what clients compare exactly).
    pub fn accepts(&self, token: u64) -> bool {
        token <= self.end()
    }

    /// Issues the next token; `None` when the counter is at its end (or above it: the legacy
    /// setting was turned off with the counter in the legacy range). Never the same value
    /// twice.
    pub fn issue(&mut self) -> Option<u64> {
        if self.last >= self.end() {
            return None;
        }
        self.last += 1;
        Some(self.last)
    }

    /// Can the counter issue another token?
    pub fn exhausted(&self) -> bool {
        self.last >= self.end()
    }

    /// Makes sure later tokens are above `token` (one issued elsewhere, e.g. by a master).
    /// Returns true when this moved the counter above [`MAX_EXACT_TOKEN`] (a counter from a
    /// pre-release build), so the caller can say so once rather than on every grant.
    pub fn observe(&mut self, token: u64) -> bool {
        let was_exact = self.last <= MAX_EXACT_TOKEN;
        self.last = self.last.max(token.min(MAX_TOKEN));
        was_exact && self.last > MAX_EXACT_TOKEN
    }

    /// Is the counter past [`MAX_EXACT_TOKEN`] (carried over from a pre-release build)?
    pub fn beyond_exact(&self) -> bool {
        self.last > MAX_EXACT_TOKEN
    }

    /// Jumps to the wall-clock floor of `now_us` (never back): called when an instance starts
    /// or is promoted, so its tokens are above everything an earlier incarnation or a previous
    /// master issued, saved or not (see [`token_floor`]). With the legacy setting on it jumps
    /// to the pre-release floor instead ([`legacy_floor`]), whatever the counter read: legacy
    /// tokens may have been issued since the RDB this server starts from was saved (a RESTORE
    /// of pre-release data after the save), and the µs floor is far below them.
    pub fn raise_to_floor(&mut self, now_us: Micros) {
        let _ = self.observe(token_floor(now_us));
        if self.legacy {
            let _ = self.observe(legacy_floor(now_us));
        }
    }
}

/// Something that happened to a lock besides the direct answer to the operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A queued waiter's turn came but its grant was refused (see [`Refusal`]): it has left
    /// the queue and must get the error; the waiters behind it were considered in turn.
    Refused { waiter: WaiterId, reason: Refusal },
    /// A queued waiter was granted the lock. `count` is its hold count after the grant
    /// (greater than 1 when the owner already held the lock).
    Granted {
        waiter: WaiterId,
        owner: Box<[u8]>,
        mode: Mode,
        token: u64,
        count: u64,
        expires_at: Millis,
    },
    /// A holder's expiry passed and it was dropped.
    Expired { owner: Box<[u8]>, mode: Mode },
    /// A bound holder's connection closed (or the server lost it: restart, promotion) and
    /// the hold was dropped.
    Disconnected { owner: Box<[u8]>, mode: Mode },
    /// A lock-delay began (`until` is its end) after an exclusive hold ended without a
    /// release.
    DelayStarted { until: Millis },
    /// A pending lock-delay ended.
    DelayEnded,
    /// A hold bound to connection `conn` ended (released, expired or disconnected), so the
    /// Redis side can forget where that connection held something.
    BoundEnded { conn: u64 },
    /// The operation itself created, changed or ended `owner`'s hold (a direct grant, a
    /// re-entry, a release, an extend): its new state must reach replicas.
    Updated { owner: Box<[u8]> },
    /// A hold ended (released to a count of 0, expired, or its connection closed) after
    /// `held_ms` ms: from its grant to the release or disconnect, or to its expiry. Not
    /// reported for holds whose start is unknown (restored ones; see [`Holder::granted_at`]).
    HoldEnded { held_ms: Millis },
}

/// The context of one operation: the time, the fencing counter, where events go, and
/// whether the server refuses every grant now (and why).
pub struct Step<'a> {
    pub now: Millis,
    pub fences: &'a mut FenceCounter,
    pub events: &'a mut Vec<Event>,
    /// `Some` while no grant may be made (re-entries included): a direct request answers
    /// [`Acquired::Refused`], a waiter whose turn comes gets [`Event::Refused`].
    pub refuse: Option<Refusal>,
}

/// The answer to an acquire request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Granted now. `count` is the owner's hold count after the grant.
    Granted { token: u64, count: u64 },
    /// Not grantable now; the request joined the queue under the given id.
    Queued,
    /// Not grantable now, and the caller did not want to wait.
    Busy,
    /// The owner holds the lock shared and asked for it exclusively: waiting would never end.
    Deadlock,
    /// The owner's hold count is at its maximum (2^64 - 1).
    CountOverflow,
    /// Grantable, but grants are refused: no new token can be issued, or the step refuses
    /// every grant ([`Step::refuse`]).
    Refused(Refusal),
    /// A semaphore request on a lock key, or a lock request on a semaphore key.
    WrongKind,
    /// A semaphore request naming another capacity than the key's.
    CapacityMismatch,
}

/// Why a saved or replicated holder cannot be restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// The owner is empty or longer than [`MAX_OWNER_LEN`].
    OwnerLength,
    /// A count of 0, or a token that was never issued (0, or above [`MAX_TOKEN`]).
    CountOrToken,
    /// A writer beside another holder, a permit beside a lock holder, or permits beyond the
    /// capacity (or of another capacity) beside the others.
    Conflict,
    /// A permit with a capacity out of range or below its count, or a lock hold with one.
    Capacity,
    /// An expiry after [`MAX_INSTANT`].
    Expiry,
    /// A lock-delay above [`MAX_DURATION`], or on a hold that is not exclusive.
    LockDelay,
    /// A token above the key's last granted token (its fence).
    AboveFence,
}

impl RestoreError {
    pub fn message(self) -> &'static str {
        match self {
            RestoreError::OwnerLength => "owner length out of range",
            RestoreError::CountOrToken => "count or token out of range",
            RestoreError::Conflict => "a writer beside another holder, or permits that do not fit",
            RestoreError::Capacity => "capacity out of range",
            RestoreError::Expiry => "expiry out of range",
            RestoreError::LockDelay => "lock-delay out of range or on a hold that is not exclusive",
            RestoreError::AboveFence => "a token above the key's fence",
        }
    }
}

/// The checks a saved holder passes on its own, before it is compared with the others.
pub fn check_holder(owner: &[u8], holder: &Holder) -> Result<(), RestoreError> {
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(RestoreError::OwnerLength);
    }
    if holder.count == 0
        || holder.count > MAX_COUNT
        || holder.token == 0
        || holder.token > MAX_TOKEN
    {
        return Err(RestoreError::CountOrToken);
    }
    if holder.expires_at > MAX_INSTANT {
        return Err(RestoreError::Expiry);
    }
    let lock_delay = holder.options.get().lock_delay;
    if lock_delay > MAX_DURATION || (lock_delay != 0 && holder.mode != Mode::Write) {
        return Err(RestoreError::LockDelay);
    }
    let capacity_ok = match holder.mode {
        Mode::Permit => {
            (1..=MAX_CAPACITY).contains(&holder.capacity)
                && holder.count <= u64::from(holder.capacity)
        }
        Mode::Write | Mode::Read => holder.capacity == 0,
    };
    if !capacity_ok {
        return Err(RestoreError::Capacity);
    }
    Ok(())
}

/// Reports how long `holder` was held, ending at `end` (when its start is known).
fn note_hold_end(holder: &Holder, end: Millis, step: &mut Step<'_>) {
    if holder.granted_at != 0 {
        step.events.push(Event::HoldEnded {
            held_ms: end.saturating_sub(holder.granted_at),
        });
    }
}

/// Reports the end of `holder` if it was bound to a connection.
fn note_bound_end(holder: &Holder, step: &mut Step<'_>) {
    if let Some(conn) = holder.options.bound_to() {
        step.events.push(Event::BoundEnded { conn });
    }
}

/// The owner does not hold the lock (never did, released, or expired).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotOwner;

/// One lock: its holders, its waiters and the last token granted on it.
#[derive(Clone, Debug, Default)]
pub struct Lock {
    holders: HolderSet,
    queue: WaitQueue,
    fence: u64,
}

impl Lock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn holders(&self) -> &HolderSet {
        &self.holders
    }

    pub fn queue(&self) -> &WaitQueue {
        &self.queue
    }

    /// The mode the lock is held in, `None` when free.
    pub fn mode(&self) -> Option<Mode> {
        self.holders.mode()
    }

    /// The last fencing token granted on this lock.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The lock's one holder when that holder is all there is to it: nobody waits, the hold
    /// has no options, and its token is the last one granted on the lock. Such a lock is
    /// rebuilt exactly by [`Lock::from_single`], so it can be stored as just this holder.
    pub fn single(&self) -> Option<(&[u8], &Holder)> {
        let (owner, holder) = self.holders.only()?;
        (self.queue.is_empty() && holder.options.is_none() && holder.token == self.fence)
            .then_some((owner, holder))
    }

    /// The lock that [`Lock::single`] describes: `holder` held by `owner`, nobody waiting, the
    /// fence at the holder's token.
    pub fn from_single(owner: &[u8], holder: Holder) -> Lock {
        let mut lock = Lock {
            fence: holder.token,
            ..Lock::default()
        };
        lock.holders.insert(owner, holder);
        lock
    }

    /// True when nobody holds the lock, nobody waits and no lock-delay is pending: the key
    /// should go away.
    pub fn is_empty(&self) -> bool {
        self.holders.is_vacant() && self.queue.is_empty()
    }

    /// The end of the pending lock-delay (absolute ms), 0 when none is pending. A delay whose
    /// end has passed stays recorded until the next operation with a clock ends it.
    pub fn delay_until(&self) -> Millis {
        self.holders.delay_until()
    }

    /// The end of the lock-delay as things stand at `now`, for reading without changing the
    /// lock (LOCK.INFO): the pending delay, or the delay an exclusive hold whose expiry has
    /// passed (not yet dropped) leaves. 0 when none is running at `now`. O(1): only an
    /// exclusive hold carries a lock-delay, and it is the key's only holder, so a key with
    /// several holders (100,000 readers) is not walked.
    pub fn delay_end(&self, now: Millis) -> Millis {
        let from_expired = self
            .holders
            .only()
            .filter(|(_, h)| h.expires_at <= now)
            .map_or(0, |(_, h)| h.expiry_with_delay());
        let end = self.delay_until().max(from_expired);
        if end > now {
            end
        } else {
            0
        }
    }

    /// When the next holder expires or the lock-delay ends: the time the timer must fire.
    pub fn next_expiry(&self) -> Option<Millis> {
        // A delay only exists while nobody holds the lock.
        self.holders
            .earliest_expiry()
            .or_else(|| self.pending_delay())
    }

    fn pending_delay(&self) -> Option<Millis> {
        match self.delay_until() {
            0 => None,
            until => Some(until),
        }
    }

    /// When the last holder expires (plus its lock-delay), or the pending lock-delay ends: the
    /// key's absolute Redis expiry, so that an expiry by Redis can never cut a delay short.
    pub fn last_expiry(&self) -> Option<Millis> {
        self.holders
            .latest_expiry()
            .or_else(|| self.pending_delay())
    }

    /// Asks for the lock in `mode` for `owner`, holding it `ttl` ms from the grant, with no
    /// options (see [`Lock::request`]).
    pub fn acquire(
        &mut self,
        owner: &[u8],
        mode: Mode,
        ttl: Millis,
        wait: Option<WaiterId>,
        step: &mut Step<'_>,
    ) -> Acquired {
        let req = Request {
            owner,
            mode,
            ttl,
            options: HoldOptions::default(),
            capacity: 0,
        };
        self.request(req, wait, step)
    }

    /// Asks for the lock as `req` says. With `wait`, a request that cannot be granted now joins
    /// the queue under that id. The options apply to a new hold only, never to a re-entry.
    pub fn request(
        &mut self,
        req: Request<'_>,
        wait: Option<WaiterId>,
        step: &mut Step<'_>,
    ) -> Acquired {
        let Request {
            owner,
            mode,
            ttl,
            options,
            capacity,
        } = req;
        self.expire(step);
        if let Some(refused) = self.refuse_kind(mode, capacity) {
            return refused;
        }
        if mode == Mode::Permit {
            return self.request_permit(req, wait, step);
        }
        if let Some(held) = self.holders.get(owner) {
            // Re-entry: an exclusive holder may take either mode again (a read inside a write
            // stays exclusive); a reader may read again even with writers queued, or it would
            // deadlock against them. A reader asking to write would wait for itself.
            if held.mode == Mode::Read && mode == Mode::Write {
                return Acquired::Deadlock;
            }
            // At most MAX_COUNT: a larger count could not be stored (an RDB or DUMP holding it
            // would be refused when loaded).
            let Some(count) = held.count.checked_add(1).filter(|c| *c <= MAX_COUNT) else {
                return Acquired::CountOverflow;
            };
            // A re-entry needs no token: only a refusal of every grant stops it.
            if let Some(reason) = step.refuse {
                return Acquired::Refused(reason);
            }
            let token = held.token;
            let expires_at = step.now.saturating_add(ttl);
            self.holders.update(owner, count, expires_at);
            step.events.push(Event::Updated {
                owner: owner.into(),
            });
            return Acquired::Granted { token, count };
        }
        if self.queue.is_empty() && self.compatible(mode) {
            let token = match self.grant_new(owner, mode, ttl, options, 0, step) {
                Ok(token) => token,
                Err(reason) => return Acquired::Refused(reason),
            };
            step.events.push(Event::Updated {
                owner: owner.into(),
            });
            return Acquired::Granted { token, count: 1 };
        }
        self.queue_or_refuse(req, wait)
    }

    /// A request for one permit of a semaphore. An owner that already holds permits asks for
    /// one more and waits its turn like anyone else (no re-entry ahead of the queue); when
    /// granted, its count grows, its expiry is reset and it gets its token again.
    fn request_permit(
        &mut self,
        req: Request<'_>,
        wait: Option<WaiterId>,
        step: &mut Step<'_>,
    ) -> Acquired {
        if !self.queue.is_empty() || !self.permits_free(req.capacity) {
            return self.queue_or_refuse(req, wait);
        }
        let expires_at = step.now.saturating_add(req.ttl);
        let (token, count) = match self.holders.get(req.owner) {
            Some(held) => {
                let Some(count) = held.count.checked_add(1).filter(|c| *c <= MAX_COUNT) else {
                    return Acquired::CountOverflow;
                };
                // One more permit of the owner's hold needs no token.
                if let Some(reason) = step.refuse {
                    return Acquired::Refused(reason);
                }
                let token = held.token;
                self.holders.update(req.owner, count, expires_at);
                (token, count)
            }
            None => {
                let granted = self.grant_new(
                    req.owner,
                    Mode::Permit,
                    req.ttl,
                    req.options,
                    req.capacity,
                    step,
                );
                match granted {
                    Ok(token) => (token, 1),
                    Err(reason) => return Acquired::Refused(reason),
                }
            }
        };
        step.events.push(Event::Updated {
            owner: req.owner.into(),
        });
        Acquired::Granted { token, count }
    }

    /// Queues a request that cannot be granted now (with a waiter id), or refuses it.
    fn queue_or_refuse(&mut self, req: Request<'_>, wait: Option<WaiterId>) -> Acquired {
        match wait {
            Some(id) => {
                self.queue.push(
                    id,
                    Waiter {
                        owner: req.owner.into(),
                        mode: req.mode,
                        ttl: req.ttl,
                        options: req.options,
                        capacity: req.capacity,
                    },
                );
                Acquired::Queued
            }
            None => Acquired::Busy,
        }
    }

    /// What the key is: a lock, a semaphore of some capacity, or nothing yet (holders and
    /// waiters all agree, since requests of the other kind are refused).
    pub fn kind(&self) -> Kind {
        let (mode, capacity) = match (self.holders.any(), self.queue.head()) {
            (Some(h), _) => (h.mode, h.capacity),
            (None, Some((_, w))) => (w.mode, w.capacity),
            (None, None) if self.delay_until() != 0 => return Kind::Lock,
            (None, None) => return Kind::Fresh,
        };
        match mode {
            Mode::Permit => Kind::Semaphore(capacity),
            Mode::Write | Mode::Read => Kind::Lock,
        }
    }

    /// The refusal a request of `mode` (and `capacity`, for a permit) gets from this key's kind.
    fn refuse_kind(&self, mode: Mode, capacity: u32) -> Option<Acquired> {
        match (self.kind(), mode) {
            (Kind::Fresh, _) => None,
            (Kind::Semaphore(c), Mode::Permit) if c == capacity => None,
            (Kind::Semaphore(_), Mode::Permit) => Some(Acquired::CapacityMismatch),
            (Kind::Lock, Mode::Write | Mode::Read) => None,
            _ => Some(Acquired::WrongKind),
        }
    }

    /// Is one more permit free under `capacity`?
    fn permits_free(&self, capacity: u32) -> bool {
        self.holders.total_count() < u64::from(capacity)
    }

    /// Drops one hold of `owner` (all of them with `all`) and serves the queue.
    /// Returns the owner's remaining count.
    pub fn release(
        &mut self,
        owner: &[u8],
        all: bool,
        step: &mut Step<'_>,
    ) -> Result<u64, NotOwner> {
        self.expire(step);
        let held = self.holders.get(owner).ok_or(NotOwner)?;
        let remaining = if all { 0 } else { held.count.saturating_sub(1) };
        step.events.push(Event::Updated {
            owner: owner.into(),
        });
        if remaining == 0 {
            if let Some(holder) = self.holders.remove(owner) {
                note_hold_end(&holder, step.now, step);
                note_bound_end(&holder, step);
            }
            self.grant_waiters(step);
        } else {
            let expires_at = held.expires_at;
            self.holders.update(owner, remaining, expires_at);
            self.grant_waiters(step);
        }
        Ok(remaining)
    }

    /// Sets `owner`'s expiry to now + `ttl`. Returns the new absolute expiry.
    pub fn extend(
        &mut self,
        owner: &[u8],
        ttl: Millis,
        step: &mut Step<'_>,
    ) -> Result<Millis, NotOwner> {
        self.expire(step);
        let count = self.holders.get(owner).ok_or(NotOwner)?.count;
        let expires_at = step.now.saturating_add(ttl);
        self.holders.update(owner, count, expires_at);
        step.events.push(Event::Updated {
            owner: owner.into(),
        });
        Ok(expires_at)
    }

    /// Drops every holder whose expiry is at or before now (an exclusive one with LOCKDELAY
    /// leaves a delay that ends `lock_delay` ms after its expiry, not after now: a late timer
    /// does not lengthen it), ends a lock-delay that is over, then serves the queue.
    pub fn expire(&mut self, step: &mut Step<'_>) {
        let mut changed = false;
        while let Some((owner, holder)) = self.holders.pop_expired(step.now) {
            let delay = holder.options.get().lock_delay;
            let mode = holder.mode;
            step.events.push(Event::Expired { owner, mode });
            note_hold_end(&holder, holder.expires_at, step);
            note_bound_end(&holder, step);
            if mode == Mode::Write && delay > 0 {
                self.start_delay(holder.expires_at.saturating_add(delay), step);
            }
            changed = true;
        }
        let until = self.delay_until();
        if until != 0 && until <= step.now {
            self.holders.set_delay_until(0);
            step.events.push(Event::DelayEnded);
            changed = true;
        }
        if changed {
            self.grant_waiters(step);
        }
    }

    /// Starts (or lengthens) the lock-delay; the lock has no holder at this point.
    fn start_delay(&mut self, until: Millis, step: &mut Step<'_>) {
        if until > self.delay_until() {
            self.holders.set_delay_until(until);
            step.events.push(Event::DelayStarted { until });
        }
    }

    /// Ends every hold bound to a connection for which `gone` is true, as a release of all its
    /// counts would, except that an exclusive hold with LOCKDELAY leaves a delay from now.
    /// Then serves the queue. Called when connections close, and with `|_| true` when the
    /// server starts or is promoted (its bound holds belong to connections it never had).
    /// Returns how many holds ended.
    pub fn end_bound(&mut self, gone: impl Fn(u64) -> bool, step: &mut Step<'_>) -> usize {
        self.expire(step);
        let ending: Vec<Box<[u8]>> = self
            .holders
            .iter()
            .filter(|(_, h)| h.options.get().bound_to.is_some_and(&gone))
            .map(|(o, _)| o.into())
            .collect();
        for owner in &ending {
            let Some(holder) = self.holders.remove(owner) else {
                continue;
            };
            let delay = holder.options.get().lock_delay;
            step.events.push(Event::Disconnected {
                owner: owner.clone(),
                mode: holder.mode,
            });
            note_hold_end(&holder, step.now, step);
            note_bound_end(&holder, step);
            if holder.mode == Mode::Write && delay > 0 {
                self.start_delay(step.now.saturating_add(delay), step);
            }
        }
        if !ending.is_empty() {
            self.grant_waiters(step);
        }
        ending.len()
    }

    /// Takes a waiter out of the queue (its timeout passed or its client went away) and
    /// serves the queue, since the waiter may have been what kept others waiting.
    pub fn cancel_waiter(&mut self, id: WaiterId, step: &mut Step<'_>) -> Option<Waiter> {
        let waiter = self.queue.remove(id)?;
        self.expire(step);
        self.grant_waiters(step);
        Some(waiter)
    }

    /// Removes every waiter, in arrival order (the key is going away; they wait elsewhere).
    pub fn take_waiters(&mut self) -> Vec<(WaiterId, Waiter)> {
        self.queue.take_all()
    }

    /// Drops queued waiters for which `keep` is false (they belong to another key now).
    /// Does not serve the queue: call [`Lock::settle`] after.
    pub fn retain_waiters(&mut self, keep: impl FnMut(WaiterId) -> bool) {
        self.queue.retain(keep);
    }

    /// Puts waiters back in their arrival places (after their key was deleted) and serves
    /// the queue.
    ///
    /// A waiter whose request does not fit what the key holds now (a lock request on a
    /// semaphore, a permit request on a lock, another capacity: the key was replaced by RENAME,
    /// MOVE, SWAPDB, RESTORE or COPY) is not put back; it is returned with the refusal a new
    /// request of its kind would get, and the caller answers it.
    pub fn requeue(
        &mut self,
        waiters: Vec<(WaiterId, Waiter)>,
        step: &mut Step<'_>,
    ) -> Vec<(WaiterId, Acquired)> {
        let mut refused = Vec::new();
        for (id, waiter) in waiters {
            match self.refuse_kind(waiter.mode, waiter.capacity) {
                Some(refusal) => refused.push((id, refusal)),
                None => self.queue.push(id, waiter),
            }
        }
        self.settle(step);
        refused
    }

    /// Expires what is due and grants what is grantable: brings the lock back to its
    /// invariant (the queue head is never grantable) after anything changed it.
    pub fn settle(&mut self, step: &mut Step<'_>) {
        self.expire(step);
        self.grant_waiters(step);
    }

    /// Puts back a holder exactly as it was saved (RDB load, replication). The token is
    /// observed by the fencing counter so later grants stay above it.
    pub fn restore_holder(&mut self, owner: &[u8], holder: Holder, fences: &mut FenceCounter) {
        let _ = fences.observe(holder.token);
        self.fence = self.fence.max(holder.token);
        self.holders.remove(owner);
        self.holders.insert(owner, holder);
    }

    /// Could `holder` be restored for `owner` (replacing the owner's own hold, if any) without
    /// breaking the lock's invariants? RDB load and `LOCK.SYNC` both ask before
    /// [`Lock::restore_holder`], so a corrupt file or stream is refused rather than believed.
    pub fn check_restorable(&self, owner: &[u8], holder: &Holder) -> Result<(), RestoreError> {
        check_holder(owner, holder)?;
        // The other holders are compatible with each other (every one of them passed this
        // check), so they share one mode (and a capacity): comparing with any one of them
        // answers for all. That keeps a load of N holders O(N), not O(N^2) (100,000 readers
        // restored or migrated one by one).
        let conflict = self
            .holders
            .iter()
            .find(|(o, _)| &o[..] != owner)
            .is_some_and(|(_, other)| match (other.mode, holder.mode) {
                (Mode::Permit, Mode::Permit) => other.capacity != holder.capacity,
                (Mode::Read, Mode::Read) => false,
                _ => true,
            });
        let own = self.holders.get(owner).map_or(0, |h| h.count);
        let others = self.holders.total_count().saturating_sub(own);
        let overfull = holder.mode == Mode::Permit
            && others.saturating_add(holder.count) > u64::from(holder.capacity);
        if conflict || overfull {
            return Err(RestoreError::Conflict);
        }
        Ok(())
    }

    /// Removes a holder outright (replication of a release or expiry decided elsewhere).
    pub fn remove_holder(&mut self, owner: &[u8]) -> Option<Holder> {
        self.holders.remove(owner)
    }

    /// Sets the pending lock-delay exactly (RDB load, replication; 0 clears it). A delay only
    /// exists while nobody holds the lock: with holders this does nothing.
    pub fn restore_delay(&mut self, until: Millis) {
        self.holders.set_delay_until(until);
    }

    /// Restores the last token granted on this lock (RDB load).
    pub fn restore_fence(&mut self, fence: u64, fences: &mut FenceCounter) {
        let _ = fences.observe(fence);
        self.fence = self.fence.max(fence.min(MAX_TOKEN));
    }

    /// Can a new (non-reentrant) hold in `mode` be added to the current holders? Never while
    /// a lock-delay is pending (callers have ended a delay that is over).
    fn compatible(&self, mode: Mode) -> bool {
        match self.holders.mode() {
            None => self.delay_until() == 0,
            Some(held) => held == Mode::Read && mode == Mode::Read,
        }
    }

    /// Serves the queue from its head while the head is grantable: a writer when nobody
    /// else holds the lock, a reader when the lock is free or shared (or held exclusively by
    /// the reader's own owner). Consecutive readers are thereby granted together, up to the
    /// next writer.
    fn grant_waiters(&mut self, step: &mut Step<'_>) {
        while let Some((_, head)) = self.queue.head() {
            let own = self.holders.get(&head.owner);
            let grantable = match (own, head.mode) {
                (_, Mode::Permit) => self.permits_free(head.capacity),
                (Some(h), Mode::Write) => h.mode == Mode::Write && self.holders.len() == 1,
                (Some(h), Mode::Read) => h.mode == Mode::Write || self.compatible(Mode::Read),
                (None, mode) => self.compatible(mode),
            };
            if !grantable {
                break;
            }
            let Some((id, waiter)) = self.queue.pop_head() else {
                break;
            };
            // Its turn has come: a refused grant answers it with the error (it has left the
            // queue), and the loop goes on with the waiters behind it.
            let granted = match (self.holders.get(&waiter.owner), step.refuse) {
                (Some(_), Some(reason)) => Err(reason),
                (Some(h), None) => {
                    // Saturates at the largest storable count (reachable only from a restored
                    // value at that count: a queued grant cannot be refused here).
                    let count = h.count.saturating_add(1).min(MAX_COUNT);
                    let token = h.token;
                    let expires_at = step.now.saturating_add(waiter.ttl);
                    self.holders.update(&waiter.owner, count, expires_at);
                    Ok((token, count))
                }
                (None, _) => self
                    .grant_new(
                        &waiter.owner,
                        waiter.mode,
                        waiter.ttl,
                        waiter.options,
                        waiter.capacity,
                        step,
                    )
                    .map(|token| (token, 1)),
            };
            let (token, count) = match granted {
                Ok(granted) => granted,
                Err(reason) => {
                    step.events.push(Event::Refused { waiter: id, reason });
                    continue;
                }
            };
            let expires_at = self
                .holders
                .get(&waiter.owner)
                .map_or(step.now, |h| h.expires_at);
            step.events.push(Event::Granted {
                waiter: id,
                owner: waiter.owner,
                mode: waiter.mode,
                token,
                count,
                expires_at,
            });
        }
    }

    /// Adds `owner` as a new holder with a fresh token. LOCKDELAY is kept for exclusive
    /// holds only (parsing refuses it on shared requests; a shared hold has no use for it).
    /// Refused (nothing changes) when the step refuses every grant or the counter cannot
    /// issue another token.
    fn grant_new(
        &mut self,
        owner: &[u8],
        mode: Mode,
        ttl: Millis,
        mut options: HoldOptions,
        capacity: u32,
        step: &mut Step<'_>,
    ) -> Result<u64, Refusal> {
        if let Some(reason) = step.refuse {
            return Err(reason);
        }
        let token = step.fences.issue().ok_or(Refusal::TokensExhausted)?;
        self.fence = token;
        if mode != Mode::Write {
            options.lock_delay = 0;
        }
        // The user goes in the holder (in what would be padding), not among the options,
        // which would then be allocated for every hold.
        let user = std::mem::replace(&mut options.user, UNKNOWN_USER);
        self.holders.insert(
            owner,
            Holder {
                mode,
                user,
                capacity: if mode == Mode::Permit { capacity } else { 0 },
                count: 1,
                expires_at: step.now.saturating_add(ttl),
                token,
                granted_at: step.now,
                options: PackedOptions::new(options),
            },
        );
        Ok(token)
    }
}
