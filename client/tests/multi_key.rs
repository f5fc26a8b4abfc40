//! Issue 24, "several keys at once": two multi-key guards over the same keys named in opposite
//! orders never deadlock (every round completes, well within a bound) and never overlap
//! (in-use flags per key), for sync threads, async tasks and Redlock; read and write modes
//! mixed in one set; bad sets (a key twice, no key) are refused before anything is sent.
#![cfg(feature = "tokio")]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockClient, LockError, Mode, MultiGuard};
use redis_lock_testkit::{lock_calls, Server};

const TTL: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(30);
/// For all rounds of a test: generous (a deadlock would end only by the waits running out,
/// and every round must succeed anyway).
const ALL_ROUNDS_BOUND: Duration = Duration::from_secs(240);

fn write() -> Acquire {
    Acquire::write(TTL).wait(WAIT)
}

fn read() -> Acquire {
    Acquire::read(TTL).wait(WAIT)
}

/// In-use flags of keys "a" and "b": who holds each, as the holders say, and how often two
/// holders overlapped.
#[derive(Default)]
struct InUse {
    writer: [AtomicBool; 2],
    readers: [AtomicU32; 2],
    overlaps: AtomicU64,
}

impl InUse {
    fn slot(key: &str) -> usize {
        usize::from(key == "b")
    }

    fn enter(&self, key: &str, mode: Mode) {
        let i = Self::slot(key);
        let clash = match mode {
            Mode::Read => {
                self.readers[i].fetch_add(1, Ordering::SeqCst);
                self.writer[i].load(Ordering::SeqCst)
            }
            _ => {
                self.writer[i].swap(true, Ordering::SeqCst)
                    || self.readers[i].load(Ordering::SeqCst) > 0
            }
        };
        if clash {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, key: &str, mode: Mode) {
        let i = Self::slot(key);
        match mode {
            Mode::Read => {
                self.readers[i].fetch_sub(1, Ordering::SeqCst);
            }
            _ => self.writer[i].store(false, Ordering::SeqCst),
        }
    }

    /// Marks every key of `items` in use, lets others run a moment, and clears them.
    fn hold(&self, items: &[(&str, Mode)]) {
        for (key, mode) in items {
            self.enter(key, *mode);
        }
        thread::yield_now();
        for (key, mode) in items {
            self.leave(key, *mode);
        }
    }
}

/// Two sync threads, `rounds` rounds each of `round(who)` (contender 0 or 1: one
/// multi-key acquire, its keys marked in use, its release).
fn sync_contenders(
    round: impl Fn(usize) -> Result<(), LockError> + Sync,
    rounds: usize,
    what: &str,
) {
    let started = Instant::now();
    thread::scope(|s| {
        for who in 0..2 {
            let round = &round;
            s.spawn(move || {
                for n in 0..rounds {
                    round(who)
                        .unwrap_or_else(|e| panic!("{what}: contender {who}, round {n}: {e}"));
                }
            });
        }
    });
    let took = started.elapsed();
    eprintln!("{what}: 2 x {rounds} rounds in {:.2} s", took.as_secs_f64());
    assert!(took < ALL_ROUNDS_BOUND, "{what}: took {took:?}");
}

/// Two contenders, each taking `a` and `b` for writing, named in opposite orders, `rounds`
/// times: `acquire_all(who, set)` is contender `who`'s multi-key acquire.
fn opposite_orders(
    acquire_all: impl Fn(usize, &[(&str, Acquire)]) -> Result<MultiGuard, LockError> + Sync,
    rounds: usize,
    what: &str,
) {
    let in_use = InUse::default();
    let marks = [
        vec![("a", Mode::Write), ("b", Mode::Write)],
        vec![("b", Mode::Write), ("a", Mode::Write)],
    ];
    let sets = [
        [("a", write()), ("b", write())],
        [("b", write()), ("a", write())],
    ];
    sync_contenders(
        |who| {
            let guard = acquire_all(who, &sets[who])?;
            in_use.hold(&marks[who]);
            guard.release()
        },
        rounds,
        what,
    );
    assert_eq!(in_use.overlaps.load(Ordering::SeqCst), 0, "overlaps");
}

#[test]
fn two_sync_multi_key_guards_in_opposite_orders_never_deadlock_nor_overlap() {
    let server = Server::start();
    let clients = [
        LockClient::new(&url(&server), TIMEOUT).unwrap(),
        LockClient::new(&url(&server), TIMEOUT).unwrap(),
    ];
    opposite_orders(
        |who, set| clients[who].acquire_all(set),
        1000,
        "sync, 1 server",
    );
}

#[test]
fn mixed_read_and_write_sets_in_opposite_orders_never_deadlock_nor_overlap() {
    let server = Server::start();
    let clients = [
        LockClient::new(&url(&server), TIMEOUT).unwrap(),
        LockClient::new(&url(&server), TIMEOUT).unwrap(),
    ];
    let in_use = InUse::default();
    // Each writes one key and reads the other: they clash on both.
    let marks = [
        vec![("a", Mode::Write), ("b", Mode::Read)],
        vec![("b", Mode::Write), ("a", Mode::Read)],
    ];
    // The modes reach the server.
    let probe = clients[0]
        .acquire_all(&[("a", write()), ("b", read())])
        .unwrap();
    let info = clients[1].info("b").unwrap().expect("b is held");
    assert_eq!(info.mode, "read", "{info:?}");
    assert_eq!(probe.get("b").map(|g| g.mode()), Some(Mode::Read));
    probe.release().unwrap();
    let sets = [
        [("a", write()), ("b", read())],
        [("b", write()), ("a", read())],
    ];
    sync_contenders(
        |who| {
            let guard = clients[who].acquire_all(&sets[who])?;
            in_use.hold(&marks[who]);
            guard.release()
        },
        300,
        "sync, mixed modes",
    );
    assert_eq!(in_use.overlaps.load(Ordering::SeqCst), 0, "overlaps");
}

#[test]
fn two_redlock_multi_key_guards_in_opposite_orders_never_deadlock_nor_overlap() {
    let servers = three();
    let locks = [redlock(&servers), redlock(&servers)];
    opposite_orders(
        |who, set| locks[who].acquire_all(set),
        100,
        "Redlock, 3 servers",
    );
}

#[test]
fn two_async_multi_key_guards_in_opposite_orders_never_deadlock_nor_overlap() {
    const ROUNDS: usize = 1000;
    let server = Server::start();
    let servers = three();
    let rt = multi_thread_runtime();
    rt.block_on(async {
        for (what, rounds) in [
            ("async, 1 server", ROUNDS),
            ("AsyncRedlock, 3 servers", 100),
        ] {
            let in_use = Arc::new(InUse::default());
            let started = Instant::now();
            let contenders: Vec<_> = [["a", "b"], ["b", "a"]]
                .into_iter()
                .map(|order| {
                    let in_use = in_use.clone();
                    let single = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
                    let quorum = async_redlock(&servers);
                    let redlock = what.starts_with("AsyncRedlock");
                    tokio::spawn(async move {
                        let set = [(order[0], write()), (order[1], write())];
                        let marks = [(order[0], Mode::Write), (order[1], Mode::Write)];
                        for round in 0..rounds {
                            let guard = if redlock {
                                quorum.acquire_all(&set).await
                            } else {
                                single.acquire_all(&set).await
                            }
                            .unwrap_or_else(|e| panic!("{order:?}, round {round}: {e}"));
                            in_use.hold(&marks);
                            tokio::task::yield_now().await;
                            guard
                                .release()
                                .await
                                .unwrap_or_else(|e| panic!("{order:?}, round {round}: {e}"));
                        }
                    })
                })
                .collect();
            for c in contenders {
                c.await.expect("contender");
            }
            let took = started.elapsed();
            eprintln!("{what}: 2 x {rounds} rounds in {:.2} s", took.as_secs_f64());
            assert_eq!(
                in_use.overlaps.load(Ordering::SeqCst),
                0,
                "{what}: overlaps"
            );
            assert!(took < ALL_ROUNDS_BOUND, "{what}: took {took:?}");
        }
    });
}

#[test]
fn bad_sets_are_refused_before_anything_is_sent() {
    let server = Server::start();
    let mut c = server.client();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let rt = multi_thread_runtime();
    let aio = rt.block_on(async { AsyncLockClient::new(&url(&server), TIMEOUT).unwrap() });
    let before = lock_calls(&mut c);
    let twice = [("a", write()), ("a", read())];
    let none: [(&str, Acquire); 0] = [];
    for (what, set) in [("a key twice", &twice[..]), ("no key", &none[..])] {
        assert!(
            matches!(
                client.acquire_all(set),
                Err(LockError::InvalidRequest { .. })
            ),
            "sync, {what}"
        );
        assert!(
            matches!(
                rt.block_on(aio.acquire_all(set)),
                Err(LockError::InvalidRequest { .. })
            ),
            "async, {what}"
        );
    }
    assert_eq!(lock_calls(&mut c), before, "nothing was sent");
}
