//! Issue 24, "bounded resources": a client's connections for waiting acquires are capped
//! (`max_wait_connections`). 10,000 tasks waiting on one key through one `AsyncLockClient`
//! with a cap of 64 each get the lock or a clear `LockError::WaitLimit`, never overlap, and
//! the server never sees more than the cap (plus a few) connections from the client; the
//! same, smaller, for the sync client's threads.
#![cfg(feature = "tokio")]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{LockClient, LockError};
use redis_lock_testkit::{waiting, Server};

const KEY: &str = "capped";
const TTL: Duration = Duration::from_millis(200);
const HOLD: Duration = Duration::from_millis(1);
const WAIT: Duration = Duration::from_secs(120);
/// Connections besides the wait connections: the client's shared one, the sampler's, and
/// a margin for a connection being replaced.
const OTHER_CONNECTIONS: u64 = 6;

/// What the tasks saw.
#[derive(Default)]
struct Tally {
    granted: AtomicU64,
    wait_limit: AtomicU64,
    /// A holder found the in-use flag already set.
    overlaps: AtomicU64,
    /// A holder's guard was lost while it held (its 200 ms ran out): exclusion is not
    /// promised past that, so an overlap then is not the client's fault.
    lost_while_held: AtomicU64,
    other_errors: Mutex<Vec<String>>,
}

/// Samples, every 10 ms until `stop`, the most connections the server had beyond `baseline`
/// and the longest wait queue of `KEY`.
fn sample(server: &Server, stop: Arc<AtomicBool>) -> thread::JoinHandle<(u64, i64)> {
    let mut c = server.client();
    let baseline = connected_clients(&mut c);
    thread::spawn(move || {
        let (mut extra, mut queue) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            extra = extra.max(connected_clients(&mut c).saturating_sub(baseline));
            queue = queue.max(waiting(&mut c, KEY));
            thread::sleep(Duration::from_millis(10));
        }
        (extra, queue)
    })
}

fn check(tally: &Tally, n: u64, what: &str) {
    let granted = tally.granted.load(Ordering::Relaxed);
    let limited = tally.wait_limit.load(Ordering::Relaxed);
    let errors = tally.other_errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{what}: other errors: {:?}",
        &errors[..errors.len().min(5)]
    );
    assert_eq!(
        granted + limited,
        n,
        "{what}: every request got the lock or WaitLimit"
    );
    let overlaps = tally.overlaps.load(Ordering::Relaxed);
    let lost = tally.lost_while_held.load(Ordering::Relaxed);
    assert!(
        overlaps == 0 || lost > 0,
        "{what}: {overlaps} overlapping holders with no guard lost"
    );
}

#[test]
fn ten_thousand_tasks_with_a_cap_of_64_wait_connections_all_get_the_lock_or_wait_limit() {
    const TASKS: u64 = 10_000;
    const CAP: usize = 64;
    let server = Server::start();
    let rt = multi_thread_runtime();
    let client = rt.block_on(async {
        AsyncLockClient::new(&url(&server), TIMEOUT)
            .unwrap()
            .max_wait_connections(CAP)
    });
    let tally = Arc::new(Tally::default());
    let in_use = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(&server, stop.clone());
    let started = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (client, tally, in_use) = (client.clone(), tally.clone(), in_use.clone());
                tokio::spawn(async move {
                    match client.lock(KEY, TTL, WAIT).await {
                        Ok(guard) => {
                            if in_use.swap(true, Ordering::SeqCst) {
                                tally.overlaps.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::time::sleep(HOLD).await;
                            if guard.is_lost() {
                                tally.lost_while_held.fetch_add(1, Ordering::Relaxed);
                            }
                            in_use.store(false, Ordering::SeqCst);
                            tally.granted.fetch_add(1, Ordering::Relaxed);
                            let _ = guard.release().await;
                        }
                        Err(LockError::WaitLimit { limit }) => {
                            assert_eq!(limit, CAP);
                            tally.wait_limit.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => tally.other_errors.lock().unwrap().push(e.to_string()),
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    });
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (extra, queue) = sampler.join().unwrap();
    eprintln!(
        "{TASKS} tasks, cap {CAP}: {} granted, {} WaitLimit, {} lost while held, in {:.1} s; \
         at most {extra} connections beyond the baseline and {queue} queued on the server",
        tally.granted.load(Ordering::Relaxed),
        tally.wait_limit.load(Ordering::Relaxed),
        tally.lost_while_held.load(Ordering::Relaxed),
        took.as_secs_f64()
    );
    check(&tally, TASKS, "async");
    assert!(
        extra <= CAP as u64 + OTHER_CONNECTIONS,
        "{extra} connections for a cap of {CAP}"
    );
    assert!(
        queue <= CAP as i64,
        "{queue} waiters on the server for a cap of {CAP}"
    );
    assert!(took < WAIT, "took {took:?}");
}

#[test]
fn forty_threads_with_a_cap_of_4_wait_connections_all_get_the_lock_or_wait_limit() {
    const THREADS: u64 = 40;
    const CAP: usize = 4;
    let server = Server::start();
    let client = Arc::new(
        LockClient::new(&url(&server), TIMEOUT)
            .unwrap()
            .max_wait_connections(CAP),
    );
    let tally = Arc::new(Tally::default());
    let in_use = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(&server, stop.clone());
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (client, tally, in_use) = (client.clone(), tally.clone(), in_use.clone());
            thread::spawn(move || match client.lock(KEY, TTL, WAIT) {
                Ok(guard) => {
                    if in_use.swap(true, Ordering::SeqCst) {
                        tally.overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    thread::sleep(HOLD);
                    if guard.is_lost() {
                        tally.lost_while_held.fetch_add(1, Ordering::Relaxed);
                    }
                    in_use.store(false, Ordering::SeqCst);
                    tally.granted.fetch_add(1, Ordering::Relaxed);
                    let _ = guard.release();
                }
                Err(LockError::WaitLimit { limit }) => {
                    assert_eq!(limit, CAP);
                    tally.wait_limit.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tally.other_errors.lock().unwrap().push(e.to_string()),
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (extra, queue) = sampler.join().unwrap();
    eprintln!(
        "{THREADS} threads, cap {CAP}: {} granted, {} WaitLimit in {:.2} s; at most {extra} \
         connections beyond the baseline (short commands open their own when concurrent) and \
         {queue} queued on the server",
        tally.granted.load(Ordering::Relaxed),
        tally.wait_limit.load(Ordering::Relaxed),
        took.as_secs_f64()
    );
    check(&tally, THREADS, "sync");
    // The sync client opens a further short-command connection per concurrent short
    // command (documented), so the cap shows in the server's wait queue.
    assert!(
        queue <= CAP as i64,
        "{queue} waiters on the server for a cap of {CAP}"
    );
}

#[test]
fn a_waiter_that_finds_every_wait_connection_taken_gets_wait_limit_sync_and_async() {
    let server = Server::start();
    let holder = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let _held = holder.try_lock(KEY, Duration::from_secs(30)).unwrap();
    let client = Arc::new(
        LockClient::new(&url(&server), TIMEOUT)
            .unwrap()
            .max_wait_connections(1),
    );
    // The first waiter takes the only wait connection for 3 s.
    let first = {
        let client = client.clone();
        thread::spawn(move || client.lock(KEY, TTL, Duration::from_secs(3)).err())
    };
    wait_until_waiting(&server, 1);
    let second = client.lock(KEY, TTL, Duration::from_millis(300));
    match second {
        Err(e @ LockError::WaitLimit { limit: 1 }) => {
            assert!(e.to_string().contains('1'), "{e}");
        }
        other => panic!(
            "sync: expected WaitLimit {{ limit: 1 }}, got {:?}",
            other.map(|g| g.owner().to_string())
        ),
    }
    assert!(matches!(
        first.join().unwrap(),
        Some(LockError::Held { .. })
    ));

    let rt = multi_thread_runtime();
    rt.block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT)
            .unwrap()
            .max_wait_connections(1);
        let first = {
            let client = client.clone();
            tokio::spawn(async move { client.lock(KEY, TTL, Duration::from_secs(3)).await.err() })
        };
        wait_until_waiting(&server, 1);
        match client.lock(KEY, TTL, Duration::from_millis(300)).await {
            Err(LockError::WaitLimit { limit: 1 }) => {}
            other => panic!(
                "async: expected WaitLimit {{ limit: 1 }}, got {:?}",
                other.map(|g| g.owner().to_string())
            ),
        }
        assert!(matches!(first.await.unwrap(), Some(LockError::Held { .. })));
    });
}

/// Waits until `KEY` has `n` waiters on the server.
fn wait_until_waiting(server: &Server, n: i64) {
    let mut c = server.client();
    redis_lock_testkit::wait_until("the first waiter queued", || waiting(&mut c, KEY) == n);
}
