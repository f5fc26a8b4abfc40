//! The reference model for the lock core: the rules of SPEC.md written as plainly as
//! possible (vectors scanned linearly), and a driver that runs an operation sequence on both
//! [`Lock`] and the model, comparing them step by step and checking the safety invariants
//! after every step. Used by the property test (`model_tests`) and the cargo-fuzz target
//! (`fuzz/`), so both hunt with the same oracle.
//!
//! Version 2 options are in: an acquire may be bound to one of a few connections (`BIND`) and
//! carry a lock-delay (`LOCKDELAY`), and a connection may close ([`Op::Disconnect`]).

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
}

#[derive(Clone, Debug, PartialEq)]
struct MHolder {
    owner: u8,
    mode: Mode,
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
}

/// The reference: the rules of SPEC.md written as plainly as possible.
#[derive(Default)]
struct Model {
    holders: Vec<MHolder>,
    queue: Vec<MWaiter>,
    last_token: u64,
    /// The end of the pending lock-delay, 0 when none. Every operation first ends a delay
    /// that is over ([`Model::expire`]), so while it is not 0 nobody may be granted.
    delay_until: Millis,
    /// Everything reported since the driver last looked, in order.
    events: Vec<MEvent>,
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
            // The model does not generate semaphore requests yet.
            Mode::Permit => false,
        }
    }

    fn serve(&mut self, now: Millis) {
        while self.head_grantable() {
            let w = self.queue.remove(0);
            let (token, count) = match self.holding(w.owner) {
                // A re-entry: the hold keeps the options it was created with.
                Some(i) => {
                    let h = &mut self.holders[i];
                    h.count += 1;
                    h.expires_at = now + w.ttl;
                    (h.token, h.count)
                }
                None => (self.new_hold(&w, now), 1),
            };
            self.events.push(MEvent::Granted {
                id: w.id,
                owner: w.owner,
                mode: w.mode,
                token,
                count,
                expires_at: now + w.ttl,
            });
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
    }

    fn acquire(&mut self, w: MWaiter, wait: bool, now: Millis) -> Acquired {
        self.expire(now);
        if let Some(i) = self.holding(w.owner) {
            // A re-entry: options are ignored.
            let h = &mut self.holders[i];
            if h.mode == Mode::Read && w.mode == Mode::Write {
                return Acquired::Deadlock;
            }
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
            let token = self.new_hold(&w, now);
            return Acquired::Granted { token, count: 1 };
        }
        if wait {
            self.queue.push(w);
            Acquired::Queued
        } else {
            Acquired::Busy
        }
    }

    /// A release never leaves a lock-delay.
    fn release(&mut self, owner: u8, all: bool, now: Millis) -> Result<u64, NotOwner> {
        self.expire(now);
        let i = self.holding(owner).ok_or(NotOwner)?;
        let h = &mut self.holders[i];
        h.count = if all { 0 } else { h.count - 1 };
        let left = h.count;
        if left == 0 {
            self.holders.remove(i);
            self.serve(now);
        }
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
        if h.mode == Mode::Read {
            ensure_eq!(
                h.options.get().lock_delay,
                0,
                "{owner:?} reads with a delay"
            );
        }
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

/// Sorts each run of consecutive `Disconnected` events by owner: holds that end together (at
/// one connection's close) may be reported in any order.
fn sort_disconnect_runs(events: &mut [MEvent]) {
    let key = |e: &MEvent| match e {
        MEvent::Disconnected { owner, .. } => Some(*owner),
        _ => None,
    };
    let mut start = 0;
    while start < events.len() {
        let mut end = start;
        while end < events.len() && key(&events[end]).is_some() {
            end += 1;
        }
        events[start..end].sort_by_key(key);
        start = end + 1;
    }
}

/// Runs `ops` on a [`Lock`] and on the model; `Err` describes the first divergence or broken
/// invariant.
pub fn run(ops: &[Op]) -> Result<(), String> {
    let mut lock = Lock::new();
    let mut fences = FenceCounter::default();
    let mut model = Model::default();
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

    for (n, op) in ops.iter().cloned().enumerate() {
        let delay_before = lock.delay_until();
        let mut events = Vec::new();
        let mut step = Step {
            now,
            fences: &mut fences,
            events: &mut events,
        };
        // A new hold granted directly, with the options it must have.
        let mut direct = None;
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
                    ttl,
                    bound_to: bind,
                    lock_delay,
                };
                let want = model.acquire(waiter, wait, now);
                ensure_eq!(got, want, "op {n}: {op:?}");
                match got {
                    Acquired::Granted { token, count: 1 } => {
                        direct = Some((token, hold_options(mode, options)));
                    }
                    Acquired::Queued => {
                        if let Some(id) = id {
                            asked.insert(id, hold_options(mode, options));
                        }
                    }
                    _ => {}
                }
            }
            Op::Release { owner, all } => {
                let got = lock.release(&owner_bytes(owner), all, &mut step);
                ensure_eq!(got, model.release(owner, all, now), "op {n}: {op:?}");
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
        }

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
                    if *count == 1 {
                        ensure!(*token > max_token, "token did not increase");
                        max_token = *token;
                        let options = asked
                            .get(&waiter.0)
                            .copied()
                            .ok_or_else(|| format!("unknown waiter {} granted", waiter.0))?;
                        new_holds.push((*token, options));
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
                Event::Expired { owner, mode } => reported.push(MEvent::Expired {
                    owner: owner[1] - b'0',
                    mode: *mode,
                }),
                Event::Disconnected { owner, mode } => reported.push(MEvent::Disconnected {
                    owner: owner[1] - b'0',
                    mode: *mode,
                }),
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
                Event::Updated { .. } | Event::BoundEnded { .. } => {}
            }
        }
        if let Some((token, options)) = direct {
            ensure!(
                pending == 0,
                "op {n}: granted directly at {now} during a lock-delay until {pending}"
            );
            ensure!(token > max_token, "token did not increase");
            max_token = token;
            new_holds.push((token, options));
        }
        ensure_eq!(
            pending,
            lock.delay_until(),
            "op {n}: the delay events disagree with the lock"
        );
        sort_disconnect_runs(&mut reported);
        ensure_eq!(
            reported,
            std::mem::take(&mut model.events),
            "op {n}: {op:?}, events"
        );

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
                ttl: w.ttl,
                bound_to: w.options.bound_to,
                lock_delay: w.options.lock_delay,
            })
            .collect();
        ensure_eq!(queue, model.queue, "op {n}: {op:?}, queue");
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
/// connection 0..3) and LOCKDELAY (bits 4-7: 0 below 8, else 5 to 40 ms).
pub fn decode(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .map(|c| {
            let (kind, a, b, d) = (c[0] % 12, c[1], c[2], c[3]);
            let owner = a % OWNERS;
            let mode = if b & 1 == 0 { Mode::Write } else { Mode::Read };
            match kind {
                0..=3 => Op::Acquire {
                    owner,
                    mode,
                    ttl: 1 + u64::from(d % 60),
                    wait: b & 2 != 0,
                    bind: match (b >> 2) & 3 {
                        0 => None,
                        conn => Some(u64::from(conn - 1)),
                    },
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
                _ => Op::Disconnect {
                    conn: u64::from(d) % CONNS,
                },
            }
        })
        .collect()
}
