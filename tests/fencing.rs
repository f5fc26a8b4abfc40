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
    let aof = server.incr_aof();
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

/// 2^53 - 1: the largest integer a double (a Lua number, a JavaScript `Number`) holds exactly.
const MAX_EXACT: i64 = (1 << 53) - 1;

/// Inside `EVAL` every integer reply becomes a Lua number (a double): two successive grants
/// must still differ there, by exactly 1 on an otherwise idle server, and the fence LOCK.INFO
/// reports to a read-only script must come back as the very token that was granted.
#[test]
fn tokens_read_through_eval_compare_correctly() {
    let server = Server::start();
    let mut c = server.client();
    let script = "local a = redis.call('LOCK.ACQUIRE', KEYS[1], 'o', 60000) \
                  redis.call('LOCK.RELEASE', KEYS[1], 'o') \
                  local b = redis.call('LOCK.ACQUIRE', KEYS[1], 'o', 60000) \
                  redis.call('LOCK.RELEASE', KEYS[1], 'o') \
                  if a == b then return -1 end \
                  return b - a";
    assert_eq!(
        int(&mut c, &["EVAL", script, "1", "eval-key"]),
        1,
        "two successive grants, compared in Lua"
    );
    let token = int(&mut c, &["LOCK.ACQUIRE", "eval-key", "holder", "60000"]);
    assert!((1..=MAX_EXACT).contains(&token), "token {token}");
    let fence = "local r = redis.call('LOCK.INFO', KEYS[1]) return r[2]";
    assert_eq!(
        int(&mut c, &["EVAL_RO", fence, "1", "eval-key"]),
        token,
        "LOCK.INFO's fence through EVAL_RO"
    );
    // A script that fences a write with the token it was given.
    let guarded = "local r = redis.call('LOCK.INFO', KEYS[1]) \
                   if r[2] == tonumber(ARGV[1]) then return 1 else return 0 end";
    assert_eq!(
        int(
            &mut c,
            &["EVAL_RO", guarded, "1", "eval-key", &token.to_string()]
        ),
        1
    );
    assert_eq!(
        int(
            &mut c,
            &[
                "EVAL_RO",
                guarded,
                "1",
                "eval-key",
                &(token - 1).to_string()
            ]
        ),
        0,
        "the previous token is told apart"
    );
}

/// Tokens stay at most 2^53 - 1 and keep increasing through everything that raises the
/// counter to the clock's floor: a module load, `DEBUG RELOAD`, a restart from the AOF, and a
/// replica's promotion.
#[test]
fn tokens_stay_below_2_53_after_reload_restart_and_promotion() {
    let mut server = Server::start_with(&["--appendonly", "yes", "--enable-debug-command", "yes"]);
    let mut c = server.client();
    let mut last = grant_many(&mut c, "first", 5);
    assert!(last <= MAX_EXACT, "first tokens: {last}");
    assert_eq!(query(&mut c, &["DEBUG", "RELOAD"]).unwrap(), Value::Okay);
    let next = next_token(&mut c, "after-reload");
    assert!(
        next > last && next <= MAX_EXACT,
        "after DEBUG RELOAD: {next} (before {last})"
    );
    last = next;
    server.crash_and_restart();
    let mut c = server.client();
    let next = next_token(&mut c, "after-restart");
    assert!(
        next > last && next <= MAX_EXACT,
        "after a restart: {next} (before {last})"
    );

    let (master, replica) = master_and_replica(&[]);
    let mut m = master.client();
    let max = grant_many(&mut m, "seen", 5);
    assert_eq!(int(&mut m, &["WAIT", "1", "5000"]), 1);
    drop(master);
    let mut r = replica.client();
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    let next = next_token(&mut r, "after-promotion");
    assert!(
        next > max && next <= MAX_EXACT,
        "after promotion: {next} (before {max})"
    );
}

/// A token from a pre-release build, whose floor was `unix_ms << 20` (about 1.88e18 in 2026;
/// this one is that floor in 2040, so that the pre-release build itself, whose own counter
/// stays below it, shows what this test checks).
const LEGACY: u64 = (1 << 61) + 5;

/// `key`'s DUMP with its fence and its holder's token replaced by `token`.
fn forged_legacy_dump(c: &mut Connection, key: &str, token: u64) -> Vec<u8> {
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    let mut d = ModuleDump::parse(&payload).expect("a lock value");
    // fence, holder count, owner, mode, count, expiry, token, ...
    d.fields[0] = Field::Unsigned(token);
    d.fields[6] = Field::Unsigned(token);
    d.payload()
}

fn warnings(server: &Server) -> Vec<String> {
    std::fs::read_to_string(server.dir.join("lock.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("above 2^53-1"))
        .map(str::to_string)
        .collect()
}

/// A lock value carrying a token above 2^53 - 1 (written by a pre-release build) is accepted:
/// the counter keeps counting from it, never goes back (through RESTORE, an RDB's aux counter
/// and value, a replica's full sync and LOCK.SYNC stream, a promotion), and each occasion logs
/// one warning, not one per grant.
#[test]
fn a_counter_from_a_pre_release_build_keeps_counting_and_is_reported_once() {
    let mut server = Server::start_with(&["--logfile", "lock.log"]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "model", "old-owner", "600000"]);
    let payload = forged_legacy_dump(&mut c, "model", LEGACY);
    redis::cmd("RESTORE")
        .arg("legacy")
        .arg(0)
        .arg(payload)
        .query::<()>(&mut c)
        .expect("a value from a pre-release build is restored");
    assert_eq!(info_int(&mut c, "legacy", "fence"), LEGACY as i64);
    let first = next_token(&mut c, "fresh");
    assert_eq!(
        first,
        LEGACY as i64 + 1,
        "counting on from the restored token"
    );
    let after = grant_many(&mut c, "many", 50);
    assert!(after > first);
    let logged = warnings(&server);
    assert_eq!(
        logged.len(),
        1,
        "one warning for the RESTORE, none per grant: {logged:#?}"
    );

    // Saved and loaded: the RDB's counter and value carry it; loading ends with one warning.
    assert_eq!(query(&mut c, &["SAVE"]).unwrap(), Value::Okay);
    server.crash_and_restart();
    let mut c = server.client();
    let next = next_token(&mut c, "after-restart");
    assert!(next > after, "after a restart: {next} (before {after})");
    let logged = warnings(&server);
    assert_eq!(logged.len(), 2, "one more for the load: {logged:#?}");

    // A replica gets it by full sync, then by LOCK.SYNC; promoted, it continues above.
    let port = server.port.to_string();
    let replica = Server::start_with(&["--logfile", "lock.log", "--replicaof", "127.0.0.1", &port]);
    let mut r = replica.client();
    wait_for_link(&mut r);
    let streamed = grant_many(&mut c, "streamed", 20);
    assert_eq!(int(&mut c, &["WAIT", "1", "5000"]), 1);
    drop(c);
    drop(server);
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    let promoted = next_token(&mut r, "after-promotion");
    assert!(
        promoted > streamed,
        "after promotion: {promoted} (before {streamed})"
    );
    let logged = warnings(&replica);
    assert!(
        (1..=2).contains(&logged.len()),
        "the replica warns per occasion (full sync, promotion), not per grant: {logged:#?}"
    );
}
