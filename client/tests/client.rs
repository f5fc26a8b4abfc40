//! The client helper against real redis-servers with the module: one instance, and Redlock over
//! five, with servers killed and paused.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::{holders, int, query, Server, PATIENCE};
use redis_lock_client::{Acquire, LockClient, LockError, Outcome, Redlock, Watchdog};

fn url(s: &Server) -> String {
    format!("redis://127.0.0.1:{}/", s.port)
}

const TIMEOUT: Duration = Duration::from_millis(200);

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
    common::wait_until("waiter queued", || common::waiting(&mut c, "res") == 1);
    thread::sleep(Duration::from_millis(20));
    assert!(first.extend().unwrap() > Duration::from_secs(9));
    first.release().unwrap();
    let t2 = waiter.join().unwrap().unwrap().unwrap();
    assert!(t2 > t1);
    // The waiter's guard was dropped inside the thread: released.
    common::wait_until("released on drop", || int(&mut c, &["EXISTS", "res"]) == 0);

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

fn five() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

fn redlock(servers: &[Server]) -> Redlock {
    let urls: Vec<String> = servers.iter().map(url).collect();
    Redlock::new(&urls, TIMEOUT).unwrap()
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
    for s in &servers {
        let mut c = s.client();
        assert_eq!(int(&mut c, &["EXISTS", "job"]), 0);
    }
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
