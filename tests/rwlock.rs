//! Read-write locks against a real redis-server: shared holders with their own counts and
//! expiries, writer preference, reader runs, DEADLOCK on upgrade, and what happens when a
//! queued writer leaves.

use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

fn mode(c: &mut Connection, key: &str) -> String {
    match info(c, key).and_then(|m| m.get("mode").cloned()) {
        Some(Value::SimpleString(s)) => s,
        Some(Value::BulkString(b)) => String::from_utf8_lossy(&b).to_string(),
        other => panic!("mode: {other:?}"),
    }
}

fn queue_modes(c: &mut Connection, key: &str) -> Vec<String> {
    match info(c, key).and_then(|m| m.get("queue").cloned()) {
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::SimpleString(s) => s,
                Value::BulkString(b) => String::from_utf8_lossy(&b).to_string(),
                other => panic!("queue item {other:?}"),
            })
            .collect(),
        other => panic!("queue: {other:?}"),
    }
}

fn owners(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(o, n)| (o.to_string(), *n)).collect()
}

#[test]
fn readers_share_with_their_own_counts_and_tokens() {
    let server = Server::start();
    let mut c = server.client();
    let t1 = int(&mut c, &["LOCK.RWREAD", "rw", "r1", "10000"]);
    let t2 = int(&mut c, &["LOCK.RWREAD", "rw", "r2", "10000"]);
    assert!(t2 > t1, "each reader gets its own token");
    assert_eq!(
        int(&mut c, &["LOCK.RWREAD", "rw", "r1", "10000"]),
        t1,
        "re-entry keeps the token"
    );
    assert_eq!(holders(&mut c, "rw"), owners(&[("r1", 2), ("r2", 1)]));
    assert_eq!(mode(&mut c, "rw"), "read");
    assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "rw", "w", "10000"]));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rw", "r1"]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rw", "r2"]), 0);
    assert_eq!(holders(&mut c, "rw"), owners(&[("r1", 1)]));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rw", "r1", "ALL"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "rw"]), 0);
    assert_eq!(info_field(&mut c, "readers"), 0);
}

#[test]
fn each_reader_expires_alone_and_extends_alone() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "ttl", "short", "150"]);
    int(&mut c, &["LOCK.RWREAD", "ttl", "long", "60000"]);
    int(&mut c, &["LOCK.RWREAD", "ttl", "extended", "150"]);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "ttl", "extended", "60000"]), 1);
    wait_until("short reader expired", || holders(&mut c, "ttl").len() == 2);
    assert_eq!(
        holders(&mut c, "ttl"),
        owners(&[("extended", 1), ("long", 1)])
    );
    assert!(err(&mut c, &["LOCK.RELEASE", "ttl", "short"]).starts_with("NOTOWNER"));
    assert!(
        int(&mut c, &["PTTL", "ttl"]) > 50_000,
        "the key lives as long as its last reader"
    );
}

#[test]
fn the_exclusive_holder_reading_re_enters_its_exclusive_hold() {
    let server = Server::start();
    let mut c = server.client();
    let t = int(&mut c, &["LOCK.ACQUIRE", "ex", "me", "10000"]);
    assert_eq!(int(&mut c, &["LOCK.RWREAD", "ex", "me", "10000"]), t);
    assert_eq!(holders(&mut c, "ex"), owners(&[("me", 2)]));
    assert_eq!(mode(&mut c, "ex"), "write");
    assert!(is_nil(&mut c, &["LOCK.RWREAD", "ex", "other", "10000"]));
}

#[test]
fn a_reader_asking_to_write_gets_deadlock_and_nothing_changes() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "up", "r", "60000"]);
    int(&mut c, &["LOCK.RWREAD", "up", "other", "60000"]);
    let fence = info_int(&mut c, "up", "fence");
    for words in [
        vec!["LOCK.ACQUIRE", "up", "r", "1000"],
        vec!["LOCK.ACQUIRE", "up", "r", "1000", "WAIT", "0"],
        vec!["LOCK.ACQUIRE", "up", "r", "1000", "WAIT", "100"],
    ] {
        assert!(err(&mut c, &words).starts_with("DEADLOCK"), "{words:?}");
    }
    assert_eq!(holders(&mut c, "up"), owners(&[("other", 1), ("r", 1)]));
    assert_eq!(waiting(&mut c, "up"), 0);
    assert_eq!(info_int(&mut c, "up", "fence"), fence);
}

#[test]
fn a_queued_writer_makes_new_readers_queue_but_not_re_entering_ones() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "wp", "r1", "60000"]);
    let writer = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "wp", "w", "60000", "WAIT", "0"],
        1,
    );
    assert!(
        is_nil(&mut c, &["LOCK.RWREAD", "wp", "r2", "60000"]),
        "new reader overtook a queued writer"
    );
    let r2 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "wp", "r2", "60000", "WAIT", "0"],
        2,
    );
    assert_eq!(queue_modes(&mut c, "wp"), vec!["write", "read"]);
    // r1 re-enters although a writer waits: otherwise it would deadlock against it.
    int(&mut c, &["LOCK.RWREAD", "wp", "r1", "60000"]);
    assert_eq!(holders(&mut c, "wp"), owners(&[("r1", 2)]));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "wp", "r1", "ALL"]), 0);
    writer.token();
    assert_eq!(holders(&mut c, "wp"), owners(&[("w", 1)]));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "wp", "w"]), 0);
    r2.token();
    assert_eq!(holders(&mut c, "wp"), owners(&[("r2", 1)]));
}

/// Sets up: writer `w0` holds; queue = r1 r2 r3 w4 r5. Returns the queued requests.
fn writer_then_mixed_queue(server: &Server, c: &mut Connection, key: &str) -> Vec<Waiter> {
    int(c, &["LOCK.ACQUIRE", key, "w0", "60000"]);
    let mut handles = Vec::new();
    for (i, (command, owner)) in [
        ("LOCK.RWREAD", "r1"),
        ("LOCK.RWREAD", "r2"),
        ("LOCK.RWREAD", "r3"),
        ("LOCK.ACQUIRE", "w4"),
        ("LOCK.RWREAD", "r5"),
    ]
    .into_iter()
    .enumerate()
    {
        handles.push(spawn_waiter(
            server,
            c,
            &[command, key, owner, "60000", "WAIT", "0"],
            i as i64 + 1,
        ));
    }
    assert_eq!(
        queue_modes(c, key),
        vec!["read", "read", "read", "write", "read"]
    );
    handles
}

fn assert_reader_run_granted(c: &mut Connection, key: &str, mut handles: Vec<Waiter>) {
    let tail = handles.split_off(3);
    let tokens: Vec<i64> = handles.into_iter().map(Waiter::token).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "reader tokens {tokens:?}"
    );
    assert_eq!(holders(c, key), owners(&[("r1", 1), ("r2", 1), ("r3", 1)]));
    assert_eq!(queue_modes(c, key), vec!["write", "read"]);
    for h in &tail {
        assert!(!h.is_finished());
    }
    for r in ["r1", "r2", "r3"] {
        int(c, &["LOCK.RELEASE", key, r]);
    }
    let mut tail = tail.into_iter();
    tail.next().unwrap().token();
    assert_eq!(holders(c, key), owners(&[("w4", 1)]));
    int(c, &["LOCK.RELEASE", key, "w4"]);
    tail.next().unwrap().token();
    assert_eq!(holders(c, key), owners(&[("r5", 1)]));
}

#[test]
fn a_writer_release_grants_the_run_of_readers_up_to_the_next_writer() {
    let server = Server::start();
    let mut c = server.client();
    let handles = writer_then_mixed_queue(&server, &mut c, "run");
    int(&mut c, &["LOCK.RELEASE", "run", "w0"]);
    assert_reader_run_granted(&mut c, "run", handles);
}

#[test]
fn a_writer_expiry_grants_the_run_of_readers() {
    let server = Server::start();
    let mut c = server.client();
    let handles = writer_then_mixed_queue(&server, &mut c, "exp");
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "exp", "w0", "100"]), 1);
    wait_until("writer expired", || holders(&mut c, "exp").len() == 3);
    assert_reader_run_granted(&mut c, "exp", handles);
}

#[test]
fn a_writer_deleted_with_the_key_grants_the_run_of_readers() {
    let server = Server::start();
    let mut c = server.client();
    let handles = writer_then_mixed_queue(&server, &mut c, "del");
    int(&mut c, &["DEL", "del"]);
    wait_until("readers granted on the fresh lock", || {
        holders(&mut c, "del").len() == 3
    });
    assert_reader_run_granted(&mut c, "del", handles);
}

#[test]
fn a_queued_writer_timing_out_at_the_head_lets_the_readers_behind_it_in() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "to", "r0", "60000"]);
    let writer = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "to", "w", "60000", "WAIT", "300"],
        1,
    );
    let r1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "to", "r1", "60000", "WAIT", "0"],
        2,
    );
    let r2 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "to", "r2", "60000", "WAIT", "0"],
        3,
    );
    assert!(matches!(writer.join(), Ok(Value::Nil)));
    r1.token();
    r2.token();
    assert_eq!(
        holders(&mut c, "to"),
        owners(&[("r0", 1), ("r1", 1), ("r2", 1)])
    );
    assert_eq!(waiting(&mut c, "to"), 0);
}

#[test]
fn a_queued_writer_disconnecting_at_the_head_lets_the_readers_behind_it_in() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "dc", "r0", "60000"]);
    let mut wconn = server.client();
    let wid = client_id(&mut wconn);
    let writer = thread::spawn(move || {
        query(
            &mut wconn,
            &["LOCK.ACQUIRE", "dc", "w", "60000", "WAIT", "0"],
        )
    });
    wait_until("writer queued", || waiting(&mut c, "dc") == 1);
    let r1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "dc", "r1", "60000", "WAIT", "0"],
        2,
    );
    int(&mut c, &["CLIENT", "KILL", "ID", &wid.to_string()]);
    assert!(writer.join().unwrap().is_err());
    r1.token();
    assert_eq!(holders(&mut c, "dc"), owners(&[("r0", 1), ("r1", 1)]));
}

#[test]
fn readers_and_writers_show_in_info_lock() {
    let server = Server::start();
    let mut c = server.client();
    for r in ["a", "b", "c"] {
        int(&mut c, &["LOCK.RWREAD", "i1", r, "60000"]);
    }
    int(&mut c, &["LOCK.ACQUIRE", "i2", "w", "60000"]);
    let w = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "i1", "w2", "60000", "WAIT", "0"],
        1,
    );
    assert_eq!(info_field(&mut c, "readers"), 3);
    assert_eq!(info_field(&mut c, "writers"), 1);
    assert_eq!(info_field(&mut c, "waiters"), 1);
    assert_eq!(info_field(&mut c, "locks_held"), 2);
    for r in ["a", "b", "c"] {
        int(&mut c, &["LOCK.RELEASE", "i1", r]);
    }
    w.token();
    assert_eq!(info_field(&mut c, "readers"), 0);
    assert_eq!(info_field(&mut c, "writers"), 2);
    assert_eq!(info_field(&mut c, "waiters"), 0);
}

#[test]
fn a_renamed_lock_keeps_expiring_its_readers_one_by_one() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "old", "short", "200"]);
    int(&mut c, &["LOCK.RWREAD", "old", "long", "60000"]);
    query(&mut c, &["RENAME", "old", "new"]).unwrap();
    // LOCK.INFO hides a holder whose time has passed; the INFO figures change only when the
    // module's timer really drops it, which needs the timer re-armed under the new name.
    wait_until("short reader dropped under the new name", || {
        info_field(&mut c, "expirations_total") == 1 && info_field(&mut c, "readers") == 1
    });
    assert_eq!(holders(&mut c, "new"), owners(&[("long", 1)]));
    thread::sleep(Duration::from_millis(50));
    assert_eq!(int(&mut c, &["EXISTS", "old"]), 0);
}
