//! CLIENT PAUSE WRITE (and the pause of a FAILOVER): the server keeps its dataset constant and
//! propagates nothing, and asserts so when AOF is on or a replica is attached. A waiter that
//! leaves during the pause (its WAIT timeout, CLIENT UNBLOCK, its connection closing) must
//! change no key and grant nobody until the pause ends; then the waiters it let in are served.

use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;
use redis_lock_testkit::*;

const LONG: &str = "600000";
const PAUSE: &str = "30000";

/// How the queued writer leaves during the pause.
#[derive(Clone, Copy, Debug)]
enum Departure {
    /// Its WAIT timeout passes.
    Timeout,
    /// CLIENT UNBLOCK (reported to the module as a timeout).
    Unblock,
    /// CLIENT KILL (its connection closes).
    Kill,
}

/// What makes the server assert on a write during the pause.
#[derive(Clone, Copy, Debug)]
enum Persistence {
    Aof,
    Replica,
}

/// The id of the client blocked in `LOCK.ACQUIRE` (the writer), from CLIENT LIST.
fn blocked_writer_id(c: &mut Connection) -> String {
    let list = value_text(&query(c, &["CLIENT", "LIST"]).unwrap());
    list.lines()
        .find(|l| l.contains("cmd=lock.acquire"))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .unwrap_or_else(|| panic!("no blocked writer in {list}"))
        .to_string()
}

fn a_writer_leaving_during_a_pause(persistence: Persistence, departure: Departure) {
    let (master, replica) = match persistence {
        Persistence::Aof => (Server::start_with(&["--appendonly", "yes"]), None),
        Persistence::Replica => {
            let (m, r) = master_and_replica(&[]);
            (m, Some(r))
        }
    };
    let mut c = master.client();
    int(&mut c, &["LOCK.RWREAD", "k", "r1", LONG]);
    let wait = match departure {
        // Long enough that the pause surely starts first, even on a loaded machine.
        Departure::Timeout => "1500",
        Departure::Unblock | Departure::Kill => "0",
    };
    let writer = spawn_waiter(
        &master,
        &mut c,
        &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", wait],
        1,
    );
    let writer_id = blocked_writer_id(&mut c);
    // A reader behind the writer: the writer's departure lets it in beside r1.
    let reader = spawn_waiter(
        &master,
        &mut c,
        &["LOCK.RWREAD", "k", "r2", LONG, "WAIT", "0"],
        2,
    );
    query(&mut c, &["CLIENT", "PAUSE", PAUSE, "WRITE"]).unwrap();
    match departure {
        Departure::Timeout => {}
        Departure::Unblock => {
            assert_eq!(
                int(&mut c, &["CLIENT", "UNBLOCK", &writer_id, "TIMEOUT"]),
                1
            );
        }
        Departure::Kill => {
            assert_eq!(int(&mut c, &["CLIENT", "KILL", "ID", &writer_id]), 1);
        }
    }
    let left = writer.join();
    match departure {
        Departure::Kill => assert!(left.is_err(), "{left:?}"),
        Departure::Timeout | Departure::Unblock => {
            assert_eq!(left.unwrap(), redis::Value::Nil)
        }
    }
    // Give the server a moment to act on the departure (it used to write and replicate here,
    // and die on an assertion).
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        value_text(&query(&mut c, &["PING"]).expect("the server survives")),
        "PONG"
    );
    assert!(!reader.is_finished(), "nobody is granted during the pause");
    // LOCK.INFO shows the reader still queued, not the writer that left.
    let map = info(&mut c, "k").expect("the lock");
    assert_eq!(map["waiting"], redis::Value::Int(1));
    assert_eq!(value_texts(&map["queue"]), ["read"]);
    query(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
    assert!(reader.token() > 0);
    let mut expected = vec![("r1".to_string(), 1), ("r2".to_string(), 1)];
    expected.sort();
    let mut got = holders(&mut c, "k");
    got.sort();
    assert_eq!(got, expected);
    assert_eq!(waiting(&mut c, "k"), 0);
    if let Some(replica) = replica {
        let mut r = replica.client();
        wait_until("the replica has both readers", || {
            let mut h = holders(&mut r, "k");
            h.sort();
            h == expected
        });
    }
}

#[test]
fn a_writer_timing_out_during_a_pause_with_aof_writes_nothing_until_it_ends() {
    a_writer_leaving_during_a_pause(Persistence::Aof, Departure::Timeout);
}

#[test]
fn a_writer_timing_out_during_a_pause_with_a_replica_writes_nothing_until_it_ends() {
    a_writer_leaving_during_a_pause(Persistence::Replica, Departure::Timeout);
}

#[test]
fn a_writer_unblocked_during_a_pause_with_aof_writes_nothing_until_it_ends() {
    a_writer_leaving_during_a_pause(Persistence::Aof, Departure::Unblock);
}

#[test]
fn a_writer_unblocked_during_a_pause_with_a_replica_writes_nothing_until_it_ends() {
    a_writer_leaving_during_a_pause(Persistence::Replica, Departure::Unblock);
}

#[test]
fn a_writer_killed_during_a_pause_with_aof_writes_nothing_until_it_ends() {
    a_writer_leaving_during_a_pause(Persistence::Aof, Departure::Kill);
}

#[test]
fn a_writer_killed_during_a_pause_with_a_replica_writes_nothing_until_it_ends() {
    a_writer_leaving_during_a_pause(Persistence::Replica, Departure::Kill);
}

/// A waiter that timed out during the pause is still listed in the lock value until its key is
/// settled; an expiry timer deferred by the pause may run first. It must grant the next waiter,
/// not the one that left. (A semaphore, so that the key outlives the expiring holder and the
/// timer, not the key's own TTL, ends it.)
#[test]
fn an_expiry_deferred_by_a_pause_does_not_grant_a_waiter_that_left_during_it() {
    // The short holder's TTL must pass only after the pause has begun (and `gone` timed out),
    // so it is seconds, not a race with the set-up on a loaded machine.
    for _ in 0..3 {
        let server = Server::start();
        let mut c = server.client();
        let start = Instant::now();
        int(&mut c, &["LOCK.SEMACQUIRE", "s", "short", "2", "3000"]);
        int(&mut c, &["LOCK.SEMACQUIRE", "s", "long", "2", LONG]);
        let gone = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.SEMACQUIRE", "s", "gone", "2", LONG, "WAIT", "1000"],
            1,
        );
        let next = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.SEMACQUIRE", "s", "next", "2", LONG, "WAIT", "0"],
            2,
        );
        query(&mut c, &["CLIENT", "PAUSE", PAUSE, "WRITE"]).unwrap();
        assert!(
            start.elapsed() < Duration::from_millis(2500),
            "the set-up took {:?}: the short hold may have ended before the pause",
            start.elapsed()
        );
        assert_eq!(gone.join().unwrap(), redis::Value::Nil);
        // Past the short holder's TTL: its timer is due and waits for the pause to end.
        thread::sleep(Duration::from_millis(3300).saturating_sub(start.elapsed()));
        query(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
        let token = next.token();
        let mut got = holders(&mut c, "s");
        got.sort();
        assert_eq!(
            got,
            [("long".to_string(), 1), ("next".to_string(), 1)],
            "token {token}"
        );
    }
}

/// The expiry timers of many locks that come due during a pause wait for it to end, then
/// expire their holders.
#[test]
fn expiry_timers_due_during_a_pause_expire_their_holders_after_it() {
    let server = Server::start();
    let mut c = server.client();
    let start = Instant::now();
    for i in 0..50 {
        let key = format!("k{i}");
        // Two readers with different TTLs: the earlier one needs a timer.
        int(&mut c, &["LOCK.RWREAD", &key, "short", "2000"]);
        int(&mut c, &["LOCK.RWREAD", &key, "long", LONG]);
    }
    query(&mut c, &["CLIENT", "PAUSE", PAUSE, "WRITE"]).unwrap();
    let before = info_field(&mut c, "expirations_total");
    assert!(
        before < 50,
        "every short hold ended before the pause began ({:?} of set-up)",
        start.elapsed()
    );
    // Past every short TTL: their timers are due and wait for the pause to end.
    thread::sleep(Duration::from_millis(2300).saturating_sub(start.elapsed()));
    assert_eq!(info_field(&mut c, "expirations_total"), before);
    query(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
    wait_until("50 expirations", || {
        info_field(&mut c, "expirations_total") == 50
    });
    assert_eq!(holders(&mut c, "k7"), [("long".to_string(), 1)]);
}

/// A master demoted by FAILOVER keeps the expiry timers it armed; when one fires there it must
/// not expire anything by this server's own clock (the new master decides, and replicates it).
#[test]
fn a_demoted_master_does_not_expire_holders_by_its_own_timers() {
    let (old, new) = master_and_replica(&[]);
    let mut a = old.client();
    let mut b = new.client();
    // Two readers with different TTLs: the earlier one is on a timer.
    int(&mut a, &["LOCK.RWREAD", "k", "short", "1500"]);
    int(&mut a, &["LOCK.RWREAD", "k", "long", LONG]);
    wait_until("the replica has both readers", || {
        holders(&mut b, "k").len() == 2
    });
    query(&mut a, &["FAILOVER"]).unwrap();
    let role = |c: &mut Connection| match query(c, &["ROLE"]).unwrap() {
        redis::Value::Array(v) => value_text(&v[0]),
        other => panic!("ROLE: {other:?}"),
    };
    wait_until("the old master is a replica", || role(&mut a) == "slave");
    wait_until("the new master is a master", || role(&mut b) == "master");
    // The new master may not expire anything while paused; the old one must not on its own.
    query(&mut b, &["CLIENT", "PAUSE", PAUSE, "WRITE"]).unwrap();
    thread::sleep(Duration::from_millis(2000));
    // (LOCK.INFO hides a holder past its TTL anywhere, so the counter is what tells.)
    assert_eq!(info_field(&mut a, "expirations_total"), 0);
    query(&mut b, &["CLIENT", "UNPAUSE"]).unwrap();
    wait_until("the new master expires the short reader", || {
        holders(&mut b, "k") == [("long".to_string(), 1)]
    });
    wait_until("the old master follows", || {
        holders(&mut a, "k") == [("long".to_string(), 1)]
    });
}
