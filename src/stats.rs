//! The fencing counter and the figures shown by `INFO lock` (their storage is in `state`).

use std::cell::Cell;

use redis_lock_core::{Lock, Mode};

use crate::state::{with_counters, with_waiters, Histogram, HOLD_BUCKETS_MS, WAIT_BUCKETS_MS};
use crate::sys::info::InfoSource;

pub use crate::state::with_fences;

pub fn last_token() -> u64 {
    with_fences(|f| f.last())
}

/// Jumps the fencing counter to the wall-clock floor (`redis_lock_core::token_floor`, one
/// token per microsecond): at load, when loading ends and on promotion, so this server's next
/// tokens are above every token an earlier incarnation of it, or a previous master, issued,
/// whether or not those grants reached the RDB, the AOF or this replica. The assumption: the
/// clocks of the servers involved differ by less than the time since the previous master last
/// started or was promoted (less the tokens it issued since, in µs). `occasion` names the
/// moment for the warning given when the counter is past 2^53 - 1 (see [`warn_beyond_exact`]).
pub fn raise_fences_to_clock(occasion: &str) {
    let now = crate::sys::context::now_us();
    with_fences(|f| f.raise_to_floor(now));
    if with_fences(|f| f.beyond_exact()) {
        warn_beyond_exact(occasion, last_token());
    }
}

/// Makes the fencing counter observe `token`, carried by a value or state from elsewhere
/// (`from` says what, for the log). The counter crossing 2^53 - 1 that way (data from a
/// pre-release build) is logged once, unless the server is loading: the end of loading says it
/// once for the whole file (`raise_fences_to_clock`).
pub fn observe_token(token: u64, from: &str) {
    if with_fences(|f| f.observe(token)) && !crate::sys::context::server_is_loading() {
        warn_beyond_exact(from, last_token());
    }
}

/// Is a stored `token` (a holder's token, a key's fence or a saved counter) loadable? Above
/// 2^53 - 1 only with `lock.legacy-tokens` on (data of a pre-release build), never above
/// 2^63 - 1. When it is not, logs why, naming `what` (the key) and the way out, and, during a
/// load, remembers it: an AOF load goes on past a command that fails, so the end of that load
/// stops the server ([`stop_if_load_refused`]); an RDB load fails on its own.
pub fn accept_stored_token(token: u64, what: &str) -> bool {
    if with_fences(|f| f.accepts(token)) {
        return true;
    }
    let line = format!(
        "lock module: {what} carries fencing token {token}, above {} ({}); such a value was \
         written by a pre-release build (or crafted) and is refused. To load it, set \
         lock.legacy-tokens yes (a config-file line, --lock.legacy-tokens yes on the command \
         line, or CONFIG SET at runtime): tokens then go on above it, and clients that read \
         integers as doubles cannot tell neighbouring tokens apart",
        if with_fences(|f| f.legacy()) {
            "2^63-1"
        } else {
            "2^53-1"
        },
        with_fences(|f| f.end()),
    );
    crate::sys::context::log_warning(&line);
    if crate::sys::context::server_is_loading() {
        crate::state::with_refused_load(|r| {
            r.get_or_insert(line);
        });
    }
    false
}

/// At the end of a load: if it refused a value (an AOF load, which Redis does not stop when a
/// command fails), stops the server as a failed RDB load does, so it never runs on a data set
/// with keys left out. The log already names each refused key and the way out.
pub fn stop_if_load_refused() {
    if let Some(line) = crate::state::with_refused_load(Option::take) {
        crate::sys::context::log_warning(&format!(
            "lock module: the load refused a lock value, so the server stops rather than run \
             without it (first refusal: {line})"
        ));
        crate::sys::context::exit_after_refused_load();
    }
}

/// A failed load (the server exits, or a replica tries again) forgets what it refused.
pub fn forget_refused_load() {
    crate::state::with_refused_load(|r| *r = None);
}

/// The warning for tokens above 2^53 - 1: they keep counting (never backwards), but clients
/// that read integers as doubles can no longer tell neighbouring tokens apart.
pub fn warn_beyond_exact(occasion: &str, token: u64) {
    crate::sys::context::log_warning(&format!(
        "lock module: {occasion}: fencing token {token} is above 2^53-1 ({}), carried over \
         from a pre-release build; tokens keep counting from it and never go back, but Lua \
         scripts, JavaScript and JSON clients read them as doubles and cannot tell neighbouring \
         tokens apart",
        redis_lock_core::MAX_EXACT_TOKEN
    ));
}

/// The current-value figures one lock contributes to INFO: recomputed after each change and
/// applied as a difference, so the totals never need a scan of the keyspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    pub locks_held: u32,
    pub readers: u32,
    pub writers: u32,
    pub waiters: u32,
    /// Semaphore permits held (an owner with 3 permits counts 3).
    pub permits: u32,
}

impl Gauges {
    #[inline]
    pub fn of(lock: &Lock) -> Self {
        let holders = lock.holders();
        let waiters = u32::try_from(lock.queue().len()).unwrap_or(u32::MAX);
        let Some(first) = holders.any() else {
            return Gauges {
                waiters,
                ..Gauges::default()
            };
        };
        let count = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        let (readers, writers, permits) = match first.mode {
            Mode::Read => (count, 0, 0),
            Mode::Write => (0, count, 0),
            Mode::Permit => (
                0,
                0,
                u32::try_from(holders.total_count()).unwrap_or(u32::MAX),
            ),
        };
        Gauges {
            locks_held: 1,
            readers,
            writers,
            waiters,
            permits,
        }
    }
}

fn bump(cell: &Cell<u64>, by: u64) {
    cell.set(cell.get().saturating_add(by));
}

fn shift(cell: &Cell<u64>, old: u32, new: u32) {
    cell.set(
        cell.get()
            .saturating_sub(u64::from(old))
            .saturating_add(u64::from(new)),
    );
}

pub fn count_grant() {
    with_counters(|c| bump(&c.grants, 1));
}

pub fn count_timeout() {
    with_counters(|c| bump(&c.timeouts, 1));
}

pub fn count_deadlock() {
    with_counters(|c| bump(&c.deadlocks, 1));
}

pub fn count_deadlock_check_cut() {
    with_counters(|c| bump(&c.deadlock_checks_cut, 1));
}

pub fn count_disconnect() {
    with_counters(|c| bump(&c.disconnects, 1));
}

pub fn count_queue_full() {
    with_counters(|c| bump(&c.queue_full, 1));
}

pub fn count_reentry() {
    with_counters(|c| bump(&c.reentries, 1));
}

pub fn count_release() {
    with_counters(|c| bump(&c.releases, 1));
}

pub fn count_extend() {
    with_counters(|c| bump(&c.extends, 1));
}

pub fn count_given_back() {
    with_counters(|c| bump(&c.given_back, 1));
}

/// A queued waiter was granted after waiting `waited_ms`: a hand-over, and a sample of the
/// wait-time histogram.
pub fn count_handoff(waited_ms: u64) {
    with_counters(|c| sample(&c.waits, waited_ms));
}

/// A hold ended (released, expired or disconnected) after `held_ms`: a sample of the hold-time
/// histogram.
pub fn count_hold_end(held_ms: u64) {
    with_counters(|c| sample(&c.holds, held_ms));
}

/// Adds one sample to `h` (one bucket bumped; the cumulative counts are summed when shown).
fn sample<const N: usize>(h: &Histogram<N>, ms: u64) {
    bump(&h.count, 1);
    bump(&h.sum, ms);
    if let Some(i) = h.bounds.iter().position(|le| ms <= *le) {
        if let Some(bucket) = h.buckets.get(i) {
            bump(bucket, 1);
        }
    }
}

/// Shows `h` as INFO fields: the cumulative buckets under `names` (as Prometheus histograms
/// have them, each counting every sample up to its bound), then `<prefix>_count` and
/// `<prefix>_sum`.
fn add_histogram<const N: usize>(
    add: &mut dyn FnMut(&'static str, u64),
    h: &Histogram<N>,
    names: &[&'static str; N],
    count_and_sum: [&'static str; 2],
) {
    let mut cumulative = 0u64;
    for (name, bucket) in names.iter().zip(h.buckets.iter()) {
        cumulative = cumulative.saturating_add(bucket.get());
        add(name, cumulative);
    }
    add(count_and_sum[0], h.count.get());
    add(count_and_sum[1], h.sum.get());
}

/// The server evicted a lock key.
pub fn count_eviction() {
    with_counters(|c| bump(&c.evictions, 1));
}

pub fn count_expirations(n: u64) {
    with_counters(|c| bump(&c.expirations, n));
}

/// Replaces one lock's contribution `old` by `new`.
pub fn update_gauges(old: Gauges, new: Gauges) {
    if old == new {
        return;
    }
    with_counters(|c| {
        shift(&c.locks_held, old.locks_held, new.locks_held);
        shift(&c.readers, old.readers, new.readers);
        shift(&c.writers, old.writers, new.writers);
        shift(&c.waiters, old.waiters, new.waiters);
        shift(&c.permits, old.permits, new.permits);
    });
}

/// The `INFO lock` section.
pub struct InfoFields;

/// The wait-time histogram's field names: `wait_ms_le_<bound>`, in `WAIT_BUCKETS_MS` order.
const WAIT_BUCKET_NAMES: [&str; WAIT_BUCKETS_MS.len()] = [
    "wait_ms_le_1",
    "wait_ms_le_5",
    "wait_ms_le_10",
    "wait_ms_le_50",
    "wait_ms_le_100",
    "wait_ms_le_500",
    "wait_ms_le_1000",
    "wait_ms_le_5000",
    "wait_ms_le_10000",
    "wait_ms_le_60000",
];

/// The hold-time histogram's field names, in `HOLD_BUCKETS_MS` order.
const HOLD_BUCKET_NAMES: [&str; HOLD_BUCKETS_MS.len()] = [
    "hold_ms_le_1",
    "hold_ms_le_5",
    "hold_ms_le_10",
    "hold_ms_le_50",
    "hold_ms_le_100",
    "hold_ms_le_500",
    "hold_ms_le_1000",
    "hold_ms_le_5000",
    "hold_ms_le_10000",
    "hold_ms_le_60000",
    "hold_ms_le_300000",
    "hold_ms_le_3600000",
];

/// The age (ms) of the longest-waiting queued client, and the longest queue of any key:
/// read when INFO asks from the first entries of the waiter registry's two rankings.
pub fn queue_figures(now: u64) -> (u64, u64) {
    with_waiters(|r| r.queue_extremes(now))
}

impl InfoSource for InfoFields {
    fn fields(add: &mut dyn FnMut(&'static str, u64)) {
        let (oldest, longest) = queue_figures(crate::sys::context::now_ms());
        // The figures in the order SPEC.md names them, then the later ones.
        with_counters(|c| {
            add("locks_held", c.locks_held.get());
            add("readers", c.readers.get());
            add("writers", c.writers.get());
            add("waiters", c.waiters.get());
            add("permits", c.permits.get());
            add("grants_total", c.grants.get());
            add("timeouts_total", c.timeouts.get());
            add("expirations_total", c.expirations.get());
            add("disconnects_total", c.disconnects.get());
            add("deadlocks_total", c.deadlocks.get());
            add("handoffs_total", c.waits.count.get());
            add("reentries_total", c.reentries.get());
            add("releases_total", c.releases.get());
            add("extends_total", c.extends.get());
            add("maxwaiters_total", c.queue_full.get());
            add("given_back_total", c.given_back.get());
            // 1 while maxmemory and maxmemory-policy let the server evict lock keys.
            add(
                "evictable",
                u64::from(crate::sys::context::server_can_evict()),
            );
            add("evicted_total", c.evictions.get());
            add("deadlock_checks_cut_total", c.deadlock_checks_cut.get());
            add("oldest_wait_ms", oldest);
            add("longest_queue", longest);
            add_histogram(
                add,
                &c.waits,
                &WAIT_BUCKET_NAMES,
                ["wait_ms_count", "wait_ms_sum"],
            );
            add_histogram(
                add,
                &c.holds,
                &HOLD_BUCKET_NAMES,
                ["hold_ms_count", "hold_ms_sum"],
            );
        });
        // Waiters answered TRYAGAIN because MIGRATE (cluster resharding) moved their key away.
        add("migrated_waiters_total", crate::state::migrated_waiters());
        // Lock keys given up because another node (or none) now serves their hash slot
        // (`settle`): their waiters were answered TRYAGAIN, their holds are gone here.
        add("slot_losses_total", crate::state::slot_losses());
        // Lock-value allocations moved by active defragmentation (`defrag`).
        add("defrag_moves_total", crate::defrag::moves_total());
        // What this build is and writes, for upgrade and rollback checks (docs/operations.md):
        // the version MODULE LIST shows, and the RDB encoding version of lock keys it writes.
        add(
            "module_version",
            u64::try_from(crate::metadata::MODULE_VERSION).unwrap_or(0),
        );
        add(
            "encoding_version",
            u64::try_from(redis_lock_core::stored::ENCODING_VERSION).unwrap_or(0),
        );
    }
}
