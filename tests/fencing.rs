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

/// With lock.legacy-tokens on, a lock value carrying a token above 2^53 - 1 (written by a
/// pre-release build) is accepted: the counter keeps counting from it, never goes back
/// (through RESTORE, an RDB's aux counter and value, a replica's full sync and LOCK.SYNC stream,
/// a promotion), and each occasion logs one warning, not one per grant. (Without the setting
/// such values are refused: see `a_restore_of_a_token_above_2_53_is_refused...`.)
#[test]
fn a_counter_from_a_pre_release_build_keeps_counting_and_is_reported_once() {
    let mut server = Server::start_with(&["--logfile", "lock.log", "--lock.legacy-tokens", "yes"]);
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
    // With the setting on the counter starts at the pre-release floor (said once, at load),
    // and the RESTORE that carried a token above it is said once more; no grant says anything.
    let logged = warnings(&server);
    assert_eq!(
        logged.len(),
        2,
        "one warning at load, one for the RESTORE, none per grant: {logged:#?}"
    );

    // Saved and loaded: the RDB's counter and value carry it; loading ends with one warning.
    assert_eq!(query(&mut c, &["SAVE"]).unwrap(), Value::Okay);
    server.crash_and_restart();
    let mut c = server.client();
    let next = next_token(&mut c, "after-restart");
    assert!(next > after, "after a restart: {next} (before {after})");
    let logged = warnings(&server);
    assert_eq!(
        logged.len(),
        4,
        "two more for the restart (module load, end of loading): {logged:#?}"
    );

    // A replica gets it by full sync, then by LOCK.SYNC; promoted, it continues above.
    let port = server.port.to_string();
    let replica = Server::start_with(&[
        "--logfile",
        "lock.log",
        "--lock.legacy-tokens",
        "yes",
        "--replicaof",
        "127.0.0.1",
        &port,
    ]);
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
        (1..=3).contains(&logged.len()),
        "the replica warns per occasion (module load, full sync, promotion), not per grant: \
         {logged:#?}"
    );
}

// ---- Never the same token twice (version 4) ----

/// 2^53 - 1 as a stored (unsigned) field.
const MAX_EXACT_U: u64 = (1 << 53) - 1;

/// The DUMP of a compact lock (one holder, nothing else) with its token and fence replaced
/// (fields: fence, holder count, owner, mode, count, expiry, token, ...), checksum resealed.
fn with_token(original: &[u8], token: u64) -> Vec<u8> {
    let mut d = ModuleDump::parse(original).expect("a module value payload");
    assert!(
        matches!((&d.fields[0], &d.fields[6]), (Field::Unsigned(a), Field::Unsigned(b)) if a == b),
        "{:?}",
        d.fields
    );
    d.fields[0] = Field::Unsigned(token);
    d.fields[6] = Field::Unsigned(token);
    d.payload()
}

/// A real DUMP of a compact lock held by "old" for 10 minutes.
fn compact_dump(c: &mut Connection) -> Vec<u8> {
    int(c, &["LOCK.ACQUIRE", "dump:src", "old", "600000"]);
    let payload: Vec<u8> = redis::cmd("DUMP").arg("dump:src").query(c).expect("DUMP");
    int(c, &["DEL", "dump:src"]);
    payload
}

fn restore_payload(c: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("RESTORE").arg(key).arg(0).arg(payload).query(c)
}

fn log_of(server: &Server) -> String {
    std::fs::read_to_string(server.dir.join("lock.log")).unwrap_or_default()
}

/// Without lock.legacy-tokens, a RESTORE whose token is above 2^53 - 1 is refused and changes
/// nothing: the next token follows the last one. (It used to move the module-wide counter
/// there: at 2^63 - 1 every later grant on every key returned 9223372036854775807, and at
/// 2^53 + 10 every later token was inexact, both for good.)
#[test]
fn a_restore_of_a_token_above_2_53_is_refused_and_the_counter_is_unchanged() {
    let server = Server::start_with(&["--logfile", "lock.log"]);
    let mut c = server.client();
    let payload = compact_dump(&mut c);
    for token in [u64::MAX >> 1, MAX_EXACT_U + 11] {
        let before = int(&mut c, &["LOCK.ACQUIRE", "probe", "a", "600000"]);
        int(&mut c, &["LOCK.RELEASE", "probe", "a"]);
        let restored = restore_payload(&mut c, "forged", &with_token(&payload, token));
        let after = int(&mut c, &["LOCK.ACQUIRE", "probe", "b", "600000"]);
        int(&mut c, &["LOCK.RELEASE", "probe", "b"]);
        assert!(
            restored.is_err() && after == before + 1,
            "token {token}: RESTORE {restored:?}, tokens {before} then {after}"
        );
        assert_eq!(int(&mut c, &["EXISTS", "forged"]), 0);
    }
    // The exact range's last token is accepted (then the counter is at its end).
    let log = log_of(&server);
    assert!(
        log.contains("lock.legacy-tokens yes") && log.contains("lock key \"forged\""),
        "the log names the key and the way out:\n{log}"
    );
}

/// With lock.legacy-tokens on, a restored token above 2^53 - 1 is accepted and later tokens
/// go on above it; a counter at 2^63 - 1 then refuses every new hold with an error naming the
/// cause (re-entries still work), never handing out the same token twice, and that survives
/// deleting the key and a restart from the RDB.
#[test]
fn with_legacy_tokens_tokens_go_on_above_restored_ones_and_the_end_refuses_new_holds() {
    let mut server = Server::start_with(&[
        "--lock.legacy-tokens",
        "yes",
        "--save",
        "",
        "--dbfilename",
        "dump.rdb",
    ]);
    let mut c = server.client();
    let payload = compact_dump(&mut c);
    restore_payload(&mut c, "legacy", &with_token(&payload, MAX_EXACT_U + 10)).expect("accepted");
    let t1 = int(&mut c, &["LOCK.ACQUIRE", "k1", "a", "600000"]);
    let t2 = int(&mut c, &["LOCK.ACQUIRE", "k2", "a", "600000"]);
    assert!(
        t1 as u64 > MAX_EXACT_U + 10 && t2 > t1,
        "tokens {t1}, {t2} after a restored {}",
        MAX_EXACT_U + 10
    );
    // A waiter on k1 whose turn comes once the counter is at its end.
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k1", "w", "600000", "WAIT", "0"],
        1,
    );
    let end = u64::MAX >> 1;
    restore_payload(&mut c, "end", &with_token(&payload, end)).expect("accepted");
    let refused = err(&mut c, &["LOCK.ACQUIRE", "k3", "a", "600000"]);
    assert!(refused.contains("fencing-token counter"), "{refused}");
    // The holder of the last token re-enters: no new token needed.
    assert_eq!(
        int(&mut c, &["LOCK.ACQUIRE", "end", "old", "600000"]),
        end as i64
    );
    // k1's waiter gets the error when its turn comes, and leaves the queue.
    int(&mut c, &["LOCK.RELEASE", "k1", "a"]);
    let answered = waiter.join();
    assert!(
        matches!(&answered, Err(e) if format!("{e:?}").contains("fencing-token counter")),
        "{answered:?}"
    );
    assert_eq!(int(&mut c, &["EXISTS", "k1"]), 0);
    // Deleting the key that carried the end changes nothing; nor does a restart from the RDB.
    int(&mut c, &["DEL", "end", "legacy"]);
    assert!(err(&mut c, &["LOCK.ACQUIRE", "k3", "a", "600000"]).contains("fencing-token counter"));
    assert_eq!(query(&mut c, &["SAVE"]).unwrap(), Value::Okay);
    server.crash_and_restart();
    let mut c = server.client();
    for key in ["k3", "k4"] {
        let again = query(&mut c, &["LOCK.ACQUIRE", key, "a", "600000"]);
        assert!(
            matches!(&again, Err(e) if format!("{e:?}").contains("fencing-token counter")),
            "after the restart: {again:?}"
        );
    }
}

/// A semaphore at the counter's end: the waiter that would need a new token is refused when
/// its turn comes, and the one behind it, an owner asking one more permit (no new token), is
/// then granted, in order.
#[test]
fn at_the_counters_end_a_refused_waiter_leaves_and_the_one_behind_it_is_served() {
    let server = Server::start_with(&["--lock.legacy-tokens", "yes"]);
    let mut c = server.client();
    let payload = compact_dump(&mut c);
    let p1 = int(&mut c, &["LOCK.SEMACQUIRE", "sem", "p1", "2", "600000"]);
    int(&mut c, &["LOCK.SEMACQUIRE", "sem", "p2", "2", "600000"]);
    let p3 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "sem", "p3", "2", "600000", "WAIT", "0"],
        1,
    );
    let p1_again = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "sem", "p1", "2", "600000", "WAIT", "0"],
        2,
    );
    restore_payload(&mut c, "end", &with_token(&payload, u64::MAX >> 1)).expect("accepted");
    int(&mut c, &["LOCK.RELEASE", "sem", "p2"]);
    let refused = p3.join();
    assert!(
        matches!(&refused, Err(e) if format!("{e:?}").contains("fencing-token counter")),
        "{refused:?}"
    );
    assert_eq!(p1_again.token(), p1, "p1's second permit keeps its token");
    assert_eq!(holders(&mut c, "sem"), vec![("p1".to_string(), 2)]);
    assert_eq!(waiting(&mut c, "sem"), 0);
}

/// Starts the server binary on `dir` with `args` and the module; returns whether it exited
/// (within the patience) and its log.
fn start_expecting_exit(dir: &std::path::Path, port: u16, args: &[&str]) -> (bool, String) {
    let mut child = std::process::Command::new(server_binary())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .args(["--logfile", "lock.log", "--loadmodule"])
        .arg(module_path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the server");
    let exited = poll_within(PATIENCE, || matches!(child.try_wait(), Ok(Some(_)))).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("lock.log")).unwrap_or_default();
    (exited, log)
}

/// A data set written with lock.legacy-tokens on (a key restored with a token above 2^53 - 1)
/// is refused at load without it: from the RDB (the load fails, the log names the key and the
/// way out) and from the AOF (Redis goes on past a failed command, so the module stops the
/// server when the load ends). With the setting on, the same files load and tokens go on
/// above the stored ones.
#[test]
fn an_rdb_or_aof_with_a_legacy_token_is_refused_at_load_without_legacy_tokens() {
    for aof in [false, true] {
        let persistence: &[&str] = if aof {
            &[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ]
        } else {
            &[
                "--appendonly",
                "no",
                "--save",
                "",
                "--dbfilename",
                "dump.rdb",
            ]
        };
        let mut args = vec!["--lock.legacy-tokens", "yes"];
        args.extend_from_slice(persistence);
        let server = Server::start_with(&args);
        let mut c = server.client();
        let payload = compact_dump(&mut c);
        let stored = MAX_EXACT_U + 1000;
        restore_payload(&mut c, "old:key", &with_token(&payload, stored)).expect("accepted");
        let granted = int(&mut c, &["LOCK.ACQUIRE", "other", "a", "600000"]);
        if !aof {
            assert_eq!(query(&mut c, &["SAVE"]).unwrap(), Value::Okay);
        }
        let dir = std::env::temp_dir().join(format!(
            "redis-lock-legacy-load-{}-{}-{aof}",
            std::process::id(),
            server.port
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        drop(c);
        let port = server.port;
        let from = server.dir.clone();
        // Copy the data set (the RDB, or the AOF directory) while the server still runs.
        let status = std::process::Command::new("cp")
            .arg("-r")
            .arg(if aof {
                from.join("appendonlydir")
            } else {
                from.join("dump.rdb")
            })
            .arg(&dir)
            .status()
            .expect("cp");
        assert!(status.success());
        drop(server);
        let (exited, log) = start_expecting_exit(&dir, port, persistence);
        assert!(
            exited,
            "aof {aof}: the server started on a legacy token without lock.legacy-tokens; log:\n{log}"
        );
        assert!(
            (log.contains("lock key \"old:key\"") || log.contains("lock key \"other\""))
                && log.contains("lock.legacy-tokens yes"),
            "aof {aof}: the log names the key and the way out:\n{log}"
        );
        // With the setting on, it loads and goes on above.
        let mut on = vec!["--lock.legacy-tokens", "yes"];
        on.extend_from_slice(persistence);
        let server = ServerBuilder::new()
            .args(&on)
            .args(["--dir", dir.to_str().unwrap()])
            .start()
            .unwrap_or_else(|e| panic!("aof {aof}: {e}"));
        let mut c = server.client();
        assert_eq!(holders(&mut c, "old:key"), vec![("old".to_string(), 1)]);
        let next = int(&mut c, &["LOCK.ACQUIRE", "next", "a", "600000"]);
        assert!(next > granted, "aof {aof}: {next} after {granted}");
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
