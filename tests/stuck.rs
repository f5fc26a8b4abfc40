//! Finding a stuck lock in one command: LOCK.QUEUES names each queue's holders and how long
//! they have held the key, and LOCK.INFO's holder entries carry the same hold age
//! (`[owner, count, ttl, held]`). The age counts from the hold's first grant (a re-entry or
//! an extend does not restart it), survives a restart (RDB encoding 3 keeps each hold's
//! start) and reaches replicas; a hold whose start this server cannot know shows -1.

use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

const LONG: &str = "600000";

fn row<'a>(rows: &'a [QueueRow], key: &str) -> &'a QueueRow {
    rows.iter()
        .find(|r| r.key == key)
        .unwrap_or_else(|| panic!("no row for {key}: {rows:?}"))
}

#[test]
fn lock_queues_names_the_holders_of_each_queue_and_how_long_they_have_held() {
    let server = Server::start();
    let mut c = server.client();
    let mut c1 = server.client();
    query(&mut c1, &["SELECT", "1"]).unwrap();

    // An exclusive lock held for a while, with a waiter behind it.
    int(&mut c, &["LOCK.ACQUIRE", "stuck", "worker-7", LONG]);
    thread::sleep(Duration::from_millis(150));
    let _w1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "stuck", "next", LONG, "WAIT", "0"],
        1,
    );
    // A read lock shared by 30 readers in database 1, with a writer waiting.
    for i in 0..30 {
        int(
            &mut c1,
            &["LOCK.RWREAD", "shared", &format!("reader-{i:02}"), LONG],
        );
    }
    let _w2 = spawn_waiter_in(
        &server,
        &mut c1,
        "1",
        &["LOCK.ACQUIRE", "shared", "writer", LONG, "WAIT", "0"],
        1,
    );

    let rows = queue_rows(&mut c, &[]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let stuck = row(&rows, "stuck");
    assert_eq!((stuck.db, stuck.waiting, stuck.holding), (0, 1, 1));
    assert_eq!(stuck.holders.len(), 1);
    assert_eq!(stuck.holders[0].0, "worker-7");
    let held = stuck.holders[0].1;
    assert!((150..60_000).contains(&held), "held {held}");
    // The same age in LOCK.INFO (read after, so at least as large).
    let entries = holder_entries(&mut c, "stuck");
    assert_eq!(entries.len(), 1);
    assert!(entries[0].3 >= held, "{entries:?} {held}");

    // 30 holders: the count, and 10 of them by name, sorted, each with its age.
    let shared = row(&rows, "shared");
    assert_eq!((shared.db, shared.waiting, shared.holding), (1, 1, 30));
    assert_eq!(shared.holders.len(), 10, "{shared:?}");
    assert!(shared.holders.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(shared
        .holders
        .iter()
        .all(|(o, held)| o.starts_with("reader-") && *held >= 0));

    // LOCK.QUEUES reads other databases' keys without changing the caller's database.
    int(&mut c, &["LOCK.ACQUIRE", "mine", "me", LONG]);
    assert_eq!(holders(&mut c, "mine"), vec![("me".to_string(), 1)]);

    // The holder goes: the queue's next holder is named, with a fresh age.
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "stuck", "worker-7"]), 0);
    wait_until("the waiter holds", || {
        holders(&mut c, "stuck") == vec![("next".to_string(), 1)]
    });
    assert!(queue_rows(&mut c, &[]).iter().all(|r| r.key != "stuck"));
}

/// A queue whose key has no holder (waiters behind a lock-delay) has an empty list.
#[test]
fn a_queue_behind_a_lock_delay_names_no_holder() {
    let server = Server::start();
    let mut c = server.client();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "gone", "100", "LOCKDELAY", "600000"],
    );
    let _w = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", "0"],
        1,
    );
    wait_until("the hold expired into its delay", || {
        holders(&mut c, "k").is_empty()
    });
    let rows = queue_rows(&mut c, &[]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].holding, rows[0].holders.len()), (0, 0), "{rows:?}");
}

#[test]
fn the_hold_age_counts_from_the_first_grant_and_survives_a_restart() {
    let mut server = Server::start_with(&["--save", "", "--appendonly", "no"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", LONG]);
    int(&mut c, &["LOCK.SEMACQUIRE", "s", "p", "3", LONG]);
    thread::sleep(Duration::from_millis(120));
    // A re-entry and an extend keep the start.
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", LONG]);
    int(&mut c, &["LOCK.EXTEND", "k", "o", LONG]);
    let before = holder_entries(&mut c, "k");
    assert_eq!((before[0].0.as_str(), before[0].1), ("o", 2));
    assert!(before[0].3 >= 120, "{before:?}");
    assert!(holder_entries(&mut c, "s")[0].3 >= 120);

    // Saved and loaded again: the age goes on from where it was.
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    server.crash_and_restart();
    let mut c = server.client();
    let after = holder_entries(&mut c, "k");
    assert_eq!((after[0].0.as_str(), after[0].1), ("o", 2));
    assert!(after[0].3 >= before[0].3, "{before:?} then {after:?}");
    assert!(after[0].3 < 60_000, "{after:?}");
    assert!(holder_entries(&mut c, "s")[0].3 >= 120);
}

/// A replica learns holds from LOCK.SYNC, which does not carry the start: it counts from when
/// the state arrives (within the replication lag), and keeps that start across re-entries.
/// A full resynchronisation (an RDB) carries the master's starts exactly.
#[test]
fn a_replica_shows_hold_ages_from_the_stream_and_from_a_full_sync() {
    let master = Server::start();
    let mut m = master.client();
    int(&mut m, &["LOCK.ACQUIRE", "before-sync", "o", LONG]);
    thread::sleep(Duration::from_millis(200));
    let port = master.port.to_string();
    let replica = Server::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut r = replica.client();
    wait_for_link(&mut r);
    // Came with the full sync: the master's start.
    wait_until("the replica has the lock", || {
        !holder_entries(&mut r, "before-sync").is_empty()
    });
    let synced = holder_entries(&mut r, "before-sync");
    assert!(synced[0].3 >= 200, "{synced:?}");

    // Came by the stream: counted from its arrival.
    int(&mut m, &["LOCK.ACQUIRE", "streamed", "o", LONG]);
    wait_until("the replica has the stream's lock", || {
        !holder_entries(&mut r, "streamed").is_empty()
    });
    thread::sleep(Duration::from_millis(150));
    int(&mut m, &["LOCK.ACQUIRE", "streamed", "o", LONG]);
    wait_until("the re-entry arrived", || {
        holder_entries(&mut r, "streamed")[0].1 == 2
    });
    let on_replica = holder_entries(&mut r, "streamed")[0].3;
    let on_master = holder_entries(&mut m, "streamed")[0].3;
    assert!(on_replica >= 150, "replica {on_replica}");
    assert!(
        on_replica <= on_master + 1_000,
        "replica {on_replica}, master {on_master}"
    );
}

/// Replayed from an AOF file without an RDB preamble, a hold's LOCK.SYNC arrives at load time:
/// its start is unknown (-1), not the load.
#[test]
fn a_hold_replayed_from_an_aof_without_preamble_has_an_unknown_age() {
    let mut server = Server::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        "no",
    ]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", LONG]);
    server.crash_and_restart();
    let mut c = server.client();
    let entries = holder_entries(&mut c, "k");
    assert_eq!((entries[0].0.as_str(), entries[0].3), ("o", -1));
    let rows = {
        let _w = spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", "0"],
            1,
        );
        queue_rows(&mut c, &[])
    };
    assert_eq!(rows[0].holders, vec![("o".to_string(), -1)]);
}
