//! What one lock key holds: the lock and the Redis-side bookkeeping for it (its timer), the
//! INFO figures a value adds while it exists, and the data type that keys of it have (its
//! methods, such as the RDB codec, are in `datatype`).

use std::borrow::Cow;

use redis_lock_core::{Holder, Lock, Millis, Mode, PackedOptions, UserId, UNKNOWN_USER};
use redis_module::RedisModuleTimerID;

use crate::stats::{self, Gauges};
use crate::sys::datatype::ValueType;
use crate::sys::defrag::Mover;

/// The module data type `redislock`, whose values are [`LockValue`]s. Its behaviour (the
/// `TypeHandler` implementation) is in `datatype`.
pub struct LockType;

/// Encoding version of the RDB format (`redis_lock_core::stored`).
pub const ENCODING_VERSION: i32 = redis_lock_core::stored::ENCODING_VERSION;

/// The registered type.
pub static LOCK_TYPE: ValueType<LockType> = ValueType::new("redislock", ENCODING_VERSION);

/// The timer a value has armed, and where it will look for the value (the key by hash: a value
/// that moved to another name needs a new timer).
#[derive(Debug)]
pub struct ArmedTimer {
    pub id: RedisModuleTimerID,
    pub at: Millis,
    pub db: i32,
    pub key_hash: u64,
}

/// The longest owner a lock stored compactly keeps inline; a longer owner makes the value the
/// full form. The core's limit for a lone holder's inline owner, so that unpacking a compact
/// value onto the stack never allocates.
pub const COMPACT_OWNER: usize = redis_lock_core::INLINE_OWNER;

/// What one lock key holds: the lock, and the Redis-side bookkeeping for it (its timer).
///
/// Most locks are one exclusive or shared holder and nothing else; those are kept compactly,
/// in one 64-byte allocation with the owner inline, the rest in the full form. The form is a
/// storage detail: every read or change goes through [`LockValue::lock_mut`] (which unpacks a
/// compact value) or [`LockValue::view`], and [`LockValue::pack`] (called at the end of every
/// commit) packs it again when it fits.
#[derive(Debug)]
pub struct LockValue {
    repr: Repr,
}

#[derive(Debug)]
enum Repr {
    /// An empty lock: a key just created for a request, or one about to be deleted.
    Vacant,
    Compact(Compact),
    Full(Box<FullValue>),
}

/// A lock or semaphore with one plain holder (see `Lock::single`) whose owner fits inline: the
/// holder's figures, the owner, nothing else. The fence is the holder's token; a compact value never has
/// a timer (a lone holder with nobody waiting has its key's Redis expiry instead).
#[derive(Debug)]
struct Compact {
    token: u64,
    expires_at: Millis,
    /// The hold's start in the low [`GRANTED_BITS`] bits (a start at or past 2^48 ms, the
    /// year 10889, takes the full form), and the user that made it above them: the user
    /// costs the compact form no byte (it is 64 bytes, one allocator size class, exactly).
    granted_and_user: u64,
    /// A semaphore's capacity for a permit hold, 0 for a lock.
    capacity: u32,
    /// Hold counts above 65,535 take the full form.
    count: u16,
    mode: Mode,
    owner_len: u8,
    owner: [u8; COMPACT_OWNER],
}

/// The general form: any lock, and its timer.
#[derive(Debug, Default)]
struct FullValue {
    lock: Lock,
    timer: Option<Box<ArmedTimer>>,
}

/// How many low bits of [`Compact::granted_and_user`] hold the start.
const GRANTED_BITS: u32 = 48;

impl Compact {
    /// The compact form of `lock`, if it has one.
    fn of(lock: &Lock) -> Option<Compact> {
        let (owner, h) = lock.single()?;
        if h.granted_at >> GRANTED_BITS != 0 {
            return None;
        }
        let granted_and_user = h.granted_at | (u64::from(h.user) << GRANTED_BITS);
        let owner_len = u8::try_from(owner.len())
            .ok()
            .filter(|&n| usize::from(n) <= COMPACT_OWNER)?;
        let count = u16::try_from(h.count).ok()?;
        let mut inline = [0; COMPACT_OWNER];
        inline.get_mut(..owner.len())?.copy_from_slice(owner);
        Some(Compact {
            token: h.token,
            expires_at: h.expires_at,
            granted_and_user,
            capacity: h.capacity,
            count,
            mode: h.mode,
            owner_len,
            owner: inline,
        })
    }

    fn owner(&self) -> &[u8] {
        self.owner
            .get(..usize::from(self.owner_len))
            .unwrap_or(&self.owner)
    }

    fn unpack(&self) -> Lock {
        let granted_at = self.granted_and_user & ((1 << GRANTED_BITS) - 1);
        let user = UserId::try_from(self.granted_and_user >> GRANTED_BITS).unwrap_or(UNKNOWN_USER);
        let holder = Holder {
            mode: self.mode,
            user,
            capacity: self.capacity,
            count: u64::from(self.count),
            expires_at: self.expires_at,
            token: self.token,
            granted_at,
            options: PackedOptions::NONE,
        };
        Lock::from_single(self.owner(), holder)
    }

    /// What `Gauges::of` gives for the unpacked lock, without unpacking it.
    fn gauges(&self) -> Gauges {
        let (readers, writers, permits) = match self.mode {
            Mode::Read => (1, 0, 0),
            Mode::Write => (0, 1, 0),
            Mode::Permit => (0, 0, u32::from(self.count)),
        };
        Gauges {
            locks_held: 1,
            readers,
            writers,
            waiters: 0,
            permits,
        }
    }
}

impl LockValue {
    pub fn new(lock: Lock) -> Self {
        // INFO figures: every change to a live value is counted as the difference between
        // its figures before and after (see `LockKey`), so a value adds its own when it is
        // created and takes them back when it is freed.
        stats::update_gauges(Gauges::default(), Gauges::of(&lock));
        let mut value = LockValue { repr: Repr::Vacant };
        value.store(lock);
        value
    }

    /// The lock as a value on its own when the value is not in the full form (vacant or
    /// compact), so an operation can run on it without the full form's allocation; `None` for
    /// a full value (use [`LockValue::lock_mut`]). Store the result back with
    /// [`LockValue::store_small`] or [`LockValue::store`].
    pub fn unpack_small(&self) -> Option<Lock> {
        match &self.repr {
            Repr::Vacant => Some(Lock::new()),
            Repr::Compact(c) => Some(c.unpack()),
            Repr::Full(_) => None,
        }
    }

    /// Stores `lock` vacant or compact if it is empty or fits; false (and nothing changed)
    /// otherwise. The value must have no timer (it is replaced).
    pub fn store_small(&mut self, lock: &Lock) -> bool {
        if lock.is_empty() {
            self.repr = Repr::Vacant;
        } else if let Some(c) = Compact::of(lock) {
            self.repr = Repr::Compact(c);
        } else {
            return false;
        }
        true
    }

    /// Stores `lock` in whichever form fits it. The value must have no timer (it is replaced).
    pub fn store(&mut self, lock: Lock) {
        if !self.store_small(&lock) {
            self.repr = Repr::Full(Box::new(FullValue { lock, timer: None }));
        }
    }

    /// The lock, unpacked for reading or changing. A compact value becomes the full form
    /// until the next [`LockValue::pack`].
    pub fn lock_mut(&mut self) -> &mut Lock {
        &mut self.full().lock
    }

    fn full(&mut self) -> &mut FullValue {
        if let Some(lock) = self.unpack_small() {
            self.repr = Repr::Full(Box::new(FullValue { lock, timer: None }));
        }
        match &mut self.repr {
            Repr::Full(f) => f,
            // Unreachable: made full just above.
            Repr::Vacant | Repr::Compact(_) => unreachable_full(),
        }
    }

    /// The lock for reading, without changing the value's form (a compact value is unpacked
    /// into a copy).
    pub fn view(&self) -> Cow<'_, Lock> {
        match &self.repr {
            Repr::Vacant => Cow::Owned(Lock::new()),
            Repr::Compact(c) => Cow::Owned(c.unpack()),
            Repr::Full(f) => Cow::Borrowed(&f.lock),
        }
    }

    /// How many clients wait for the lock (no unpacking: a compact value has none).
    pub fn waiters(&self) -> usize {
        match &self.repr {
            Repr::Vacant | Repr::Compact(_) => 0,
            Repr::Full(f) => f.lock.queue().len(),
        }
    }

    /// The INFO figures this value contributes.
    pub fn gauges(&self) -> Gauges {
        match &self.repr {
            Repr::Vacant => Gauges::default(),
            Repr::Compact(c) => c.gauges(),
            Repr::Full(f) => Gauges::of(&f.lock),
        }
    }

    /// The value's armed expiry timer, if any.
    pub fn timer(&self) -> Option<&ArmedTimer> {
        match &self.repr {
            Repr::Vacant | Repr::Compact(_) => None,
            Repr::Full(f) => f.timer.as_deref(),
        }
    }

    pub fn take_timer(&mut self) -> Option<Box<ArmedTimer>> {
        match &mut self.repr {
            Repr::Vacant | Repr::Compact(_) => None,
            Repr::Full(f) => f.timer.take(),
        }
    }

    pub fn set_timer(&mut self, timer: ArmedTimer) {
        self.full().timer = Some(Box::new(timer));
    }

    /// Stores the value compactly if it fits (one plain holder, no timer).
    pub fn pack(&mut self) {
        if let Repr::Full(f) = &self.repr {
            if f.timer.is_none() {
                if let Some(c) = Compact::of(&f.lock) {
                    self.repr = Repr::Compact(c);
                }
            }
        }
    }

    /// Is the value vacant or compact (and so has no timer)?
    pub fn is_small(&self) -> bool {
        !matches!(self.repr, Repr::Full(_))
    }

    /// Active defragmentation (`defrag`): moves the boxes this value owns, the full form and
    /// its timer, when the allocator suggests it. The value's own box is moved by the caller;
    /// a vacant or compact value owns nothing else. The lock's inner allocations (holder
    /// table, queue, long owner names) stay where they are.
    pub fn defrag(&mut self, mover: &mut Mover<'_>) {
        if let Repr::Full(f) = &mut self.repr {
            mover.boxed(f);
            if let Some(t) = &mut f.timer {
                mover.boxed(t);
            }
        }
    }

    /// Approximate bytes used, for MEMORY USAGE.
    pub fn memory(&self) -> usize {
        std::mem::size_of::<Self>()
            + match &self.repr {
                Repr::Vacant | Repr::Compact(_) => 0,
                Repr::Full(f) => {
                    std::mem::size_of::<FullValue>()
                        + f.lock.holders().heap_size()
                        + f.lock.queue().heap_size()
                }
            }
    }
}

/// The one way `LockValue::full` could fail to find the form it just made: it cannot, but a
/// panic would take the server down, so this makes an empty lock instead of panicking.
#[cold]
fn unreachable_full() -> &'static mut FullValue {
    Box::leak(Box::default())
}

impl Drop for LockValue {
    fn drop(&mut self) {
        stats::update_gauges(self.gauges(), Gauges::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory per lock is a published figure (docs/benchmarks.md); this keeps the value from
    /// growing back by accident. 64 bytes is one jemalloc size class: a compact lock with a
    /// 32-byte owner is one allocation of that class.
    /// The compact form's figures are what the unpacked lock's would be, for every mode.
    #[test]
    fn compact_gauges_match_the_unpacked_lock() {
        for (mode, capacity, count, user) in [
            (Mode::Write, 0, 1, 1),
            (Mode::Read, 0, 3, UserId::MAX),
            (Mode::Permit, 5, 2, UNKNOWN_USER),
        ] {
            let holder = Holder {
                mode,
                user,
                capacity,
                count,
                expires_at: 1_000,
                token: 7,
                granted_at: (1 << GRANTED_BITS) - 1,
                options: PackedOptions::NONE,
            };
            let lock = Lock::from_single(b"owner", holder);
            let c = Compact::of(&lock).expect("compact");
            assert_eq!(c.gauges(), Gauges::of(&lock), "{mode:?}");
            assert_eq!(c.unpack().single(), lock.single(), "{mode:?}");
        }
    }

    #[test]
    fn a_lock_value_fits_in_64_bytes() {
        assert_eq!(std::mem::size_of::<LockValue>(), 64);
    }
}
