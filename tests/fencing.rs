//! Fencing tokens never go backwards, with real faults: restarts with any persistence setting
//! (none, AOF `everysec` killed right after grants, an RDB older than the last grants) and
//! failovers where the promoted replica missed the last grants (manual, Sentinel, Cluster).

use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

fn next_token(c: &mut Connection, key: &str) -> i64 {
    int(c, &["LOCK.ACQUIRE", key, "after", "600000"])
}

#[test]
fn a_restart_without_persistence_continues_above_every_token() {
    let mut server = Server::start_with(&["--save", "", "--appendonly", "no"]);
    let mut c = server.client();
    let max = grant_many(&mut c, "np", 50);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(int(&mut c, &["DBSIZE"]), 0, "nothing was persisted");
    let next = next_token(&mut c, "np:0");
    assert!(next > max, "token {next} after the restart, {max} before");
}

/// The AOF file that receives new writes (Redis 7 / Valkey 8 multi-part AOF).
fn incr_aof(server: &Server) -> std::path::PathBuf {
    let dir = server.dir.join("appendonlydir");
    std::fs::read_dir(&dir)
        .expect("appendonlydir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incr AOF file")
}

#[test]
fn sigkill_with_appendfsync_everysec_right_after_grants_continues_above_them() {
    let mut server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
    ]);
    let mut c = server.client();
    // Some grants reach the disk (everysec: give the fsync its second)...
    grant_many(&mut c, "early", 20);
    thread::sleep(Duration::from_millis(1500));
    let aof = incr_aof(&server);
    let synced = std::fs::metadata(&aof).expect("aof").len();
    // ...the last ones do not: they were replied, then the machine lost what had not been
    // fsynced. A process kill alone loses nothing the kernel has, so the lost tail is cut off
    // the file by hand, exactly as a power cut with `everysec` would leave it.
    let max = grant_many(&mut c, "late", 200);
    server.signal("KILL");
    wait_until("the server is dead", || !server.alive());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&aof)
        .expect("open aof");
    file.set_len(synced).expect("truncate aof");
    drop(file);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(
        int(&mut c, &["EXISTS", "early:0"]),
        1,
        "the synced part was loaded"
    );
    assert_eq!(
        int(&mut c, &["EXISTS", "late:0"]),
        0,
        "the lost tail is gone"
    );
    let next = next_token(&mut c, "late:0");
    assert!(next > max, "token {next} after the restart, {max} before");
}

#[test]
fn a_restart_from_an_rdb_older_than_the_last_grants_continues_above_them() {
    let mut server = Server::start_with(&["--save", "", "--appendonly", "no"]);
    let mut c = server.client();
    let saved = grant_many(&mut c, "saved", 10);
    assert_eq!(query(&mut c, &["SAVE"]).unwrap(), Value::Okay);
    // Grants after the snapshot, never saved (SIGKILL: no save on shutdown).
    let max = grant_many(&mut c, "lost", 100);
    assert!(max > saved);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(int(&mut c, &["EXISTS", "saved:0"]), 1, "the RDB was loaded");
    assert_eq!(
        int(&mut c, &["EXISTS", "lost:0"]),
        0,
        "the later grants were lost"
    );
    let next = next_token(&mut c, "lost:0");
    assert!(next > max, "token {next} after the restart, {max} before");
}

#[test]
fn a_promoted_replica_that_missed_the_last_grants_continues_above_them() {
    let (master, replica) = master_and_replica(&[]);
    let mut m = master.client();
    let replicated = grant_many(&mut m, "seen", 10);
    assert_eq!(int(&mut m, &["WAIT", "1", "5000"]), 1);
    // The replica stops, and the master drops its link (as a network partition would), so
    // what the master grants next never reaches the replica; then the master dies.
    replica.signal("STOP");
    int(&mut m, &["CLIENT", "KILL", "TYPE", "replica"]);
    let max = grant_many(&mut m, "missed", 100);
    assert!(max > replicated);
    drop(m);
    drop(master);
    replica.signal("CONT");
    let mut r = replica.client();
    assert_eq!(
        int(&mut r, &["EXISTS", "missed:0"]),
        0,
        "the replica missed them"
    );
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    for key in ["missed:0", "seen:0-new", "other"] {
        let next = next_token(&mut r, key);
        assert!(
            next > max,
            "{key}: token {next} after failover, {max} before"
        );
    }
}
