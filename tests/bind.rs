//! BIND: a hold tied to the connection that asked for it ends when that connection closes,
//! whichever way it closes, and its waiters are served at once; an unbound hold is untouched; a
//! restart or a promotion ends bound holds (their connections are gone); replicas follow.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis_lock_testkit::*;

/// A TTL far longer than any test: only the connection can end these holds in time.
const LONG: &str = "600000";

/// The hand-over must be far shorter than the TTL; on a loaded 2-core machine it can still
/// take a scheduler tick or two, so the bound is generous (the figure is printed).
const HAND_OVER_BOUND: Duration = Duration::from_secs(5);

/// A connection that holds `key` bound, as `owner`; returns it with its client id.
fn bound_holder(server: &Server, key: &str, owner: &str) -> (redis::Connection, i64) {
    let mut c = server.client();
    let id = client_id(&mut c);
    int(&mut c, &["LOCK.ACQUIRE", key, owner, LONG, "BIND"]);
    (c, id)
}

/// Queues a waiter on `key`, closes the bound holder's connection with `close`, and returns
/// how long the waiter took to be granted after the close.
fn hand_over_after(
    server: &Server,
    key: &str,
    close: impl FnOnce(&mut redis::Connection),
) -> Duration {
    let mut c = server.client();
    let waiter = spawn_waiter(
        server,
        &mut c,
        &["LOCK.ACQUIRE", key, "heir", LONG, "WAIT", "0"],
        1,
    );
    let start = Instant::now();
    close(&mut c);
    let _ = waiter.token();
    let took = start.elapsed();
    assert_eq!(holders(&mut c, key), vec![("heir".to_string(), 1)]);
    took
}

#[test]
fn closing_a_bound_holders_connection_serves_its_waiter_at_once() {
    let server = Server::start();
    let mut admin = server.client();

    // CLIENT KILL from another connection.
    let (_held, id) = bound_holder(&server, "kill", "h");
    let by_kill = hand_over_after(&server, "kill", |_| {
        int(&mut admin, &["CLIENT", "KILL", "ID", &id.to_string()]);
    });

    // The holder closes its own socket.
    let (held, _) = bound_holder(&server, "close", "h");
    let by_close = hand_over_after(&server, "close", move |_| drop(held));

    // The holder's process is killed: redis-cli sends the acquire from its stdin and stays
    // connected until SIGKILL.
    let mut cli = Command::new("redis-cli")
        .args(["-p", &server.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-cli");
    cli.stdin
        .as_mut()
        .expect("stdin")
        .write_all(format!("LOCK.ACQUIRE process h {LONG} BIND\n").as_bytes())
        .expect("write");
    wait_until("redis-cli holds the lock", || {
        holders(&mut admin, "process") == vec![("h".to_string(), 1)]
    });
    let by_process_kill = hand_over_after(&server, "process", |_| {
        cli.kill().expect("kill redis-cli");
    });
    let _ = cli.wait();

    println!("hand-over: CLIENT KILL {by_kill:?}, socket closed {by_close:?}, process killed {by_process_kill:?}");
    for took in [by_kill, by_close, by_process_kill] {
        assert!(took < HAND_OVER_BOUND, "hand-over took {took:?}");
    }
    assert_eq!(info_field(&mut admin, "disconnects_total"), 3);
}

#[test]
fn an_unbound_hold_outlives_its_connection() {
    let server = Server::start();
    let mut c = server.client();
    let mut holder = server.client();
    int(&mut holder, &["LOCK.ACQUIRE", "k", "plain", LONG]);
    int(&mut holder, &["LOCK.RWREAD", "r", "reader", LONG]);
    let (bound, _) = bound_holder(&server, "other", "b");
    drop(holder);
    drop(bound);
    wait_until("the bound hold ended", || info(&mut c, "other").is_none());
    assert_eq!(holders(&mut c, "k"), vec![("plain".to_string(), 1)]);
    assert_eq!(holders(&mut c, "r"), vec![("reader".to_string(), 1)]);
    assert_eq!(info_field(&mut c, "disconnects_total"), 1);
}

#[test]
fn only_the_bound_connection_matters() {
    let server = Server::start();
    let mut c = server.client();
    // Readers: one bound, one not, on the same key; the bound one's connection also holds an
    // unbound lock elsewhere.
    let mut a = server.client();
    int(&mut a, &["LOCK.RWREAD", "shared", "a", LONG, "BIND"]);
    int(&mut a, &["LOCK.ACQUIRE", "a-unbound", "a", LONG]);
    int(&mut c, &["LOCK.RWREAD", "shared", "c", LONG]);
    // A re-entry from another connection keeps the hold bound to the first one.
    let mut other = server.client();
    int(&mut other, &["LOCK.RWREAD", "shared", "a", LONG, "BIND"]);
    drop(other);
    drop(a);
    wait_until("a's bound read hold ended", || {
        holders(&mut c, "shared") == vec![("c".to_string(), 1)]
    });
    assert_eq!(holders(&mut c, "a-unbound"), vec![("a".to_string(), 1)]);
}

#[test]
fn a_bound_waiter_is_bound_to_its_own_connection() {
    let server = Server::start();
    let mut c = server.client();
    let (holder, _) = bound_holder(&server, "k", "first");
    // The waiter asks with BIND on its own connection, which stays open after the grant.
    let mut waiter_conn = server.client();
    let waiter_id = client_id(&mut waiter_conn);
    let handle = std::thread::spawn(move || {
        let reply = query(
            &mut waiter_conn,
            &["LOCK.ACQUIRE", "k", "second", LONG, "WAIT", "0", "BIND"],
        );
        (reply, waiter_conn)
    });
    wait_until("the waiter is queued", || waiting(&mut c, "k") == 1);
    drop(holder);
    let (reply, waiter_conn) = handle.join().expect("waiter thread");
    assert!(matches!(reply, Ok(redis::Value::Int(_))), "{reply:?}");
    assert_eq!(holders(&mut c, "k"), vec![("second".to_string(), 1)]);
    // The first holder's connection is long gone; the hold is tied to the waiter's.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(holders(&mut c, "k"), vec![("second".to_string(), 1)]);
    int(&mut c, &["CLIENT", "KILL", "ID", &waiter_id.to_string()]);
    wait_until("the granted waiter's bound hold ended", || {
        info(&mut c, "k").is_none()
    });
    drop(waiter_conn);
}

#[test]
fn the_end_of_a_bound_hold_is_notified_and_reaches_replicas() {
    let (master, replica) = master_and_replica(&["--notify-keyspace-events", "Ed"]);
    let mut r = replica.client();
    let mut sub = master.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:lock.*").unwrap();
    pubsub.set_read_timeout(Some(PATIENCE)).unwrap();

    let (mut holder, _) = bound_holder(&master, "k", "h");
    // WAIT counts the replicas that have this connection's writes.
    assert_eq!(int(&mut holder, &["WAIT", "1", "5000"]), 1);
    assert_eq!(holders(&mut r, "k"), vec![("h".to_string(), 1)]);
    drop(holder);
    let names: Vec<String> = next_events(&mut pubsub, 2)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names, ["lock.acquire", "lock.disconnect"]);
    wait_until("the replica dropped the hold", || {
        info(&mut r, "k").is_none()
    });
}

#[test]
fn bound_holds_end_when_the_server_restarts() {
    for persistence in [
        &["--appendonly", "no", "--save", "3600 1"][..],
        &["--appendonly", "yes", "--appendfsync", "always"][..],
    ] {
        let mut server = Server::start_with(persistence);
        let mut c = server.client();
        let (held, _) = bound_holder(&server, "bound", "h");
        int(&mut c, &["LOCK.ACQUIRE", "unbound", "u", LONG]);
        let token = int(&mut c, &["LOCK.ACQUIRE", "fence", "u", LONG]);
        if persistence.contains(&"--save") {
            query(&mut c, &["SAVE"]).unwrap();
        }
        server.crash_and_restart();
        drop(held);
        let mut c = server.client();
        wait_until("the loaded bound hold ended", || {
            info(&mut c, "bound").is_none()
        });
        assert_eq!(
            holders(&mut c, "unbound"),
            vec![("u".to_string(), 1)],
            "{persistence:?}"
        );
        let next = int(&mut c, &["LOCK.ACQUIRE", "bound", "new", LONG]);
        assert!(next > token, "{persistence:?}: {next} after {token}");
    }
}

#[test]
fn a_promoted_replica_ends_the_bound_holds_it_replicated() {
    let (master, replica) = master_and_replica(&[]);
    let mut r = replica.client();
    let mut m = master.client();
    let (_held, _) = bound_holder(&master, "bound", "h");
    int(&mut m, &["LOCK.ACQUIRE", "unbound", "u", LONG]);
    assert_eq!(int(&mut m, &["WAIT", "1", "5000"]), 1);
    // On a replica the hold stays: its connection is on the master, and alive.
    assert_eq!(holders(&mut r, "bound"), vec![("h".to_string(), 1)]);
    master.signal("STOP");
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    wait_until("the promoted replica ended the bound hold", || {
        info(&mut r, "bound").is_none()
    });
    assert_eq!(holders(&mut r, "unbound"), vec![("u".to_string(), 1)]);
    assert!(int(&mut r, &["LOCK.ACQUIRE", "bound", "new", LONG]) > 0);
    master.signal("CONT");
}

#[test]
fn bind_inside_multi_binds_and_inside_a_script_is_refused() {
    let server = Server::start();
    let mut c = server.client();
    let mut tx = server.client();
    let reply: Vec<redis::Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("multi")
        .arg("m")
        .arg(LONG)
        .arg("BIND")
        .query(&mut tx)
        .expect("MULTI/EXEC");
    assert!(matches!(reply[..], [redis::Value::Int(_)]), "{reply:?}");
    drop(tx);
    wait_until("the hold taken in MULTI ended with its connection", || {
        info(&mut c, "multi").is_none()
    });
    let e = err(
        &mut c,
        &[
            "EVAL",
            "return redis.call('LOCK.ACQUIRE', KEYS[1], 'o', '1000', 'BIND')",
            "1",
            "script",
        ],
    );
    assert!(e.contains("BIND is not allowed in scripts"), "{e}");
    assert_eq!(int(&mut c, &["EXISTS", "script"]), 0);
}

#[test]
fn a_bound_hold_follows_its_key_through_rename() {
    let server = Server::start();
    let mut c = server.client();
    let (held, _) = bound_holder(&server, "before", "h");
    query(&mut c, &["RENAME", "before", "after"]).unwrap();
    // Let the rename be settled (the key is indexed under its new name), then close.
    wait_until("the renamed lock is there", || {
        holders(&mut c, "after") == vec![("h".to_string(), 1)]
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(held);
    wait_until("the renamed bound hold ended", || {
        info(&mut c, "after").is_none()
    });
}

#[test]
fn a_raw_socket_that_disconnects_mid_reply_still_ends_its_hold() {
    let server = Server::start();
    let mut c = server.client();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    send_raw(&mut stream, &["LOCK.ACQUIRE", "raw", "r", LONG, "BIND"]).expect("send");
    wait_until("the raw connection holds the lock", || {
        holders(&mut c, "raw") == vec![("r".to_string(), 1)]
    });
    drop(stream);
    wait_until("the raw connection's hold ended", || {
        info(&mut c, "raw").is_none()
    });
}

/// How many bound holds the spread-out close is tested with: enough for many slices of the
/// settle pass, even in a debug build.
const MANY_HOLDS: usize = 20_000;

/// The key of bound hold `i` of the many: in the order they are settled (by name).
fn many_key(i: usize) -> String {
    format!("many:{i:05}")
}

/// Reads `n` one-line replies (integers, nil, status) from `reader`, as their lines.
fn reply_lines(reader: &mut impl std::io::BufRead, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read a reply");
        out.push(line.trim_end().to_string());
    }
    out
}

#[test]
fn a_connection_with_many_bound_holds_ends_them_over_several_turns() {
    let (server, replica) = master_and_replica(&[]);
    let mut c = server.client();
    let mut holder = server.client();
    let holder_id = client_id(&mut holder);
    for start in (0..MANY_HOLDS).step_by(5_000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 5_000).min(MANY_HOLDS) {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(many_key(i))
                .arg("h")
                .arg(LONG)
                .arg("BIND");
        }
        let tokens: Vec<i64> = pipe.query(&mut holder).expect("bound holds");
        assert!(tokens.iter().all(|t| *t > 0));
    }
    // Two waiters each on an early key, a middle one and the second-to-last one; the last key
    // has none.
    let waited = [
        many_key(0),
        many_key(MANY_HOLDS / 2),
        many_key(MANY_HOLDS - 2),
    ];
    let late_free = many_key(MANY_HOLDS - 1);
    let mut queued = Vec::new();
    for key in &waited {
        let first = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", key, "w1", LONG, "WAIT", "0"],
            1,
        );
        let second = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", key, "w2", LONG, "WAIT", "0"],
            2,
        );
        queued.push((key.clone(), first, second));
    }
    assert_eq!(int(&mut c, &["DBSIZE"]), MANY_HOLDS as i64);

    // One stream of commands, written at once: the close, then DBSIZE after DBSIZE, with two
    // newcomers on the last keys in the middle. The server reads a few kB of it per turn of
    // its event loop, so the replies show what each turn left behind.
    const PROBES: usize = 4_000;
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    let mut out = resp(&["CLIENT", "KILL", "ID", &holder_id.to_string()]);
    for _ in 0..PROBES {
        out.extend(resp(&["DBSIZE"]));
    }
    out.extend(resp(&["LOCK.ACQUIRE", &late_free, "newcomer", LONG]));
    out.extend(resp(&["LOCK.ACQUIRE", &waited[2], "newcomer", LONG]));
    for _ in 0..PROBES {
        out.extend(resp(&["DBSIZE"]));
    }
    let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
    let writer = std::thread::spawn(move || stream.write_all(&out));
    let lines = reply_lines(&mut reader, 1 + 2 * PROBES + 2);
    writer.join().expect("writer").expect("write the stream");
    drop(holder);

    assert_eq!(lines[0], ":1", "CLIENT KILL");
    let sizes = |range: std::ops::Range<usize>| -> Vec<i64> {
        lines[range]
            .iter()
            .map(|l| l.trim_start_matches(':').parse().expect("DBSIZE"))
            .collect()
    };
    let before = sizes(1..1 + PROBES);
    let newcomers = &lines[1 + PROBES..3 + PROBES];
    let after = sizes(3 + PROBES..lines.len());
    // Left at the end: the waited keys (the first waiter holds each) and the newcomer's.
    let left = waited.len() as i64 + 1;
    let all: Vec<i64> = before.iter().chain(&after).copied().collect();
    let between = all
        .iter()
        .filter(|&&n| left < n && n < MANY_HOLDS as i64)
        .count();
    println!(
        "{MANY_HOLDS} bound holds: {between} of {} probes saw them partly ended",
        all.len()
    );
    // Some turns of the event loop ran between slices of the work: clients were served while
    // part of the holds had ended (done in one step, a probe sees all or none).
    assert!(
        between > 0,
        "no probe ran during the spread: {:?}",
        &all[..20]
    );
    // The newcomers came while the spread was still going (the probe after them saw holds
    // not yet ended), before the last keys' turn; they found the dead connection's holds
    // ended: the free key granted, the waited key not (its waiters come first).
    assert!(
        after[0] > left,
        "the spread was over before the newcomers: {after:?}"
    );
    assert!(
        newcomers[0].starts_with(':'),
        "newcomer on a free key: {newcomers:?}"
    );
    assert!(
        newcomers[1] == "$-1" || newcomers[1] == "*-1",
        "newcomer on a waited key: {newcomers:?}"
    );

    wait_until("every bound hold ended", || {
        info_field(&mut c, "disconnects_total") == MANY_HOLDS as u64
    });
    assert_eq!(int(&mut c, &["DBSIZE"]), left);
    assert_eq!(
        holders(&mut c, &late_free),
        vec![("newcomer".to_string(), 1)]
    );
    // Each waited key went to its first waiter; the second still waits, and gets it next.
    for (key, first, second) in queued {
        let _ = first.token();
        assert_eq!(holders(&mut c, &key), vec![("w1".to_string(), 1)], "{key}");
        assert_eq!(waiting(&mut c, &key), 1, "{key}");
        int(&mut c, &["LOCK.RELEASE", &key, "w1"]);
        let _ = second.token();
        assert_eq!(holders(&mut c, &key), vec![("w2".to_string(), 1)], "{key}");
    }
    // The replica followed every change.
    let mut r = replica.client();
    wait_until("the replica has the master's keys", || {
        int(&mut r, &["DBSIZE"]) == left
    });
}
