//! Section 11: the Rust client's Redlock over five servers of its own (quorum 3). What an
//! uncontended acquire + release costs next to one server, and what a waiter costs each server
//! while the lock is held, waiting queued (the default) or polling.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use redis_lock_client::{Acquire, LockClient, Redlock, WaitStrategy};

use crate::measure::flush;
use crate::server::Server;
use redis_lock_testkit::lock_calls;

/// Per-server timeout of the clients measured (connecting and each reply of a short command).
const TIMEOUT: Duration = Duration::from_millis(500);

pub fn url(s: &Server) -> String {
    format!("redis://127.0.0.1:{}/", s.port)
}

/// `n` servers with the module, each on a free loopback port, pinned like the main one.
pub fn start(
    module: &std::path::Path,
    n: usize,
    cpu: Option<usize>,
) -> Result<Vec<Server>, String> {
    (0..n).map(|_| Server::start(module, cpu)).collect()
}

fn redlock(servers: &[Server]) -> Result<Redlock, String> {
    let urls: Vec<String> = servers.iter().map(url).collect();
    Redlock::new(&urls, TIMEOUT).map_err(|e| format!("Redlock::new: {e}"))
}

/// Uncontended acquire + release, each sample one pair from the call to the release's return:
/// through `Redlock` over all the servers, through `LockClient` on the first one, and as raw
/// `LOCK.ACQUIRE` + `LOCK.RELEASE` on a plain connection to the first one. The three take turns
/// sample by sample.
pub struct Uncontended {
    pub redlock: Vec<Duration>,
    pub single: Vec<Duration>,
    pub raw: Vec<Duration>,
}

pub fn uncontended(servers: &[Server], samples: usize) -> Result<Uncontended, String> {
    for s in servers {
        flush(&mut s.connect());
    }
    let rl = redlock(servers)?;
    let first = &servers[0];
    let single =
        LockClient::new(&url(first), TIMEOUT).map_err(|e| format!("LockClient::new: {e}"))?;
    let mut raw = first.connect();
    let ttl = Duration::from_secs(10);
    let mut out = Uncontended {
        redlock: Vec::with_capacity(samples),
        single: Vec::with_capacity(samples),
        raw: Vec::with_capacity(samples),
    };
    // The first 20 rounds are not counted: they open the connections.
    for i in 0..samples + 20 {
        let key = format!("u:{}", i % 1000);
        let t = Instant::now();
        let g = rl
            .acquire(&format!("{key}:rl"), Acquire::write(ttl))
            .map_err(|e| format!("Redlock acquire: {e}"))?;
        g.release().map_err(|e| format!("Redlock release: {e}"))?;
        let redlock = t.elapsed();

        let t = Instant::now();
        let g = single
            .try_lock(&format!("{key}:one"), ttl)
            .map_err(|e| format!("LockClient acquire: {e}"))?;
        g.release()
            .map_err(|e| format!("LockClient release: {e}"))?;
        let one = t.elapsed();

        let t = Instant::now();
        let raw_key = format!("{key}:raw");
        let v: Value = redis::cmd("LOCK.ACQUIRE")
            .arg(&raw_key)
            .arg("bench")
            .arg(10_000)
            .query(&mut raw)
            .map_err(|e| format!("LOCK.ACQUIRE: {e}"))?;
        if !matches!(v, Value::Int(_)) {
            return Err(format!("LOCK.ACQUIRE {raw_key}: not granted: {v:?}"));
        }
        let v: Value = redis::cmd("LOCK.RELEASE")
            .arg(&raw_key)
            .arg("bench")
            .query(&mut raw)
            .map_err(|e| format!("LOCK.RELEASE: {e}"))?;
        if !matches!(v, Value::Int(_)) {
            return Err(format!("LOCK.RELEASE {raw_key}: {v:?}"));
        }
        let bare = t.elapsed();
        if i >= 20 {
            out.redlock.push(redlock);
            out.single.push(one);
            out.raw.push(bare);
        }
    }
    Ok(out)
}

/// What `waiters` Redlock waiters on one key cost and how fast the lock passes between them.
pub struct Contended {
    /// Lock commands (every `LOCK.*`, INFO commandstats) per second per waiter on the server
    /// that received the most, while the lock was held and the waiters waited.
    pub commands_per_waiter: f64,
    /// From a holder's release call to the next holder's acquire returning.
    pub handovers: Vec<Duration>,
}

/// How long the waiters of the rounds after the first ask before the holder releases.
pub const LATER_SETTLE: Duration = Duration::from_millis(100);

/// `rounds` rounds: a holder takes the key; `waiters` threads ask for it with a wait; after
/// `settle` (in the first round; [`LATER_SETTLE`] in the others) they are all waiting. In the
/// first round, every server's lock commands are counted over `window`. Then the holder releases, and each waiter in turn gets the lock, holds it
/// 1 ms and releases it: `waiters` hand-overs per round.
pub fn contended(
    servers: &[Server],
    strategy: WaitStrategy,
    waiters: usize,
    rounds: usize,
    settle: Duration,
    window: Duration,
) -> Result<Contended, String> {
    for s in servers {
        flush(&mut s.connect());
    }
    let rl = redlock(servers)?.wait_strategy(strategy);
    let mut stats: Vec<redis::Connection> = servers.iter().map(|s| s.connect()).collect();
    let ttl = Duration::from_secs(30);
    let mut cost = f64::NAN;
    let handovers: Mutex<Vec<Duration>> = Mutex::new(Vec::new());
    for round in 0..rounds {
        let key = format!("rl:{strategy:?}:{waiters}:{round}");
        let holder = rl
            .acquire(&key, Acquire::write(ttl))
            .map_err(|e| format!("holder's acquire: {e}"))?;
        let released = Mutex::new(Instant::now());
        let (rl, key, released, handovers) = (&rl, &key, &released, &handovers);
        thread::scope(|s| -> Result<(), String> {
            let threads: Vec<_> = (0..waiters)
                .map(|_| {
                    s.spawn(move || -> Result<(), String> {
                        let g = rl
                            .acquire(key, Acquire::write(ttl).wait(Duration::from_secs(30)))
                            .map_err(|e| format!("waiter's acquire ({strategy:?}): {e}"))?;
                        let granted = Instant::now();
                        let since = *released.lock().expect("release time");
                        handovers
                            .lock()
                            .expect("hand-overs")
                            .push(granted.saturating_duration_since(since));
                        thread::sleep(Duration::from_millis(1));
                        *released.lock().expect("release time") = Instant::now();
                        g.release()
                            .map_err(|e| format!("waiter's release ({strategy:?}): {e}"))
                    })
                })
                .collect();
            thread::sleep(if round == 0 { settle } else { LATER_SETTLE });
            let measured = if round == 0 {
                let before: Vec<f64> = stats.iter_mut().map(|c| lock_calls(c) as f64).collect();
                let t = Instant::now();
                thread::sleep(window);
                let after: Vec<f64> = stats.iter_mut().map(|c| lock_calls(c) as f64).collect();
                let secs = t.elapsed().as_secs_f64();
                Some(
                    before
                        .iter()
                        .zip(&after)
                        .map(|(b, a)| (a - b) / secs / waiters as f64)
                        .fold(0.0, f64::max),
                )
            } else {
                None
            };
            *released.lock().expect("release time") = Instant::now();
            let released_ok = holder
                .release()
                .map_err(|e| format!("holder's release: {e}"));
            let mut result = released_ok;
            for t in threads {
                let r = t
                    .join()
                    .unwrap_or_else(|_| Err("a waiter thread panicked".into()));
                if result.is_ok() {
                    result = r;
                }
            }
            if let Some(c) = measured {
                cost = c;
            }
            result
        })?;
    }
    Ok(Contended {
        commands_per_waiter: cost,
        handovers: handovers.into_inner().expect("hand-overs"),
    })
}
