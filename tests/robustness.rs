//! Every kind of entry point survives a panic: a fault armed with `LOCK.DEBUG-PANIC <name>`
//! fires inside the next run of that entry point, and the server must keep answering and
//! locking. One test per callback kind: commands, blocked-client reply / timeout / disconnect,
//! timers, data-type callbacks, keyspace and server events, INFO.

use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

fn arm(c: &mut Connection, name: &str) {
    assert_eq!(query(c, &["LOCK.DEBUG-PANIC", name]).unwrap(), Value::Okay);
}

/// The server still answers and still locks.
fn assert_alive(server: &mut Server) {
    assert!(server.alive(), "redis-server died");
    let mut c = server.client();
    assert_eq!(
        query(&mut c, &["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    let key = format!("alive:{}", rand_suffix());
    assert!(int(&mut c, &["LOCK.ACQUIRE", &key, "me", "10000"]) > 0);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", &key, "me"]), 0);
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn assert_internal_error(r: redis::RedisResult<Value>) {
    let e = r.expect_err("expected the guard's error reply");
    assert!(format!("{e:?}").contains("internal error"), "{e:?}");
}

#[test]
fn a_panic_in_any_command_is_an_error_reply() {
    let mut server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "held", "me", "60000"]);
    for (name, words) in [
        ("LOCK.ACQUIRE", vec!["LOCK.ACQUIRE", "k", "o", "1000"]),
        ("LOCK.RWREAD", vec!["LOCK.RWREAD", "k", "o", "1000"]),
        ("LOCK.RELEASE", vec!["LOCK.RELEASE", "held", "me"]),
        ("LOCK.EXTEND", vec!["LOCK.EXTEND", "held", "me", "1000"]),
        ("LOCK.INFO", vec!["LOCK.INFO", "held"]),
    ] {
        arm(&mut c, name);
        assert_internal_error(query(&mut c, &words));
    }
    assert_eq!(holders(&mut c, "held"), vec![("me".to_string(), 1)]);
    assert_alive(&mut server);
}

#[test]
fn a_panic_in_a_blocked_clients_reply_timeout_or_disconnect_callback() {
    let mut server = Server::start();
    let mut c = server.client();

    // Reply: the waiter is granted by a release; its reply callback panics.
    int(&mut c, &["LOCK.ACQUIRE", "r", "holder", "60000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "r", "w", "60000", "WAIT", "0"],
        1,
    );
    arm(&mut c, "blocked reply");
    int(&mut c, &["LOCK.RELEASE", "r", "holder"]);
    assert_internal_error(waiter.join());

    // Timeout.
    int(&mut c, &["LOCK.ACQUIRE", "t", "holder", "60000"]);
    arm(&mut c, "blocked timeout");
    assert_internal_error(query(
        &mut c,
        &["LOCK.ACQUIRE", "t", "w", "1000", "WAIT", "50"],
    ));

    // Disconnect.
    int(&mut c, &["LOCK.ACQUIRE", "d", "holder", "60000"]);
    let mut w = server.client();
    let id = client_id(&mut w);
    let waiter =
        thread::spawn(move || query(&mut w, &["LOCK.ACQUIRE", "d", "w", "60000", "WAIT", "0"]));
    wait_until("queued", || waiting(&mut c, "d") == 1);
    arm(&mut c, "blocked disconnect");
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    assert!(waiter.join().unwrap().is_err());
    assert_alive(&mut server);
}

#[test]
fn a_panic_in_a_timer() {
    let mut server = Server::start();
    let mut c = server.client();
    // Expiry timer: two readers expiring at different times need it.
    int(&mut c, &["LOCK.RWREAD", "e", "short", "100"]);
    int(&mut c, &["LOCK.RWREAD", "e", "long", "60000"]);
    arm(&mut c, "expiry timer");
    thread::sleep(Duration::from_millis(300));
    assert_alive(&mut server);
    // The settle timer (serving waiters after a DEL).
    int(&mut c, &["LOCK.ACQUIRE", "s", "holder", "60000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "s", "w", "60000", "WAIT", "500"],
        1,
    );
    arm(&mut c, "settle timer");
    int(&mut c, &["DEL", "s"]);
    // The waiter is not lost: it times out (or is served by a later settle).
    assert!(waiter.join().is_ok());
    assert_alive(&mut server);
}

#[test]
fn a_panic_in_a_data_type_callback() {
    let mut server = Server::start_with(&["--enable-debug-command", "yes", "--appendonly", "yes"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "v", "me", "600000"]);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("v").query(&mut c).unwrap();

    arm(&mut c, "rdb load");
    let restored = redis::cmd("RESTORE")
        .arg("v2")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut c);
    assert!(restored.is_err(), "a failed load must not create the key");
    assert_eq!(int(&mut c, &["EXISTS", "v2"]), 0);

    for (name, words) in [
        ("mem usage", vec!["MEMORY", "USAGE", "v"]),
        ("digest", vec!["DEBUG", "DIGEST-VALUE", "v"]),
        ("copy", vec!["COPY", "v", "v3"]),
    ] {
        arm(&mut c, name);
        let _ = query(&mut c, &words);
        assert!(server.alive(), "{name}");
    }
    // rdb save and aux save run in SAVE; aof rewrite in the BGREWRITEAOF child.
    for name in ["rdb save", "aux save"] {
        arm(&mut c, name);
        let _ = query(&mut c, &["SAVE"]);
        assert!(server.alive(), "{name}");
    }
    arm(&mut c, "aof rewrite");
    query(&mut c, &["BGREWRITEAOF"]).unwrap();
    wait_until("rewrite done", || aof_rewrite_finished(&mut c));
    // unlink and free run on DEL.
    for name in ["unlink", "free"] {
        int(&mut c, &["LOCK.ACQUIRE", "gone", "me", "600000"]);
        arm(&mut c, name);
        int(&mut c, &["DEL", "gone"]);
        assert!(server.alive(), "{name}");
    }
    assert_alive(&mut server);
}

#[test]
fn a_panic_in_a_keyspace_or_server_event_or_info() {
    let mut server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "a", "me", "600000"]);
    arm(&mut c, "keyspace event");
    query(&mut c, &["RENAME", "a", "b"]).unwrap();
    arm(&mut c, "swapdb event");
    query(&mut c, &["SWAPDB", "0", "1"]).unwrap();
    arm(&mut c, "loading event");
    query(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    arm(&mut c, "flush event");
    query(&mut c, &["FLUSHALL"]).unwrap();
    arm(&mut c, "info");
    let _: String = redis::cmd("INFO").arg("lock").query(&mut c).unwrap();
    assert_alive(&mut server);
}
