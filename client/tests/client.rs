//! The client helper against real redis-servers with the module: one instance, and Redlock over
//! five, with servers killed and paused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::{Acquire, LockClient, LockError, LossCause, Outcome, Redlock, Watchdog};
use redis_lock_testkit::{holders, int, query, wait_until, waiting, Server, PATIENCE};

#[test]
fn one_instance_try_wait_extend_release_and_drop() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let ttl = Duration::from_secs(10);
    let first = client.try_lock("res", ttl).unwrap();
    let t1 = first.fencing_token().unwrap();
    assert!(first.validity() > Duration::from_secs(9) && first.validity() <= ttl);
    assert!(matches!(
        client.try_lock("res", ttl),
        Err(LockError::Held { .. })
    ));
    assert!(matches!(
        client.try_read("res", ttl),
        Err(LockError::Held { .. })
    ));

    // A waiter blocks on the server until the release.
    let client2 = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let waiter = thread::spawn(move || {
        client2
            .lock("res", ttl, Duration::from_secs(5))
            .map(|g| g.fencing_token())
    });
    let mut c = server.client();
    wait_until("waiter queued", || waiting(&mut c, "res") == 1);
    thread::sleep(Duration::from_millis(20));
    assert!(first.extend().unwrap() > Duration::from_secs(9));
    first.release().unwrap();
    let t2 = waiter.join().unwrap().unwrap().unwrap();
    assert!(t2 > t1);
    // The waiter's guard was dropped inside the thread: released.
    wait_until("released on drop", || int(&mut c, &["EXISTS", "res"]) == 0);

    // A wait that times out is `Held`.
    let _holder = client.try_lock("res", ttl).unwrap();
    let started = Instant::now();
    assert!(matches!(
        client.lock("res", ttl, Duration::from_millis(150)),
        Err(LockError::Held { .. })
    ));
    assert!(started.elapsed() >= Duration::from_millis(140));

    // Readers share.
    let r1 = client.try_read("shared", ttl).unwrap();
    let r2 = client.try_read("shared", ttl).unwrap();
    assert_eq!(holders(&mut c, "shared").len(), 2);
    assert!(matches!(
        client.try_lock("shared", ttl),
        Err(LockError::Held { .. })
    ));
    drop((r1, r2));
    assert_eq!(int(&mut c, &["EXISTS", "shared"]), 0);
}

#[test]
fn an_unreachable_single_server_is_unreachable_not_held() {
    let server = Server::start();
    let u = url(&server);
    drop(server);
    let client = LockClient::new(&u, TIMEOUT).unwrap();
    let e = client.try_lock("x", Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
}

#[test]
fn redlock_acquires_on_all_five_and_releases_everywhere() {
    let servers = five();
    let rl = redlock(&servers);
    assert_eq!(rl.quorum(), 3);
    let ttl = Duration::from_secs(10);
    let guard = rl.acquire("job", Acquire::write(ttl)).unwrap();
    assert_eq!(guard.tokens().len(), 5);
    assert_eq!(guard.fencing_token(), None, "tokens are per server");
    let v = guard.validity();
    assert!(
        v > Duration::from_secs(9) && v <= ttl - ttl / 100,
        "validity {v:?}"
    );
    let other = redlock(&servers);
    match other.acquire("job", Acquire::write(ttl)) {
        Err(LockError::Held { causes }) => {
            assert_eq!(causes.len(), 5);
            assert!(
                causes.iter().all(|(_, o)| *o == Outcome::Held),
                "{causes:?}"
            );
        }
        other => panic!("expected Held, got {other:?}"),
    }
    guard.release().unwrap();
    gone_from_every_server(&servers, "job");
    // Readers on a majority share too.
    let r1 = rl.acquire("cfg", Acquire::read(ttl)).unwrap();
    let r2 = other.acquire("cfg", Acquire::read(ttl)).unwrap();
    assert!(matches!(
        rl.acquire("cfg", Acquire::write(ttl)),
        Err(LockError::Held { .. })
    ));
    drop((r1, r2));
}

#[test]
fn redlock_survives_two_dead_servers_but_not_three() {
    let mut servers = five();
    let rl = redlock(&servers);
    let ttl = Duration::from_secs(5);
    servers.truncate(3); // two killed
    let guard = rl.acquire("k", Acquire::write(ttl)).unwrap();
    assert_eq!(guard.tokens().len(), 3);
    drop(guard);
    servers.truncate(2); // three killed
    let started = Instant::now();
    let e = rl.acquire("k", Acquire::write(ttl)).unwrap_err();
    let took = started.elapsed();
    match &e {
        LockError::Unreachable { causes } => {
            let dead = causes
                .iter()
                .filter(|(_, o)| matches!(o, Outcome::Unreachable(_)))
                .count();
            assert_eq!(dead, 3, "{causes:?}");
        }
        other => panic!("expected Unreachable, got {other}"),
    }
    // Parallel requests: one per-instance timeout (plus the release round), not five.
    assert!(took < TIMEOUT * 4, "took {took:?}");
}

#[test]
fn redlock_acquires_with_two_servers_paused() {
    let servers = five();
    let rl = redlock(&servers);
    servers[3].signal("STOP");
    servers[4].signal("STOP");
    let started = Instant::now();
    let result = rl.acquire("p", Acquire::write(Duration::from_secs(5)));
    let took = started.elapsed();
    servers[3].signal("CONT");
    servers[4].signal("CONT");
    let guard = result.unwrap();
    assert_eq!(guard.tokens().len(), 3);
    assert!(took < TIMEOUT * 3, "took {took:?}");
}

#[test]
fn sixteen_threads_increment_a_counter_under_the_quorum_lock_without_losing_updates() {
    let servers = Arc::new(five());
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (servers, counter, inside, overlaps) = (
                servers.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
            );
            thread::spawn(move || {
                let rl = redlock(&servers)
                    .retry_delay(Duration::from_micros(200), Duration::from_millis(5));
                for _ in 0..200 {
                    let guard = rl
                        .acquire(
                            "counter",
                            Acquire::write(Duration::from_secs(10)).wait(PATIENCE * 3),
                        )
                        .expect("acquire");
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // A read-modify-write that loses updates if two run at once.
                    let seen = counter.load(Ordering::SeqCst);
                    // Long enough for any broken exclusion to show up as an overlap.
                    thread::sleep(Duration::from_micros(100));
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    guard.release().expect("release");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "critical sections overlapped"
    );
    assert_eq!(counter.load(Ordering::SeqCst), 16 * 200, "lost updates");
}

#[test]
fn the_watchdog_keeps_a_lock_for_five_ttls_and_reports_its_loss() {
    let servers = five();
    let rl = redlock(&servers);
    let ttl = Duration::from_millis(300);
    let (tx, rx) = mpsc::channel();
    let called = Arc::new(AtomicBool::new(false));
    let flag = called.clone();
    let guard = rl
        .acquire(
            "wd",
            Acquire::write(ttl).watchdog(
                Watchdog::new()
                    .notify(tx)
                    .on_lost(move |_| flag.store(true, Ordering::SeqCst)),
            ),
        )
        .unwrap();
    thread::sleep(ttl * 5);
    assert!(!guard.is_lost());
    assert!(guard.validity() > Duration::ZERO);
    for s in &servers {
        let mut c = s.client();
        assert_eq!(
            holders(&mut c, "wd").len(),
            1,
            "lock gone from a server after 5 ttls"
        );
    }
    let intruder = redlock(&servers);
    assert!(matches!(
        intruder.acquire("wd", Acquire::write(ttl)),
        Err(LockError::Held { .. })
    ));

    // Delete the lock behind the guard's back on a majority.
    for s in &servers[..3] {
        let mut c = s.client();
        query(&mut c, &["DEL", "wd"]).unwrap();
    }
    let lost = rx.recv_timeout(PATIENCE).expect("loss reported");
    assert_eq!(lost.key, "wd");
    assert!(guard.is_lost());
    assert!(called.load(Ordering::SeqCst));
    assert_eq!(guard.validity(), Duration::ZERO);
}

/// A watchdog's extends do not queue behind a blocking acquire of the same client: while that
/// client waits (far longer than the ttl) for a lock held elsewhere, its guarded lock stays
/// held and another client cannot take it.
#[test]
fn the_watchdog_keeps_extending_while_the_same_client_blocks_in_a_long_wait() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let elsewhere = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let intruder = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let ttl = Duration::from_secs(1);
    let guard = client
        .acquire("guarded", Acquire::write(ttl).watchdog(Watchdog::new()))
        .unwrap();
    let busy = elsewhere.try_lock("busy", Duration::from_secs(60)).unwrap();
    let mut c = server.client();
    let (taken, lost, validity, held_by, still_waiting, waited) = thread::scope(|s| {
        // The same client blocks (up to 30 s) for a lock that another client holds.
        let waiter = s.spawn(|| client.lock("busy", ttl, PATIENCE * 3));
        wait_until("the wait is queued", || waiting(&mut c, "busy") == 1);
        // Meanwhile someone else tries for 3 s (3 ttls) to take the guarded lock.
        let taken = intruder.lock("guarded", ttl, Duration::from_secs(3));
        let observed = (
            taken.map(|g| g.fencing_token()),
            guard.is_lost(),
            guard.validity(),
            holders(&mut c, "guarded"),
            waiting(&mut c, "busy"),
        );
        // End the wait before asserting, so a failure does not wait for it.
        drop(busy);
        let waited = waiter.join().unwrap().map(|g| g.fencing_token());
        (
            observed.0, observed.1, observed.2, observed.3, observed.4, waited,
        )
    });
    assert!(
        matches!(taken, Err(LockError::Held { .. })),
        "another client took the lock while its holder's client was waiting: {taken:?}"
    );
    assert!(!lost, "is_lost() while the watchdog should be extending");
    assert!(validity > Duration::ZERO);
    assert_eq!(held_by, vec![(guard.owner().to_string(), 1)]);
    assert_eq!(still_waiting, 1, "the blocking wait was still in progress");
    assert!(matches!(waited, Ok(Some(_))), "the waiter: {waited:?}");
    assert!(!guard.is_lost());
    guard.release().unwrap();
}

/// `is_lost()` follows the clock: once the validity has run out without a confirmed extend it
/// is true, even while the watchdog's extend to a paused server is still waiting for its
/// timeout (longer than the ttl here); the watchdog then reports the loss once.
#[test]
fn is_lost_is_true_as_soon_as_validity_runs_out_on_a_paused_server() {
    let server = Server::start();
    // A per-instance timeout longer than the lease: the watchdog's extend is still pending
    // when the validity ends.
    let client = LockClient::new(&url(&server), Duration::from_secs(2)).unwrap();
    let ttl = Duration::from_millis(600);
    let (tx, rx) = mpsc::channel();
    let guard = client
        .acquire(
            "paused",
            Acquire::write(ttl).watchdog(Watchdog::new().notify(tx)),
        )
        .unwrap();
    let plain = client.try_lock("plain", ttl).unwrap();
    thread::sleep(ttl * 2); // a few extends went through
    assert!(!guard.is_lost(), "lost while the server answers");
    server.signal("STOP");
    let stopped = Instant::now();
    // Every confirmed extend was sent before the server stopped, so the validity ends before
    // `stopped + ttl`: from then on the guard must say lost. Sample for a second longer.
    let mut violation = None;
    let mut lost_seen_at = None;
    while stopped.elapsed() < ttl + Duration::from_secs(1) {
        let validity = guard.validity();
        let since = stopped.elapsed();
        let lost = guard.is_lost();
        if violation.is_none() {
            if validity.is_zero() && !lost {
                violation = Some(format!("validity zero but not lost, {since:?} after STOP"));
            } else if since >= ttl && !lost {
                violation = Some(format!("not lost {since:?} after STOP (ttl {ttl:?})"));
            } else if lost_seen_at.is_some() && !lost {
                violation = Some(format!("lost, then not lost again at {since:?}"));
            }
        }
        if lost && lost_seen_at.is_none() {
            lost_seen_at = Some(since);
        }
        thread::sleep(Duration::from_millis(1));
    }
    let plain_lost = plain.is_lost();
    // The watchdog reports once, when its pending extend has timed out.
    let report = rx.recv_timeout(PATIENCE);
    server.signal("CONT");
    assert_eq!(violation, None);
    assert!(lost_seen_at.is_some(), "never lost");
    assert!(plain_lost, "a guard without watchdog is lost after its ttl");
    assert_eq!(report.expect("loss reported").key, "paused");
    // Still lost once the server answers again; an extend cannot revive it.
    assert!(guard.is_lost());
    assert!(matches!(
        guard.extend(),
        Err(LockError::Lost(l)) if l.cause == LossCause::Expired
    ));
    assert!(guard.is_lost());
    assert_eq!(guard.validity(), Duration::ZERO);
    drop(guard);
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "reported once"
    );
}

/// Dropping a guard does not wait for another thread's blocking acquire on the same client, and
/// the lock is released.
#[test]
fn dropping_a_guard_does_not_wait_for_a_blocking_acquire_of_the_same_client() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let elsewhere = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let guard = client.try_lock("mine", Duration::from_secs(60)).unwrap();
    let _busy = elsewhere.try_lock("busy", Duration::from_secs(60)).unwrap();
    let mut c = server.client();
    let wait = Duration::from_secs(5);
    let (took, released, waited) = thread::scope(|s| {
        let waiter = s.spawn(|| {
            let started = Instant::now();
            let r = client.lock("busy", Duration::from_secs(1), wait);
            (r.map(|g| g.fencing_token()), started.elapsed())
        });
        wait_until("the wait is queued", || waiting(&mut c, "busy") == 1);
        let started = Instant::now();
        drop(guard);
        let took = started.elapsed();
        let released = int(&mut c, &["EXISTS", "mine"]) == 0;
        (took, released, waiter.join().unwrap())
    });
    eprintln!("drop took {took:?} while a {wait:?} wait ran");
    assert!(took < Duration::from_secs(1), "drop took {took:?}");
    assert!(released, "the lock is still held after the drop");
    // The wait ran its full course: no read timeout cut it.
    let (result, waited) = waited;
    assert!(
        matches!(result, Err(LockError::Held { .. })),
        "waiter: {result:?}"
    );
    assert!(
        waited >= wait - Duration::from_millis(50),
        "waited {waited:?}"
    );
}

/// A blocking acquire's reply may come long after the per-instance timeout: the wait is not
/// cut short by a read timeout.
#[test]
fn a_wait_longer_than_five_seconds_is_granted_at_its_end() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let holder = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let held = holder.try_lock("long", Duration::from_secs(60)).unwrap();
    let mut c = server.client();
    thread::scope(|s| {
        let waiter = s.spawn(|| client.lock("long", Duration::from_secs(10), PATIENCE * 3));
        wait_until("the wait is queued", || waiting(&mut c, "long") == 1);
        thread::sleep(Duration::from_secs(6));
        held.release().unwrap();
        let granted = waiter.join().unwrap();
        assert!(granted.is_ok(), "after 6 s: {granted:?}");
    });
}

/// One client is meant to be shared by threads (see the crate docs on connections).
#[test]
fn clients_and_guards_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<LockClient>();
    send_sync::<Redlock>();
    send_sync::<redis_lock_client::LockGuard>();
}

#[test]
fn using_hands_the_guard_over_and_shows_a_lock_taken_away() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let token = client
        .using("u", Acquire::write(Duration::from_secs(5)), |g| {
            assert!(!g.is_lost());
            g.fencing_token()
        })
        .unwrap();
    assert!(token.is_some());
    assert_eq!(
        int(&mut c, &["EXISTS", "u"]),
        0,
        "released after the closure"
    );

    // The key is deleted mid-closure: the watchdog's next extend (every 1.5 s of a 30 s
    // lease) finds the owner gone and the guard turns lost long before its validity ends.
    let lost = client.using(
        "u",
        Acquire::write(Duration::from_secs(30)).watchdog(Watchdog::new().fraction(0.05)),
        |g| {
            assert_eq!(int(&mut c, &["DEL", "u"]), 1);
            let deadline = Instant::now() + PATIENCE;
            while !g.is_lost() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            g.is_lost()
        },
    );
    // The lock was lost while the closure ran: not a success.
    assert!(
        matches!(&lost, Err(LockError::Lost(l)) if l.cause == LossCause::Deleted),
        "{lost:?}"
    );

    // Redlock's using, with an owner prefix.
    let servers = five();
    let rl = redlock(&servers).owner_prefix("batch-").unwrap();
    let owner = rl
        .using("r", Acquire::write(Duration::from_secs(5)), |g| {
            g.owner().to_string()
        })
        .unwrap();
    assert!(owner.starts_with("batch-"), "{owner}");
    // `using` returned once a quorum confirmed its release; the rest may still be on the way.
    gone_from_every_server(&servers, "r");
    let g = rl
        .acquire("r", Acquire::write(Duration::from_secs(5)))
        .unwrap();
    let infos = rl.info("r");
    assert_eq!(infos.len(), 5);
    assert!(infos.iter().all(|(_, i)| {
        i.as_ref()
            .is_ok_and(|i| i.as_ref().is_some_and(|i| i.hold_count(g.owner()) == 1))
    }));
    drop(g);
    assert!(matches!(
        redlock(&servers).owner_prefix("p".repeat(1000)),
        Err(LockError::InvalidRequest { .. })
    ));
}

#[test]
fn one_lock_client_cloned_into_16_threads_never_overlaps() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (client, inside, done) = (client.clone(), inside.clone(), done.clone());
            thread::spawn(move || {
                for _ in 0..10 {
                    let g = client
                        .lock("shared", Duration::from_secs(10), PATIENCE * 3)
                        .expect("lock within the wait");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    thread::sleep(Duration::from_millis(1));
                    inside.store(false, Ordering::SeqCst);
                    g.release().expect("release");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 160);
    assert!(client.info("shared").unwrap().is_none());
}
