//! Nothing lost: RDB and AOF restarts (with SIGKILL), AOF rewrite, replicas and promotion,
//! DUMP/RESTORE/COPY/DEBUG RELOAD, ACL, INFO figures, keyspace events, the waiter bound.

use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

/// What must survive for one key: holders with counts (sorted), and the key's fence.
fn state(c: &mut Connection, key: &str) -> (Vec<(String, i64)>, i64) {
    (holders(c, key), info_int(c, key, "fence"))
}

/// Builds a mixed state: an exclusive holder with count 2, two readers (one re-entered), a key
/// whose lock came and went (its tokens must still count), and returns the largest token.
fn build_state(c: &mut Connection) -> i64 {
    let mut max = 0;
    for words in [
        vec!["LOCK.ACQUIRE", "w", "writer", "600000"],
        vec!["LOCK.ACQUIRE", "w", "writer", "600000"],
        vec!["LOCK.RWREAD", "r", "reader-1", "600000"],
        vec!["LOCK.RWREAD", "r", "reader-2", "600000"],
        vec!["LOCK.RWREAD", "r", "reader-1", "600000"],
        vec!["LOCK.ACQUIRE", "gone", "x", "600000"],
    ] {
        max = max.max(int(c, &words));
    }
    assert_eq!(int(c, &["LOCK.RELEASE", "gone", "x"]), 0);
    max
}

fn assert_state_survived(
    c: &mut Connection,
    before_w: &(Vec<(String, i64)>, i64),
    before_r: &(Vec<(String, i64)>, i64),
    max_token: i64,
) {
    assert_eq!(&state(c, "w"), before_w);
    assert_eq!(&state(c, "r"), before_r);
    assert_eq!(int(c, &["EXISTS", "gone"]), 0);
    let pttl = int(c, &["PTTL", "w"]);
    assert!(pttl > 500_000, "absolute expiry lost: PTTL {pttl}");
    assert!(
        is_nil(c, &["LOCK.ACQUIRE", "w", "intruder", "1000"]),
        "the writer's hold was lost"
    );
    let next = int(c, &["LOCK.ACQUIRE", "fresh", "someone", "1000"]);
    assert!(
        next > max_token,
        "token {next} not above {max_token} after restart"
    );
}

fn restart_round_trip(extra: &[&str], persist: &str) {
    let mut server = Server::start_with(extra);
    let mut c = server.client();
    let max = build_state(&mut c);
    let w = state(&mut c, "w");
    let r = state(&mut c, "r");
    match persist {
        "save" => {
            query(&mut c, &["SAVE"]).unwrap();
        }
        "bgrewriteaof" => {
            query(&mut c, &["BGREWRITEAOF"]).unwrap();
            wait_until("AOF rewrite finished", || aof_rewrite_finished(&mut c));
            // Something after the rewrite, appended to the new AOF.
            int(&mut c, &["LOCK.RWREAD", "r", "reader-2", "600000"]);
            int(&mut c, &["LOCK.RELEASE", "r", "reader-2"]);
        }
        _ => {}
    }
    drop(c);
    server.crash_and_restart();
    let mut c = server.client();
    assert_state_survived(&mut c, &w, &r, max);
}

#[test]
fn rdb_snapshot_restart_keeps_holders_expiries_and_fences() {
    restart_round_trip(&[], "save");
}

#[test]
fn aof_without_preamble_kill_9_restart_loses_no_grant() {
    restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "no",
        ],
        "none",
    );
}

#[test]
fn aof_with_preamble_kill_9_restart_loses_no_grant() {
    restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "yes",
        ],
        "none",
    );
}

#[test]
fn aof_rewrite_without_preamble_then_restart() {
    restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "no",
        ],
        "bgrewriteaof",
    );
}

#[test]
fn aof_rewrite_with_preamble_then_restart() {
    restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "yes",
        ],
        "bgrewriteaof",
    );
}

#[test]
fn a_blocked_waiters_grant_reaches_the_aof() {
    let mut server = Server::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        "no",
    ]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "bw", "holder", "600000"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "bw", "heir", "600000", "WAIT", "0"],
        1,
    );
    int(&mut c, &["LOCK.RELEASE", "bw", "holder"]);
    let token = waiter.token();
    drop(c);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(holders(&mut c, "bw"), vec![("heir".to_string(), 1)]);
    assert_eq!(info_int(&mut c, "bw", "fence"), token);
}

#[test]
fn loaded_holders_still_expire_one_by_one() {
    let mut server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.RWREAD", "lx", "short", "1500"]);
    int(&mut c, &["LOCK.RWREAD", "lx", "long", "600000"]);
    query(&mut c, &["SAVE"]).unwrap();
    drop(c);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(info_field(&mut c, "readers"), 2);
    wait_until("the short reader expired after the restart", || {
        info_field(&mut c, "readers") == 1 && info_field(&mut c, "expirations_total") == 1
    });
    assert_eq!(holders(&mut c, "lx"), vec![("long".to_string(), 1)]);
}

#[test]
fn lock_sync_is_refused_from_clients() {
    let server = Server::start();
    let mut c = server.client();
    let e = err(
        &mut c,
        &["LOCK.SYNC", "k", "o", "1 write 99999999999999 5 5 5"],
    );
    assert!(e.contains("internal"), "{e}");
    // A malformed state gets the same refusal: a client learns nothing about the format.
    let e = err(&mut c, &["LOCK.SYNC", "k", "o", "garbage"]);
    assert!(e.contains("internal"), "{e}");
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

fn replicate(master: &mut Connection) {
    let acked = int(master, &["WAIT", "1", "5000"]);
    assert_eq!(acked, 1, "replica did not acknowledge");
}

fn debug_master_and_replica() -> (Server, Server) {
    master_and_replica(&["--enable-debug-command", "yes"])
}

#[test]
fn a_replica_has_the_same_holders_and_fences_and_refuses_writes() {
    let (master, replica) = debug_master_and_replica();
    let mut m = master.client();
    let mut r = replica.client();
    build_state(&mut m);
    // A waiter granted by a release must reach the replica too.
    int(&mut m, &["LOCK.ACQUIRE", "q", "holder", "600000"]);
    let waiter = spawn_waiter(
        &master,
        &mut m,
        &["LOCK.ACQUIRE", "q", "heir", "600000", "WAIT", "0"],
        1,
    );
    int(&mut m, &["LOCK.RELEASE", "q", "holder"]);
    waiter.token();
    replicate(&mut m);
    for key in ["w", "r", "q"] {
        assert_eq!(state(&mut r, key), state(&mut m, key), "{key}");
    }
    assert_eq!(int(&mut r, &["EXISTS", "gone"]), 0);
    let dm: String = redis::cmd("DEBUG").arg("DIGEST").query(&mut m).unwrap();
    let dr: String = redis::cmd("DEBUG").arg("DIGEST").query(&mut r).unwrap();
    assert_eq!(
        dm, dr,
        "datasets differ (holders, counts, absolute expiries, tokens)"
    );
    let e = err(&mut r, &["LOCK.ACQUIRE", "w", "x", "1000"]);
    assert!(e.starts_with("READONLY"), "{e}");
    let e = err(&mut r, &["LOCK.RELEASE", "w", "writer"]);
    assert!(e.starts_with("READONLY"), "{e}");
}

#[test]
fn a_replica_never_expires_holders_by_its_own_clock() {
    let (master, replica) = debug_master_and_replica();
    let mut m = master.client();
    let mut r = replica.client();
    int(&mut m, &["LOCK.RWREAD", "e", "brief", "800"]);
    replicate(&mut m);
    assert_eq!(info_field(&mut r, "readers"), 1);
    master.signal("STOP");
    thread::sleep(Duration::from_millis(1500));
    let readers = info_field(&mut r, "readers");
    let expired = info_field(&mut r, "expirations_total");
    master.signal("CONT");
    assert_eq!(
        (readers, expired),
        (1, 0),
        "the replica dropped a holder on its own"
    );
    wait_until("the master's expiry reached the replica", || {
        info_field(&mut r, "readers") == 0
    });
    assert_eq!(int(&mut r, &["EXISTS", "e"]), 0);
}

#[test]
fn a_promoted_replica_continues_fences_above_every_token_and_expires_holders() {
    let (master, replica) = debug_master_and_replica();
    let mut m = master.client();
    let mut r = replica.client();
    let max = build_state(&mut m);
    // Two readers with different expiries: the key's own Redis expiry (the last holder's)
    // cannot drop the first one; only the module's timer can.
    int(&mut m, &["LOCK.RWREAD", "soon", "brief", "1500"]);
    int(&mut m, &["LOCK.RWREAD", "soon", "lasting", "600000"]);
    replicate(&mut m);
    drop(master);
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    let next = int(&mut r, &["LOCK.ACQUIRE", "after-failover", "me", "10000"]);
    assert!(next > max, "token {next} not above {max}");
    assert!(is_nil(&mut r, &["LOCK.ACQUIRE", "w", "intruder", "1000"]));
    wait_until("the promoted node expires holders by its own timer", || {
        info_field(&mut r, "expirations_total") == 1
    });
    assert_eq!(holders(&mut r, "soon"), vec![("lasting".to_string(), 1)]);
}

#[test]
fn dump_restore_copy_and_debug_reload_keep_the_lock() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "src", "me", "600000"]);
    int(&mut c, &["LOCK.ACQUIRE", "src", "me", "600000"]);
    let before = state(&mut c, "src");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("copy1")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(state(&mut c, "copy1"), before);
    assert_eq!(int(&mut c, &["COPY", "src", "copy2"]), 1);
    assert_eq!(state(&mut c, "copy2"), before);
    let mem = int(&mut c, &["MEMORY", "USAGE", "src"]);
    assert!(mem > 0);
    let d1: String = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg("src")
        .query::<Vec<String>>(&mut c)
        .unwrap()
        .remove(0);
    let d2: String = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg("copy2")
        .query::<Vec<String>>(&mut c)
        .unwrap()
        .remove(0);
    assert_eq!(d1, d2);
    assert_ne!(d1, "0000000000000000000000000000000000000000");
    query(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(state(&mut c, "src"), before);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "src", "me", "ALL"]), 0);
}

#[test]
fn unlink_flushdb_and_restore_over_a_lock_serve_its_waiters() {
    let server = Server::start();
    let mut c = server.client();
    for (i, how) in ["UNLINK", "FLUSHDB", "RESTORE"].into_iter().enumerate() {
        let key = format!("k{i}");
        int(&mut c, &["LOCK.ACQUIRE", &key, "holder", "600000"]);
        let waiter = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", &key, "heir", "600000", "WAIT", "0"],
            1,
        );
        match how {
            "UNLINK" => {
                int(&mut c, &["UNLINK", &key]);
            }
            "FLUSHDB" => {
                query(&mut c, &["FLUSHDB"]).unwrap();
            }
            _ => {
                query(&mut c, &["SET", "plain", "v"]).unwrap();
                let dump: Vec<u8> = redis::cmd("DUMP").arg("plain").query(&mut c).unwrap();
                redis::cmd("RESTORE")
                    .arg(&key)
                    .arg(0)
                    .arg(dump)
                    .arg("REPLACE")
                    .query::<()>(&mut c)
                    .unwrap();
            }
        }
        let reply = waiter.join();
        if how == "RESTORE" {
            assert_eq!(reply.unwrap_err().code(), Some("WRONGTYPE"));
        } else {
            assert!(matches!(reply, Ok(Value::Int(_))), "{how}: {reply:?}");
            assert_eq!(
                holders(&mut c, &key),
                vec![("heir".to_string(), 1)],
                "{how}"
            );
        }
    }
}

#[test]
fn acl_key_patterns_apply_to_lock_commands() {
    let server = Server::start();
    let mut c = server.client();
    query(
        &mut c,
        &["ACL", "SETUSER", "app", "on", ">secret", "~app:*", "+@all"],
    )
    .unwrap();
    let mut u = server.client();
    query(&mut u, &["AUTH", "app", "secret"]).unwrap();
    assert!(matches!(
        query(&mut u, &["LOCK.ACQUIRE", "app:1", "me", "1000"]),
        Ok(Value::Int(_))
    ));
    for words in [
        vec!["LOCK.ACQUIRE", "other:1", "me", "1000"],
        vec!["LOCK.RWREAD", "other:1", "me", "1000"],
        vec!["LOCK.RELEASE", "other:1", "me"],
        vec!["LOCK.EXTEND", "other:1", "me", "1000"],
        vec!["LOCK.INFO", "other:1"],
    ] {
        let e = err(&mut u, &words);
        assert!(e.starts_with("NOPERM"), "{words:?}: {e}");
    }
    assert_eq!(int(&mut c, &["EXISTS", "other:1"]), 0);
}

#[test]
fn info_lock_reports_every_figure() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "a", "w", "600000"]);
    int(&mut c, &["LOCK.RWREAD", "b", "r1", "600000"]);
    int(&mut c, &["LOCK.RWREAD", "b", "r2", "600000"]);
    int(&mut c, &["LOCK.RWREAD", "c", "brief", "50"]);
    assert!(is_nil(
        &mut c,
        &["LOCK.ACQUIRE", "a", "x", "1000", "WAIT", "50"]
    ));
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "a", "y", "1000", "WAIT", "0"],
        1,
    );
    wait_until("brief reader expired", || {
        info_field(&mut c, "expirations_total") == 1
    });
    assert_eq!(info_field(&mut c, "locks_held"), 2);
    assert_eq!(info_field(&mut c, "writers"), 1);
    assert_eq!(info_field(&mut c, "readers"), 2);
    assert_eq!(info_field(&mut c, "waiters"), 1);
    assert_eq!(info_field(&mut c, "grants_total"), 4);
    assert_eq!(info_field(&mut c, "timeouts_total"), 1);
    int(&mut c, &["LOCK.RELEASE", "a", "w"]);
    waiter.token();
    assert_eq!(info_field(&mut c, "grants_total"), 5);
    assert_eq!(info_field(&mut c, "waiters"), 0);
}

#[test]
fn keyspace_events_for_acquire_release_and_expire() {
    let server = Server::start_with(&["--notify-keyspace-events", "Ed"]);
    let mut c = server.client();
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:lock.*").unwrap();
    pubsub.set_read_timeout(Some(PATIENCE)).unwrap();
    int(&mut c, &["LOCK.ACQUIRE", "ev", "a", "100000"]);
    int(&mut c, &["LOCK.RELEASE", "ev", "a"]);
    int(&mut c, &["LOCK.ACQUIRE", "ev", "b", "50"]);
    let seen = next_events(&mut pubsub, 4);
    let names: Vec<&str> = seen.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "lock.acquire",
            "lock.release",
            "lock.acquire",
            "lock.expire"
        ]
    );
    assert!(seen.iter().all(|(_, key)| key == "ev"));
}

#[test]
fn the_wait_queue_bound_is_enforced_and_configurable() {
    let server = Server::start_with(&["--lock.max-waiters", "2"]);
    let mut c = server.client();
    assert_eq!(
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("lock.max-waiters")
            .query::<Vec<String>>(&mut c)
            .unwrap(),
        vec!["lock.max-waiters".to_string(), "2".to_string()]
    );
    int(&mut c, &["LOCK.ACQUIRE", "mw", "holder", "600000"]);
    let mut handles = Vec::new();
    for i in 1..=2 {
        handles.push(spawn_waiter(
            &server,
            &mut c,
            &[
                "LOCK.ACQUIRE",
                "mw",
                &format!("w{i}"),
                "1000",
                "WAIT",
                "2000",
            ],
            i,
        ));
    }
    let e = err(&mut c, &["LOCK.ACQUIRE", "mw", "w3", "1000", "WAIT", "0"]);
    assert!(e.starts_with("MAXWAITERS"), "{e}");
    assert!(
        is_nil(&mut c, &["LOCK.ACQUIRE", "mw", "w3", "1000"]),
        "without WAIT it is a plain no"
    );
    assert_eq!(waiting(&mut c, "mw"), 2);
    query(&mut c, &["CONFIG", "SET", "lock.max-waiters", "3"]).unwrap();
    handles.push(spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "mw", "w3", "1000", "WAIT", "2000"],
        3,
    ));
    assert!(err(&mut c, &["CONFIG", "SET", "lock.max-waiters", "0"]).contains("between 1 and"));
    for h in handles {
        let _ = h.join();
    }
}

#[test]
fn move_and_swapdb_carry_the_lock_and_its_timer() {
    let server = Server::start();
    let mut c = server.client();
    for (i, how) in ["MOVE", "SWAPDB"].into_iter().enumerate() {
        let key = format!("mv{i}");
        int(&mut c, &["LOCK.RWREAD", &key, "short", "300"]);
        int(&mut c, &["LOCK.RWREAD", &key, "long", "600000"]);
        if how == "MOVE" {
            assert_eq!(int(&mut c, &["MOVE", &key, "1"]), 1);
        } else {
            query(&mut c, &["SWAPDB", "0", "1"]).unwrap();
        }
        let expired = i as u64 + 1;
        wait_until("the short reader expired in database 1", || {
            info_field(&mut c, "expirations_total") == expired && info_field(&mut c, "readers") == 1
        });
        query(&mut c, &["SELECT", "1"]).unwrap();
        assert_eq!(
            holders(&mut c, &key),
            vec![("long".to_string(), 1)],
            "{how}"
        );
        assert_eq!(int(&mut c, &["LOCK.RELEASE", &key, "long"]), 0);
        query(&mut c, &["SELECT", "0"]).unwrap();
        if how == "SWAPDB" {
            query(&mut c, &["SWAPDB", "0", "1"]).unwrap();
        }
    }
}

#[test]
fn a_corrupt_lock_payload_is_refused_cleanly() {
    assert_eq!(
        crc64(b"123456789"),
        0xe9c6_d914_c4b8_d9ca,
        "CRC-64 check value"
    );
    let mut server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "src", "o", "600000"]);
    let good: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    // Sanity: resealing an untouched payload keeps it valid.
    redis::cmd("RESTORE")
        .arg("ok")
        .arg(0)
        .arg(reseal(good.clone()))
        .query::<()>(&mut c)
        .unwrap();

    // Layout: type byte, 0x81 + 8-byte module id whose low 10 bits are the encoding version
    // (the id is big-endian, so its last byte is the version while that is below 256).
    assert_eq!(good[1], 0x81, "64-bit module id expected");
    assert_eq!(good[9], 3, "encoding version 3");
    let mut wrong_version = good.clone();
    wrong_version[9] = 4;

    // The value ends with the holder's `bound`, `lock_delay`, `capacity` (unsigned 0 each:
    // opcode 2, length byte 0) and `granted_at` (a Unix ms time: opcode 2, then 0x81 and 8
    // bytes), then the key's `delay_until` (0), just before the EOF opcode, the RDB version
    // (2 bytes) and the CRC.
    let eof = good.len() - 8 - 2 - 1;
    assert_eq!(good[eof], 0, "module value EOF opcode");
    assert_eq!(
        good[eof - 18..eof - 10],
        [2, 0, 2, 0, 2, 0, 2, 0x81],
        "version 3 tail"
    );
    assert_eq!(good[eof - 2..eof], [2, 0], "no lock-delay");
    // Encoding version 2 (before hold starts were kept) still loads: the same value without
    // `granted_at`. Its hold's start is unknown: LOCK.INFO's `held` is -1.
    let mut version_2 = good.clone();
    version_2.drain(eof - 12..eof - 2);
    version_2[9] = 2;
    redis::cmd("RESTORE")
        .arg("v2")
        .arg(0)
        .arg(reseal(version_2.clone()))
        .query::<()>(&mut c)
        .expect("a version 2 value loads");
    let v2 = holder_entries(&mut c, "v2");
    assert_eq!((v2[0].0.as_str(), v2[0].1, v2[0].3), ("o", 1, -1), "{v2:?}");
    // The current encoding keeps it.
    let src = holder_entries(&mut c, "ok");
    assert!(src[0].3 >= 0, "{src:?}");

    // Encoding version 1 (before BIND, LOCKDELAY and semaphores) still loads: version 2
    // without the holder's `bound`, `lock_delay` and `capacity` and the key's `delay_until`.
    let eof_2 = eof - 10;
    let mut version_1 = version_2;
    version_1.drain(eof_2 - 8..eof_2);
    version_1[9] = 1;
    redis::cmd("RESTORE")
        .arg("v1")
        .arg(0)
        .arg(reseal(version_1))
        .query::<()>(&mut c)
        .expect("a version 1 value loads");
    assert_eq!(holders(&mut c, "v1"), vec![("o".to_string(), 1)]);
    // Holder "o": string opcode 5, length 1, 'o', then the mode as unsigned opcode 2 + value.
    let at = good
        .windows(5)
        .position(|w| w == [5, 1, b'o', 2, 0])
        .expect("holder layout");
    let mut bad_mode = good.clone();
    bad_mode[at + 4] = 7;
    let mut truncated = good.clone();
    truncated.drain(at..at + 5);

    for (name, payload) in [
        ("version", wrong_version),
        ("mode", bad_mode),
        ("truncated", truncated),
    ] {
        let reply = redis::cmd("RESTORE")
            .arg(format!("bad-{name}"))
            .arg(0)
            .arg(reseal(payload))
            .query::<()>(&mut c);
        let e = reply.expect_err(name);
        assert!(
            format!("{e:?}").contains("Bad data format"),
            "{name}: {e:?}"
        );
        assert_eq!(int(&mut c, &["EXISTS", &format!("bad-{name}")]), 0);
    }
    assert!(server.alive());
    assert_eq!(
        query(&mut c, &["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    assert_eq!(holders(&mut c, "src"), vec![("o".to_string(), 1)]);
}

#[test]
fn the_server_wide_waiter_bound_is_enforced() {
    let server = Server::start_with(&["--lock.max-total-waiters", "2"]);
    let mut c = server.client();
    let mut handles = Vec::new();
    for i in 0..2 {
        let key = format!("tw{i}");
        int(&mut c, &["LOCK.ACQUIRE", &key, "holder", "600000"]);
        handles.push(spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", &key, "w", "1000", "WAIT", "1500"],
            1,
        ));
    }
    int(&mut c, &["LOCK.ACQUIRE", "tw2", "holder", "600000"]);
    let e = err(&mut c, &["LOCK.ACQUIRE", "tw2", "w", "1000", "WAIT", "0"]);
    assert!(
        e.starts_with("MAXWAITERS") && e.contains("max-total-waiters"),
        "{e}"
    );
    assert_eq!(waiting(&mut c, "tw2"), 0);
    for h in handles {
        assert!(matches!(h.join(), Ok(Value::Nil)));
    }
    // Once those timed out there is room again.
    let mut w = server.client();
    let late =
        thread::spawn(move || query(&mut w, &["LOCK.ACQUIRE", "tw2", "w", "1000", "WAIT", "100"]));
    assert!(matches!(late.join().unwrap(), Ok(Value::Nil)));
}

/// AOF files written before the binary LOCK.SYNC state carry the text form
/// (`count mode expires_at token fence counter`): they still load.
#[test]
fn an_aof_with_the_text_sync_state_of_earlier_versions_still_loads() {
    let mut server = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "current", "me", "600000"]);
    server.signal("KILL");
    wait_until("the server is dead", || !server.alive());
    let incr = server.incr_aof();
    let expires_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        + 600_000;
    let state = format!("2 read {expires_at} 7 7 9");
    let mut aof = std::fs::OpenOptions::new()
        .append(true)
        .open(&incr)
        .expect("open aof");
    use std::io::Write;
    aof.write_all(&resp(&["SELECT", "0"])).expect("write");
    aof.write_all(&resp(&["LOCK.SYNC", "legacy", "old-owner", &state]))
        .expect("write");
    drop(aof);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(
        holders(&mut c, "legacy"),
        vec![("old-owner".to_string(), 2)]
    );
    assert_eq!(info_int(&mut c, "legacy", "fence"), 7);
    assert_eq!(holders(&mut c, "current"), vec![("me".to_string(), 1)]);
}
