//! Issue 24, "loss noticed within 50 ms": how long after the server ends a guard's hold does
//! `is_lost()` (and, async, `LostSignal::lost()`) say so, for the four ways the issue names:
//! the key deleted (`DEL`), the hold expired on the server while the client still counts on a
//! long ttl (`LOCK.EXTEND ... 100` from a raw connection), a bound connection killed (`CLIENT
//! KILL ID`), and a failover-like takeover (the guard's server made a replica of one without
//! the key: the full resync drops the hold, then another client takes the key on the new
//! master). None of the guards has a watchdog, and the ttl is 30 s: validity running out is
//! not what is measured.
//!
//! Each event is repeated `TRIALS` times; the median and the maximum are printed with
//! `eprintln!` (for docs/benchmarks.md; run with `--nocapture`). The asserts are the issue's
//! bound on the median (50 ms) and a generous 1 s on every trial (both times
//! `REDIS_LOCK_TEST_TIME_FACTOR`). On a 2-core machine under a parallel build (load 5 to 16) the
//! medians stayed near 1 ms and no noticed trial took over 45 ms; a loss that is missed (not a
//! slow machine) is what fails them, and the failure says whether it was noticed within 5 s. The tests of this file run
//! one at a time (a shared mutex), so they do not skew one another's figures.
#![cfg(feature = "tokio")]

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::{AsyncLockClient, AsyncLockGuard};
use redis_lock_client::{Acquire, LockClient, LockGuard};
use redis_lock_testkit::{int, query, scaled, Connection, Server, Value};

const TRIALS: usize = 20;
const TTL: Duration = Duration::from_secs(30);
/// The bound, on the median.
const MEDIAN_BOUND: Duration = Duration::from_millis(50);
/// Every trial: generous (the machine is shared).
const TRIAL_BOUND: Duration = Duration::from_secs(1);
/// Trials over `TRIAL_BOUND` after which an event stops being repeated (so that a client which
/// does not notice at all fails in seconds, not 20 x 30 s).
const GIVE_UP_AFTER: usize = 3;
/// How long a trial over `TRIAL_BOUND` is still watched, so that a failure says whether the
/// loss was noticed late or not at all.
const LATE_LOOK: Duration = Duration::from_secs(5);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[derive(Clone, Copy, Debug)]
enum Face {
    Sync,
    Async,
    /// The async guard's `LostSignal::lost()` future.
    AsyncSignal,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Del,
    Expiry,
    KilledBoundConnection,
    Failover,
}

/// The guard under test.
enum Held {
    Sync(LockGuard),
    Async(AsyncLockGuard),
    /// The guard and when its `LostSignal::lost()` completed (sent by a task awaiting it).
    Signal(AsyncLockGuard, mpsc::Receiver<Instant>),
}

impl Held {
    fn owner(&self) -> String {
        match self {
            Held::Sync(g) => g.owner().to_string(),
            Held::Async(g) | Held::Signal(g, _) => g.owner().to_string(),
        }
    }

    /// Time from `from` until the guard says it is lost, or `None` past `TRIAL_BOUND`.
    /// `is_lost` is polled every millisecond from this thread; the runtime's workers run
    /// the async client's tasks meanwhile.
    fn noticed_after(&self, from: Instant) -> Option<Duration> {
        self.noticed_after_within(from, scaled(TRIAL_BOUND))
    }

    fn noticed_after_within(&self, from: Instant, bound: Duration) -> Option<Duration> {
        let left = bound.saturating_sub(from.elapsed());
        match self {
            Held::Sync(g) => poll_1ms(left, || g.is_lost()).map(|_| from.elapsed()),
            Held::Async(g) => poll_1ms(left, || g.is_lost()).map(|_| from.elapsed()),
            Held::Signal(_, rx) => rx
                .recv_timeout(left)
                .ok()
                .map(|at| at.saturating_duration_since(from)),
        }
    }
}

/// One client of each face on one server.
struct Clients {
    rt: tokio::runtime::Runtime,
    sync: LockClient,
    aio: AsyncLockClient,
}

impl Clients {
    fn new(server: &Server) -> Clients {
        let rt = multi_thread_runtime();
        let aio = rt.block_on(async { AsyncLockClient::new(&url(server), TIMEOUT).unwrap() });
        Clients {
            rt,
            sync: LockClient::new(&url(server), TIMEOUT).unwrap(),
            aio,
        }
    }

    fn acquire(&self, face: Face, key: &str, request: Acquire) -> Held {
        match face {
            Face::Sync => Held::Sync(self.sync.acquire(key, request).expect("acquire")),
            Face::Async => Held::Async(
                self.rt
                    .block_on(self.aio.acquire(key, request))
                    .expect("acquire"),
            ),
            Face::AsyncSignal => {
                let guard = self
                    .rt
                    .block_on(self.aio.acquire(key, request))
                    .expect("acquire");
                let signal = guard.lost_signal();
                let (tx, rx) = mpsc::channel();
                self.rt.spawn(async move {
                    signal.lost().await;
                    let _ = tx.send(Instant::now());
                });
                Held::Signal(guard, rx)
            }
        }
    }
}

/// Does `key` exist on the server? `None` while the server cannot say (loading a resync).
fn key_exists(c: &mut Connection, key: &str) -> Option<bool> {
    match query(c, &["EXISTS", key]) {
        Ok(Value::Int(n)) => Some(n == 1),
        _ => None,
    }
}

/// Runs `TRIALS` trials of `event` with guards of `face`, prints the figures, and asserts the
/// bounds.
fn measure(face: Face, event: Event) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = match event {
        // The guard's server is made a replica of `primary` in each trial: no diskless-sync
        // delay, so the resync starts at once.
        Event::Failover => Server::start_with(&["--repl-diskless-sync-delay", "0"]),
        _ => Server::start(),
    };
    let primary = match event {
        Event::Failover => Some(Server::start_with(&["--repl-diskless-sync-delay", "0"])),
        _ => None,
    };
    let clients = Clients::new(&server);
    let mut c = server.client();
    let mut noticed = Vec::new();
    // Failover only: from the REPLICAOF reply rather than from the key's disappearance.
    let mut from_command = Vec::new();
    let mut over_bound = 0;
    let mut late_notices = Vec::new();
    for trial in 0..TRIALS {
        let key = format!("{event:?}-{trial}");
        let request = match event {
            Event::KilledBoundConnection => Acquire::write(TTL).bind(),
            _ => Acquire::write(TTL),
        };
        let held = clients.acquire(face, &key, request);
        assert_eq!(key_exists(&mut c, &key), Some(true));
        // When the server ended the hold, and (failover) when the command causing it returned.
        let (event_at, command_at) = match event {
            Event::Del => {
                query(&mut c, &["DEL", &key]).unwrap();
                (Instant::now(), None)
            }
            Event::Expiry => {
                // The server now expires the hold in 100 ms; the guard still counts on 30 s.
                let owner = held.owner();
                query(&mut c, &["LOCK.EXTEND", &key, &owner, "100"]).unwrap();
                poll_1ms(Duration::from_secs(5), || {
                    key_exists(&mut c, &key) == Some(false)
                })
                .expect("the server expired the hold");
                (Instant::now(), None)
            }
            Event::KilledBoundConnection => {
                // The newest bound connection is this trial's (earlier ones are closed).
                let id = bound_clients(&mut c)
                    .into_iter()
                    .map(|(id, _)| id)
                    .max()
                    .expect("a bound connection");
                assert_eq!(int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]), 1);
                (Instant::now(), None)
            }
            Event::Failover => {
                let primary = primary.as_ref().expect("primary");
                let port = primary.port.to_string();
                query(&mut c, &["REPLICAOF", "127.0.0.1", &port]).unwrap();
                let command_at = Instant::now();
                poll_1ms(Duration::from_secs(10), || {
                    key_exists(&mut c, &key) == Some(false)
                })
                .expect("the resync dropped the hold");
                let gone_at = Instant::now();
                // Another client takes the key on the new master. (If the guard noticed
                // meanwhile, the figure includes this: it errs on the long side.)
                let taker = LockClient::new(&url(primary), TIMEOUT).unwrap();
                let taken = taker.try_lock(&key, TTL).expect("the new master grants it");
                std::mem::forget(taken); // held on the primary until its ttl; no release
                (gone_at, Some(command_at))
            }
        };
        let took = held.noticed_after(event_at);
        if let (Some(command_at), Some(d)) = (command_at, took) {
            from_command.push(event_at.duration_since(command_at) + d);
        }
        match took {
            Some(d) => noticed.push(d),
            None => {
                over_bound += 1;
                // Say when (if at all) it was noticed after all, for the failure message.
                let late = held.noticed_after_within(event_at, LATE_LOOK);
                eprintln!(
                    "[{face:?}, {event:?}] trial {trial}: not noticed within {:?}; noticed \
                     after {late:?} (looked for {LATE_LOOK:?})",
                    scaled(TRIAL_BOUND)
                );
                late_notices.push((trial, late));
            }
        }
        if let Event::Failover = event {
            query(&mut c, &["REPLICAOF", "NO", "ONE"]).unwrap();
        }
        drop(held);
        if over_bound >= GIVE_UP_AFTER {
            break;
        }
    }
    let trials = noticed.len() + over_bound;
    let (p50, max) = p50_max_ms(&mut noticed);
    eprintln!(
        "loss latency [{face:?}, {event:?}]: {trials} trials, p50 {p50:.1} ms, max {max:.1} ms \
         of those noticed within {:?}; {over_bound} not noticed within it",
        scaled(TRIAL_BOUND)
    );
    if let Event::Failover = event {
        let (p50, max) = p50_max_ms(&mut from_command);
        eprintln!(
            "loss latency [{face:?}, {event:?}] from the REPLICAOF reply (resync included): \
             p50 {p50:.1} ms, max {max:.1} ms"
        );
    }
    assert_eq!(
        over_bound,
        0,
        "[{face:?}, {event:?}] {over_bound} of {trials} trials did not notice the loss within \
         {:?} (trial, noticed after): {late_notices:?}",
        scaled(TRIAL_BOUND)
    );
    assert!(
        p50 <= scaled(MEDIAN_BOUND).as_secs_f64() * 1e3,
        "[{face:?}, {event:?}] median {p50:.1} ms over {:?}",
        scaled(MEDIAN_BOUND)
    );
}

#[test]
fn sync_del_is_noticed_within_50_ms() {
    measure(Face::Sync, Event::Del);
}

#[test]
fn sync_server_side_expiry_is_noticed_within_50_ms() {
    measure(Face::Sync, Event::Expiry);
}

#[test]
fn sync_killed_bound_connection_is_noticed_within_50_ms() {
    measure(Face::Sync, Event::KilledBoundConnection);
}

#[test]
fn sync_failover_takeover_is_noticed_within_50_ms() {
    measure(Face::Sync, Event::Failover);
}

#[test]
fn async_del_is_noticed_within_50_ms() {
    measure(Face::Async, Event::Del);
}

#[test]
fn async_server_side_expiry_is_noticed_within_50_ms() {
    measure(Face::Async, Event::Expiry);
}

#[test]
fn async_killed_bound_connection_is_noticed_within_50_ms() {
    measure(Face::Async, Event::KilledBoundConnection);
}

#[test]
fn async_failover_takeover_is_noticed_within_50_ms() {
    measure(Face::Async, Event::Failover);
}

#[test]
fn lost_signal_fires_within_50_ms_of_a_del() {
    measure(Face::AsyncSignal, Event::Del);
}

#[test]
fn lost_signal_fires_within_50_ms_of_a_server_side_expiry() {
    measure(Face::AsyncSignal, Event::Expiry);
}

#[test]
fn lost_signal_fires_within_50_ms_of_a_killed_bound_connection() {
    measure(Face::AsyncSignal, Event::KilledBoundConnection);
}

#[test]
fn lost_signal_fires_within_50_ms_of_a_failover_takeover() {
    measure(Face::AsyncSignal, Event::Failover);
}
