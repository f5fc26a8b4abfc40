//! Semaphore permits (`Acquire::permit`, `LOCK.SEMACQUIRE`), explicit owners
//! (`Acquire::owner`) and the refusals the server names (`Deadlock`, `WrongKind`,
//! `CapacityMismatch`) against real redis-servers with the module.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::{Acquire, LockClient, LockError, LockGuard, LossCause, Mode, Watchdog};
use redis_lock_testkit::{
    holders, info, int, query, wait_until, waiting, Connection, Server, Value, PATIENCE,
};

const LONG: Duration = Duration::from_secs(60);

/// LOCK.INFO's `mode` field, or None when the key does not exist.
fn mode(c: &mut Connection, key: &str) -> Option<String> {
    info(c, key).map(|m| match m.get("mode") {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        other => panic!("mode field: {other:?}"),
    })
}

/// LOCK.INFO's `capacity` field.
fn capacity(c: &mut Connection, key: &str) -> Option<i64> {
    info(c, key).and_then(|m| match m.get("capacity") {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    })
}

fn sorted(mut v: Vec<(String, i64)>) -> Vec<(String, i64)> {
    v.sort();
    v
}

/// The owners of `guards`, one permit each, as `holders` lists them.
fn one_each(guards: &[&LockGuard]) -> Vec<(String, i64)> {
    sorted(guards.iter().map(|g| (g.owner().to_string(), 1)).collect())
}

/// The first server's error text in a refusal.
fn refusal_text(e: &LockError) -> String {
    match e.causes().first() {
        Some((_, o)) if o.is_refusal() => o.error_text().unwrap_or_default().to_string(),
        other => panic!("{e}: first cause {other:?}"),
    }
}

#[test]
fn permits_up_to_capacity_then_held_and_a_released_permit_goes_to_the_waiter() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let guards: Vec<LockGuard> = (0..3)
        .map(|i| {
            client
                .try_permit("sem", 3, LONG)
                .unwrap_or_else(|e| panic!("permit {i}: {e}"))
        })
        .collect();
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token().unwrap()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "every permit gets a new, greater token: {tokens:?}"
    );
    for g in &guards {
        assert_eq!(g.mode(), Mode::Permit { capacity: 3 });
        assert!(g.validity() > Duration::from_secs(55));
        assert!(!g.is_lost());
    }
    let refs: Vec<&LockGuard> = guards.iter().collect();
    assert_eq!(
        sorted(holders(&mut c, "sem")),
        one_each(&refs),
        "one permit per guard, each under an owner of its own"
    );
    assert_eq!(mode(&mut c, "sem").as_deref(), Some("semaphore"));
    assert_eq!(capacity(&mut c, "sem"), Some(3));

    // Full: a try is Held, a wait runs out as Held.
    let e = client.try_permit("sem", 3, LONG).unwrap_err();
    assert!(matches!(e, LockError::Held { .. }), "{e}");
    let started = Instant::now();
    let e = client
        .permit("sem", 3, LONG, Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(e, LockError::Held { .. }), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(190));
    assert_eq!(
        waiting(&mut c, "sem"),
        0,
        "the timed-out waiter left the queue"
    );

    // A waiter gets the permit that a release frees, at once.
    let waiter_client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let waiter = thread::spawn(move || waiter_client.permit("sem", 3, LONG, PATIENCE * 3));
    wait_until("the waiter queued", || waiting(&mut c, "sem") == 1);
    let mut guards = guards;
    let freed = guards.remove(1);
    freed.release().unwrap();
    let granted = waiter.join().unwrap().expect("granted on the release");
    assert!(granted.fencing_token().unwrap() > tokens[2]);
    let refs: Vec<&LockGuard> = guards.iter().chain([&granted]).collect();
    assert_eq!(sorted(holders(&mut c, "sem")), one_each(&refs));
    drop(guards);
    drop(granted);
    assert_eq!(int(&mut c, &["EXISTS", "sem"]), 0, "all permits released");
}

/// Waiters are granted in the order they queued, never more than `capacity` at a time.
#[test]
fn waiters_get_permits_in_fifo_order() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let first = client.try_permit("fifo", 2, LONG).unwrap();
    let second = client.try_permit("fifo", 2, LONG).unwrap();
    let (tx, rx) = mpsc::channel::<(usize, LockGuard)>();
    let mut threads = Vec::new();
    for id in 0..5 {
        let (u, tx) = (url(&server), tx.clone());
        threads.push(thread::spawn(move || {
            let client = LockClient::new(&u, TIMEOUT).unwrap();
            let guard = client
                .permit("fifo", 2, LONG, PATIENCE * 3)
                .unwrap_or_else(|e| panic!("waiter {id}: {e}"));
            tx.send((id, guard)).unwrap();
        }));
        // The next one queues only once this one is queued.
        wait_until("queued in order", || {
            waiting(&mut c, "fifo") == id as i64 + 1
        });
    }
    let quiet = |rx: &mpsc::Receiver<(usize, LockGuard)>| {
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "a permit was granted beyond the capacity"
        );
    };
    quiet(&rx);
    let mut order = Vec::new();
    let mut held = Vec::new();
    // Each release hands exactly one permit to the head waiter.
    for freed in [first, second] {
        freed.release().unwrap();
        let (id, guard) = rx.recv_timeout(PATIENCE).expect("a waiter granted");
        order.push(id);
        held.push(guard);
        quiet(&rx);
    }
    while order.len() < 5 {
        drop(held.remove(0)); // drop releases too
        let (id, guard) = rx.recv_timeout(PATIENCE).expect("a waiter granted");
        order.push(id);
        held.push(guard);
        assert!(holders(&mut c, "fifo").len() <= 2);
        quiet(&rx);
    }
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
    for t in threads {
        t.join().unwrap();
    }
    drop(held);
    assert_eq!(int(&mut c, &["EXISTS", "fifo"]), 0);
}

#[test]
fn dropping_a_permit_guard_releases_it() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let guard = client.try_permit("dropped", 1, LONG).unwrap();
    assert_eq!(
        holders(&mut c, "dropped"),
        vec![(guard.owner().to_string(), 1)]
    );
    drop(guard);
    assert_eq!(int(&mut c, &["EXISTS", "dropped"]), 0);

    // With a waiter: the drop hands the permit over.
    let guard = client.try_permit("dropped", 1, LONG).unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| client.permit("dropped", 1, LONG, PATIENCE * 3));
        wait_until("the waiter queued", || waiting(&mut c, "dropped") == 1);
        drop(guard);
        let next = waiter.join().unwrap().expect("granted on the drop");
        assert_eq!(
            holders(&mut c, "dropped"),
            vec![(next.owner().to_string(), 1)]
        );
    });
}

#[test]
fn extend_and_the_watchdog_keep_a_permit_past_its_ttl() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();

    // extend() resets the owner's expiry.
    let ttl = Duration::from_secs(2);
    let plain = client.try_permit("ext", 2, ttl).unwrap();
    thread::sleep(Duration::from_millis(700));
    let validity = plain.extend().expect("extend");
    assert!(validity > Duration::from_millis(1500), "{validity:?}");
    let pttl = int(&mut c, &["PTTL", "ext"]);
    assert!(pttl > 1500, "the key's expiry follows the extend: {pttl}");
    plain.release().unwrap();

    // The watchdog keeps a short-lived permit for five ttls.
    let ttl = Duration::from_millis(300);
    let (tx, rx) = mpsc::channel();
    let guard = client
        .acquire(
            "wd",
            Acquire::permit(1, ttl).watchdog(Watchdog::new().notify(tx)),
        )
        .unwrap();
    thread::sleep(ttl * 5);
    assert!(!guard.is_lost());
    assert!(guard.validity() > Duration::ZERO);
    assert_eq!(holders(&mut c, "wd"), vec![(guard.owner().to_string(), 1)]);
    assert!(matches!(
        other.try_permit("wd", 1, ttl),
        Err(LockError::Held { .. })
    ));
    // Deleted behind its back: the watchdog reports the loss.
    query(&mut c, &["DEL", "wd"]).unwrap();
    let lost = rx.recv_timeout(PATIENCE).expect("loss reported");
    assert_eq!(lost.key, "wd");
    assert!(guard.is_lost());
}

#[test]
fn a_bound_permit_ends_with_its_connection_and_the_waiter_gets_it() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let guard = client
        .acquire("bsem", Acquire::permit(1, LONG).bind())
        .expect("bound permit");
    assert!(guard.is_bound());
    let bound = bound_clients(&mut c);
    assert_eq!(bound.len(), 1, "{bound:?}");
    assert!(
        bound[0].1.contains("cmd=lock.semacquire"),
        "the permit came over the bound connection: {}",
        bound[0].1
    );
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let started = Instant::now();
            let r = client.permit("bsem", 1, LONG, PATIENCE * 3);
            (r, started.elapsed())
        });
        wait_until("the waiter queued", || waiting(&mut c, "bsem") == 1);
        let id = bound[0].0.to_string();
        assert_eq!(int(&mut c, &["CLIENT", "KILL", "ID", &id]), 1);
        let (next, waited) = waiter.join().unwrap();
        let next = next.expect("granted when the bound connection closed");
        assert!(waited < PATIENCE, "granted at the close, not the ttl");
        assert_eq!(holders(&mut c, "bsem"), vec![(next.owner().to_string(), 1)]);
    });
    wait_until("the guard knows", || guard.is_lost());
    assert!(matches!(
        guard.extend(),
        Err(LockError::Lost(l)) if l.cause == LossCause::ConnectionClosed
    ));
}

#[test]
fn wrong_kind_and_capacity_mismatch_are_errors_of_their_own_and_change_nothing() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();

    // A permit of a lock key.
    let lock = client.try_lock("lk", LONG).unwrap();
    let e = client.try_permit("lk", 2, LONG).unwrap_err();
    assert!(matches!(e, LockError::WrongKind { .. }), "{e}");
    assert!(refusal_text(&e).starts_with("WRONGKIND"), "{e}");
    let e = client
        .permit("lk", 2, LONG, Duration::from_secs(5))
        .unwrap_err();
    assert!(matches!(e, LockError::WrongKind { .. }), "{e}");
    assert_eq!(holders(&mut c, "lk"), vec![(lock.owner().to_string(), 1)]);
    assert_eq!(mode(&mut c, "lk").as_deref(), Some("write"));

    // A lock of a semaphore key, read or write.
    let permit = client.try_permit("sk", 2, LONG).unwrap();
    for request in [Acquire::write(LONG), Acquire::read(LONG)] {
        let e = client.acquire("sk", request).unwrap_err();
        assert!(matches!(e, LockError::WrongKind { .. }), "{e}");
    }

    // Another capacity, with or without a wait: refused at once.
    let started = Instant::now();
    for request in [
        Acquire::permit(3, LONG),
        Acquire::permit(1, LONG).wait(Duration::from_secs(5)),
    ] {
        let e = client.acquire("sk", request).unwrap_err();
        assert!(matches!(e, LockError::CapacityMismatch { .. }), "{e}");
        assert!(e.to_string().contains("capacity"), "{e}");
    }
    assert!(started.elapsed() < Duration::from_secs(4), "not queued");
    assert_eq!(holders(&mut c, "sk"), vec![(permit.owner().to_string(), 1)]);
    assert_eq!(capacity(&mut c, "sk"), Some(2));
    assert_eq!(waiting(&mut c, "sk"), 0);

    // Once the key is gone, the next request sets the capacity anew.
    drop(permit);
    let anew = client.try_permit("sk", 3, LONG).expect("new capacity");
    assert_eq!(capacity(&mut c, "sk"), Some(3));
    drop(anew);

    // Another Redis type is still a plain refusal.
    query(&mut c, &["SET", "str", "x"]).unwrap();
    let e = client.try_permit("str", 2, LONG).unwrap_err();
    assert!(matches!(e, LockError::Refused { .. }), "{e}");
    assert!(refusal_text(&e).starts_with("WRONGTYPE"), "{e}");
}

#[test]
fn invalid_permit_requests_are_refused_before_anything_is_sent() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    for request in [
        Acquire::permit(0, LONG),
        Acquire::permit(1 << 31, LONG),
        Acquire::permit(2, LONG).lock_delay(Duration::from_secs(1)),
        Acquire::permit(2, LONG).owner(""),
        Acquire::permit(2, LONG).owner("o").bind(),
    ] {
        let e = client.acquire("bad", request).unwrap_err();
        assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
        assert!(e.causes().is_empty());
    }
    assert!(info(&mut c, "bad").is_none());
}

/// Redlock refuses permits: a majority of independent semaphores does not bound the holders
/// to the capacity. The second half shows why, with the module's own commands.
#[test]
fn redlock_refuses_permits_and_why() {
    let servers = five();
    let rl = redlock(&servers);
    for request in [
        Acquire::permit(2, LONG),
        Acquire::permit(1, LONG).wait(Duration::from_secs(1)),
        Acquire::permit(2, LONG).bind(),
    ] {
        let e = rl.acquire("rsem", request).unwrap_err();
        assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
        assert!(e.to_string().contains("majority"), "{e}");
    }
    let e = rl
        .acquire("rsem", Acquire::write(LONG).owner("job"))
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
    for s in &servers {
        let mut c = s.client();
        assert!(info(&mut c, "rsem").is_none(), "nothing was sent");
    }

    // Three servers, capacity 2: three owners each get a majority (2 of 3), every server stays
    // within its capacity, and yet three hold at once.
    let three = &servers[..3];
    let mut conns: Vec<Connection> = three.iter().map(|s| s.client()).collect();
    for (owner, pair) in [("a", [0, 1]), ("b", [1, 2]), ("c", [0, 2])] {
        for i in pair {
            int(
                &mut conns[i],
                &["LOCK.SEMACQUIRE", "demo", owner, "2", "60000"],
            );
        }
    }
    for c in &mut conns {
        assert_eq!(holders(c, "demo").len(), 2, "each server at its capacity");
    }
}

#[test]
fn an_upgrade_by_the_same_owner_is_a_deadlock() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();

    // Both through the client, under one explicit owner.
    let read = client
        .acquire("up", Acquire::read(LONG).owner("job-1"))
        .unwrap();
    assert_eq!(read.owner(), "job-1");
    let started = Instant::now();
    for request in [
        Acquire::write(LONG).owner("job-1"),
        Acquire::write(LONG)
            .owner("job-1")
            .wait(Duration::from_secs(5)),
    ] {
        let e = client.acquire("up", request).unwrap_err();
        assert!(matches!(e, LockError::Deadlock { .. }), "{e}");
        assert!(refusal_text(&e).starts_with("DEADLOCK"), "{e}");
    }
    assert!(started.elapsed() < Duration::from_secs(4), "not queued");
    assert_eq!(holders(&mut c, "up"), vec![("job-1".to_string(), 1)]);
    assert_eq!(waiting(&mut c, "up"), 0);
    // Another owner is simply held off.
    let e = client.try_lock("up", LONG).unwrap_err();
    assert!(matches!(e, LockError::Held { .. }), "{e}");
    drop(read);
    assert_eq!(int(&mut c, &["EXISTS", "up"]), 0);

    // The read hold taken with the raw command, the write asked through the client.
    int(&mut c, &["LOCK.RWREAD", "up2", "o", "60000"]);
    let e = client
        .acquire("up2", Acquire::write(LONG).owner("o"))
        .unwrap_err();
    assert!(matches!(e, LockError::Deadlock { .. }), "{e}");
    assert_eq!(holders(&mut c, "up2"), vec![("o".to_string(), 1)]);
}

/// An explicit owner re-enters its holds, and each of its guards releases one.
#[test]
fn guards_of_an_explicit_owner_reenter_and_release_one_hold_each() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let a = client
        .acquire("re", Acquire::write(LONG).owner("job"))
        .unwrap();
    let b = client
        .acquire("re", Acquire::write(LONG).owner("job"))
        .unwrap();
    assert_eq!(a.fencing_token(), b.fencing_token(), "a re-entry");
    assert_eq!(holders(&mut c, "re"), vec![("job".to_string(), 2)]);
    a.release().unwrap();
    assert_eq!(holders(&mut c, "re"), vec![("job".to_string(), 1)]);
    assert!(!b.is_lost());
    drop(b);
    assert_eq!(int(&mut c, &["EXISTS", "re"]), 0);

    // A semaphore: each guard is one more permit of the owner.
    let p1 = client
        .acquire("ps", Acquire::permit(2, LONG).owner("pool"))
        .unwrap();
    let p2 = client
        .acquire("ps", Acquire::permit(2, LONG).owner("pool"))
        .unwrap();
    assert_eq!(p1.fencing_token(), p2.fencing_token());
    assert_eq!(holders(&mut c, "ps"), vec![("pool".to_string(), 2)]);
    let e = client
        .acquire("ps", Acquire::permit(2, LONG).owner("pool"))
        .unwrap_err();
    assert!(matches!(e, LockError::Held { .. }), "capacity 2: {e}");
    drop(p1);
    assert_eq!(holders(&mut c, "ps"), vec![("pool".to_string(), 1)]);
    drop(p2);
    assert_eq!(int(&mut c, &["EXISTS", "ps"]), 0);
}

/// A wait that would close a cycle of owners across keys is refused with `Deadlock`. Needs the
/// module's cross-key deadlock detection (SPEC "Deadlock detection"); run with `--ignored`
/// once it is in.
#[test]
fn a_wait_that_would_close_a_cycle_is_a_deadlock() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let a = client
        .acquire("k1", Acquire::write(LONG).owner("A"))
        .unwrap();
    let b = client
        .acquire("k2", Acquire::write(LONG).owner("B"))
        .unwrap();
    thread::scope(|s| {
        // A waits for k2, held by B.
        let a_waits =
            s.spawn(|| client.acquire("k2", Acquire::write(LONG).owner("A").wait(PATIENCE * 3)));
        wait_until("A queued on k2", || waiting(&mut c, "k2") == 1);
        // B waiting for k1 (held by A) would close the cycle.
        let started = Instant::now();
        let e = client
            .acquire("k1", Acquire::write(LONG).owner("B").wait(PATIENCE))
            .unwrap_err();
        assert!(matches!(e, LockError::Deadlock { .. }), "{e}");
        assert!(started.elapsed() < PATIENCE / 2, "refused, not queued");
        assert_eq!(waiting(&mut c, "k1"), 0);
        drop(b);
        let granted = a_waits.join().unwrap().expect("A granted once B released");
        assert_eq!(holders(&mut c, "k2"), vec![("A".to_string(), 1)]);
        drop(granted);
    });
    drop(a);
}
