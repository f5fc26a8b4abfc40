//! The reference model for the lock core: the rules of SPEC.md written as plainly as
//! possible (vectors scanned linearly), and a driver that runs an operation sequence on both
//! [`Lock`] and the model, comparing them step by step and checking the safety invariants
//! after every step. Used by the property test (`model_tests`) and the cargo-fuzz target
//! (`fuzz/`), so both hunt with the same oracle.

use super::*;

/// Owners are `o0`..`o4`.
pub const OWNERS: u8 = 5;

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
}

#[derive(Clone, Debug, PartialEq)]
struct MHolder {
    owner: u8,
    mode: Mode,
    count: u64,
    expires_at: Millis,
    token: u64,
}

#[derive(Clone, Debug)]
struct MWaiter {
    id: u64,
    owner: u8,
    mode: Mode,
    ttl: Millis,
}

/// The reference: the rules of SPEC.md written as plainly as possible.
#[derive(Default)]
struct Model {
    holders: Vec<MHolder>,
    queue: Vec<MWaiter>,
    last_token: u64,
    /// (waiter id, owner, token) for every grant out of the queue, in order.
    granted: Vec<(u64, u8, u64)>,
    expired: Vec<u8>,
}

impl Model {
    fn holding(&self, owner: u8) -> Option<usize> {
        self.holders.iter().position(|h| h.owner == owner)
    }

    fn all_read(&self) -> bool {
        self.holders.iter().all(|h| h.mode == Mode::Read)
    }

    fn new_hold(&mut self, owner: u8, mode: Mode, ttl: Millis, now: Millis) -> u64 {
        self.last_token += 1;
        self.holders.push(MHolder {
            owner,
            mode,
            count: 1,
            expires_at: now + ttl,
            token: self.last_token,
        });
        self.last_token
    }

    fn head_grantable(&self) -> bool {
        let Some(w) = self.queue.first() else {
            return false;
        };
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
        }
    }

    fn serve(&mut self, now: Millis) {
        while self.head_grantable() {
            let w = self.queue.remove(0);
            let token = match self.holding(w.owner) {
                Some(i) => {
                    let h = &mut self.holders[i];
                    h.count += 1;
                    h.expires_at = now + w.ttl;
                    h.token
                }
                None => self.new_hold(w.owner, w.mode, w.ttl, now),
            };
            self.granted.push((w.id, w.owner, token));
        }
    }

    fn expire(&mut self, now: Millis) {
        let mut due: Vec<MHolder> = self
            .holders
            .iter()
            .filter(|h| h.expires_at <= now)
            .cloned()
            .collect();
        if due.is_empty() {
            return;
        }
        due.sort_by_key(|h| (h.expires_at, h.owner));
        self.expired.extend(due.iter().map(|h| h.owner));
        self.holders.retain(|h| h.expires_at > now);
        self.serve(now);
    }

    fn acquire(
        &mut self,
        owner: u8,
        mode: Mode,
        ttl: Millis,
        wait: Option<u64>,
        now: Millis,
    ) -> Acquired {
        self.expire(now);
        if let Some(i) = self.holding(owner) {
            let h = &mut self.holders[i];
            if h.mode == Mode::Read && mode == Mode::Write {
                return Acquired::Deadlock;
            }
            h.count += 1;
            h.expires_at = now + ttl;
            return Acquired::Granted {
                token: h.token,
                count: h.count,
            };
        }
        let fits = self.holders.is_empty() || (mode == Mode::Read && self.all_read());
        if self.queue.is_empty() && fits {
            let token = self.new_hold(owner, mode, ttl, now);
            return Acquired::Granted { token, count: 1 };
        }
        match wait {
            Some(id) => {
                self.queue.push(MWaiter {
                    id,
                    owner,
                    mode,
                    ttl,
                });
                Acquired::Queued
            }
            None => Acquired::Busy,
        }
    }

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
}

fn owner_bytes(o: u8) -> [u8; 2] {
    [b'o', b'0' + o]
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
    }
    if let Some((_, head)) = lock.queue().head() {
        ensure!(!holders.is_empty(), "waiters queued behind a free lock");
        let own = lock.holders().get(&head.owner);
        let grantable = match head.mode {
            Mode::Write => own.is_some_and(|h| h.mode == Mode::Write),
            Mode::Read => {
                lock.mode() == Some(Mode::Read) || own.is_some_and(|h| h.mode == Mode::Write)
            }
        };
        ensure!(!grantable, "queue head left waiting although grantable");
    }
    Ok(())
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
    let mut granted_ids = std::collections::HashSet::new();
    let mut cancelled = std::collections::HashSet::new();

    for op in ops.iter().cloned() {
        let mut events = Vec::new();
        let mut step = Step {
            now,
            fences: &mut fences,
            events: &mut events,
        };
        let mut direct_token = None;
        match op {
            Op::Acquire {
                owner,
                mode,
                ttl,
                wait,
            } => {
                let id = wait.then(|| {
                    next_id += 1;
                    next_id
                });
                let got = lock.acquire(&owner_bytes(owner), mode, ttl, id.map(WaiterId), &mut step);
                let want = model.acquire(owner, mode, ttl, id, now);
                ensure_eq!(got, want);
                if let Acquired::Granted { token, count: 1 } = got {
                    direct_token = Some(token);
                }
            }
            Op::Release { owner, all } => {
                let got = lock.release(&owner_bytes(owner), all, &mut step);
                ensure_eq!(got, model.release(owner, all, now));
            }
            Op::Extend { owner, ttl } => {
                let got = lock.extend(&owner_bytes(owner), ttl, &mut step);
                ensure_eq!(got, model.extend(owner, ttl, now));
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
        }

        // Events must match the model's grants and expiries, in order.
        let mut grants = Vec::new();
        let mut expiries = Vec::new();
        for e in &events {
            match e {
                Event::Granted {
                    waiter,
                    owner,
                    token,
                    count,
                    ..
                } => {
                    grants.push((waiter.0, owner[1] - b'0', *token));
                    ensure!(waiter.0 > last_granted_id, "grant out of queue order");
                    last_granted_id = waiter.0;
                    ensure!(granted_ids.insert(waiter.0), "waiter granted twice");
                    ensure!(!cancelled.contains(&waiter.0), "cancelled waiter granted");
                    if *count == 1 {
                        ensure!(*token > max_token, "token did not increase");
                        max_token = *token;
                    }
                }
                Event::Expired { owner, .. } => expiries.push(owner[1] - b'0'),
                Event::Updated { .. }
                | Event::Disconnected { .. }
                | Event::DelayStarted { .. }
                | Event::DelayEnded => {}
            }
        }
        if let Some(t) = direct_token {
            ensure!(t > max_token, "token did not increase");
            max_token = t;
        }
        ensure_eq!(grants, std::mem::take(&mut model.granted));
        ensure_eq!(expiries, std::mem::take(&mut model.expired));

        // Same holders and queue as the model.
        let mut got: Vec<MHolder> = lock
            .holders()
            .iter()
            .map(|(o, h)| MHolder {
                owner: o[1] - b'0',
                mode: h.mode,
                count: h.count,
                expires_at: h.expires_at,
                token: h.token,
            })
            .collect();
        got.sort_by_key(|h| h.owner);
        let mut want = model.holders.clone();
        want.sort_by_key(|h| h.owner);
        ensure_eq!(got, want);
        let queue: Vec<u64> = lock.queue().iter().map(|(id, _)| id.0).collect();
        let model_queue: Vec<u64> = model.queue.iter().map(|w| w.id).collect();
        ensure_eq!(queue, model_queue);
        ensure_eq!(
            lock.next_expiry(),
            model.holders.iter().map(|h| h.expires_at).min()
        );
        ensure_eq!(
            lock.last_expiry(),
            model.holders.iter().map(|h| h.expires_at).max()
        );
        check_invariants(&lock, now)?;
    }
    Ok(())
}

/// Decodes fuzzer bytes into operations (4 bytes per operation).
pub fn decode(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .map(|c| {
            let (kind, a, b, d) = (c[0] % 11, c[1], c[2], c[3]);
            let owner = a % OWNERS;
            let mode = if b & 1 == 0 { Mode::Write } else { Mode::Read };
            match kind {
                0..=3 => Op::Acquire {
                    owner,
                    mode,
                    ttl: 1 + u64::from(d % 60),
                    wait: b & 2 != 0,
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
                _ => Op::Cancel {
                    nth: usize::from(d),
                },
            }
        })
        .collect()
}
