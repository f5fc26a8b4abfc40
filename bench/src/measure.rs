//! The measurements. Each takes the server and a lock approach and returns figures; nothing is
//! asserted here: targets are compared in the report.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::locks::{module_waiting, Lock};
use crate::server::{command_usec, used_memory, Server};

pub(crate) const LONG_TTL: u64 = 600_000;

pub(crate) fn flush(c: &mut Connection) {
    let _: () = redis::cmd("FLUSHALL").query(c).expect("FLUSHALL");
    reset_stats(c);
}

/// Zeroes INFO commandstats, so the next reading covers only what follows.
pub(crate) fn reset_stats(c: &mut Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(c)
        .expect("RESETSTAT");
}

/// Server time (INFO commandstats, µs) per uncontended acquire + release, one connection, no
/// pipelining. The approaches take turns over `rounds` rounds of `pairs` pairs each and every
/// approach's median round is reported, so drift on a shared machine hits all of them alike.
pub fn server_times(server: &Server, locks: &[&dyn Lock], pairs: usize, rounds: usize) -> Vec<f64> {
    let mut c = server.connect();
    flush(&mut c);
    for l in locks {
        l.prepare(&mut c);
    }
    let mut per_lock: Vec<Vec<f64>> = vec![Vec::new(); locks.len()];
    for _ in 0..rounds {
        for (lock, out) in locks.iter().zip(per_lock.iter_mut()) {
            reset_stats(&mut c);
            for i in 0..pairs {
                let key = format!("st:{}", i % 1000);
                assert!(
                    lock.try_acquire(&mut c, &key, "me", 10_000),
                    "{}: uncontended acquire failed",
                    lock.name()
                );
                assert!(
                    lock.release(&mut c, &key, "me"),
                    "{}: release failed",
                    lock.name()
                );
            }
            let (usec, _) = command_usec(&mut c, lock.commands());
            out.push(usec / pairs as f64);
        }
    }
    per_lock
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        })
        .collect()
}

/// Acquire + release pairs per second with `conns` connections, each on its own keys.
pub fn throughput(server: &Server, lock: &dyn Lock, conns: usize, duration: Duration) -> f64 {
    let mut c = server.connect();
    flush(&mut c);
    lock.prepare(&mut c);
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        for t in 0..conns {
            let (done, stop) = (&done, &stop);
            let mut conn = server.connect();
            s.spawn(move || {
                let key = format!("tp:{t}");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if lock.try_acquire(&mut conn, &key, "me", 10_000)
                        && lock.release(&mut conn, &key, "me")
                    {
                        n += 1;
                    }
                }
                done.fetch_add(n, Ordering::Relaxed);
            });
        }
        thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
    });
    done.load(Ordering::Relaxed) as f64 / duration.as_secs_f64()
}

/// What one contended-handoff run saw.
pub struct HandoffRun {
    /// Release sent to the next grant's reply, per grant.
    pub samples: Vec<Duration>,
    /// The longest any client waited in one acquire, from its call to its grant (calls made
    /// after the first release; including the clients still waiting when the run stopped,
    /// once they get through).
    pub longest_wait: Duration,
    /// How many of the clients were granted at least once before the run stopped.
    pub clients_served: usize,
}

/// Contended handoff: `waiters` clients loop acquire (blocking) / release on one lock (or one
/// semaphore of `permits` permits); each sample is the time from a release being sent to the
/// next grant's reply arriving. Releases and grants are paired first in, first out: with one
/// permit there is at most one release waiting for its grant; with more, each grant takes the
/// oldest release not yet taken.
pub fn handoff(
    server: &Server,
    lock: &dyn Lock,
    waiters: usize,
    permits: usize,
    samples: usize,
    budget: Duration,
) -> HandoffRun {
    let mut c = server.connect();
    flush(&mut c);
    lock.prepare(&mut c);
    let key = "handoff";
    let released_at: Mutex<VecDeque<Instant>> = Mutex::new(VecDeque::new());
    let out: Mutex<Vec<Duration>> = Mutex::new(Vec::new());
    let longest_wait: Mutex<Duration> = Mutex::new(Duration::ZERO);
    let served = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let starters: Vec<String> = if permits <= 1 {
        vec!["starter".into()]
    } else {
        (0..permits).map(|i| format!("starter{i}")).collect()
    };
    for s in &starters {
        assert!(lock.try_acquire(&mut c, key, s, LONG_TTL));
    }
    let deadline = Instant::now() + budget;
    let started: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    thread::scope(|s| {
        for w in 0..waiters {
            let (released_at, out, stop) = (&released_at, &out, &stop);
            let (longest_wait, served, started) = (&longest_wait, &served, &started);
            let mut conn = server.connect();
            s.spawn(move || {
                let owner = format!("w{w}");
                let mut was_served = false;
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    if !lock.acquire(&mut conn, key, &owner, LONG_TTL, Duration::from_secs(30)) {
                        continue;
                    }
                    let granted = Instant::now();
                    if started.get().is_some_and(|t| asked >= *t) {
                        let mut l = longest_wait.lock().unwrap();
                        *l = (*l).max(granted.duration_since(asked));
                    }
                    if !was_served && !stop.load(Ordering::Relaxed) {
                        was_served = true;
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(t0) = released_at.lock().unwrap().pop_front() {
                        let mut v = out.lock().unwrap();
                        v.push(granted.duration_since(t0));
                        if v.len() >= samples || Instant::now() >= deadline {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    released_at.lock().unwrap().push_back(Instant::now());
                    lock.release(&mut conn, key, &owner);
                }
            });
        }
        // Let every waiter queue, then start the chain.
        thread::sleep(Duration::from_millis(200));
        let _ = started.set(Instant::now());
        for s in &starters {
            released_at.lock().unwrap().push_back(Instant::now());
            lock.release(&mut c, key, s);
        }
    });
    HandoffRun {
        samples: out.into_inner().unwrap(),
        longest_wait: longest_wait.into_inner().unwrap(),
        clients_served: served.load(Ordering::Relaxed) as usize,
    }
}

/// Crash hand-over: a holder takes the lock with `ttl_ms` and never releases; one waiter
/// blocks. Each sample: grant time minus (the holder's request time + ttl).
pub fn crash(server: &Server, lock: &dyn Lock, rounds: usize, ttl_ms: u64) -> Vec<Duration> {
    let mut c = server.connect();
    flush(&mut c);
    lock.prepare(&mut c);
    let mut w = server.connect();
    let mut out = Vec::new();
    for r in 0..rounds {
        let key = format!("crash:{r}");
        let sent = Instant::now();
        assert!(lock.try_acquire(&mut c, &key, "crashed", ttl_ms));
        let expires = sent + Duration::from_millis(ttl_ms);
        // Start waiting at a different moment each round (0-97 ms after the holder), so that
        // a poll period never lines up with the TTL by construction.
        thread::sleep(Duration::from_millis((r as u64 * 37) % 98));
        assert!(
            lock.acquire(&mut w, &key, "heir", LONG_TTL, Duration::from_secs(30)),
            "waiter never granted"
        );
        out.push(Instant::now().saturating_duration_since(expires));
        lock.release(&mut w, &key, "heir");
    }
    out
}

/// Disconnect hand-over of the module's bound locks: a holder takes the lock with BIND (and a
/// TTL far beyond the test) on its own connection; one waiter blocks; the holder's connection
/// is closed. Each sample: the waiter's grant time minus the moment the socket was closed.
pub fn bound_crash(server: &Server, rounds: usize) -> Vec<Duration> {
    let mut c = server.connect();
    flush(&mut c);
    let mut out = Vec::new();
    for r in 0..rounds {
        let key = format!("bound:{r}");
        let mut holder = server.connect();
        let token: redis::RedisResult<i64> = redis::cmd("LOCK.ACQUIRE")
            .arg(&key)
            .arg("crashed")
            .arg(LONG_TTL)
            .arg("BIND")
            .query(&mut holder);
        assert!(token.is_ok(), "bound acquire: {token:?}");
        let mut w = server.connect();
        let waiter_key = key.clone();
        let waiter = thread::spawn(move || {
            let reply: redis::RedisResult<i64> = redis::cmd("LOCK.ACQUIRE")
                .arg(&waiter_key)
                .arg("heir")
                .arg(LONG_TTL)
                .arg("WAIT")
                .arg(30_000)
                .query(&mut w);
            (reply, Instant::now())
        });
        // The waiter must be queued before the holder goes.
        wait_for_waiting(&mut c, &key, 1);
        let closed = Instant::now();
        drop(holder);
        let (reply, granted) = waiter.join().expect("waiter thread");
        assert!(reply.is_ok(), "waiter: {reply:?}");
        out.push(granted.saturating_duration_since(closed));
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query(&mut c);
    }
    out
}

/// Fairness: per round a holder holds the lock while `waiters` clients arrive one after another,
/// then releases; each grant is out of order when an earlier arrival was still waiting. Returns
/// (out-of-order grants, grants).
///
/// Where the approach keeps a queue on the server, the next client starts only once the server
/// shows the one before queued, so the order of arrival is known, not assumed. With clients
/// started 5 ms apart, a full run once counted one grant in 320 out of order; 450 rounds of that
/// method with the module's queue read back (LOCK.INFO `waiters`) before the release, idle and
/// with both CPUs busy, never reproduced it, and every grant followed the queue. Whatever held
/// one request back (a client thread or the server stalled beyond the gap), arrival by a fixed
/// gap is an assumption the figure should not rest on. Without a queue to see (SET NX polling),
/// the clients still start 5 ms apart.
pub fn fairness(server: &Server, lock: &dyn Lock, rounds: usize, waiters: usize) -> (usize, usize) {
    let mut c = server.connect();
    flush(&mut c);
    lock.prepare(&mut c);
    let mut out_of_order = 0;
    let mut grants = 0;
    for r in 0..rounds {
        let key = format!("fair:{r}");
        assert!(lock.try_acquire(&mut c, &key, "holder", LONG_TTL));
        let order: Mutex<Vec<usize>> = Mutex::new(Vec::new());
        thread::scope(|s| {
            for i in 0..waiters {
                let (order, key) = (&order, &key);
                let mut conn = server.connect();
                s.spawn(move || {
                    let owner = format!("w{i}");
                    if lock.acquire(&mut conn, key, &owner, LONG_TTL, Duration::from_secs(60)) {
                        order.lock().unwrap().push(i);
                        thread::sleep(Duration::from_millis(1));
                        lock.release(&mut conn, key, &owner);
                    }
                });
                if lock.queued(&mut c, key).is_some() {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while lock.queued(&mut c, key).unwrap_or(0) < i as i64 + 1 {
                        assert!(Instant::now() < deadline, "waiter {i} did not queue");
                        thread::sleep(Duration::from_millis(1));
                    }
                } else {
                    thread::sleep(Duration::from_millis(5));
                }
            }
            thread::sleep(Duration::from_millis(20));
            lock.release(&mut c, &key, "holder");
        });
        let order = order.into_inner().unwrap();
        let mut waiting: Vec<usize> = (0..waiters).collect();
        for granted in order {
            if waiting.first() != Some(&granted) {
                out_of_order += 1;
            }
            waiting.retain(|&x| x != granted);
            grants += 1;
        }
    }
    (out_of_order, grants)
}

/// Bytes of `used_memory` per held lock, over `n` locks with 32-byte owners.
pub fn memory_per_lock(server: &Server, lock: &dyn Lock, n: usize) -> f64 {
    let mut c = server.connect();
    flush(&mut c);
    lock.prepare(&mut c);
    thread::sleep(Duration::from_millis(100));
    let before = used_memory(&mut c);
    fill(&mut c, lock, "mem", n);
    let after = used_memory(&mut c);
    (after - before) / n as f64
}

/// Bytes of `used_memory` per reader, over `n` readers (32-byte owners, each its own) spread
/// `per_key` to a key.
pub fn memory_per_reader(server: &Server, n: usize, per_key: usize) -> f64 {
    let mut c = server.connect();
    flush(&mut c);
    let mut filler = server.connect();
    let before = steady_memory(&mut c);
    for start in (0..n).step_by(1000) {
        let mut p = redis::pipe();
        for i in start..(start + 1000).min(n) {
            p.cmd("LOCK.RWREAD")
                .arg(format!("rd:{}", i / per_key.max(1)))
                .arg(format!("{:032x}", i))
                .arg(LONG_TTL)
                .ignore();
        }
        let _: () = p.query(&mut filler).expect("fill readers");
    }
    drop(filler);
    let after = steady_memory(&mut c);
    (after - before) / n as f64
}

/// `used_memory` once it has stopped moving: two readings 200 ms apart within 4 KB (at most
/// 30 s). Redis frees some of what earlier measurements left behind a little at a time, in its
/// cron (the pooled temp clients of module-blocked clients: 50 per run), which would otherwise
/// count against the locks (at 1000 locks the figure came out negative).
fn steady_memory(c: &mut Connection) -> f64 {
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut last = used_memory(c);
    loop {
        thread::sleep(Duration::from_millis(200));
        let now = used_memory(c);
        if (now - last).abs() < 4096.0 || Instant::now() >= give_up {
            return now;
        }
        last = now;
    }
}

/// Holds `n` locks `{prefix}:{i}` (pipelined).
pub fn fill(c: &mut Connection, lock: &dyn Lock, prefix: &str, n: usize) {
    let owner = "0123456789abcdef0123456789abcdef";
    for start in (0..n).step_by(1000) {
        let mut p = redis::pipe();
        for i in start..(start + 1000).min(n) {
            p.add_command(lock.acquire_cmd(&format!("{prefix}:{i}"), owner, LONG_TTL))
                .ignore();
        }
        let _: () = p.query(c).expect("fill");
    }
}

/// Raw connections that send one command each and never read: clients that stay blocked.
pub(crate) struct RawClients(Vec<TcpStream>);

impl RawClients {
    pub(crate) fn open(server: &Server, n: usize) -> RawClients {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let mut s = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
            s.write_all(b"*1\r\n$4\r\nPING\r\n").expect("write");
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf).expect("PONG");
            v.push(s);
        }
        RawClients(v)
    }

    pub(crate) fn send_each(&mut self, mut command: impl FnMut(usize) -> Vec<String>) {
        for (i, s) in self.0.iter_mut().enumerate() {
            let words = command(i);
            let mut out = format!("*{}\r\n", words.len());
            for w in words {
                out.push_str(&format!("${}\r\n{w}\r\n", w.len()));
            }
            s.write_all(out.as_bytes()).expect("write");
        }
    }
}

pub(crate) fn wait_for_waiting(c: &mut Connection, key: &str, n: usize) {
    // Generous (queueing is linear: a waiter that holds nothing anyone waits for is queued
    // without a deadlock walk).
    let deadline = Instant::now() + Duration::from_secs(60);
    while module_waiting(c, key) < n as i64 {
        assert!(Instant::now() < deadline, "waiters did not queue");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Takes `key` for the owner `holder` with a long lease, so clients queue behind it.
fn hold(c: &mut Connection, key: &str) {
    let _: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg("holder")
        .arg(LONG_TTL)
        .query(c)
        .expect("acquire");
}

/// Client `i`'s request to wait on `key` for at most `wait` ms (0: no limit).
fn waiter_words(key: &str, i: usize, wait: &str) -> Vec<String> {
    vec![
        "LOCK.ACQUIRE".into(),
        key.into(),
        format!("owner-{i:05}"),
        LONG_TTL.to_string(),
        "WAIT".into(),
        wait.to_string(),
    ]
}

/// Bytes per blocked waiter, in three parts: (the module's own data, Redis 7.0's two pooled
/// temp clients per module-blocked client, what Redis spends on any connection blocked in a
/// command). Baseline: `n` connections blocked in BLPOP. Then `n` waiters that time out (which
/// leaves Redis's temp-client pool warm), then `n` waiters again: the second round costs the
/// module's data plus the blocked connection; the first round's extra is Redis's pool growing.
pub fn memory_per_waiter(server: &Server, n: usize) -> (f64, f64, f64) {
    let mut c = server.connect();
    flush(&mut c);
    hold(&mut c, "wm");
    let settle = || thread::sleep(Duration::from_millis(300));
    let waiter_cmd = |wait: &'static str| move |i: usize| waiter_words("wm", i, wait);
    settle();
    let base = used_memory(&mut c);
    let mut blpop = RawClients::open(server, n);
    // All on one list, like the lock waiters on one lock: per client, only the connection and
    // Redis's blocked state.
    blpop.send_each(|_| vec!["BLPOP".into(), "one-list".into(), "0".into()]);
    settle();
    let per_blpop = (used_memory(&mut c) - base) / n as f64;
    drop(blpop);
    settle();

    let cold_base = used_memory(&mut c);
    let mut cold = RawClients::open(server, n);
    cold.send_each(waiter_cmd("3000"));
    wait_for_waiting(&mut c, "wm", n);
    settle();
    let per_cold = (used_memory(&mut c) - cold_base) / n as f64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while module_waiting(&mut c, "wm") > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    drop(cold);
    // No pause here: Redis frees unused pooled temp clients (50 per modulesCron run), and the
    // warm round must find them still pooled.
    let warm_base = used_memory(&mut c);
    let mut warm = RawClients::open(server, n);
    warm.send_each(waiter_cmd("0"));
    wait_for_waiting(&mut c, "wm", n);
    let per_warm = (used_memory(&mut c) - warm_base) / n as f64;
    drop(warm);
    (per_warm - per_blpop, per_cold - per_warm, per_blpop)
}

/// On a fresh server: `used_memory` per idle client connection, and how much more each costs
/// once it waits in a lock queue (`n` clients queued on one held lock; the server's state for a
/// module-blocked client included, on its first use, before any pooling).
pub fn memory_per_connection_and_wait(server: &Server, n: usize) -> (f64, f64) {
    let mut c = server.connect();
    flush(&mut c);
    hold(&mut c, "wq");
    let settle = || thread::sleep(Duration::from_millis(300));
    settle();
    let base = used_memory(&mut c);
    let mut clients = RawClients::open(server, n);
    settle();
    let connected = used_memory(&mut c);
    clients.send_each(|i| waiter_words("wq", i, "0"));
    wait_for_waiting(&mut c, "wq", n);
    settle();
    let waiting = used_memory(&mut c);
    drop(clients);
    (
        (connected - base) / n as f64,
        (waiting - connected) / n as f64,
    )
}

/// What `held` locks held cost: the server time of one more acquire + release among them, and
/// their memory.
pub struct HeldCost {
    /// Server µs per acquire + release (INFO commandstats).
    pub usec: f64,
    /// `used_memory` per held lock (32-byte owners). The locks are taken over a connection of
    /// their own that is closed before the reading, so its query and reply buffers are not
    /// counted: at 1000 locks they would be a good part of the figure.
    pub bytes_per_lock: f64,
}

/// What `held` locks held cost, for the module and for a baseline: each one's memory per held
/// lock (measured with `held` locks of its own kind), and the server time of one more acquire +
/// release while `held` of the module's locks are held.
///
/// The time rounds of the two alternate over the same keyspace, and each figure is the median
/// of 5. Measured one after the other (all the module's rounds, flush and refill, then the
/// baseline's), the two drifted apart by up to a fifth between sizes, so their growth from 1k
/// to 1M locks disagreed in a way that said more about when each ran than about either.
pub fn costs_with_locks_held(
    server: &Server,
    module: &dyn Lock,
    baseline: &dyn Lock,
    held: usize,
    pairs: usize,
) -> (HeldCost, HeldCost) {
    let mut c = server.connect();
    let mut memory = |lock: &dyn Lock| {
        flush(&mut c);
        lock.prepare(&mut c);
        let before = steady_memory(&mut c);
        {
            let mut filler = server.connect();
            fill(&mut filler, lock, "held", held);
        }
        (steady_memory(&mut c) - before) / held as f64
    };
    let base_bytes = memory(baseline);
    // The module's locks stay held for the time rounds of both.
    let module_bytes = memory(module);
    baseline.prepare(&mut c);
    let batches = (pairs / 100 / 5).max(1);
    let mut round = |lock: &dyn Lock, r: usize| {
        reset_stats(&mut c);
        for batch in 0..batches {
            let mut p = redis::pipe();
            for j in 0..100 {
                let key = format!("probe:{r}:{batch}:{j}");
                p.add_command(lock.acquire_cmd(&key, "me", 10_000)).ignore();
            }
            let _: () = p.query(&mut c).expect("probe acquire");
            for j in 0..100 {
                lock.release(&mut c, &format!("probe:{r}:{batch}:{j}"), "me");
            }
        }
        let (usec, _) = command_usec(&mut c, lock.commands());
        usec / (batches * 100) as f64
    };
    let (mut module_rounds, mut base_rounds) = (Vec::new(), Vec::new());
    for r in 0..5 {
        module_rounds.push(round(module, 2 * r));
        base_rounds.push(round(baseline, 2 * r + 1));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(2).copied().unwrap_or(f64::NAN)
    };
    (
        HeldCost {
            usec: median(module_rounds),
            bytes_per_lock: module_bytes,
        },
        HeldCost {
            usec: median(base_rounds),
            bytes_per_lock: base_bytes,
        },
    )
}

/// Server time (µs) of one LOCK.RELEASE that grants the next of `n` queued waiters, measured
/// over `releases` releases while the queue is that deep.
pub fn release_with_waiters(server: &Server, n: usize, releases: usize) -> f64 {
    let mut c = server.connect();
    flush(&mut c);
    let _: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("deep")
        .arg("w-holder")
        .arg(LONG_TTL)
        .query(&mut c)
        .expect("acquire");
    let mut raw = RawClients::open(server, n);
    raw.send_each(|i| {
        vec![
            "LOCK.ACQUIRE".into(),
            "deep".into(),
            format!("w{i}"),
            LONG_TTL.to_string(),
            "WAIT".into(),
            "0".into(),
        ]
    });
    wait_for_waiting(&mut c, "deep", n);
    reset_stats(&mut c);
    let mut current = "w-holder".to_string();
    for i in 0..releases.min(n) {
        let _: i64 = redis::cmd("LOCK.RELEASE")
            .arg("deep")
            .arg(&current)
            .query(&mut c)
            .expect("release");
        current = format!("w{i}");
    }
    let (usec, calls) = command_usec(&mut c, &["lock.release"]);
    drop(raw);
    usec / calls.max(1.0)
}

/// Server time (µs) per reader acquire + release with `readers` readers already holding.
pub fn reader_pair_with_readers(server: &Server, readers: usize, pairs: usize) -> f64 {
    let mut c = server.connect();
    flush(&mut c);
    for start in (0..readers).step_by(1000) {
        let mut p = redis::pipe();
        for i in start..(start + 1000).min(readers) {
            p.cmd("LOCK.RWREAD")
                .arg("shared")
                .arg(format!("reader-{i}"))
                .arg(LONG_TTL)
                .ignore();
        }
        let _: () = p.query(&mut c).expect("readers");
    }
    reset_stats(&mut c);
    for batch in 0..pairs / 100 {
        let mut p = redis::pipe();
        for j in 0..100 {
            let owner = format!("probe-{batch}-{j}");
            p.cmd("LOCK.RWREAD")
                .arg("shared")
                .arg(&owner)
                .arg(10_000)
                .ignore();
            p.cmd("LOCK.RELEASE").arg("shared").arg(&owner).ignore();
        }
        let _: () = p.query(&mut c).expect("probe");
    }
    let (usec, _) = command_usec(&mut c, &["lock.rwread", "lock.release"]);
    usec / (pairs / 100 * 100) as f64
}
