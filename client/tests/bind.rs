//! Bound holds (`Acquire::bind`) and lock-delay (`Acquire::lock_delay`) against real
//! redis-servers with the module: the options reach the server, a bound guard has a connection
//! of its own that it keeps, a closed connection (`CLIENT KILL`) ends the hold at once and makes
//! the guard lost, a release comes before the close (no lock-delay), and a lock-delay on a read
//! lock is refused before anything is sent.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::{Acquire, LockClient, LockError, LossCause, Outcome, Redlock, Watchdog};
use redis_lock_testkit::{
    holders, info, int, query, wait_until, waiting, Connection, Server, Value, PATIENCE,
};

fn bound_ids(c: &mut Connection) -> Vec<i64> {
    bound_clients(c).into_iter().map(|(id, _)| id).collect()
}

/// Kills the server's only bound connection (server side, as a crash or an operator would).
fn kill_the_bound_connection(c: &mut Connection) -> i64 {
    let ids = bound_ids(c);
    assert_eq!(ids.len(), 1, "bound connections: {ids:?}");
    assert_eq!(int(c, &["CLIENT", "KILL", "ID", &ids[0].to_string()]), 1);
    ids[0]
}

/// LOCK.INFO's `delay` field (remaining lock-delay, ms), or None when the key does not exist.
fn delay(c: &mut Connection, key: &str) -> Option<i64> {
    info(c, key).map(|m| match m.get("delay") {
        Some(Value::Int(d)) => *d,
        other => panic!("delay field: {other:?}"),
    })
}

#[test]
fn bind_and_lock_delay_reach_the_server_on_a_connection_of_the_guards_own() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    // A plain guard first: its short-command connection stays pooled, unnamed.
    let plain = client
        .try_lock("plain", Duration::from_secs(60))
        .expect("plain lock");
    assert!(!plain.is_bound());
    assert!(bound_ids(&mut c).is_empty());

    let guard = client
        .acquire(
            "bd",
            Acquire::write(Duration::from_secs(60))
                .bind()
                .lock_delay(Duration::from_secs(60)),
        )
        .expect("bound lock");
    assert!(guard.is_bound());
    let clients = bound_clients(&mut c);
    assert_eq!(clients.len(), 1, "{clients:?}");
    assert!(
        clients[0].1.contains("cmd=lock.acquire"),
        "the acquire came over the bound connection: {}",
        clients[0].1
    );
    assert_eq!(holders(&mut c, "bd"), vec![(guard.owner().to_string(), 1)]);
    assert_eq!(delay(&mut c, "bd"), Some(0), "no delay while held");

    // The server ends the hold when that connection closes (BIND), and the lock-delay then
    // keeps the lock from everyone (LOCKDELAY).
    kill_the_bound_connection(&mut c);
    wait_until("the bound hold ended", || holders(&mut c, "bd").is_empty());
    let pending = delay(&mut c, "bd").expect("the key stays while the delay is pending");
    assert!(
        pending > 0 && pending <= 60_000,
        "remaining lock-delay {pending}"
    );
    assert!(matches!(
        other.try_lock("bd", Duration::from_secs(1)),
        Err(LockError::Held { .. })
    ));
    wait_until("the guard knows", || guard.is_lost());
    assert_eq!(guard.validity(), Duration::ZERO);
    assert!(matches!(
        guard.extend(),
        Err(LockError::Lost(l)) if l.cause == LossCause::ConnectionClosed
    ));
    // Its drop sends nothing that could disturb the next holder (its connection is gone).
    drop(guard);
    query(&mut c, &["DEL", "bd"]).unwrap(); // ends the delay
    let next = other
        .try_lock("bd", Duration::from_secs(60))
        .expect("free after DEL");
    // The plain guard was never bound and is unaffected.
    assert!(!plain.is_lost());
    assert_eq!(
        holders(&mut c, "plain"),
        vec![(plain.owner().to_string(), 1)]
    );
    drop((next, plain));
}

#[test]
fn a_killed_bound_connection_frees_the_lock_for_a_waiter_long_before_the_ttl() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let waiter_client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let ttl = Duration::from_secs(120);
    let (tx, rx) = mpsc::channel();
    let guard = client
        .acquire(
            "k",
            Acquire::write(ttl)
                .bind()
                .watchdog(Watchdog::new().notify(tx)),
        )
        .unwrap();
    let mut c = server.client();
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let r = waiter_client.lock("k", ttl, PATIENCE * 3);
            (r.map(|g| g.fencing_token()), Instant::now())
        });
        wait_until("the waiter is queued", || waiting(&mut c, "k") == 1);
        assert!(!guard.is_lost());
        let killed_at = Instant::now();
        kill_the_bound_connection(&mut c);
        let (granted, at) = waiter.join().unwrap();
        let took = at.duration_since(killed_at);
        eprintln!("waiter granted {took:?} after the kill (ttl {ttl:?})");
        assert!(matches!(granted, Ok(Some(_))), "waiter: {granted:?}");
        // Far below the ttl: the hold ended with its connection, not at its ttl.
        assert!(took < PATIENCE, "granted {took:?} after the kill");
    });
    let lost = rx
        .recv_timeout(PATIENCE)
        .expect("the watchdog reports the loss");
    assert_eq!(lost.key, "k");
    assert!(
        lost.causes.iter().any(
            |(_, o)| matches!(o, Outcome::Unreachable(e) if e.contains("bound connection closed"))
        ),
        "{lost:?}"
    );
    assert!(guard.is_lost());
    drop(guard);
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "reported once"
    );
}

/// Without a watchdog, `is_lost()` itself notices the closed connection (no request sent).
#[test]
fn is_lost_sees_a_closed_bound_connection_without_a_watchdog() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let guard = client
        .acquire("nw", Acquire::write(Duration::from_secs(120)).bind())
        .unwrap();
    let mut c = server.client();
    // Checking does not send anything: the bound connection's last command stays the acquire.
    for _ in 0..20 {
        assert!(!guard.is_lost());
        assert!(guard.validity() > Duration::ZERO);
    }
    let clients = bound_clients(&mut c);
    assert!(
        clients[0].1.contains("cmd=lock.acquire"),
        "{}",
        clients[0].1
    );
    kill_the_bound_connection(&mut c);
    wait_until("is_lost() after the kill", || guard.is_lost());
    assert_eq!(guard.validity(), Duration::ZERO);
    wait_until("the lock is free", || {
        other.try_lock("nw", Duration::from_secs(10)).is_ok()
    });
    // Lost stays lost; releasing a lost bound guard says so (not a success).
    assert!(guard.is_lost());
    assert!(matches!(
        guard.release(),
        Err(LockError::Lost(l)) if l.cause == LossCause::ConnectionClosed
    ));
}

#[test]
fn releasing_or_dropping_a_bound_guard_frees_the_lock_with_no_lock_delay_and_closes_it() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let request = || {
        Acquire::write(Duration::from_secs(60))
            .bind()
            .lock_delay(Duration::from_secs(60))
            .watchdog(Watchdog::new())
    };

    let guard = client.acquire("rel", request()).unwrap();
    assert_eq!(bound_ids(&mut c).len(), 1);
    guard.release().unwrap();
    // Released before the close: no lock-delay, so the key is gone at once.
    assert_eq!(int(&mut c, &["EXISTS", "rel"]), 0);
    wait_until("the bound connection closed", || {
        bound_ids(&mut c).is_empty()
    });
    drop(other.try_lock("rel", Duration::from_secs(1)).expect("free"));

    let guard = client.acquire("rel", request()).unwrap();
    assert_eq!(bound_ids(&mut c).len(), 1);
    drop(guard);
    assert_eq!(int(&mut c, &["EXISTS", "rel"]), 0);
    wait_until("the bound connection closed", || {
        bound_ids(&mut c).is_empty()
    });
    drop(other.try_lock("rel", Duration::from_secs(1)).expect("free"));

    // A read lock binds too; two bound guards have a connection each.
    let r1 = client
        .acquire("shared", Acquire::read(Duration::from_secs(60)).bind())
        .unwrap();
    let r2 = client
        .acquire("shared", Acquire::read(Duration::from_secs(60)).bind())
        .unwrap();
    assert_eq!(bound_ids(&mut c).len(), 2);
    assert_eq!(holders(&mut c, "shared").len(), 2);
    drop(r1);
    assert_eq!(holders(&mut c, "shared"), vec![(r2.owner().to_string(), 1)]);
    drop(r2);
    assert_eq!(int(&mut c, &["EXISTS", "shared"]), 0);
    wait_until("both closed", || bound_ids(&mut c).is_empty());
}

/// A waiting bound acquire waits on the connection the guard then keeps: the hold is bound to
/// it, and a failed (timed-out) bound wait leaves no connection behind.
#[test]
fn a_waiting_bound_acquire_keeps_the_connection_it_waited_on() {
    let server = Server::start();
    let holder = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let held = holder.try_lock("w", Duration::from_secs(60)).unwrap();

    // A wait that times out: nil, and its connection is closed.
    let r = client.acquire(
        "w",
        Acquire::write(Duration::from_secs(60))
            .bind()
            .wait(Duration::from_millis(100)),
    );
    assert!(matches!(r, Err(LockError::Held { .. })), "{r:?}");
    wait_until("the failed wait's connection closed", || {
        bound_ids(&mut c).is_empty()
    });

    let guard = thread::scope(|s| {
        let waiter = s.spawn(|| {
            client.acquire(
                "w",
                Acquire::write(Duration::from_secs(60))
                    .bind()
                    .wait(PATIENCE * 3),
            )
        });
        wait_until("the bound waiter is queued", || waiting(&mut c, "w") == 1);
        let waiting_on = bound_ids(&mut c);
        assert_eq!(waiting_on.len(), 1);
        held.release().unwrap();
        let guard = waiter.join().unwrap().expect("granted");
        assert_eq!(bound_ids(&mut c), waiting_on, "the same connection");
        guard
    });
    assert_eq!(holders(&mut c, "w"), vec![(guard.owner().to_string(), 1)]);
    kill_the_bound_connection(&mut c);
    wait_until("the hold ended with the connection", || {
        int(&mut c, &["EXISTS", "w"]) == 0
    });
    wait_until("the guard knows", || guard.is_lost());
    drop(other.try_lock("w", Duration::from_secs(1)).expect("free"));
}

#[test]
fn a_lock_delay_on_a_read_lock_is_refused_before_anything_is_sent() {
    // A server that is not there: the error is about the request, not the server.
    let gone = url(&Server::start());
    let client = LockClient::new(&gone, TIMEOUT).unwrap();
    let read = Acquire::read(Duration::from_secs(10)).lock_delay(Duration::from_secs(1));
    let e = client.acquire("r", read.clone()).unwrap_err();
    assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
    assert!(e.to_string().contains("write locks only"), "{e}");
    assert!(e.causes().is_empty());
    let e = client.acquire("r", read.clone().bind()).unwrap_err();
    assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
    let rl = Redlock::new(&[gone.as_str(), gone.as_str(), gone.as_str()], TIMEOUT).unwrap();
    let e = rl
        .acquire("r", read.wait(Duration::from_secs(1)))
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
    // Over the module's limit (2^47 ms).
    let e = client
        .acquire(
            "r",
            Acquire::write(Duration::from_secs(10)).lock_delay(Duration::from_secs(1 << 40)),
        )
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");

    // On a live server: nothing was created, and a write lock takes the same delay.
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let e = client
        .acquire(
            "r",
            Acquire::read(Duration::from_secs(10)).lock_delay(Duration::from_millis(1)),
        )
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidRequest { .. }), "{e}");
    assert!(info(&mut c, "r").is_none());
    let g = client
        .acquire(
            "r",
            Acquire::write(Duration::from_secs(10)).lock_delay(Duration::from_millis(1)),
        )
        .unwrap();
    assert_eq!(holders(&mut c, "r").len(), 1);
    drop(g);
}

/// A lock-delay without BIND applies when the ttl runs out.
#[test]
fn a_lock_delay_starts_when_an_unbound_hold_expires() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let guard = client
        .acquire(
            "exp",
            Acquire::write(Duration::from_millis(100)).lock_delay(Duration::from_secs(60)),
        )
        .unwrap();
    wait_until("the hold expired", || holders(&mut c, "exp").is_empty());
    assert!(guard.is_lost());
    assert!(delay(&mut c, "exp").is_some_and(|d| d > 0));
    assert!(matches!(
        other.try_lock("exp", Duration::from_secs(1)),
        Err(LockError::Held { .. })
    ));
}

/// The watchdog of a bound guard extends over the guard's own connection (which also keeps it
/// from idling), and a server that stalls longer than the reply timeout does not cost the hold:
/// the bound connection survives the late reply.
#[test]
fn a_bound_guard_survives_a_stall_longer_than_its_reply_timeout() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    // Extends every 600 ms, so a stall of 1.5 s (from any moment) holds an extend sent at
    // least 900 ms before its end: it times out (200 ms), and so do its retries.
    let ttl = Duration::from_secs(6);
    let (tx, rx) = mpsc::channel();
    let guard = client
        .acquire(
            "st",
            Acquire::write(ttl)
                .bind()
                .watchdog(Watchdog::new().fraction(0.1).notify(tx)),
        )
        .unwrap();
    let mut c = server.client();
    let before = bound_ids(&mut c);
    wait_until("the watchdog extended over the bound connection", || {
        bound_clients(&mut c)
            .iter()
            .any(|(_, l)| l.contains("cmd=lock.extend"))
    });
    // Stall the server for well over the reply timeout (200 ms) but well within the lease:
    // an extend times out on the bound connection meanwhile.
    server.signal("STOP");
    thread::sleep(Duration::from_millis(1500));
    server.signal("CONT");
    // A few more extends (a full ttl: an extend that failed would have lost the lease).
    thread::sleep(ttl);
    assert!(!guard.is_lost(), "lost after a stall: {:?}", rx.try_recv());
    assert!(rx.try_recv().is_err());
    assert_eq!(bound_ids(&mut c), before, "the same bound connection");
    assert_eq!(holders(&mut c, "st"), vec![(guard.owner().to_string(), 1)]);
    guard.release().unwrap();
    assert_eq!(int(&mut c, &["EXISTS", "st"]), 0);
}

/// Redlock: one bound connection per server; the lock is lost when fewer than a quorum (3 of
/// 5) remain open, not before.
#[test]
fn a_bound_redlock_guard_is_lost_when_a_majority_of_its_connections_close() {
    let servers = five();
    let rl = redlock(&servers);
    let (tx, rx) = mpsc::channel();
    let guard = rl
        .acquire(
            "q",
            Acquire::write(Duration::from_secs(120))
                .bind()
                .watchdog(Watchdog::new().notify(tx)),
        )
        .unwrap();
    assert_eq!(guard.tokens().len(), 5);
    let mut conns: Vec<Connection> = servers.iter().map(Server::client).collect();
    for c in conns.iter_mut() {
        assert_eq!(bound_ids(c).len(), 1);
    }
    for c in conns[..2].iter_mut() {
        kill_the_bound_connection(c);
        wait_until("the hold there ended", || holders(c, "q").is_empty());
    }
    // Three of five still hold it: not lost, nothing reported (the watchdog checks every
    // 100 ms: give it several rounds).
    thread::sleep(Duration::from_millis(500));
    assert!(!guard.is_lost());
    assert!(guard.validity() > Duration::ZERO);
    assert!(rx.try_recv().is_err());
    let intruder = redlock(&servers);
    assert!(matches!(
        intruder.acquire("q", Acquire::write(Duration::from_secs(10))),
        Err(LockError::Held { .. })
    ));

    kill_the_bound_connection(&mut conns[2]);
    let lost = rx.recv_timeout(PATIENCE).expect("loss reported");
    let closed = lost
        .causes
        .iter()
        .filter(
            |(_, o)| matches!(o, Outcome::Unreachable(e) if e.contains("bound connection closed")),
        )
        .count();
    assert_eq!(closed, 3, "{lost:?}");
    assert!(guard.is_lost());
    wait_until("a majority is free", || {
        intruder
            .acquire("q", Acquire::write(Duration::from_secs(10)))
            .is_ok()
    });
    drop(guard);
    for c in conns.iter_mut() {
        wait_until("no bound connection left", || bound_ids(c).is_empty());
    }
}

/// A bound Redlock attempt that does not reach a quorum gives back what it got by releasing
/// (no hold and no lock-delay left behind) and closes its connections; retries reuse them.
#[test]
fn a_failed_bound_redlock_acquire_leaves_no_hold_no_lock_delay_and_no_connection() {
    let servers = five();
    let mut conns: Vec<Connection> = servers.iter().map(Server::client).collect();
    // Someone else holds the lock on three servers.
    for c in conns[2..].iter_mut() {
        int(c, &["LOCK.ACQUIRE", "f", "someone", "60000"]);
    }
    let rl = redlock(&servers);
    let request = Acquire::write(Duration::from_secs(60))
        .bind()
        .lock_delay(Duration::from_secs(60));
    let e = rl.acquire("f", request.clone()).unwrap_err();
    assert!(matches!(e, LockError::Held { .. }), "{e}");
    let e = rl
        .acquire("f", request.clone().wait(Duration::from_millis(300)))
        .unwrap_err();
    assert!(matches!(e, LockError::Held { .. }), "{e}");
    for c in conns[..2].iter_mut() {
        // Released, not disconnected: no key, so no lock-delay pending.
        assert_eq!(int(c, &["EXISTS", "f"]), 0);
    }
    for c in conns.iter_mut() {
        wait_until("the attempts' connections closed", || {
            bound_ids(c).is_empty()
        });
    }
    for c in conns[2..].iter_mut() {
        assert_eq!(holders(c, "f"), vec![("someone".to_string(), 1)]);
        int(c, &["LOCK.RELEASE", "f", "someone"]);
    }
    let guard = rl.acquire("f", request).expect("free now");
    assert_eq!(guard.tokens().len(), 5);
}
