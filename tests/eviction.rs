//! Eviction (SPEC "Added in version 3"): the server may evict lock keys when `maxmemory` is set
//! and `maxmemory-policy` is not `noeviction`. The module warns in the log, says so in
//! `INFO lock` (`evictable`), counts (`evicted_total`) and notifies (`lock.evicted`) every
//! evicted lock key and serves its waiters as after DEL, and can refuse new holds
//! (`lock.refuse-when-evictable`). Also: LOCK.INFO during a client pause, when a lock's TTL has
//! passed but its hand-over waits for the pause to end.
//!
//! Memory is never asserted tightly: `maxmemory` is set a little above what the server uses,
//! then keys are written until evictions (or -OOM) are seen, with a generous bound.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use redis_lock_testkit::*;

const LONG: &str = "600000";

/// A log file for one server of this test (the harness discards the server's output).
fn log_path(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "redis-lock-eviction-{}-{name}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn log_text(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The part of the module's warning every test looks for.
const WARNING: &str = "may evict lock keys";

fn warnings_in(path: &PathBuf) -> usize {
    log_text(path).matches(WARNING).count()
}

fn config_set(c: &mut Connection, name: &str, value: &str) {
    query(c, &["CONFIG", "SET", name, value])
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e:?}"));
}

fn used_memory_now(c: &mut Connection) -> u64 {
    info_u64(c, "memory", "used_memory")
}

/// Writes 1 KB string values in pipelined batches until `done` holds (checked after each
/// batch), failing after `max_keys` keys.
fn fill_until(c: &mut Connection, max_keys: usize, mut done: impl FnMut(&mut Connection) -> bool) {
    let payload = "x".repeat(1024);
    let mut written = 0;
    while written < max_keys {
        let mut pipe = redis::pipe();
        for i in written..written + 200 {
            pipe.cmd("SET")
                .arg(format!("fill:{i}"))
                .arg(&payload)
                .ignore();
        }
        // Under noeviction the batch ends in -OOM errors: expected there, and harmless here.
        let _: redis::RedisResult<()> = pipe.query(c);
        written += 200;
        if done(c) {
            return;
        }
    }
    panic!("condition not reached after writing {max_keys} keys");
}

#[test]
fn the_warning_is_logged_at_load_when_the_settings_can_evict() {
    let log = log_path("load-lru");
    let logfile = log.to_string_lossy().to_string();
    let server = Server::start_with(&[
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--logfile",
        &logfile,
    ]);
    let mut c = server.client();
    wait_until("the warning at load", || warnings_in(&log) == 1);
    // It names the way out.
    assert!(log_text(&log).contains("noeviction"), "{}", log_text(&log));
    assert_eq!(info_field(&mut c, "evictable"), 1);

    // noeviction (the default) and maxmemory 0 with an evicting policy: no warning.
    for (name, args) in [
        ("load-noeviction", ["--maxmemory", "100mb"]),
        ("load-unlimited", ["--maxmemory-policy", "allkeys-lru"]),
    ] {
        let log = log_path(name);
        let logfile = log.to_string_lossy().to_string();
        let mut all = args.to_vec();
        all.extend(["--logfile", &logfile]);
        let server = Server::start_with(&all);
        let mut c = server.client();
        assert_eq!(info_field(&mut c, "evictable"), 0, "{args:?}");
        // The module has loaded (it answers), so its load-time check has run.
        assert!(log_text(&log).contains("Module 'lock' loaded"), "{name}");
        assert_eq!(warnings_in(&log), 0, "{args:?}: {}", log_text(&log));
    }
}

#[test]
fn the_warning_is_logged_when_config_set_makes_eviction_possible() {
    let log = log_path("config-set");
    let logfile = log.to_string_lossy().to_string();
    let server = Server::start_with(&["--logfile", &logfile]);
    let mut c = server.client();
    config_set(&mut c, "maxmemory", "100mb");
    // Still noeviction: nothing to warn about.
    config_set(&mut c, "maxmemory-policy", "noeviction");
    assert_eq!(warnings_in(&log), 0, "{}", log_text(&log));
    // volatile-* evicts lock keys too: every held lock key has a TTL.
    config_set(&mut c, "maxmemory-policy", "volatile-ttl");
    wait_until("a warning after CONFIG SET maxmemory-policy", || {
        warnings_in(&log) == 1
    });
    // Lifting the limit: no new warning (and a notice that locks are safe again).
    config_set(&mut c, "maxmemory", "0");
    config_set(&mut c, "maxmemory", "50mb");
    wait_until("a warning after CONFIG SET maxmemory", || {
        warnings_in(&log) == 2
    });
    assert!(
        log_text(&log).contains("can no longer evict lock keys"),
        "{}",
        log_text(&log)
    );
    // Changing the limit while the server can evict already does not warn again.
    config_set(&mut c, "maxmemory", "60mb");
    // Unrelated settings do not warn again.
    config_set(&mut c, "maxmemory-samples", "7");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(warnings_in(&log), 2, "{}", log_text(&log));
}

#[test]
fn info_says_whether_the_settings_can_evict_locks() {
    let server = Server::start();
    let mut c = server.client();
    assert_eq!(info_field(&mut c, "evictable"), 0, "defaults");
    config_set(&mut c, "maxmemory", "100mb");
    for (policy, evictable) in [
        ("noeviction", 0),
        ("allkeys-lru", 1),
        ("volatile-ttl", 1),
        ("volatile-lru", 1),
        ("allkeys-random", 1),
        ("noeviction", 0),
        ("allkeys-lfu", 1),
    ] {
        config_set(&mut c, "maxmemory-policy", policy);
        assert_eq!(info_field(&mut c, "evictable"), evictable, "{policy}");
    }
    // An evicting policy without a limit evicts nothing.
    config_set(&mut c, "maxmemory", "0");
    assert_eq!(info_field(&mut c, "evictable"), 0, "maxmemory 0");
    assert_eq!(info_field(&mut c, "evicted_total"), 0);
}

/// Holds `n` locks `lock:0..n` with a long TTL; returns their tokens.
fn hold_locks(c: &mut Connection, n: usize) -> Vec<i64> {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("lock:{i}"))
            .arg(format!("holder{i}"))
            .arg(LONG);
    }
    pipe.query(c).expect("acquire")
}

/// Evicts lock keys under `policy` and checks what the module makes of it.
fn evicted_locks_are_counted_notified_and_their_waiters_served(policy: &str) {
    let server = Server::start();
    let mut c = server.client();
    config_set(&mut c, "notify-keyspace-events", "KEed");
    let tokens = hold_locks(&mut c, 200);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "lock:0", "waiter", LONG, "WAIT", "0"],
        1,
    );
    // What happens to the waited-on key, in order; and every lock.evicted anywhere.
    let mut sub_conn = server.client();
    sub_conn
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut pubsub = sub_conn.as_pubsub();
    pubsub.subscribe("__keyspace@0__:lock:0").unwrap();
    pubsub.subscribe("__keyevent@0__:lock.evicted").unwrap();

    // A limit a little above what the server uses now; then fill until the waiter is served.
    let limit = used_memory_now(&mut c) + 2 * 1024 * 1024;
    config_set(&mut c, "maxmemory", &limit.to_string());
    config_set(&mut c, "maxmemory-policy", policy);
    fill_until(&mut c, 400_000, |c| {
        waiter.is_finished() && info_field(c, "evicted_total") > 0
    });
    // Stop evicting, so the figures hold still.
    config_set(&mut c, "maxmemory", "0");

    let token = waiter.token();
    assert!(
        token > tokens[0],
        "the waiter's grant {token} follows the holder's {}",
        tokens[0]
    );
    let evicted = info_field(&mut c, "evicted_total");
    assert!(evicted >= 1);

    let mut on_key = Vec::new();
    let mut notified = 0u64;
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let Ok(msg) = pubsub.get_message() else {
            break; // quiet for 500 ms: every event has arrived
        };
        let channel = msg.get_channel_name().to_string();
        let payload: String = msg.get_payload().unwrap();
        if channel == "__keyspace@0__:lock:0" {
            on_key.push(payload);
        } else {
            notified += 1;
        }
    }
    // Every evicted lock key was notified, once.
    assert_eq!(notified, evicted, "lock.evicted events vs evicted_total");
    // The waited-on key: the server's eviction, the module's notification, then the grant.
    let pos = |name: &str| on_key.iter().position(|e| e == name);
    let (Some(ev), Some(lev), Some(acq)) =
        (pos("evicted"), pos("lock.evicted"), pos("lock.acquire"))
    else {
        panic!("events on lock:0: {on_key:?}");
    };
    assert!(ev < lev && lev < acq, "events on lock:0: {on_key:?}");
    assert!(server_alive(&mut c));
}

fn server_alive(c: &mut Connection) -> bool {
    matches!(
        query(c, &["PING"]),
        Ok(Value::Okay) | Ok(Value::SimpleString(_))
    )
}

#[test]
fn evicted_locks_are_counted_notified_and_their_waiters_served_under_allkeys_lru() {
    evicted_locks_are_counted_notified_and_their_waiters_served("allkeys-lru");
}

#[test]
fn evicted_locks_are_counted_notified_and_their_waiters_served_under_volatile_ttl() {
    evicted_locks_are_counted_notified_and_their_waiters_served("volatile-ttl");
}

#[test]
fn a_pending_lock_delay_evicted_is_counted_and_a_deleted_lock_is_not() {
    let server = Server::start();
    let mut c = server.client();
    config_set(&mut c, "notify-keyspace-events", "Ed");
    hold_locks(&mut c, 2);
    // A hold whose lease ran out, leaving its lock-delay pending: nobody holds it, yet the key
    // keeps the lock from being granted until the delay ends.
    int(
        &mut c,
        &["LOCK.ACQUIRE", "delayed", "o", "50", "LOCKDELAY", LONG],
    );
    wait_until("the hold expires, the delay runs", || {
        info(&mut c, "delayed").is_some_and(|m| value_text(&m["mode"]) == "free")
    });
    int(&mut c, &["DEL", "lock:0"]);
    // A string of the same name, evicted later, was never a lock.
    query(&mut c, &["SET", "lock:0", "x"]).unwrap();
    let mut sub_conn = server.client();
    sub_conn
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut pubsub = sub_conn.as_pubsub();
    pubsub.subscribe("__keyevent@0__:lock.evicted").unwrap();

    let limit = used_memory_now(&mut c) + 1024 * 1024;
    config_set(&mut c, "maxmemory", &limit.to_string());
    config_set(&mut c, "maxmemory-policy", "allkeys-random");
    fill_until(&mut c, 400_000, |c| {
        matches!(
            query(c, &["EXISTS", "lock:0", "lock:1", "delayed"]),
            Ok(Value::Int(0))
        )
    });
    config_set(&mut c, "maxmemory", "0");
    // All three were evicted; lock:1 (held) and delayed (a pending delay) were locks then.
    assert_eq!(info_field(&mut c, "evicted_total"), 2);
    let mut keys: Vec<String> = (0..2)
        .map(|_| {
            pubsub
                .get_message()
                .expect("lock.evicted")
                .get_payload()
                .unwrap()
        })
        .collect();
    keys.sort();
    assert_eq!(keys, ["delayed", "lock:1"]);
    assert!(pubsub.get_message().is_err(), "no other lock.evicted");
}

#[test]
fn noeviction_keeps_every_lock_and_answers_oom() {
    let server = Server::start();
    let mut c = server.client();
    let tokens = hold_locks(&mut c, 200);
    let limit = used_memory_now(&mut c) + 2 * 1024 * 1024;
    config_set(&mut c, "maxmemory", &limit.to_string());
    config_set(&mut c, "maxmemory-policy", "noeviction");
    // The probe is larger than a batch of writes: a batch refused for its own arguments'
    // size (about 200 KB) must not leave a smaller probe passing at the edge for ever.
    fill_until(&mut c, 400_000, |c| {
        match query(c, &["SET", "probe", &"y".repeat(256 * 1024)]) {
            Err(e) => e.code() == Some("OOM"),
            Ok(_) => false,
        }
    });
    // Full, and firmly so: the server counts the command's own arguments (and, with libc
    // malloc as in Valkey 9 wheels, its reply buffers) in the memory it checks before each
    // command, so at the very edge a small command can pass where a 1 KB SET was just refused
    // (Redis 7.0 does this too). A limit below what is used leaves no edge.
    let used = used_memory_now(&mut c);
    config_set(&mut c, "maxmemory", &(used - used / 8).to_string());
    assert_eq!(info_field(&mut c, "locks_held"), 200);
    assert_eq!(info_field(&mut c, "evicted_total"), 0);
    assert_eq!(info_field(&mut c, "evictable"), 0);
    for i in [0usize, 99, 199] {
        let key = format!("lock:{i}");
        assert_eq!(info_int(&mut c, &key, "fence"), tokens[i], "{key}");
    }
    // A new lock is refused like any write (the commands are deny-oom), waiting or not, of
    // every kind; releasing works.
    for words in [
        &["LOCK.ACQUIRE", "new", "o", LONG][..],
        &["LOCK.ACQUIRE", "new", "o", LONG, "WAIT", "100"],
        &["LOCK.RWREAD", "new", "o", LONG],
        &["LOCK.SEMACQUIRE", "new", "o", "2", LONG],
    ] {
        assert!(err(&mut c, words).starts_with("OOM"), "{words:?}");
    }
    assert_eq!(int(&mut c, &["EXISTS", "new"]), 0);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "lock:0", "holder0"]), 0);
    assert_eq!(info_field(&mut c, "locks_held"), 199);
}

#[test]
fn the_refusal_option_refuses_new_holds_while_the_server_can_evict() {
    let server = Server::start();
    let mut c = server.client();
    let get = |c: &mut Connection| -> Vec<String> {
        value_texts(&query(c, &["CONFIG", "GET", "lock.refuse-when-evictable"]).unwrap())
    };
    assert_eq!(
        get(&mut c),
        ["lock.refuse-when-evictable", "no"],
        "off by default"
    );
    // Bad values are refused and change nothing.
    assert!(query(
        &mut c,
        &["CONFIG", "SET", "lock.refuse-when-evictable", "maybe"]
    )
    .is_err());
    assert_eq!(get(&mut c)[1], "no");

    config_set(&mut c, "lock.refuse-when-evictable", "yes");
    assert_eq!(get(&mut c)[1], "yes");
    // The server cannot evict yet: holds are granted.
    let token = int(&mut c, &["LOCK.ACQUIRE", "held", "a", LONG]);
    int(&mut c, &["LOCK.SEMACQUIRE", "sem", "a", "2", LONG]);

    config_set(&mut c, "maxmemory", "100mb");
    config_set(&mut c, "maxmemory-policy", "allkeys-lru");
    let refused: [&[&str]; 5] = [
        &["LOCK.ACQUIRE", "new", "b", LONG],
        &["LOCK.ACQUIRE", "held", "a", LONG, "WAIT", "0"],
        &["LOCK.RWREAD", "new", "b", LONG, "WAIT", "100"],
        &["LOCK.SEMACQUIRE", "sem", "b", "2", LONG],
        &["LOCK.SEMACQUIRE", "sem2", "b", "2", LONG],
    ];
    for words in refused {
        let e = err(&mut c, words);
        assert!(
            e.starts_with("ERR")
                && e.contains("lock.refuse-when-evictable")
                && e.contains("noeviction"),
            "{words:?}: {e}"
        );
    }
    // Nothing changed: no key was created, the held lock kept its one hold.
    assert!(is_nil(&mut c, &["LOCK.INFO", "new"]));
    assert!(is_nil(&mut c, &["LOCK.INFO", "sem2"]));
    assert_eq!(holders(&mut c, "held"), [("a".to_string(), 1)]);
    assert_eq!(info_int(&mut c, "held", "fence"), token);
    assert_eq!(holders(&mut c, "sem"), [("a".to_string(), 1)]);
    // A bad request still gets its own error first.
    assert!(err(&mut c, &["LOCK.ACQUIRE", "new", "b", "0"]).contains("ttl"));
    // RELEASE, EXTEND and INFO keep working.
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "held", "a", LONG]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "held", "a"]), 0);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "sem", "a"]), 0);
    assert!(is_nil(&mut c, &["LOCK.INFO", "held"]));

    // Back to a safe policy: granted again. And with the option off, never refused.
    config_set(&mut c, "maxmemory-policy", "noeviction");
    int(&mut c, &["LOCK.ACQUIRE", "new", "b", LONG]);
    config_set(&mut c, "maxmemory-policy", "volatile-lru");
    config_set(&mut c, "lock.refuse-when-evictable", "no");
    int(&mut c, &["LOCK.RWREAD", "read", "b", LONG]);
}

#[test]
fn the_refusal_option_can_be_set_in_the_config_file() {
    let server = Server::start_with(&[
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--lock.refuse-when-evictable",
        "yes",
    ]);
    let mut c = server.client();
    let e = err(&mut c, &["LOCK.ACQUIRE", "k", "o", LONG]);
    assert!(e.contains("lock.refuse-when-evictable"), "{e}");
}

#[test]
fn lock_info_shows_the_waiters_while_a_pause_holds_back_the_hand_over() {
    lock_info_shows_the_waiters_while_a_pause_holds_back_the_hand_over_with(&[]);
}

#[test]
fn lock_info_shows_the_waiters_while_a_pause_holds_back_the_hand_over_with_aof() {
    lock_info_shows_the_waiters_while_a_pause_holds_back_the_hand_over_with(&[
        "--appendonly",
        "yes",
    ]);
}

fn lock_info_shows_the_waiters_while_a_pause_holds_back_the_hand_over_with(args: &[&str]) {
    let server = Server::start_with(args);
    let mut c = server.client();
    let token = int(&mut c, &["LOCK.ACQUIRE", "k", "holder", "300"]);
    // Another lock that nobody waits for.
    int(&mut c, &["LOCK.ACQUIRE", "alone", "holder", "300"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", "0"],
        1,
    );
    query(&mut c, &["CLIENT", "PAUSE", "30000", "WRITE"]).unwrap();
    // Well past the holders' TTL: the keys read as absent, but the server keeps them and
    // nobody may be granted until the pause ends.
    thread::sleep(Duration::from_millis(600));
    // With nobody queued, an expired lock is gone, as any expired key is.
    assert!(is_nil(&mut c, &["LOCK.INFO", "alone"]));
    assert!(is_nil(&mut c, &["LOCK.INFO", "never"]));
    assert!(!waiter.is_finished(), "no hand-over during the pause");
    let map = info(&mut c, "k").expect("LOCK.INFO shows the queued waiter, not nil");
    assert_eq!(value_text(&map["mode"]), "free");
    assert_eq!(map["fence"], Value::Int(token));
    assert_eq!(map["holders"], Value::Array(vec![]));
    assert_eq!(map["waiting"], Value::Int(1));
    assert_eq!(value_texts(&map["queue"]), ["write"]);
    assert_eq!(map["delay"], Value::Int(0));
    let Value::Array(waiters) = &map["waiters"] else {
        panic!("waiters: {map:?}");
    };
    let [Value::Array(first)] = &waiters[..] else {
        panic!("waiters: {waiters:?}");
    };
    assert_eq!(value_text(&first[0]), "w");
    assert!(!waiter.is_finished(), "still no hand-over");

    query(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
    let granted = waiter.token();
    assert!(granted > token);
    assert_eq!(holders(&mut c, "k"), [("w".to_string(), 1)]);
}

#[test]
fn a_bound_hold_whose_connection_closes_during_a_pause_is_handed_over_after_it() {
    a_bound_hold_whose_connection_closes_during_a_pause_is_handed_over_after_it_with(&[]);
}

#[test]
fn a_bound_hold_whose_connection_closes_during_a_pause_is_handed_over_after_it_with_aof() {
    a_bound_hold_whose_connection_closes_during_a_pause_is_handed_over_after_it_with(&[
        "--appendonly",
        "yes",
    ]);
}

fn a_bound_hold_whose_connection_closes_during_a_pause_is_handed_over_after_it_with(args: &[&str]) {
    let server = Server::start_with(args);
    let mut c = server.client();
    let mut holder = server.client();
    let token = int(&mut holder, &["LOCK.ACQUIRE", "k", "h", "300", "BIND"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", "0"],
        1,
    );
    query(&mut c, &["CLIENT", "PAUSE", "30000", "WRITE"]).unwrap();
    thread::sleep(Duration::from_millis(600));
    // The hold's TTL has passed; now its connection closes too. (This used to make the module
    // re-create the key the server still kept: an assertion failure killed the server.)
    let holder_id = format!("id={} ", client_id(&mut holder));
    drop(holder);
    wait_until("the holder's connection closed", || {
        let list = query(&mut c, &["CLIENT", "LIST"]).map(|v| value_text(&v));
        list.is_ok_and(|l| !l.lines().any(|line| line.starts_with(&holder_id)))
    });
    assert!(server_alive(&mut c), "the server survives");
    assert!(!waiter.is_finished(), "no hand-over during the pause");
    assert_eq!(
        info(&mut c, "k").expect("waiter shown")["waiting"],
        Value::Int(1)
    );
    query(&mut c, &["CLIENT", "UNPAUSE"]).unwrap();
    assert!(waiter.token() > token);
}

#[test]
fn a_replica_that_ignores_maxmemory_warns_when_it_is_promoted() {
    let memory = ["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"];
    let master = Server::start_with(&memory);
    let log = log_path("replica");
    let logfile = log.to_string_lossy().to_string();
    let port = master.port.to_string();
    let mut args = memory.to_vec();
    args.extend(["--logfile", &logfile, "--replicaof", "127.0.0.1", &port]);
    let replica = Server::start_with(&args);
    let mut r = replica.client();
    wait_for_link(&mut r);
    // replica-ignore-maxmemory yes (the default): the replica evicts nothing on its own.
    assert_eq!(info_field(&mut r, "evictable"), 0);
    assert_eq!(warnings_in(&log), 0, "{}", log_text(&log));
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    wait_until("a warning on promotion", || warnings_in(&log) == 1);
    assert_eq!(info_field(&mut r, "evictable"), 1);
}

#[test]
fn a_replica_warns_when_config_set_makes_it_apply_maxmemory() {
    let memory = ["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"];
    let master = Server::start_with(&memory);
    let log = log_path("replica-ignore");
    let logfile = log.to_string_lossy().to_string();
    let port = master.port.to_string();
    let mut args = memory.to_vec();
    args.extend(["--logfile", &logfile, "--replicaof", "127.0.0.1", &port]);
    let replica = Server::start_with(&args);
    let mut r = replica.client();
    wait_for_link(&mut r);
    assert_eq!(warnings_in(&log), 0, "{}", log_text(&log));
    config_set(&mut r, "replica-ignore-maxmemory", "no");
    wait_until("a warning once the replica applies maxmemory", || {
        warnings_in(&log) == 1
    });
}

/// A lock key that Redis expired, whose name then holds a string that is evicted: not a lock's
/// eviction.
#[test]
fn a_string_evicted_under_the_name_of_an_expired_lock_is_not_counted() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", "100"]);
    thread::sleep(Duration::from_millis(300));
    // Redis expires the key when it is read.
    assert!(matches!(query(&mut c, &["GET", "k"]), Ok(Value::Nil)));
    query(&mut c, &["SET", "k", "a plain string"]).unwrap();
    config_set(&mut c, "maxmemory-policy", "allkeys-random");
    config_set(&mut c, "maxmemory", "1");
    wait_until("the string evicted", || int(&mut c, &["EXISTS", "k"]) == 0);
    config_set(&mut c, "maxmemory", "0");
    assert_eq!(info_field(&mut c, "evicted_total"), 0);
}

/// A lock whose holders had all expired, evicted before Redis removed it by expiry, is counted
/// once: as an expiration.
#[test]
fn an_evicted_lock_whose_holders_had_expired_counts_as_an_expiration_only() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    query(&mut c, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]).unwrap();
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", "100"]);
    thread::sleep(Duration::from_millis(300));
    config_set(&mut c, "maxmemory-policy", "allkeys-random");
    config_set(&mut c, "maxmemory", "1");
    wait_until("the key evicted", || {
        query(&mut c, &["DBSIZE"]).ok() == Some(Value::Int(0))
    });
    config_set(&mut c, "maxmemory", "0");
    wait_until("the expiration counted", || {
        info_field(&mut c, "expirations_total") == 1
    });
    assert_eq!(info_field(&mut c, "evicted_total"), 0);
}

/// A held lock key overwritten by SET (a class of notification the module does not follow),
/// then its name evicted: not a lock's eviction.
#[test]
fn a_string_evicted_under_the_name_of_an_overwritten_lock_is_not_counted() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", LONG]);
    query(&mut c, &["SET", "k", "a plain string"]).unwrap();
    config_set(&mut c, "maxmemory-policy", "allkeys-random");
    config_set(&mut c, "maxmemory", "1");
    wait_until("the string evicted", || int(&mut c, &["EXISTS", "k"]) == 0);
    config_set(&mut c, "maxmemory", "0");
    assert_eq!(info_field(&mut c, "evicted_total"), 0);
}

/// With lock.refuse-when-evictable on, a waiter queued while the server could not evict is
/// not granted once it can (CONFIG SET maxmemory-policy allkeys-lru): when its turn comes it
/// gets the refusal, and so does the waiter behind it, in order. (It used to be granted.)
#[test]
fn waiters_whose_turn_comes_while_the_server_can_evict_get_the_refusal() {
    let server = Server::start();
    let mut c = server.client();
    config_set(&mut c, "lock.refuse-when-evictable", "yes");
    int(&mut c, &["LOCK.ACQUIRE", "q", "holder", LONG]);
    let first = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "q", "w1", LONG, "WAIT", "0"],
        1,
    );
    let second = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "q", "w2", LONG, "WAIT", "0"],
        2,
    );
    config_set(&mut c, "maxmemory", "1gb");
    config_set(&mut c, "maxmemory-policy", "allkeys-lru");
    assert_eq!(info_field(&mut c, "evictable"), 1);
    int(&mut c, &["LOCK.RELEASE", "q", "holder"]);
    for (name, waiter) in [("w1", first), ("w2", second)] {
        let answered = waiter.join();
        assert!(
            matches!(&answered, Err(e) if format!("{e:?}").contains("lock.refuse-when-evictable")),
            "{name}: {answered:?}"
        );
    }
    assert_eq!(int(&mut c, &["EXISTS", "q"]), 0, "nobody holds or waits");
    // Back to noeviction: grants again.
    config_set(&mut c, "maxmemory-policy", "noeviction");
    assert!(int(&mut c, &["LOCK.ACQUIRE", "q", "w1", LONG]) > 0);
}
