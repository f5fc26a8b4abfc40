//! The owners currently holding one lock.
//!
//! Most locks have one holder, so that case is stored inline (no index; a short owner inline
//! too). From two holders on (readers, permits), holders are indexed by owner and by expiry
//! (`indexed`), so that every operation stays logarithmic: a reader acquiring or releasing next
//! to 10,000 other readers costs the same as next to one, and the nearest expiry (for the
//! timer) and the latest one (for the key's Redis TTL) are read without a scan.

use super::indexed::Indexed;
#[cfg(doc)]
use super::UNKNOWN_USER;
use super::{HoldOptions, Millis, Mode, UserId};

/// One owner's hold on a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub mode: Mode,
    /// The semaphore's capacity for a [`Mode::Permit`] hold (every permit holder of a key has
    /// the same), 0 for a lock. It sits in what would be padding after `mode`.
    pub capacity: u32,
    /// The ACL user that made the hold (the server's number for it), [`UNKNOWN_USER`] when
    /// not known. A re-entry, by whichever user, does not change it. It too sits in what
    /// would be padding.
    pub user: UserId,
    /// Reentrancy count (for a semaphore: permits held), at least 1 while the holder exists.
    pub count: u64,
    /// Absolute time (ms) at which the hold ends unless extended.
    pub expires_at: Millis,
    /// Fencing token handed out when this hold began.
    pub token: u64,
    /// When this hold began (absolute ms), for the hold-time figures; 0 when unknown (a hold
    /// restored from an RDB file or a master's stream, whose start this server never saw).
    /// A re-entry or an extend does not change it.
    pub granted_at: Millis,
    /// BIND and LOCKDELAY, as the hold was created with them.
    pub options: PackedOptions,
}

impl Holder {
    /// When this hold's lock-delay would end if it expired now-due: its expiry plus its delay
    /// for an exclusive hold with LOCKDELAY, its expiry otherwise.
    pub fn expiry_with_delay(&self) -> Millis {
        match self.mode {
            Mode::Write => self
                .expires_at
                .saturating_add(self.options.get().lock_delay),
            Mode::Read | Mode::Permit => self.expires_at,
        }
    }

    /// How long this hold has been held at `now` (ms since it began; a re-entry or an extend
    /// does not restart it), or `None` when its start is unknown (see [`Holder::granted_at`]).
    /// A start after `now` (the wall clock stepped back) counts as 0.
    pub fn held_ms(&self, now: Millis) -> Option<Millis> {
        (self.granted_at != 0).then(|| now.saturating_sub(self.granted_at))
    }
}

/// [`HoldOptions`] in 8 bytes: a hold without options (nearly all of them) allocates nothing,
/// and a lock value stays within one allocator size class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedOptions(Option<Box<HoldOptions>>);

impl PackedOptions {
    /// No options.
    pub const NONE: PackedOptions = PackedOptions(None);

    pub fn new(options: HoldOptions) -> Self {
        if options == HoldOptions::default() {
            PackedOptions(None)
        } else {
            PackedOptions(Some(Box::new(options)))
        }
    }

    pub fn get(&self) -> HoldOptions {
        self.0.as_deref().copied().unwrap_or_default()
    }

    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// The bound connection, without copying the rest.
    pub fn bound_to(&self) -> Option<u64> {
        self.0.as_ref().and_then(|o| o.bound_to)
    }
}

/// The owner of a lone holder: inline when short (most owners are a 32-character hex UUID or
/// shorter), so a lock with one holder allocates nothing for its owner.
#[derive(Clone, Debug)]
enum OwnerBytes {
    Inline { len: u8, bytes: [u8; INLINE_OWNER] },
    Heap(Box<[u8]>),
}

/// The longest owner a lone holder keeps inline (no allocation for it). 32 bytes is a hex
/// UUID, what redis-py's `Lock` and most clients use.
pub const INLINE_OWNER: usize = 32;

impl OwnerBytes {
    fn new(owner: &[u8]) -> Self {
        let mut bytes = [0; INLINE_OWNER];
        match (u8::try_from(owner.len()), bytes.get_mut(..owner.len())) {
            (Ok(len), Some(inline)) => {
                inline.copy_from_slice(owner);
                OwnerBytes::Inline { len, bytes }
            }
            _ => OwnerBytes::Heap(owner.into()),
        }
    }

    fn get(&self) -> &[u8] {
        match self {
            OwnerBytes::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            OwnerBytes::Heap(b) => b,
        }
    }

    fn into_box(self) -> Box<[u8]> {
        match self {
            OwnerBytes::Inline { .. } => self.get().into(),
            OwnerBytes::Heap(b) => b,
        }
    }

    fn heap_size(&self) -> usize {
        match self {
            OwnerBytes::Inline { .. } => 0,
            OwnerBytes::Heap(b) => b.len(),
        }
    }
}

#[derive(Clone, Debug, Default)]
enum Repr {
    #[default]
    Empty,
    /// Nobody holds the lock and nobody may be granted it before this absolute time: the
    /// lock-delay of an exclusive hold that ended without a release. Kept here, in the space
    /// the one-holder case needs anyway, because a delay only exists while there is no holder.
    Delayed(Millis),
    One(OwnerBytes, Holder),
    Many(Box<Indexed>),
}

/// All holders of one lock, or (when there are none) the end of a pending lock-delay.
/// Invariant: every holder has the same mode.
#[derive(Clone, Debug, Default)]
pub struct HolderSet {
    repr: Repr,
}

impl HolderSet {
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => 0,
            Repr::One(..) => 1,
            Repr::Many(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self.repr, Repr::Empty | Repr::Delayed(_))
    }

    /// No holder and no lock-delay.
    pub fn is_vacant(&self) -> bool {
        matches!(self.repr, Repr::Empty)
    }

    /// The end of the pending lock-delay, 0 when there is none.
    pub fn delay_until(&self) -> Millis {
        match self.repr {
            Repr::Delayed(until) => until,
            _ => 0,
        }
    }

    /// Sets (or with 0 clears) the lock-delay. Only an empty set carries one: on a set with
    /// holders this does nothing.
    pub fn set_delay_until(&mut self, until: Millis) {
        if self.is_empty() {
            self.repr = if until == 0 {
                Repr::Empty
            } else {
                Repr::Delayed(until)
            };
        }
    }

    pub fn get(&self, owner: &[u8]) -> Option<&Holder> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(o, h) => (o.get() == owner).then_some(h),
            Repr::Many(m) => m.get(owner),
        }
    }

    /// Some holder (the only one, or any of several), `None` when nobody holds the lock.
    pub fn any(&self) -> Option<&Holder> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(_, h) => Some(h),
            Repr::Many(m) => m.first(),
        }
    }

    /// The mode the lock is held in, or `None` when nobody holds it.
    pub fn mode(&self) -> Option<Mode> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(_, h) => Some(h.mode),
            Repr::Many(m) => m.first().map(|h| h.mode),
        }
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = (&[u8], &Holder)> + '_> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => Box::new(std::iter::empty()),
            Repr::One(o, h) => Box::new(std::iter::once((o.get(), h))),
            Repr::Many(m) => Box::new(m.iter()),
        }
    }

    /// At most `max` holders whose lease has not passed at `now`, sorted by owner bytes,
    /// chosen among the first `looks` holders in storage order: naming a few holders of a lock
    /// with 100,000 readers must not walk all of them (LOCK.QUEUES). A holder whose lease has
    /// passed but whose removal has not run yet is not named.
    pub fn some_live(&self, now: Millis, max: usize, looks: usize) -> Vec<(&[u8], &Holder)> {
        let mut some: Vec<_> = self
            .iter()
            .take(looks)
            .filter(|(_, h)| h.expires_at > now)
            .take(max)
            .collect();
        some.sort_by(|a, b| a.0.cmp(b.0));
        some
    }

    /// How many holders are live at `now` (a lease just past is not counted before its removal
    /// runs), counted when there are at most `looks` of them; above that, every recorded
    /// holder, so a lock with 100,000 readers is not walked (LOCK.QUEUES).
    pub fn live_count(&self, now: Millis, looks: usize) -> usize {
        let recorded = self.len();
        if recorded > looks {
            return recorded;
        }
        self.iter().filter(|(_, h)| h.expires_at > now).count()
    }

    /// How many holders are live at `now` (a lease just past is not counted before its removal
    /// runs): exact, in O(holders whose lease has passed), through the expiry index.
    pub fn live_len(&self, now: Millis) -> usize {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => 0,
            Repr::One(_, h) => usize::from(h.expires_at > now),
            Repr::Many(m) => m.len().saturating_sub(m.count_due(now)),
        }
    }

    /// The first `max` live holders in storage order, sorted by owner bytes: `LOCK.INFO key
    /// COUNT n`, in O(n + holders whose lease has passed), whatever the number of holders.
    pub fn first_live(&self, now: Millis, max: usize) -> Vec<(&[u8], &Holder)> {
        let mut some: Vec<_> = self
            .iter()
            .filter(|(_, h)| h.expires_at > now)
            .take(max)
            .collect();
        some.sort_by(|a, b| a.0.cmp(b.0));
        some
    }

    /// Adds a new holder (ending any lock-delay); the caller has checked that `owner` holds
    /// nothing yet.
    pub fn insert(&mut self, owner: &[u8], holder: Holder) {
        match std::mem::take(&mut self.repr) {
            Repr::Empty | Repr::Delayed(_) => self.repr = Repr::One(OwnerBytes::new(owner), holder),
            Repr::One(o, h) => {
                let mut m = Indexed::default();
                m.insert(o.into_box(), h);
                m.insert(owner.into(), holder);
                self.repr = Repr::Many(Box::new(m));
            }
            Repr::Many(mut m) => {
                m.insert(owner.into(), holder);
                self.repr = Repr::Many(m);
            }
        }
    }

    pub fn remove(&mut self, owner: &[u8]) -> Option<Holder> {
        match std::mem::take(&mut self.repr) {
            Repr::Empty => None,
            Repr::Delayed(until) => {
                self.repr = Repr::Delayed(until);
                None
            }
            Repr::One(o, h) => {
                if o.get() == owner {
                    Some(h)
                } else {
                    self.repr = Repr::One(o, h);
                    None
                }
            }
            Repr::Many(mut m) => {
                let removed = m.remove(owner).map(|(_, h)| h);
                self.repr = Self::shrunk(m);
                removed
            }
        }
    }

    /// Back to the inline form when one holder is left (frees the indexes).
    fn shrunk(m: Box<Indexed>) -> Repr {
        match m.len() {
            0 => Repr::Empty,
            1 => match m.into_only() {
                Some((o, h)) => Repr::One(OwnerBytes::new(&o), h),
                None => Repr::Empty,
            },
            _ => Repr::Many(m),
        }
    }

    /// Changes the count and expiry of an existing holder. Returns `None` if `owner` does not
    /// hold the lock.
    pub fn update(&mut self, owner: &[u8], count: u64, expires_at: Millis) -> Option<&Holder> {
        match &mut self.repr {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(o, h) => {
                if o.get() != owner {
                    return None;
                }
                h.count = count;
                h.expires_at = expires_at;
                Some(h)
            }
            Repr::Many(m) => m.update(owner, count, expires_at),
        }
    }

    /// The only holder, when there is exactly one.
    pub fn only(&self) -> Option<(&[u8], &Holder)> {
        match &self.repr {
            Repr::One(o, h) => Some((o.get(), h)),
            _ => None,
        }
    }

    /// The distinct users of the holders ([`Holder::user`]), in O(distinct users): one
    /// holder's, or the list the many-holder form keeps.
    pub fn users(&self) -> Box<dyn Iterator<Item = UserId> + '_> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => Box::new(std::iter::empty()),
            Repr::One(_, h) => Box::new(std::iter::once(h.user)),
            Repr::Many(m) => Box::new(m.users()),
        }
    }

    /// The sum of the holders' counts: for a semaphore, the permits held.
    pub fn total_count(&self) -> u64 {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => 0,
            Repr::One(_, h) => h.count,
            Repr::Many(m) => m.total(),
        }
    }

    /// The earliest expiry among the holders.
    pub fn earliest_expiry(&self) -> Option<Millis> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(_, h) => Some(h.expires_at),
            Repr::Many(m) => m.earliest_expiry(),
        }
    }

    /// The latest expiry among the holders, an exclusive holder's lock-delay included: the
    /// key's Redis expiry. (Readers have no lock-delay, so the expiry index is enough for them.)
    pub fn latest_expiry(&self) -> Option<Millis> {
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(_, h) => Some(h.expiry_with_delay()),
            Repr::Many(m) => m.latest_expiry(),
        }
    }

    /// Removes and returns the holder with the earliest expiry if it is due at `now`.
    pub fn pop_expired(&mut self, now: Millis) -> Option<(Box<[u8]>, Holder)> {
        if self.earliest_expiry()? > now {
            return None;
        }
        match std::mem::take(&mut self.repr) {
            Repr::Empty | Repr::Delayed(_) => None,
            Repr::One(o, h) => Some((o.into_box(), h)),
            Repr::Many(mut m) => {
                let popped = m.pop_expired(now);
                self.repr = Self::shrunk(m);
                popped
            }
        }
    }

    /// Bytes of heap owned by this set, for MEMORY USAGE (an estimate).
    pub fn heap_size(&self) -> usize {
        let options = |h: &Holder| {
            if h.options.is_none() {
                0
            } else {
                std::mem::size_of::<HoldOptions>()
            }
        };
        match &self.repr {
            Repr::Empty | Repr::Delayed(_) => 0,
            Repr::One(o, h) => o.heap_size() + options(h),
            Repr::Many(m) => m.heap_size() + m.iter().map(|(_, h)| options(h)).sum::<usize>(),
        }
    }
}

#[cfg(test)]
mod size_tests {
    /// The user of a hold sits in what was padding: a holder is no larger than before it had
    /// one (memory per reader is a published figure).
    #[test]
    fn a_holder_is_48_bytes() {
        assert_eq!(std::mem::size_of::<super::Holder>(), 48);
    }
}
