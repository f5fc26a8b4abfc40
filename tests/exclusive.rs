//! Exclusive locks against a real redis-server: FIFO blocking, timeouts, disconnects,
//! expiry hand-over, reentrancy, fencing, MULTI/Lua, bad input, deletion, the panic guard.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_testkit::*;

#[test]
fn grants_follow_arrival_order_for_twelve_queued_clients() {
    let server = Server::start();
    let mut c = server.client();
    let first = int(&mut c, &["LOCK.ACQUIRE", "fifo", "holder", "10000"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 1..=12 {
        let mut w = server.client();
        let order = Arc::clone(&order);
        threads.push(thread::spawn(move || {
            let owner = format!("w{i}");
            let token = int(
                &mut w,
                &["LOCK.ACQUIRE", "fifo", &owner, "10000", "WAIT", "0"],
            );
            order.lock().unwrap().push((i, token));
            assert_eq!(int(&mut w, &["LOCK.RELEASE", "fifo", &owner]), 0);
        }));
        // Queue them one at a time so arrival order is known.
        wait_until("waiter queued", || waiting(&mut c, "fifo") == i);
    }
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "fifo", "holder"]), 0);
    for t in threads {
        t.join().unwrap();
    }
    let order = order.lock().unwrap().clone();
    let ids: Vec<i64> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        ids,
        (1..=12).collect::<Vec<_>>(),
        "grants out of arrival order"
    );
    let tokens: Vec<i64> = order.iter().map(|(_, t)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
    assert!(tokens[0] > first);
    assert!(
        info(&mut c, "fifo").is_none(),
        "key should be gone once free"
    );
}

#[test]
fn wait_timeout_replies_nil_close_to_the_timeout_and_leaves_the_queue() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "t", "holder", "10000"]);
    let before = info_field(&mut c, "timeouts_total");
    let started = Instant::now();
    assert!(is_nil(
        &mut c,
        &["LOCK.ACQUIRE", "t", "late", "1000", "WAIT", "300"]
    ));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(295),
        "returned after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(3000),
        "returned after {waited:?}"
    );
    assert_eq!(waiting(&mut c, "t"), 0);
    assert_eq!(info_field(&mut c, "timeouts_total"), before + 1);
    assert_eq!(holders(&mut c, "t"), vec![("holder".to_string(), 1)]);
}

#[test]
fn wait_zero_blocks_until_the_lock_is_released() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "z", "holder", "60000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "z", "patient", "1000", "WAIT", "0"],
        1,
    );
    thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "WAIT 0 returned while the lock was held"
    );
    int(&mut c, &["LOCK.RELEASE", "z", "holder"]);
    let token = waiter.token();
    assert!(token > 1);
    assert_eq!(holders(&mut c, "z"), vec![("patient".to_string(), 1)]);
}

#[test]
fn a_queued_client_that_disconnects_leaves_and_the_next_is_served() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "d", "holder", "60000"]);

    let mut gone = server.client();
    let gone_id = client_id(&mut gone);
    let gone_thread = thread::spawn(move || {
        query(
            &mut gone,
            &["LOCK.ACQUIRE", "d", "gone", "60000", "WAIT", "0"],
        )
    });
    wait_until("first waiter queued", || waiting(&mut c, "d") == 1);

    let next = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "d", "next", "60000", "WAIT", "0"],
        2,
    );

    int(&mut c, &["CLIENT", "KILL", "ID", &gone_id.to_string()]);
    wait_until("disconnected waiter left the queue", || {
        waiting(&mut c, "d") == 1
    });
    assert!(
        gone_thread.join().unwrap().is_err(),
        "killed client got a reply"
    );

    int(&mut c, &["LOCK.RELEASE", "d", "holder"]);
    next.token();
    assert_eq!(holders(&mut c, "d"), vec![("next".to_string(), 1)]);
}

#[test]
fn a_holder_that_never_releases_hands_over_at_its_ttl() {
    let server = Server::start();
    let mut c = server.client();
    let ttl = 400u64;
    let acquired = Instant::now();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "crash", "crashed", &ttl.to_string()],
    );
    let mut w = server.client();
    let waiter = thread::spawn(move || {
        let token = int(
            &mut w,
            &["LOCK.ACQUIRE", "crash", "heir", "5000", "WAIT", "0"],
        );
        (token, Instant::now())
    });
    let (token, granted) = waiter.join().unwrap();
    let after_ttl = granted
        .duration_since(acquired)
        .saturating_sub(Duration::from_millis(ttl));
    assert!(token >= 2);
    assert!(
        granted.duration_since(acquired) >= Duration::from_millis(ttl - 5),
        "granted before the holder's ttl"
    );
    // Generous bound for a loaded machine; the typical figure is about a millisecond.
    assert!(
        after_ttl < Duration::from_millis(1500),
        "hand-over {after_ttl:?} after the ttl"
    );
    eprintln!("crash hand-over: granted {after_ttl:?} after the holder's ttl");
    assert_eq!(holders(&mut c, "crash"), vec![("heir".to_string(), 1)]);
    assert!(info_field(&mut c, "expirations_total") >= 1);
}

#[test]
fn an_expired_lock_without_waiters_disappears() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "gone", "a", "100"]);
    let pttl = int(&mut c, &["PTTL", "gone"]);
    assert!((1..=100).contains(&pttl), "PTTL {pttl}");
    wait_until("key expired", || int(&mut c, &["EXISTS", "gone"]) == 0);
    assert_eq!(
        err(&mut c, &["LOCK.RELEASE", "gone", "a"])
            .split(' ')
            .next(),
        Some("NOTOWNER")
    );
}

#[test]
fn reentrancy_counts_and_release_replies() {
    let server = Server::start();
    let mut c = server.client();
    let t1 = int(&mut c, &["LOCK.ACQUIRE", "r", "me", "10000"]);
    let t2 = int(&mut c, &["LOCK.ACQUIRE", "r", "me", "10000"]);
    let t3 = int(&mut c, &["LOCK.ACQUIRE", "r", "me", "10000", "WAIT", "100"]);
    assert_eq!(
        (t1, t2),
        (t3, t3),
        "a reentrant grant returns the holding's token"
    );
    assert_eq!(holders(&mut c, "r"), vec![("me".to_string(), 3)]);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "r", "me"]), 2);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "r", "me"]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "r", "me"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "r"]), 0);

    int(&mut c, &["LOCK.ACQUIRE", "r", "me", "10000"]);
    int(&mut c, &["LOCK.ACQUIRE", "r", "me", "10000"]);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "r", "me", "ALL"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "r"]), 0);
}

#[test]
fn reentry_resets_the_expiry_and_extend_sets_it() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "x", "me", "1000"]);
    int(&mut c, &["LOCK.ACQUIRE", "x", "me", "50000"]);
    assert!(int(&mut c, &["PTTL", "x"]) > 40_000);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "x", "me", "90000"]), 1);
    assert!(int(&mut c, &["PTTL", "x"]) > 80_000);
    assert_eq!(holders(&mut c, "x"), vec![("me".to_string(), 2)]);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "x", "me", "200"]), 1);
    wait_until("extended-down lock expired", || {
        int(&mut c, &["EXISTS", "x"]) == 0
    });
}

#[test]
fn not_owner_is_an_error_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.client();
    assert!(err(&mut c, &["LOCK.RELEASE", "n", "nobody"]).starts_with("NOTOWNER"));
    assert!(err(&mut c, &["LOCK.EXTEND", "n", "nobody", "100"]).starts_with("NOTOWNER"));
    assert_eq!(int(&mut c, &["EXISTS", "n"]), 0);
    int(&mut c, &["LOCK.ACQUIRE", "n", "owner", "10000"]);
    let before = holders(&mut c, "n");
    let fence = info_int(&mut c, "n", "fence");
    assert!(err(&mut c, &["LOCK.RELEASE", "n", "other"]).starts_with("NOTOWNER"));
    assert!(err(&mut c, &["LOCK.RELEASE", "n", "other", "ALL"]).starts_with("NOTOWNER"));
    assert!(err(&mut c, &["LOCK.EXTEND", "n", "other", "100"]).starts_with("NOTOWNER"));
    assert_eq!(holders(&mut c, "n"), before);
    assert_eq!(info_int(&mut c, "n", "fence"), fence);
}

#[test]
fn fencing_tokens_increase_across_release_expiry_and_del() {
    let server = Server::start();
    let mut c = server.client();
    let t1 = int(&mut c, &["LOCK.ACQUIRE", "f", "a", "10000"]);
    int(&mut c, &["LOCK.RELEASE", "f", "a"]);
    let t2 = int(&mut c, &["LOCK.ACQUIRE", "f", "b", "50"]);
    wait_until("expiry", || int(&mut c, &["EXISTS", "f"]) == 0);
    let t3 = int(&mut c, &["LOCK.ACQUIRE", "f", "c", "10000"]);
    assert_eq!(info_int(&mut c, "f", "fence"), t3);
    int(&mut c, &["DEL", "f"]);
    let t4 = int(&mut c, &["LOCK.ACQUIRE", "f", "d", "10000"]);
    int(&mut c, &["UNLINK", "f"]);
    let t5 = int(&mut c, &["LOCK.ACQUIRE", "f", "e", "10000"]);
    let tokens = [t1, t2, t3, t4, t5];
    assert!(t1 >= 1);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn multi_and_scripts_never_block() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "m", "holder", "60000"]);

    let started = Instant::now();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("m")
        .arg("tx")
        .arg("1000")
        .arg("WAIT")
        .arg("0")
        .cmd("LOCK.ACQUIRE")
        .arg("free-in-tx")
        .arg("tx")
        .arg("1000")
        .arg("WAIT")
        .arg("0")
        .query(&mut c)
        .unwrap();
    assert_eq!(replies[0], Value::Nil);
    assert!(
        matches!(replies[1], Value::Int(_)),
        "a free lock is granted inside MULTI"
    );

    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'lua', '1000', 'WAIT', '0')";
    assert!(is_nil(&mut c, &["EVAL", script, "1", "m"]));

    let library = "#!lua name=locklib\nredis.register_function('try_lock', function(keys, args) return redis.call('LOCK.ACQUIRE', keys[1], 'fn', '1000', 'WAIT', '0') end)";
    query(&mut c, &["FUNCTION", "LOAD", library]).unwrap();
    assert!(is_nil(&mut c, &["FCALL", "try_lock", "1", "m"]));

    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(waiting(&mut c, "m"), 0);
    assert_eq!(holders(&mut c, "m"), vec![("holder".to_string(), 1)]);
}

#[test]
fn malformed_input_gets_an_error_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "held", "owner", "60000"]);
    query(&mut c, &["SET", "str", "value"]).unwrap();
    let long_owner = "o".repeat(1025);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["LOCK.ACQUIRE"], "wrong number of arguments"),
        (vec!["LOCK.ACQUIRE", "new"], "wrong number of arguments"),
        (
            vec!["LOCK.ACQUIRE", "new", "o"],
            "wrong number of arguments",
        ),
        (vec!["LOCK.ACQUIRE", "new", "o", "0"], "ttl must be"),
        (vec!["LOCK.ACQUIRE", "new", "o", "-1"], "ttl must be"),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "abc"],
            "ttl is not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "1.5"],
            "ttl is not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "18446744073709551616"],
            "ttl is not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "9223372036854775807"],
            "ttl must be",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "140737488355329"],
            "ttl must be",
        ),
        (vec!["LOCK.ACQUIRE", "new", "", "100"], "owner must be"),
        (
            vec!["LOCK.ACQUIRE", "new", &long_owner, "100"],
            "owner must be",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "100", "FOO"],
            "unknown option",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "100", "FOO", "1"],
            "unknown option",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "100", "WAIT"],
            "syntax error",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "100", "WAIT", "-1"],
            "timeout must be",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "100", "WAIT", "x"],
            "timeout is not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "new", "o", "100", "WAIT", "1", "extra"],
            "unknown option",
        ),
        (vec!["LOCK.ACQUIRE", "str", "o", "100"], "WRONGTYPE"),
        (vec!["LOCK.ACQUIRE", "held", "o", "0"], "ttl must be"),
        (vec!["LOCK.RELEASE", "new"], "wrong number of arguments"),
        (
            vec!["LOCK.RELEASE", "held", "owner", "SOME"],
            "unknown option",
        ),
        (
            vec!["LOCK.RELEASE", "held", "owner", "ALL", "x"],
            "syntax error",
        ),
        (vec!["LOCK.RELEASE", "held", ""], "owner must be"),
        (vec!["LOCK.RELEASE", "str", "o"], "WRONGTYPE"),
        (
            vec!["LOCK.EXTEND", "held", "owner"],
            "wrong number of arguments",
        ),
        (vec!["LOCK.EXTEND", "held", "owner", "0"], "ttl must be"),
        (
            vec!["LOCK.EXTEND", "held", "owner", "1", "2"],
            "wrong number of arguments",
        ),
        (vec!["LOCK.EXTEND", "str", "o", "100"], "WRONGTYPE"),
        (vec!["LOCK.INFO"], "wrong number of arguments"),
        (vec!["LOCK.INFO", "a", "b"], "unknown option"),
        (vec!["LOCK.INFO", "a", "COUNT"], "syntax error"),
        (vec!["LOCK.INFO", "str"], "WRONGTYPE"),
        (vec!["GET", "held"], "WRONGTYPE"),
        (vec!["LPUSH", "held", "x"], "WRONGTYPE"),
    ];
    let keys_before: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let held_before = holders(&mut c, "held");
    let pttl_before = int(&mut c, &["PTTL", "held"]);
    for (words, expected) in &cases {
        let e = err(&mut c, words);
        assert!(
            e.contains(expected),
            "{words:?}: got {e:?}, expected {expected:?}"
        );
    }
    let mut keys_after: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let mut keys_before = keys_before;
    keys_before.sort();
    keys_after.sort();
    assert_eq!(keys_after, keys_before, "an error created or removed a key");
    assert_eq!(holders(&mut c, "held"), held_before);
    assert!(int(&mut c, &["PTTL", "held"]) <= pttl_before);
    let value: String = redis::cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(value, "value");
    // Binary-safe owners, including NUL and CRLF, are fine and never echoed in errors.
    let weird = "a\0b\r\nc";
    assert!(matches!(
        query(&mut c, &["LOCK.ACQUIRE", "bin", weird, "1000"]),
        Ok(Value::Int(_))
    ));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "bin", weird]), 0);
    let max_owner = "o".repeat(1024);
    assert!(matches!(
        query(&mut c, &["LOCK.ACQUIRE", "maxo", &max_owner, "1000"]),
        Ok(Value::Int(_))
    ));
    assert_eq!(
        query(&mut c, &["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
}

#[test]
fn deleting_a_lock_serves_its_waiters_in_order() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "del", "holder", "60000"]);
    let first = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "del", "w1", "60000", "WAIT", "0"],
        1,
    );
    let mut w2 = server.client();
    let second = thread::spawn(move || {
        let t = int(
            &mut w2,
            &["LOCK.ACQUIRE", "del", "w2", "60000", "WAIT", "0"],
        );
        (t, w2)
    });
    wait_until("w2 queued", || waiting(&mut c, "del") == 2);

    assert_eq!(int(&mut c, &["DEL", "del"]), 1);
    let t1 = first.token();
    assert!(t1 > 1);
    wait_until("w2 still queued behind w1", || waiting(&mut c, "del") == 1);
    assert_eq!(holders(&mut c, "del"), vec![("w1".to_string(), 1)]);
    assert!(!second.is_finished());
    int(&mut c, &["LOCK.RELEASE", "del", "w1"]);
    let (t2, _) = second.join().unwrap();
    assert!(t2 > t1);
}

#[test]
fn overwriting_a_lock_with_another_type_gives_waiters_wrongtype() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "ow", "holder", "60000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "ow", "w", "60000", "WAIT", "0"],
        1,
    );
    query(&mut c, &["SET", "ow", "plain"]).unwrap();
    let reply = waiter.join();
    let e = reply.expect_err("waiter should get an error");
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e:?}");
}

#[test]
fn flushall_serves_waiters_on_a_fresh_lock() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "fl", "holder", "60000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "fl", "w", "60000", "WAIT", "0"],
        1,
    );
    query(&mut c, &["FLUSHALL"]).unwrap();
    assert!(waiter.token() > 1);
    assert_eq!(holders(&mut c, "fl"), vec![("w".to_string(), 1)]);
}

#[test]
fn a_panic_becomes_an_error_reply_and_the_server_keeps_answering() {
    let mut server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "p", "me", "60000"]);
    let e = err(&mut c, &["LOCK.DEBUG-PANIC"]);
    assert!(e.contains("internal error"), "{e}");
    assert_eq!(
        query(&mut c, &["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    assert!(server.alive());
    assert_eq!(holders(&mut c, "p"), vec![("me".to_string(), 1)]);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "p", "me"]), 0);
}

#[test]
fn commands_declare_their_key_and_arity() {
    let server = Server::start();
    let mut c = server.client();
    for (command, args) in [
        ("LOCK.ACQUIRE", vec!["k1", "o", "10"]),
        ("LOCK.RWREAD", vec!["k1", "o", "10"]),
        ("LOCK.RELEASE", vec!["k1", "o"]),
        ("LOCK.EXTEND", vec!["k1", "o", "10"]),
        ("LOCK.INFO", vec!["k1"]),
    ] {
        let mut words = vec!["COMMAND", "GETKEYS", command];
        words.extend(args);
        let keys: Vec<String> = cmd(&words).query(&mut c).unwrap();
        assert_eq!(keys, vec!["k1".to_string()], "{command}");
    }
}

#[test]
fn a_waiter_killed_between_its_grant_and_its_reply_never_holds_the_lock() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "g", "holder", "60000"]);
    let mut doomed = server.client();
    let doomed_id = client_id(&mut doomed);
    let doomed_thread = thread::spawn(move || {
        query(
            &mut doomed,
            &["LOCK.ACQUIRE", "g", "doomed", "60000", "WAIT", "0"],
        )
    });
    wait_until("doomed queued", || waiting(&mut c, "g") == 1);
    let next = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "g", "next", "60000", "WAIT", "0"],
        2,
    );

    // One write, so Redis runs all three before replying to anyone: the RELEASE grants the
    // lock to "doomed", whose connection is then killed before its reply could be sent.
    let replies: (i64, i64, Value) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg("g")
        .arg("holder")
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(doomed_id)
        .cmd("LOCK.INFO")
        .arg("g")
        .query(&mut c)
        .unwrap();
    assert_eq!((replies.0, replies.1), (0, 1));
    assert!(
        doomed_thread.join().unwrap().is_err(),
        "the killed client got a reply"
    );
    next.token();
    assert_eq!(holders(&mut c, "g"), vec![("next".to_string(), 1)]);
}

#[test]
fn a_grant_is_visible_to_a_command_pipelined_after_the_release() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "vis", "holder", "60000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "vis", "heir", "60000", "WAIT", "0"],
        1,
    );
    let (released, after): (i64, Value) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg("vis")
        .arg("holder")
        .cmd("LOCK.INFO")
        .arg("vis")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 0);
    let text = format!("{after:?}");
    assert!(
        text.contains("heir"),
        "LOCK.INFO right after RELEASE: {text}"
    );
    waiter.token();
}

/// Redis 7.0 checks blocked clients' timeouts before it runs the module's pending unblocks, and
/// for a client the module already unblocked it calls the disconnect callback instead of the
/// timeout one. A waiter granted in the same event-loop iteration in which its WAIT deadline
/// passed must still get its reply (and keep the lock), not hang.
#[test]
fn a_grant_racing_the_waiters_own_timeout_still_gets_its_reply() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    for round in 0..5 {
        let key = format!("race{round}");
        int(&mut c, &["LOCK.ACQUIRE", &key, "holder", "60000"]);
        let mut w = server.client();
        w.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let k = key.clone();
        let waiter = thread::spawn(move || {
            query(&mut w, &["LOCK.ACQUIRE", &k, "heir", "60000", "WAIT", "50"])
        });
        wait_until("queued", || waiting(&mut c, &key) == 1);
        // One write: the deadline passes during the sleep, then the release grants the waiter
        // before Redis gets to its timeout check.
        let _: (Value, i64) = redis::pipe()
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.1")
            .cmd("LOCK.RELEASE")
            .arg(&key)
            .arg("holder")
            .query(&mut c)
            .unwrap();
        match waiter.join().unwrap() {
            Ok(Value::Int(t)) => {
                assert!(t > 0);
                // It was told it holds the lock: it must really hold it, even after the
                // module's check of whether the client was still there.
                thread::sleep(Duration::from_millis(50));
                assert_eq!(
                    holders(&mut c, &key),
                    vec![("heir".to_string(), 1)],
                    "round {round}"
                );
            }
            Ok(Value::Nil) => assert!(holders(&mut c, &key).is_empty(), "round {round}"),
            other => panic!("round {round}: the waiter got {other:?}"),
        }
    }
}

/// A request that arrives after the holder's TTL passed but before the module's expiry timer
/// ran opens the key, which the server then expires on that very lookup: the queued waiter
/// comes first all the same. `DEBUG SLEEP` and the request are pipelined on one connection, so
/// the server runs the request right after the sleep, with no turn of the event loop (where the
/// timer would run) in between. Before the fix the request was granted ahead of the waiter.
#[test]
fn a_request_that_finds_the_key_expired_on_its_own_lookup_queues_behind_the_waiters() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    for round in 0..3 {
        let key = format!("lazy:{round}");
        int(&mut c, &["LOCK.ACQUIRE", &key, "holder", "100"]);
        let waiter = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", &key, "first", "600000", "WAIT", "0"],
            1,
        );
        let (slept, late): (Value, Value) = redis::pipe()
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.3")
            .cmd("LOCK.ACQUIRE")
            .arg(&key)
            .arg("late")
            .arg("600000")
            .query(&mut c)
            .expect("pipeline");
        assert_eq!(slept, Value::Okay);
        assert_eq!(
            late,
            Value::Nil,
            "round {round}: the late request was granted first"
        );
        assert!(waiter.token() > 0);
        assert_eq!(holders(&mut c, &key), vec![("first".to_string(), 1)]);
    }
}

/// Redis answers a blocked client's timeout only when its event loop wakes, which with nothing
/// else to do is at its next cron tick (a second apart at hz 1); the module wakes it at each
/// waiter's deadline. Waiters 400 ms apart: with a tick a second apart, at least one of two of
/// them would be 400 ms late or more.
#[test]
fn wait_timeouts_end_on_time_whatever_hz_is() {
    let server = Server::start_with(&["--hz", "1"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "ontime", "holder", "600000"]);
    let timeouts = [300u64, 700, 1100, 1500];
    let conns: Vec<_> = timeouts.iter().map(|_| server.client()).collect();
    let handles: Vec<_> = timeouts
        .iter()
        .zip(conns)
        .enumerate()
        .map(|(i, (&timeout, mut conn))| {
            thread::spawn(move || {
                let owner = format!("w{i}");
                let wait = timeout.to_string();
                let started = Instant::now();
                let reply = query(
                    &mut conn,
                    &["LOCK.ACQUIRE", "ontime", &owner, "600000", "WAIT", &wait],
                );
                (timeout, reply, started.elapsed())
            })
        })
        .collect();
    // Nothing else is sent until every reply is in: no other traffic wakes the server.
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("waiter thread"))
        .collect();
    let bound = scaled(Duration::from_millis(50));
    for (timeout, reply, took) in &results {
        println!("WAIT {timeout}: nil after {took:?}");
        assert!(matches!(reply, Ok(Value::Nil)), "WAIT {timeout}: {reply:?}");
        let deadline = Duration::from_millis(*timeout);
        assert!(
            *took + CLOCK_MARGIN >= deadline,
            "WAIT {timeout} ended early: {took:?}"
        );
        assert!(
            *took < deadline + bound,
            "WAIT {timeout}: nil {:?} after the deadline (bound {bound:?})",
            took.saturating_sub(deadline)
        );
    }
    assert_eq!(waiting(&mut c, "ontime"), 0);
    assert_eq!(info_field(&mut c, "timeouts_total"), timeouts.len() as u64);
}
