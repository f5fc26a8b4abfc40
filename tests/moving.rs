//! MIGRATE moves a lock to another server (SPEC "Moving keys"): the holders, tokens, capacity
//! and pending delay go along; the waiters queued on the source get TRYAGAIN and are never
//! granted there; `MIGRATE ... COPY` and a failed MIGRATE change nothing on the source; the
//! target's tokens continue above the moved key's fence. With a plain MIGRATE between two
//! servers, inside MULTI and Lua, and with a real three-node cluster resharding a slot as
//! `redis-cli --cluster reshard` does.

use std::net::TcpListener;
use std::time::Duration;

use redis_lock_testkit::*;

/// The error code of a waiter's reply, panicking if it was not an error.
fn error_code(reply: redis::RedisResult<Value>) -> String {
    match reply {
        Err(e) => e.code().unwrap_or("").to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn migrated_waiters(c: &mut Connection) -> u64 {
    info_u64(c, "lock", "lock_migrated_waiters_total")
}

fn remaining_ttl(c: &mut Connection, key: &str) -> i64 {
    let Some(Value::Array(hs)) = info(c, key).and_then(|m| m.get("holders").cloned()) else {
        panic!("no holders field");
    };
    match hs.first() {
        Some(Value::Array(parts)) => match parts.get(2) {
            Some(Value::Int(ttl)) => *ttl,
            other => panic!("ttl {other:?}"),
        },
        other => panic!("holder {other:?}"),
    }
}

/// Servers started target first: the source's clock floor (and so its tokens) is then above
/// the target's own counter, so only the moved key can lift the target's counter over them.
fn target_then_source(target_args: &[&str]) -> (Server, Server) {
    let target = Server::start_with(target_args);
    std::thread::sleep(Duration::from_millis(20));
    let source = Server::start();
    (target, source)
}

#[test]
fn migrate_moves_the_holder_and_the_waiters_get_tryagain() {
    let (target, source) = target_then_source(&[]);
    let mut s = source.client();
    let mut t = target.client();
    let token = int(&mut s, &["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let target_before = int(&mut t, &["LOCK.ACQUIRE", "other", "x", "60000"]);
    assert!(
        target_before < token,
        "the source's tokens start above the target's"
    );
    let w = spawn_waiter(
        &source,
        &mut s,
        &["LOCK.ACQUIRE", "k", "w", "60000", "WAIT", "0"],
        1,
    );
    let r = spawn_waiter(
        &source,
        &mut s,
        &["LOCK.RWREAD", "k", "r", "60000", "WAIT", "30000"],
        2,
    );

    let port = target.port.to_string();
    let reply = query(&mut s, &["MIGRATE", "127.0.0.1", &port, "k", "0", "5000"]);
    assert_eq!(reply, Ok(Value::Okay));

    // The waiters are told to try again; neither got a token.
    assert_eq!(error_code(w.join()), "TRYAGAIN");
    assert_eq!(error_code(r.join()), "TRYAGAIN");
    assert_eq!(migrated_waiters(&mut s), 2);
    // The source does not make the key again for them, now or after its settle pass.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(int(&mut s, &["EXISTS", "k"]), 0);
    assert_eq!(info_u64(&mut s, "lock", "lock_waiters"), 0);
    assert_eq!(info_u64(&mut s, "lock", "lock_grants_total"), 1);
    assert_eq!(info_u64(&mut s, "lock", "lock_locks_held"), 0);
    assert_eq!(info_u64(&mut t, "lock", "lock_locks_held"), 2);

    // The hold goes on at the target with its token and expiry.
    assert_eq!(holders(&mut t, "k"), vec![("holder".to_string(), 1)]);
    assert_eq!(info_int(&mut t, "k", "fence"), token);
    let ttl = remaining_ttl(&mut t, "k");
    assert!(ttl > 50_000 && ttl <= 60_000, "ttl {ttl}");
    let pttl = int(&mut t, &["PTTL", "k"]);
    assert!(pttl > 50_000 && pttl <= 60_000, "pttl {pttl}");
    // A re-entry there returns the holding's token; a new grant after the release is larger.
    assert_eq!(
        int(&mut t, &["LOCK.ACQUIRE", "k", "holder", "60000"]),
        token
    );
    assert_eq!(int(&mut t, &["LOCK.RELEASE", "k", "holder", "ALL"]), 0);
    let next = int(&mut t, &["LOCK.ACQUIRE", "k", "next", "60000"]);
    assert!(next > token, "{next} after the moved {token}");
    assert!(int(&mut t, &["LOCK.ACQUIRE", "fresh", "y", "60000"]) > token);
}

#[test]
fn migrate_keys_with_auth_and_replace_moves_capacity_and_pending_delay() {
    let (target, source) = target_then_source(&[]);
    let mut t = target.client();
    query(&mut t, &["CONFIG", "SET", "requirepass", "secret"]).unwrap();
    let mut s = source.client();
    // A semaphore of capacity 2, full, with a waiter.
    int(&mut s, &["LOCK.SEMACQUIRE", "sem", "a", "2", "60000"]);
    let sem_token = int(&mut s, &["LOCK.SEMACQUIRE", "sem", "b", "2", "60000"]);
    let sw = spawn_waiter(
        &source,
        &mut s,
        &["LOCK.SEMACQUIRE", "sem", "c", "2", "60000", "WAIT", "0"],
        1,
    );
    // A lock whose bound holder left with a lock-delay still pending, and a waiter behind it.
    let mut holder = source.client();
    let delayed_token = int(
        &mut holder,
        &[
            "LOCK.ACQUIRE",
            "delayed",
            "h",
            "60000",
            "LOCKDELAY",
            "60000",
            "BIND",
        ],
    );
    drop(holder);
    wait_until("the bound hold ended", || {
        holders(&mut s, "delayed").is_empty()
    });
    let dw = spawn_waiter(
        &source,
        &mut s,
        &["LOCK.ACQUIRE", "delayed", "w", "60000", "WAIT", "0"],
        1,
    );
    // REPLACE overwrites what the target has under one of the names.
    query(&mut t, &["SET", "sem", "old"]).unwrap();

    let port = target.port.to_string();
    let words = [
        "MIGRATE",
        "127.0.0.1",
        &port,
        "",
        "0",
        "5000",
        "REPLACE",
        "AUTH",
        "secret",
        "KEYS",
        "sem",
        "delayed",
    ];
    assert_eq!(query(&mut s, &words), Ok(Value::Okay));
    assert_eq!(error_code(sw.join()), "TRYAGAIN");
    assert_eq!(error_code(dw.join()), "TRYAGAIN");
    assert_eq!(int(&mut s, &["EXISTS", "sem", "delayed"]), 0);
    assert_eq!(migrated_waiters(&mut s), 2);

    assert_eq!(info_int(&mut t, "sem", "capacity"), 2);
    assert_eq!(
        holders(&mut t, "sem"),
        vec![("a".to_string(), 1), ("b".to_string(), 1)]
    );
    assert_eq!(info_int(&mut t, "sem", "fence"), sem_token);
    // The delay is still pending there: nobody gets the lock, and its end is kept.
    let delay = info_int(&mut t, "delayed", "delay");
    assert!(delay > 50_000 && delay <= 60_000, "delay {delay}");
    assert!(is_nil(&mut t, &["LOCK.ACQUIRE", "delayed", "x", "60000"]));
    assert!(info_int(&mut t, "delayed", "fence") >= delayed_token);
}

#[test]
fn migrate_copy_and_a_failed_migrate_change_nothing_on_the_source() {
    let (target, source) = target_then_source(&[]);
    let mut s = source.client();
    int(&mut s, &["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let w = spawn_waiter(
        &source,
        &mut s,
        &["LOCK.ACQUIRE", "k", "w", "60000", "WAIT", "0"],
        1,
    );
    let port = target.port.to_string();

    // COPY: the target gets a copy; the source's lock and queue go on.
    let copy = query(
        &mut s,
        &["MIGRATE", "127.0.0.1", &port, "k", "0", "5000", "COPY"],
    );
    assert_eq!(copy, Ok(Value::Okay));
    // A target that refuses (the key exists there, no REPLACE): nothing is deleted.
    let refused = query(&mut s, &["MIGRATE", "127.0.0.1", &port, "k", "0", "5000"]);
    assert!(refused.is_err(), "{refused:?}");
    // A target that is down.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let down = closed.local_addr().unwrap().port().to_string();
    drop(closed);
    let failed = query(&mut s, &["MIGRATE", "127.0.0.1", &down, "k", "0", "1000"]);
    assert!(failed.is_err(), "{failed:?}");
    // DUMP, then a DEL as its own command: a DEL, whose waiters are served.
    query(&mut s, &["DUMP", "k"]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!w.is_finished());
    assert_eq!(waiting(&mut s, "k"), 1);
    assert_eq!(holders(&mut s, "k"), vec![("holder".to_string(), 1)]);
    assert_eq!(migrated_waiters(&mut s), 0);

    assert_eq!(int(&mut s, &["DEL", "k"]), 1);
    let token = w.token();
    assert_eq!(holders(&mut s, "k"), vec![("w".to_string(), 1)]);
    assert_eq!(info_int(&mut s, "k", "fence"), token);
    assert_eq!(migrated_waiters(&mut s), 0);
}

#[test]
fn migrate_inside_multi_and_lua_is_still_a_move() {
    let (target, source) = target_then_source(&[]);
    let mut s = source.client();
    let port = target.port.to_string();
    for (i, how) in ["multi", "lua"].iter().enumerate() {
        let key = format!("k{i}");
        int(&mut s, &["LOCK.ACQUIRE", &key, "holder", "60000"]);
        let w = spawn_waiter(
            &source,
            &mut s,
            &["LOCK.ACQUIRE", &key, "w", "60000", "WAIT", "0"],
            1,
        );
        if *how == "multi" {
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("DUMP")
                .arg(&key)
                .cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(&port)
                .arg(&key)
                .arg(0)
                .arg(5000);
            let _: Vec<Value> = pipe.query(&mut s).unwrap();
        } else {
            let script = "return redis.call('MIGRATE', ARGV[1], ARGV[2], KEYS[1], 0, 5000)";
            let r = query(&mut s, &["EVAL", script, "1", &key, "127.0.0.1", &port]);
            assert_eq!(r, Ok(Value::Okay), "{how}");
        }
        assert_eq!(error_code(w.join()), "TRYAGAIN", "{how}");
        assert_eq!(int(&mut s, &["EXISTS", &key]), 0, "{how}");
        let mut t = target.client();
        assert_eq!(
            holders(&mut t, &key),
            vec![("holder".to_string(), 1)],
            "{how}"
        );
    }
    assert_eq!(migrated_waiters(&mut s), 2);
}

#[test]
fn a_replica_of_the_source_applies_the_move_as_a_delete() {
    let target = Server::start();
    let (source, replica) = master_and_replica(&[]);
    let mut s = source.client();
    int(&mut s, &["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let w = spawn_waiter(
        &source,
        &mut s,
        &["LOCK.ACQUIRE", "k", "w", "60000", "WAIT", "0"],
        1,
    );
    let port = target.port.to_string();
    assert_eq!(
        query(&mut s, &["MIGRATE", "127.0.0.1", &port, "k", "0", "5000"]),
        Ok(Value::Okay)
    );
    assert_eq!(error_code(w.join()), "TRYAGAIN");
    let mut r = replica.client();
    wait_until("the replica deleted the key", || {
        int(&mut r, &["EXISTS", "k"]) == 0
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(int(&mut r, &["EXISTS", "k"]), 0);
    assert_eq!(
        query(&mut r, &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
}

#[test]
fn resharding_a_slot_under_a_held_lock_never_grants_it_on_the_old_node() {
    let nodes = start_cluster(3);
    let key = "reshard:{lock}";
    let (src_port, reply) = follow_moved(nodes[0].port, &["LOCK.ACQUIRE", key, "holder", "60000"]);
    let token = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("{other:?}"),
    };
    let src = nodes.iter().find(|n| n.port == src_port).unwrap();
    let dst = nodes.iter().find(|n| n.port != src_port).unwrap();
    let mut s = src.client();
    let slot = int(&mut s, &["CLUSTER", "KEYSLOT", key]).to_string();
    let w = spawn_waiter(
        src,
        &mut s,
        &["LOCK.ACQUIRE", key, "w", "60000", "WAIT", "0"],
        1,
    );
    let r = spawn_waiter(
        src,
        &mut s,
        &["LOCK.RWREAD", key, "r", "60000", "WAIT", "0"],
        2,
    );

    // What `redis-cli --cluster reshard` does for one slot, up to the keys' MIGRATE.
    let slot_no = u16::try_from(int(&mut s, &["CLUSTER", "KEYSLOT", key])).unwrap();
    start_slot_move(slot_no, src.port, dst.port);
    assert_eq!(error_code(w.join()), "TRYAGAIN");
    assert_eq!(error_code(r.join()), "TRYAGAIN");
    // Asked again on the old node, mid-migration: redirected, never granted there.
    let again = query(&mut s, &["LOCK.ACQUIRE", key, "w", "60000", "WAIT", "100"]);
    assert_eq!(error_code(again), "ASK");
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    finish_slot_move(slot_no, dst.port, &ports);
    let after = query(&mut s, &["LOCK.ACQUIRE", key, "w", "60000"]);
    assert_eq!(error_code(after), "MOVED");
    assert_eq!(int(&mut s, &["CLUSTER", "COUNTKEYSINSLOT", &slot]), 0);

    // The new owner has the hold; a waiter there gets the lock only when it is released.
    let mut d = dst.client();
    assert_eq!(holders(&mut d, key), vec![("holder".to_string(), 1)]);
    let w2 = spawn_waiter(
        dst,
        &mut d,
        &["LOCK.ACQUIRE", key, "w", "60000", "WAIT", "0"],
        1,
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(!w2.is_finished());
    assert_eq!(int(&mut d, &["LOCK.RELEASE", key, "holder"]), 0);
    assert!(w2.token() > token);
}

/// A bound hold's connection is on the source: on the target its id names some other
/// connection. The hold arrives unbound (a plain TTL hold), so a target connection that
/// happens to have the same id cannot end it by closing.
#[test]
fn a_bound_hold_arrives_unbound_and_a_same_numbered_connection_cannot_end_it() {
    let (target, source) = target_then_source(&[]);
    let mut t = target.client();
    let target_id = client_id(&mut t);
    // The holder's connection on the source, with an id the target has not handed out yet.
    let mut holder = source.client();
    while client_id(&mut holder) <= target_id + 1 {
        holder = source.client();
    }
    let holder_id = client_id(&mut holder);
    let token = int(
        &mut holder,
        &[
            "LOCK.ACQUIRE",
            "k",
            "h",
            "60000",
            "BIND",
            "LOCKDELAY",
            "100",
        ],
    );
    let mut s = source.client();
    let port = target.port.to_string();
    let reply = query(&mut s, &["MIGRATE", "127.0.0.1", &port, "k", "0", "5000"]);
    assert_eq!(reply, Ok(Value::Okay));
    assert_eq!(holders(&mut t, "k"), vec![("h".to_string(), 1)]);

    // On the target, the connection that gets the holder's id comes and goes.
    let same = loop {
        let mut c = target.client();
        let id = client_id(&mut c);
        assert!(id <= holder_id, "the target skipped id {holder_id}");
        if id == holder_id {
            break c;
        }
    };
    drop(same);
    let gone = format!("id={holder_id} ");
    wait_until("the target dropped the connection", || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut t).unwrap();
        !list.lines().any(|l| l.starts_with(&gone))
    });
    // A lock command on the key settles whatever that close did to it.
    assert_eq!(holders(&mut t, "k"), vec![("h".to_string(), 1)]);
    assert_eq!(info_int(&mut t, "k", "fence"), token);
    assert!(is_nil(&mut t, &["LOCK.ACQUIRE", "k", "intruder", "60000"]));
    // It is still the holder's to release there.
    assert_eq!(int(&mut t, &["LOCK.RELEASE", "k", "h"]), 0);
}
