//! Redlock waits: the queued strategy (the default) against the polling one, on three real
//! servers: waiters get the lock in turn, and (ignored test, printed) what a waiter costs each
//! server per second and how fast a released lock passes on.

use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::{Acquire, LockError, WaitStrategy};
use redis_lock_testkit::{lock_calls, Server, PATIENCE};

fn three() -> Vec<Server> {
    (0..3).map(|_| Server::start()).collect()
}

#[test]
fn queued_waiters_get_the_lock_in_turn_and_a_wait_runs_out_as_held() {
    let servers = three();
    let rl = redlock(&servers);
    let ttl = Duration::from_secs(10);
    let holder = rl.acquire("q", Acquire::write(ttl)).unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (rl, tx) = (rl.clone(), tx.clone());
            thread::spawn(move || {
                let g = rl
                    .acquire("q", Acquire::write(ttl).wait(PATIENCE * 2))
                    .expect("acquired in turn");
                tx.send(Instant::now()).unwrap();
                thread::sleep(Duration::from_millis(20));
                g.release().unwrap();
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    holder.release().unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    assert_eq!(rx.try_iter().count(), 3);

    // A wait that runs out is Held, after about its length, on both strategies.
    let _holder = rl.acquire("q", Acquire::write(ttl)).unwrap();
    for strategy in [WaitStrategy::Queue, WaitStrategy::Poll] {
        let rl = rl.clone().wait_strategy(strategy);
        let started = Instant::now();
        let e = rl
            .acquire("q", Acquire::write(ttl).wait(Duration::from_millis(1500)))
            .unwrap_err();
        assert!(matches!(e, LockError::Held { .. }), "{strategy:?}: {e}");
        assert!(started.elapsed() >= Duration::from_millis(1400));
    }
}

#[test]
fn a_queued_waiter_gets_a_lock_whose_holder_lacked_the_designated_server() {
    // The holder got two of three servers while the third (whichever the key designates) was
    // held by a stale hold of another owner; the waiter must still get the lock once the
    // holder releases and the stale hold expires, without waiting for a slice on a server
    // that keeps granting at once.
    let servers = three();
    let rl = redlock(&servers);
    let ttl = Duration::from_secs(10);
    let holder = rl.acquire("d", Acquire::write(ttl)).unwrap();
    // Take the key away from the holder on the server the key designates (the client's hash
    // of "d": 100 % 3 = 1), so that server grants the waiter at once while the others refuse.
    let mut c = servers[1].client();
    redis_lock_testkit::query(&mut c, &["DEL", "d"]).unwrap();
    let waiter = {
        let rl = rl.clone();
        thread::spawn(move || {
            rl.acquire("d", Acquire::write(ttl).wait(PATIENCE))
                .map(|g| g.tokens().len())
        })
    };
    thread::sleep(Duration::from_millis(500));
    let before: u64 = lock_calls(&mut servers[1].client());
    thread::sleep(Duration::from_secs(1));
    // Backing off: a few rounds a second, not a busy loop on the free server.
    let rounds = lock_calls(&mut servers[1].client()) - before;
    assert!(rounds < 40, "{rounds} lock commands in a second");
    holder.release().unwrap();
    assert!(waiter.join().unwrap().unwrap() >= 2);
}

/// One contended wait measured per strategy: `waiters` threads wait on a held lock; over one
/// second the lock commands each server receives are counted (commands per second per waiter
/// per server); then the holder releases and the time until the first waiter holds the lock is
/// the hand-over latency (median of `rounds`).
fn measure(strategy: WaitStrategy, waiters: usize, rounds: usize) -> (f64, Duration) {
    let servers = Arc::new(three());
    let rl = redlock(&servers).wait_strategy(strategy);
    let ttl = Duration::from_secs(30);
    let mut costs = Vec::new();
    let mut handovers = Vec::new();
    for round in 0..rounds {
        let key = format!("m{round}");
        let holder = rl.acquire(&key, Acquire::write(ttl)).unwrap();
        let (tx, rx) = mpsc::channel();
        let threads: Vec<_> = (0..waiters)
            .map(|_| {
                let (rl, tx, key) = (rl.clone(), tx.clone(), key.clone());
                thread::spawn(move || {
                    let g = rl
                        .acquire(&key, Acquire::write(ttl).wait(Duration::from_secs(30)))
                        .expect("acquire");
                    tx.send(Instant::now()).unwrap();
                    thread::sleep(Duration::from_millis(5));
                    drop(g);
                })
            })
            .collect();
        // Let the waiters settle into their waits.
        thread::sleep(Duration::from_millis(1500));
        let before: Vec<u64> = servers
            .iter()
            .map(|s| lock_calls(&mut s.client()))
            .collect();
        let started = Instant::now();
        thread::sleep(Duration::from_secs(1));
        let after: Vec<u64> = servers
            .iter()
            .map(|s| lock_calls(&mut s.client()))
            .collect();
        let secs = started.elapsed().as_secs_f64();
        // INFO itself is no lock command; every server's calls, per waiter and second.
        let worst = before
            .iter()
            .zip(&after)
            .map(|(b, a)| (a - b) as f64 / secs / waiters as f64)
            .fold(0.0, f64::max);
        costs.push(worst);
        let released = Instant::now();
        holder.release().unwrap();
        let first = rx.recv_timeout(PATIENCE).expect("a waiter got it");
        handovers.push(first.saturating_duration_since(released));
        for t in threads {
            t.join().unwrap();
        }
    }
    costs.sort_by(|a, b| a.total_cmp(b));
    handovers.sort();
    (costs[costs.len() / 2], handovers[handovers.len() / 2])
}

/// Prints the figures; run with
/// `cargo test -p redis-lock-client --test redlock_wait -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_redlock_wait_cost_and_handover() {
    for strategy in [WaitStrategy::Poll, WaitStrategy::Queue] {
        let (cost, handover) = measure(strategy, 4, 5);
        println!(
            "{strategy:?}: {cost:.1} lock commands per second per waiter on the busiest server \
             (4 waiters, 3 servers, median of 5); hand-over {handover:?} (median of 5)"
        );
    }
    // The queued strategy must stay quiet: a few commands per second per waiter.
    let (cost, _) = measure(WaitStrategy::Queue, 4, 3);
    assert!(cost < 10.0, "{cost}");
}

#[test]
fn a_queued_grant_counts_its_validity_from_the_start_of_its_slice() {
    // ttl 4 s: slices of 1 s. The holder releases 700 ms into the waiter's first slice; the
    // server granted then, but the client cannot tell when within the slice, so the lease is
    // counted from the slice's start: at least those 700 ms are gone from its validity.
    let servers = three();
    let rl = redlock(&servers);
    let ttl = Duration::from_secs(4);
    let holder = rl.acquire("v", Acquire::write(ttl)).unwrap();
    let waiter = {
        let rl = rl.clone();
        thread::spawn(move || {
            rl.acquire("v", Acquire::write(ttl).wait(PATIENCE))
                .map(|g| g.validity())
        })
    };
    thread::sleep(Duration::from_millis(700));
    holder.release().unwrap();
    let validity = waiter.join().unwrap().unwrap();
    assert!(validity > Duration::ZERO);
    assert!(validity < ttl - Duration::from_millis(500), "{validity:?}");
}
