//! Noticing a lost lock within milliseconds, without polling: the decisions of a client's
//! loss watcher, with no I/O.
//!
//! Each server connection that carries a client's short commands (and its guards' extends)
//! turns on Redis client-side-caching invalidations in broadcast mode with `NOLOOP`:
//! `CLIENT TRACKING on BCAST NOLOOP PREFIX <key> ...`. The server then pushes an `invalidate`
//! message naming the key whenever anyone *else* changes a watched key: another client's
//! acquire or wait, a `DEL`, an expiry (the module's timer or Redis's), an eviction, an
//! overwrite, a bound connection's close, a full resync after a failover; `FLUSHALL` pushes one
//! with no key. Changes made over the same connection (the client's own acquires, extends and
//! releases) push nothing, so a held lock costs no more than its extends. An invalidation
//! only says "this key changed": the watcher reads `LOCK.INFO key OWNER owner` for each owner
//! among the key's guards (one read when they share an owner, as they do with a fixed owner),
//! and those guards decide whether their owner still holds it
//! ([`super::hold::Hold::check_info`]). Each read costs the server O(1) whatever the number of
//! holders. A server whose module predates `OWNER` (0.3.0 and earlier) gets one plain
//! `LOCK.INFO key` instead, judged by every guard of the key
//! ([`super::reply::InfoForm`]).
//!
//! A key is registered once the client holds it, not before (a request that is not granted
//! registers nothing, so waiting and polling clients get no pushes): the registration and a
//! re-read of the key go out right after the grant, and the re-read covers the moment between
//! them. A key already covered needs neither.
//!
//! Prefixes are what broadcast mode matches (a prefix `a` also matches `ab`), and one client's
//! prefixes must not overlap, so the watcher registers a minimal set: a key whose prefix is
//! already registered needs nothing; a key that is a prefix of registered ones makes the watcher
//! replace the set. Prefixes of keys no longer held stay registered (a lock taken again and
//! again costs nothing more) until they are many or draw pushes (others busy with keys this
//! client no longer holds): then the set is replaced by the held keys'. A replacement is one
//! transaction (`MULTI`, `CLIENT TRACKING off`, `on ...`, `EXEC`), so no change falls between.
//! It is followed by a re-read of every watched key: Redis sends broadcast invalidations only
//! at the end of an event-loop iteration, and `CLIENT TRACKING off` drops those still pending
//! for the client's prefixes, so a change made by another client in the same iteration as the
//! replacement (before it) is never pushed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use super::info::LockInfo;
use super::reply::Outcome;

/// The shortest time between two re-reads of one key: under a storm of changes by others, a
/// key costs at most this many `LOCK.INFO` per second and process, and a loss is still
/// noticed within this much (plus a round trip).
pub(crate) const RECHECK_SPACING: Duration = Duration::from_millis(5);

/// A plain `LOCK.INFO` lists every holder, so a key whose last re-read listed many holders
/// (a read lock or a large semaphore, on a server that only takes the plain form) is re-read
/// less often: at least this long per holder listed between two re-reads, which keeps one
/// client's re-reads of a key under about 1 % of the server's time (`LOCK.INFO` costs about
/// 0.5 µs per holder listed). A read of one owner's hold lists at most one: the base spacing.
const SPACING_PER_HOLDER: Duration = Duration::from_micros(50);

/// Rebuild the registered prefixes once more than this many are stale.
const MAX_STALE: usize = 64;

/// Rebuild them once this many pushes came for keys no guard of this client holds.
const MAX_IGNORED_PUSHES: usize = 4;

/// What the watcher wants sent over its connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Register {
    /// Nothing: the key is covered.
    Nothing,
    /// `CLIENT TRACKING on BCAST NOLOOP PREFIX <key>`.
    Add(String),
    /// Replace the set ([`rebuild_cmds`]), then re-read `reread` (every key watched when it
    /// was decided): the replacement drops invalidations the server had not sent yet.
    Rebuild {
        set: Vec<String>,
        reread: Vec<String>,
    },
}

impl Register {
    /// The keys to re-read once this registration was sent, behind it on the same connection
    /// (and so answered after the server ran it). `granted`: the key of a guard just granted,
    /// which is re-read in any case (see [`Watch::granted`]).
    pub(crate) fn rereads(&self, granted: Option<&str>) -> Vec<String> {
        match self {
            // Every watched key, the granted one among them.
            Register::Rebuild { reread, .. } => reread.clone(),
            _ => granted.map(str::to_string).into_iter().collect(),
        }
    }
}

/// The state of one watch connection.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// Watched keys and how many guards watch each.
    keys: HashMap<String, usize>,
    /// Prefixes registered on the connection (none overlapping another).
    registered: BTreeSet<String>,
    /// Keys whose re-read is out.
    in_flight: HashSet<String>,
    /// Keys changed again while their re-read was out, or within the spacing.
    due: HashSet<String>,
    last_read: HashMap<String, Instant>,
    /// Keys whose last re-read listed many holders: their own spacing.
    spacing: HashMap<String, Duration>,
    /// Pushes for keys no guard holds, since the last rebuild.
    ignored: usize,
    /// Invalidations received so far (a flush counts as one naming every key).
    pushes: u64,
    /// For keys pushed while no guard held them: the number of the last push naming them
    /// (at most [`MAX_RECENT`] keys), so a guard granted around that push re-reads its key.
    recent: HashMap<String, u64>,
    /// The number of the last flush push.
    flushed: u64,
}

/// How many pushed keys [`Watch`] remembers for guards being granted.
const MAX_RECENT: usize = 4096;

/// `CLIENT TRACKING on BCAST NOLOOP PREFIX p ...`.
pub(crate) fn tracking_on(prefixes: &[String]) -> Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("TRACKING").arg("on").arg("BCAST").arg("NOLOOP");
    for p in prefixes {
        cmd.arg("PREFIX").arg(p);
    }
    cmd
}

/// `CLIENT TRACKING off`.
pub(crate) fn tracking_off() -> Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("TRACKING").arg("off");
    cmd
}

/// Whether an error reply to a registration means the server will not track for this client
/// (an ACL without `client|tracking`, an unknown command). A prefix that "overlaps with an
/// existing prefix" is not such a refusal: the prefix was registered already (a reconnect
/// registered the whole set while this registration was on its way).
pub(crate) fn tracking_refused(error_text: &str) -> bool {
    !error_text.to_ascii_lowercase().contains("overlap")
}

/// What a registration sends.
pub(crate) fn register_cmds(register: &Register) -> Vec<Cmd> {
    match register {
        Register::Nothing => Vec::new(),
        Register::Add(prefix) => vec![tracking_on(std::slice::from_ref(prefix))],
        Register::Rebuild { set, .. } => rebuild_cmds(set),
    }
}

/// Replaces the registered prefixes by `set` in one transaction: nothing runs between off and
/// on. The server still drops the invalidations it had not sent when `off` ran (changes made
/// earlier in the same event-loop iteration), so the watched keys are re-read after it
/// ([`Register::Rebuild`]).
pub(crate) fn rebuild_cmds(set: &[String]) -> Vec<Cmd> {
    let mut cmds = vec![redis::cmd("MULTI"), tracking_off()];
    if !set.is_empty() {
        cmds.push(tracking_on(set));
    }
    cmds.push(redis::cmd("EXEC"));
    cmds
}

/// The keys an `invalidate` push names: `Some(keys)`, or `None` for "everything" (a flush).
/// Anything else (another kind of push, a malformed one) is not an invalidation.
pub(crate) fn invalidated_keys(
    kind_is_invalidate: bool,
    data: &[Value],
) -> Option<Option<Vec<String>>> {
    if !kind_is_invalidate {
        return None;
    }
    match data.first() {
        None | Some(Value::Nil) => Some(None),
        Some(Value::Array(keys)) | Some(Value::Set(keys)) => Some(Some(
            keys.iter()
                .filter_map(|k| match k {
                    Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    Value::SimpleString(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
        )),
        Some(_) => None,
    }
}

/// The minimal prefix set covering `keys`: no member is a prefix of another.
fn minimal(keys: impl Iterator<Item = String>) -> Vec<String> {
    let sorted: BTreeSet<String> = keys.collect();
    let mut out: Vec<String> = Vec::new();
    for k in sorted {
        // In sorted order a key's prefixes come before it; only the last kept one can be.
        if out.last().is_some_and(|p| k.starts_with(p.as_str())) {
            continue;
        }
        out.push(k);
    }
    out
}

impl Watch {
    /// Whether any key is watched.
    pub(crate) fn has_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The keys watched now.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }

    fn covered(&self, key: &str) -> bool {
        // In a set where no member is a prefix of another, the only member that can be a
        // prefix of `key` is the greatest one at or before it (every string between a prefix
        // of `key` and `key` starts with that prefix).
        self.registered
            .range::<str, _>((std::ops::Bound::Unbounded, std::ops::Bound::Included(key)))
            .next_back()
            .is_some_and(|p| key.starts_with(p.as_str()))
    }

    /// The number of the last invalidation received: a face takes it before sending a request
    /// that may grant, and hands it to [`Watch::granted`].
    pub(crate) fn pushes(&self) -> u64 {
        self.pushes
    }

    /// A guard of `key` was granted to a request sent when [`Watch::pushes`] was `since`: what
    /// to register so that every later change of the key by anyone else is pushed. `None`
    /// when the key was covered and no push named it since (nothing to do); otherwise the
    /// registration (possibly [`Register::Nothing`]), to be followed by the re-reads of
    /// [`Register::rereads`] with `Some(key)`: the key's (a push that came between the grant
    /// and now was not judged by this guard), or every watched key's after a replacement.
    pub(crate) fn granted(&mut self, key: &str, since: u64) -> Option<Register> {
        self.watch(key);
        let pushed_since = self.flushed > since || self.recent.get(key).is_some_and(|n| *n > since);
        if self.covered(key) {
            return pushed_since.then_some(Register::Nothing);
        }
        Some(self.cover(key))
    }

    fn cover(&mut self, key: &str) -> Register {
        if self.covered(key) {
            return Register::Nothing;
        }
        if self.registered.iter().any(|p| p.starts_with(key)) {
            return self.rebuild(Some(key));
        }
        self.registered.insert(key.to_string());
        Register::Add(key.to_string())
    }

    fn watch(&mut self, key: &str) {
        *self.keys.entry(key.to_string()).or_insert(0) += 1;
    }

    /// A guard of `key` ends. Returns a rebuild when stale prefixes have piled up.
    pub(crate) fn unwatch(&mut self, key: &str) -> Register {
        if let Some(n) = self.keys.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.keys.remove(key);
                self.last_read.remove(key);
                self.spacing.remove(key);
                self.due.remove(key);
            }
        }
        // Each watched key is covered by one prefix, so at least this many are stale.
        if self.registered.len() > self.keys.len() + MAX_STALE {
            return self.rebuild(None);
        }
        Register::Nothing
    }

    /// The prefix set for the keys watched now (and `also`), made the registered one; every
    /// watched key is to be re-read after it.
    fn rebuild(&mut self, also: Option<&str>) -> Register {
        let set = minimal(self.keys.keys().cloned().chain(also.map(str::to_string)));
        self.registered = set.iter().cloned().collect();
        self.ignored = 0;
        let mut reread = self.keys();
        reread.sort();
        Register::Rebuild { set, reread }
    }

    /// The set to register now, replacing what is registered (after a connection was set up
    /// from an older snapshot of the watched keys).
    pub(crate) fn resync(&mut self) -> Register {
        self.rebuild(None)
    }

    /// A new connection (or a reconnect): everything must be registered again, and every key
    /// re-read (changes while it was down were not pushed).
    pub(crate) fn connected(&mut self) -> Vec<String> {
        self.in_flight.clear();
        self.due.clear();
        // Changes before this connection were not pushed on it: a guard granted to a request
        // sent before now re-reads its key, as after a flush.
        self.pushes += 1;
        self.flushed = self.pushes;
        let registered = std::mem::take(&mut self.registered);
        let set = minimal(self.keys.keys().cloned().chain(registered));
        self.registered = set.iter().cloned().collect();
        set
    }

    /// An invalidation (`None`: every key). Returns the watched keys to re-read now; others
    /// are due later ([`Watch::next_due`]).
    pub(crate) fn invalidated(&mut self, keys: Option<Vec<String>>, now: Instant) -> Vec<String> {
        self.pushes += 1;
        let keys: Vec<String> = match keys {
            Some(keys) => {
                let mut held = Vec::with_capacity(keys.len());
                for k in keys {
                    if self.keys.contains_key(&k) {
                        held.push(k);
                    } else {
                        self.ignored += 1;
                        if self.recent.len() >= MAX_RECENT {
                            // Forgetting makes a guard granted now re-read: safe.
                            self.recent.clear();
                            self.flushed = self.pushes;
                        }
                        self.recent.insert(k, self.pushes);
                    }
                }
                held
            }
            None => {
                self.flushed = self.pushes;
                self.keys()
            }
        };
        let mut now_keys = Vec::new();
        for k in keys {
            if self.in_flight.contains(&k) || self.too_soon(&k, now) {
                self.due.insert(k);
            } else {
                self.in_flight.insert(k.clone());
                self.last_read.insert(k.clone(), now);
                now_keys.push(k);
            }
        }
        now_keys
    }

    fn too_soon(&self, key: &str, now: Instant) -> bool {
        self.last_read
            .get(key)
            .is_some_and(|t| now.saturating_duration_since(*t) < self.spacing_of(key))
    }

    /// Once many pushes came for keys no longer held, the registered set shrinks to the held
    /// keys' (see the module docs).
    pub(crate) fn noisy(&mut self) -> Option<Register> {
        if self.ignored < MAX_IGNORED_PUSHES {
            return None;
        }
        self.ignored = 0;
        // Only when the set would change (a held key can be the prefix of a busy one: then
        // the pushes stay).
        let set = minimal(self.keys.keys().cloned());
        if set.iter().eq(self.registered.iter()) {
            return None;
        }
        Some(self.rebuild(None))
    }

    /// The re-read of `key` came back (or failed).
    fn spacing_of(&self, key: &str) -> Duration {
        self.spacing.get(key).copied().unwrap_or(RECHECK_SPACING)
    }

    /// The re-read of `key` came back listing `holders` holders (`None`: no list). One that
    /// got no answer at all (`unanswered`) is due again, and goes out once its spacing is over.
    pub(crate) fn read_with(&mut self, key: &str, holders: Option<usize>, unanswered: bool) {
        if unanswered && self.keys.contains_key(key) {
            self.due.insert(key.to_string());
        }
        if let Some(n) = holders {
            let spacing = SPACING_PER_HOLDER
                .saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
                .max(RECHECK_SPACING);
            if spacing > RECHECK_SPACING {
                self.spacing.insert(key.to_string(), spacing);
            } else {
                self.spacing.remove(key);
            }
        }
        self.read(key);
    }

    pub(crate) fn read(&mut self, key: &str) {
        self.in_flight.remove(key);
    }

    /// When the next due re-read may go out, if any is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.due
            .iter()
            .filter(|k| !self.in_flight.contains(*k))
            .map(|k| {
                self.last_read
                    .get(k)
                    .map_or_else(Instant::now, |t| *t + self.spacing_of(k))
            })
            .min()
    }

    /// The due keys that may be re-read at `now`.
    pub(crate) fn due_now(&mut self, now: Instant) -> Vec<String> {
        let ready: Vec<String> = self
            .due
            .iter()
            .filter(|k| !self.in_flight.contains(*k) && !self.too_soon(k, now))
            .cloned()
            .collect();
        for k in &ready {
            self.due.remove(k);
            self.in_flight.insert(k.clone());
            self.last_read.insert(k.clone(), now);
        }
        ready
    }
}

/// The guards a watcher speaks for, by key, around a [`Watch`]: each with its server index
/// and the number of the first re-read that may judge it (a re-read sent before the guard was
/// granted may show the key as it was before). `G` is a face's guard state.
pub(crate) struct Watched<G> {
    pub(crate) core: Watch,
    guards: HashMap<String, Vec<WatchedGuard<G>>>,
    reads_sent: u64,
}

/// One guard under a watcher: (server index, guard, number of the first re-read that may judge
/// it, its owner).
type WatchedGuard<G> = (usize, Weak<G>, u64, String);

impl<G> Default for Watched<G> {
    fn default() -> Self {
        Watched {
            core: Watch::default(),
            guards: HashMap::new(),
            reads_sent: 0,
        }
    }
}

impl<G> Watched<G> {
    /// A new guard of `key`, on server `i` of its guard, granted to a request sent when the
    /// pushes numbered `since` (see [`Watch::granted`]): the registration to send, then the
    /// re-reads of its [`Register::rereads`] with `Some(key)`, which judge this guard; `None`
    /// for nothing to do.
    pub(crate) fn watch(
        &mut self,
        key: &str,
        i: usize,
        guard: &Arc<G>,
        owner: &str,
        since: u64,
    ) -> Option<Register> {
        let register = self.core.granted(key, since);
        let first = self.reads_sent + 1;
        self.guards.entry(key.to_string()).or_default().push((
            i,
            Arc::downgrade(guard),
            first,
            owner.to_string(),
        ));
        register
    }

    /// The owners of `key`'s live guards, each once, sorted: a re-read of the key reads each
    /// one's hold (`LOCK.INFO key OWNER owner`). Empty when no guard of the key is left.
    pub(crate) fn owners(&self, key: &str) -> Vec<String> {
        let owners: BTreeSet<&String> = self
            .guards
            .get(key)
            .map(|l| {
                l.iter()
                    .filter(|(_, g, _, _)| g.strong_count() > 0)
                    .map(|(_, _, _, o)| o)
                    .collect()
            })
            .unwrap_or_default();
        owners.into_iter().cloned().collect()
    }

    /// A guard of `key` is done; a rebuild of the prefixes may be due.
    pub(crate) fn unwatch(&mut self, key: &str, guard: *const G) -> Register {
        let Some(list) = self.guards.get_mut(key) else {
            return Register::Nothing;
        };
        let before = list.len();
        list.retain(|(_, g, _, _)| !std::ptr::eq(g.as_ptr(), guard));
        let removed = before - list.len();
        if list.is_empty() {
            self.guards.remove(key);
        }
        // Only this guard's own registrations (one per time it was watched here).
        let mut register = Register::Nothing;
        for _ in 0..removed {
            register = self.core.unwatch(key);
        }
        register
    }

    /// The number of a re-read about to be sent.
    pub(crate) fn next_read(&mut self) -> u64 {
        self.reads_sent += 1;
        self.reads_sent
    }

    /// The guards of `key` that re-read number `number` may judge. `owner`: the read was of
    /// that owner's hold alone (`OWNER`), which judges only that owner's guards; `None` for a
    /// plain read, which judges them all. The face records the re-read as done once its last
    /// read came back ([`Watch::read_with`]).
    pub(crate) fn judged(
        &self,
        key: &str,
        number: u64,
        owner: Option<&str>,
    ) -> Vec<(usize, Arc<G>)> {
        self.guards
            .get(key)
            .map(|l| {
                l.iter()
                    .filter(|(_, _, first, o)| {
                        *first <= number && owner.is_none_or(|w| w == o.as_str())
                    })
                    .filter_map(|(i, g, _, _)| Some((*i, g.upgrade()?)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What a re-read's reply says of the key (`None`: nothing can be concluded from it).
pub(crate) fn reread_info(reply: Result<Value, Outcome>) -> Option<Option<LockInfo>> {
    LockInfo::from_reply(&reply.ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_never_overlap_and_cover_every_watched_key() {
        let mut w = Watch::default();
        let add = |w: &mut Watch, k: &str| w.granted(k, 0);
        assert_eq!(
            add(&mut w, "lock:ab"),
            Some(Register::Add("lock:ab".into()))
        );
        assert_eq!(add(&mut w, "lock:ab"), None, "already covered");
        assert_eq!(add(&mut w, "lock:abc"), None, "covered by lock:ab");
        // A key that is a prefix of a registered one: replace the set with the minimal one.
        let rebuilt = add(&mut w, "lock:a");
        assert_eq!(
            rebuilt,
            Some(Register::Rebuild {
                set: vec!["lock:a".into()],
                reread: vec!["lock:a".into(), "lock:ab".into(), "lock:abc".into()],
            })
        );
        assert_eq!(add(&mut w, "other"), Some(Register::Add("other".into())));
        let mut set: Vec<String> = w.registered.iter().cloned().collect();
        set.sort();
        assert_eq!(set, vec!["lock:a".to_string(), "other".to_string()]);
    }

    #[test]
    fn stale_prefixes_are_dropped_once_many() {
        let mut w = Watch::default();
        let add = |w: &mut Watch, k: &str| {
            w.granted(k, 0);
        };
        add(&mut w, "kept");
        for i in 0..MAX_STALE {
            add(&mut w, &format!("k{i:04}"));
            assert_eq!(w.unwatch(&format!("k{i:04}")), Register::Nothing);
        }
        add(&mut w, "k9999");
        match w.unwatch("k9999") {
            Register::Rebuild { set, reread } => {
                assert_eq!(set, vec!["kept".to_string()]);
                assert_eq!(reread, vec!["kept".to_string()], "the held keys, re-read");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rereads_are_coalesced_and_spaced() {
        let mut w = Watch::default();
        for k in ["a", "b"] {
            w.granted(k, 0);
        }
        let t = Instant::now();
        assert_eq!(
            w.invalidated(Some(vec!["a".into(), "zzz".into()]), t),
            vec!["a"]
        );
        // Changed again while its read is out: due after it.
        assert!(w.invalidated(Some(vec!["a".into()]), t).is_empty());
        w.read("a");
        assert!(w.due_now(t).is_empty(), "spaced");
        let later = t + RECHECK_SPACING;
        assert_eq!(w.due_now(later), vec!["a"]);
        // A flush names no key: every watched key.
        let mut all = w.invalidated(None, later + RECHECK_SPACING);
        all.sort();
        assert_eq!(all, vec!["b"], "a is still in flight");
    }

    #[test]
    fn a_guard_granted_around_a_push_of_its_covered_key_rereads_it() {
        let mut w = Watch::default();
        assert!(w.granted("k", 0).is_some(), "first time: registered");
        w.unwatch("k");
        let since = w.pushes();
        assert_eq!(
            w.granted("k", since),
            None,
            "covered, nothing pushed: nothing to do"
        );
        w.unwatch("k");
        let since = w.pushes();
        // A push for the key while no guard held it (the grant's own change, a DEL right
        // after it): the guard granted meanwhile must re-read.
        w.invalidated(Some(vec!["k".into()]), Instant::now());
        assert_eq!(w.granted("k", since), Some(Register::Nothing));
        w.unwatch("k");
        let since = w.pushes();
        w.invalidated(None, Instant::now());
        assert_eq!(
            w.granted("k", since),
            Some(Register::Nothing),
            "a flush too"
        );
    }

    #[test]
    fn a_failed_reread_is_due_again() {
        let mut w = Watch::default();
        w.granted("k", 0);
        let t = Instant::now();
        assert_eq!(w.invalidated(Some(vec!["k".into()]), t), vec!["k"]);
        w.read_with("k", None, true);
        assert!(w.next_due().is_some());
        assert_eq!(w.due_now(t + RECHECK_SPACING), vec!["k"]);
    }

    #[test]
    fn a_key_with_many_holders_is_reread_less_often() {
        let mut w = Watch::default();
        w.granted("readers", 0);
        let t = Instant::now();
        assert_eq!(
            w.invalidated(Some(vec!["readers".into()]), t),
            vec!["readers"]
        );
        w.read_with("readers", Some(100_000), false);
        let soon = t + Duration::from_millis(100);
        assert!(w.invalidated(Some(vec!["readers".into()]), soon).is_empty());
        assert!(w.due_now(soon).is_empty(), "5 s apart for 100,000 holders");
        let later = t + Duration::from_secs(5);
        assert_eq!(w.due_now(later), vec!["readers"]);
    }

    #[test]
    fn pushes_for_keys_no_longer_held_shrink_the_set() {
        let mut w = Watch::default();
        w.granted("held", 0);
        w.granted("gone", 0);
        w.unwatch("gone");
        let t = Instant::now();
        for _ in 0..MAX_IGNORED_PUSHES - 1 {
            assert!(w.invalidated(Some(vec!["gone".into()]), t).is_empty());
            assert_eq!(w.noisy(), None);
        }
        w.invalidated(Some(vec!["gone".into()]), t);
        assert_eq!(
            w.noisy(),
            Some(Register::Rebuild {
                set: vec!["held".into()],
                reread: vec!["held".into()],
            })
        );
        assert_eq!(w.noisy(), None, "counted again from zero");
        // The same set again: no rebuild, however many pushes.
        for _ in 0..MAX_IGNORED_PUSHES * 3 {
            w.invalidated(Some(vec!["gone".into()]), t);
            assert_eq!(w.noisy(), None);
        }
        let cmds = rebuild_cmds(&["held".into()]);
        assert_eq!(cmds.len(), 4, "MULTI, off, on, EXEC");
    }

    #[test]
    fn every_replacement_is_followed_by_a_reread_of_every_watched_key() {
        // `CLIENT TRACKING off` drops the invalidations the server has not sent yet: a change
        // of a held key just before a replacement is only found by re-reading it after.
        let mut w = Watch::default();
        w.granted("a", 0);
        w.granted("b", 0);
        w.granted("gone", 0);
        w.unwatch("gone");
        let t = Instant::now();
        for _ in 0..MAX_IGNORED_PUSHES {
            w.invalidated(Some(vec!["gone".into()]), t);
        }
        let noisy = w.noisy().expect("a replacement");
        assert_eq!(noisy.rereads(None), vec!["a".to_string(), "b".to_string()]);
        // A granted key that is a prefix of a registered one: every key, the granted one too.
        let granted = w.granted("", 0).expect("a replacement");
        assert!(matches!(granted, Register::Rebuild { .. }));
        assert_eq!(
            granted.rereads(Some("")),
            vec![String::new(), "a".to_string(), "b".to_string()]
        );
        assert_eq!(w.resync().rereads(None).len(), 3, "a resync too");
        // Anything else re-reads the granted key alone.
        let mut w = Watch::default();
        let add = w.granted("k", 0).expect("registered");
        assert_eq!(add.rereads(Some("k")), vec!["k".to_string()]);
        assert!(add.rereads(None).is_empty());
        assert!(Register::Nothing.rereads(None).is_empty());
    }

    #[test]
    fn invalidation_pushes_are_read_or_refused() {
        let keys = vec![Value::Array(vec![Value::BulkString(b"k".to_vec())])];
        assert_eq!(invalidated_keys(true, &keys), Some(Some(vec!["k".into()])));
        assert_eq!(invalidated_keys(true, &[Value::Nil]), Some(None));
        assert_eq!(invalidated_keys(false, &keys), None);
        assert_eq!(invalidated_keys(true, &[Value::Int(1)]), None);
    }
}
