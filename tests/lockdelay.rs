//! LOCKDELAY: after an exclusive hold ends other than by release (its TTL passes, its bound
//! connection closes) nobody gets the lock until the delay is over, waiters and newcomers
//! alike; the head waiter gets it right after. RELEASE imposes none; the delay survives restart
//! and replication; DEL ends it. Bad options change nothing.

use std::time::{Duration, Instant};

use redis_lock_testkit::*;

const LONG: &str = "600000";

fn delay_ms(c: &mut Connection, key: &str) -> i64 {
    info_int(c, key, "delay")
}

fn mode(c: &mut Connection, key: &str) -> String {
    match info(c, key).and_then(|m| m.get("mode").cloned()) {
        Some(Value::SimpleString(s)) => s,
        Some(Value::BulkString(b)) => String::from_utf8_lossy(&b).to_string(),
        other => panic!("mode: {other:?}"),
    }
}

/// After the hold's TTL (300 ms) and delay (1200 ms): the waiter must not be served before
/// 1500 ms from the acquire (less [`CLOCK_MARGIN`]: the server's millisecond clock truncates, so
/// its deadline can fall up to 1 ms before ours), and a newcomer arriving during the delay gets
/// nil.
#[test]
fn after_an_expiry_nobody_gets_the_lock_before_the_delay_ends() {
    let server = Server::start();
    let mut c = server.client();
    let start = Instant::now();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "paused", "300", "LOCKDELAY", "1200"],
    );
    // While held, the key lives until the expiry plus the delay.
    let pttl = int(&mut c, &["PTTL", "k"]);
    assert!((1300..=1500).contains(&pttl), "PTTL while held: {pttl}");
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "next", LONG, "WAIT", "0"],
        1,
    );
    wait_until("the hold expired", || holders(&mut c, "k").is_empty());
    let elapsed = start.elapsed();
    if elapsed < Duration::from_millis(1400) {
        // Still inside the delay: free, delay shown, newcomers refused, PTTL = delay's end.
        assert_eq!(mode(&mut c, "k"), "free");
        let delay = delay_ms(&mut c, "k");
        assert!(delay > 0 && delay <= 1200, "delay {delay}");
        assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "k", "newcomer", LONG]));
        let pttl = int(&mut c, &["PTTL", "k"]);
        assert!(pttl > 0 && pttl <= 1200, "PTTL during the delay: {pttl}");
        assert!(!waiter.is_finished(), "granted during the delay");
    }
    let _ = waiter.token();
    let granted_after = start.elapsed();
    println!("waiter granted {granted_after:?} after the acquire (ttl 300 + delay 1200)");
    assert!(
        granted_after >= Duration::from_millis(1500) - CLOCK_MARGIN,
        "granted after {granted_after:?}"
    );
    assert!(
        granted_after < Duration::from_millis(1500) + PATIENCE / 2,
        "granted after {granted_after:?}"
    );
    assert_eq!(holders(&mut c, "k"), vec![("next".to_string(), 1)]);
    assert_eq!(delay_ms(&mut c, "k"), 0);
}

#[test]
fn a_newcomer_with_wait_queues_behind_the_delay_and_without_a_waiter_the_key_goes() {
    let server = Server::start();
    let mut c = server.client();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "paused", "100", "LOCKDELAY", "800"],
    );
    wait_until("the hold expired", || {
        info(&mut c, "k").is_some_and(|_| holders(&mut c, "k").is_empty())
    });
    // A lock command during the delay ends the expired hold and starts the delay for real.
    let start = Instant::now();
    assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "k", "early", LONG]));
    let reply = int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "patient", LONG, "WAIT", "5000"],
    );
    assert!(reply > 0);
    println!("waited {:?} for the delay", start.elapsed());
    int(&mut c, &["LOCK.RELEASE", "k", "patient"]);
    assert_eq!(
        int(&mut c, &["EXISTS", "k"]),
        0,
        "a release leaves no delay"
    );

    // Nobody waiting: the key disappears when the delay ends.
    int(
        &mut c,
        &["LOCK.ACQUIRE", "gone", "paused", "100", "LOCKDELAY", "300"],
    );
    wait_until("the delay-only key went away", || {
        int(&mut c, &["EXISTS", "gone"]) == 0
    });
    assert!(int(&mut c, &["LOCK.ACQUIRE", "gone", "new", LONG]) > 0);
}

#[test]
fn a_release_imposes_no_delay() {
    let server = Server::start();
    let mut c = server.client();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "h", LONG, "LOCKDELAY", "600000"],
    );
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", LONG]);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "h"]), 1);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "next", LONG, "WAIT", "0"],
        1,
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "h"]), 0);
    let _ = waiter.token();
    assert_eq!(delay_ms(&mut c, "k"), 0);
}

#[test]
fn a_bound_holders_disconnect_starts_the_delay_from_then() {
    let server = Server::start();
    let mut c = server.client();
    let mut holder = server.client();
    int(
        &mut holder,
        &["LOCK.ACQUIRE", "k", "h", LONG, "BIND", "LOCKDELAY", "1000"],
    );
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "next", LONG, "WAIT", "0"],
        1,
    );
    let closed = Instant::now();
    drop(holder);
    wait_until("the bound hold ended", || holders(&mut c, "k").is_empty());
    if closed.elapsed() < Duration::from_millis(900) {
        assert!(delay_ms(&mut c, "k") > 0);
        assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "k", "newcomer", LONG]));
    }
    let _ = waiter.token();
    let took = closed.elapsed();
    println!("granted {took:?} after the bound holder's connection closed (delay 1000)");
    assert!(
        took >= Duration::from_millis(1000) - CLOCK_MARGIN,
        "{took:?}"
    );
    assert!(
        took < Duration::from_millis(1000) + PATIENCE / 2,
        "{took:?}"
    );
}

#[test]
fn del_ends_a_pending_delay() {
    let server = Server::start();
    let mut c = server.client();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "h", "50", "LOCKDELAY", "600000"],
    );
    wait_until("the hold expired", || holders(&mut c, "k").is_empty());
    assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "k", "x", LONG]));
    assert!(delay_ms(&mut c, "k") > 590_000);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "next", LONG, "WAIT", "0"],
        1,
    );
    assert_eq!(int(&mut c, &["DEL", "k"]), 1);
    // The waiter rejoins a fresh lock, without the delay.
    let _ = waiter.token();
    assert_eq!(holders(&mut c, "k"), vec![("next".to_string(), 1)]);
}

#[test]
fn the_delay_survives_restart_and_aof_rewrite() {
    for persist in ["save", "aof", "bgrewriteaof"] {
        let args: &[&str] = match persist {
            "save" => &["--save", "3600 1"],
            "aof" => &["--appendonly", "yes", "--appendfsync", "always"],
            // Without the RDB preamble the rewrite is the module's own LOCK.SYNC commands.
            _ => &[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--aof-use-rdb-preamble",
                "no",
            ],
        };
        let mut server = Server::start_with(args);
        let mut c = server.client();
        int(
            &mut c,
            &["LOCK.ACQUIRE", "k", "h", "50", "LOCKDELAY", "600000"],
        );
        // Held, with its delay to come (the expiry is then due on load).
        int(
            &mut c,
            &["LOCK.ACQUIRE", "held", "h", "1500", "LOCKDELAY", "600000"],
        );
        wait_until("the hold expired", || holders(&mut c, "k").is_empty());
        assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "k", "x", LONG]));
        match persist {
            "save" => {
                query(&mut c, &["SAVE"]).unwrap();
            }
            "bgrewriteaof" => {
                query(&mut c, &["BGREWRITEAOF"]).unwrap();
                wait_until("AOF rewrite finished", || aof_rewrite_finished(&mut c));
            }
            _ => {}
        }
        server.crash_and_restart();
        let mut c = server.client();
        let delay = delay_ms(&mut c, "k");
        assert!(delay > 590_000, "{persist}: delay {delay} after restart");
        assert!(
            is_nil(&mut c, &["LOCK.ACQUIRE", "k", "x", LONG]),
            "{persist}"
        );
        let pttl = int(&mut c, &["PTTL", "k"]);
        assert!(pttl > 590_000, "{persist}: PTTL {pttl}");
        // The hold that was still held expires after the restart and leaves its delay.
        wait_until("the loaded hold expired", || {
            holders(&mut c, "held").is_empty()
        });
        assert!(
            is_nil(&mut c, &["LOCK.ACQUIRE", "held", "x", LONG]),
            "{persist}"
        );
        assert!(delay_ms(&mut c, "held") > 590_000, "{persist}");
    }
}

#[test]
fn the_delay_reaches_replicas_and_ends_there_with_the_master() {
    let (master, replica) = master_and_replica(&["--enable-debug-command", "yes"]);
    let mut r = replica.client();
    let mut m = master.client();
    int(
        &mut m,
        &["LOCK.ACQUIRE", "k", "h", "50", "LOCKDELAY", "1000"],
    );
    wait_until("the hold expired", || holders(&mut m, "k").is_empty());
    // A command makes the master drop the hold and start the delay; the replica follows.
    assert!(is_nil(&mut m, &["LOCK.ACQUIRE", "k", "x", LONG]));
    assert_eq!(int(&mut m, &["WAIT", "1", "5000"]), 1);
    let on_replica = delay_ms(&mut r, "k");
    assert!(on_replica > 0, "replica's delay {on_replica}");
    assert_eq!(mode(&mut r, "k"), "free");
    let dm: String = redis::cmd("DEBUG").arg("DIGEST").query(&mut m).unwrap();
    let dr: String = redis::cmd("DEBUG").arg("DIGEST").query(&mut r).unwrap();
    assert_eq!(dm, dr, "datasets differ");
    wait_until("the key went away on the master", || {
        int(&mut m, &["EXISTS", "k"]) == 0
    });
    wait_until("and on the replica", || int(&mut r, &["DBSIZE"]) == 0);
}

#[test]
fn bad_lock_delay_and_bind_options_change_nothing() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "held", "h", LONG]);
    let snapshot = |c: &mut Connection| (holders(c, "held"), info_int(c, "held", "fence"));
    let before = snapshot(&mut c);
    let cases: &[(&[&str], &str)] = &[
        (
            &["LOCK.ACQUIRE", "k", "o", "1000", "BIND", "BIND"],
            "more than once",
        ),
        (
            &[
                "LOCK.ACQUIRE",
                "k",
                "o",
                "1000",
                "LOCKDELAY",
                "5",
                "LOCKDELAY",
                "5",
            ],
            "more than once",
        ),
        (
            &["LOCK.ACQUIRE", "k", "o", "1000", "WAIT", "5", "wait", "5"],
            "more than once",
        ),
        (
            &["LOCK.ACQUIRE", "k", "o", "1000", "LOCKDELAY"],
            "syntax error",
        ),
        (
            &["LOCK.ACQUIRE", "k", "o", "1000", "BIND", "WAIT"],
            "syntax error",
        ),
        (
            &["LOCK.ACQUIRE", "k", "o", "1000", "LOCKDELAY", "-1"],
            "between 0 and 140737488355328",
        ),
        (
            &[
                "LOCK.ACQUIRE",
                "k",
                "o",
                "1000",
                "LOCKDELAY",
                "140737488355329",
            ],
            "between 0 and 140737488355328",
        ),
        (
            &["LOCK.ACQUIRE", "k", "o", "1000", "LOCKDELAY", "soon"],
            "not an integer",
        ),
        (
            &["LOCK.RWREAD", "k", "o", "1000", "LOCKDELAY", "5"],
            "exclusive locks only",
        ),
        (
            &["LOCK.RWREAD", "k", "o", "1000", "BIND", "NOW"],
            "unknown option",
        ),
    ];
    for (words, expected) in cases {
        let e = err(&mut c, words);
        assert!(e.contains(expected), "{words:?}: {e}");
        assert_eq!(int(&mut c, &["EXISTS", "k"]), 0, "{words:?}");
        let mut on_held = words.to_vec();
        on_held[1] = "held";
        on_held[2] = "h";
        let e = err(&mut c, &on_held);
        assert!(e.contains(expected), "{on_held:?}: {e}");
        assert_eq!(snapshot(&mut c), before, "{on_held:?}");
    }
    // The upper bound itself is accepted.
    assert!(
        int(
            &mut c,
            &[
                "LOCK.ACQUIRE",
                "k",
                "o",
                "1000",
                "lockdelay",
                "140737488355328"
            ]
        ) > 0
    );
}

/// RESP2 clients may read LOCK.INFO by position: the first five fields keep their places and
/// the later ones come after them in the order they were added (`delay`, then `waiters`).
#[test]
fn lock_info_keeps_the_first_five_fields_in_place_and_adds_later_ones_after() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", LONG]);
    let Ok(Value::Array(items)) = query(&mut c, &["LOCK.INFO", "k"]) else {
        panic!("LOCK.INFO is not a flat array in RESP2");
    };
    let names: Vec<String> = items
        .iter()
        .step_by(2)
        .map(|v| match v {
            Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
            other => panic!("field name {other:?}"),
        })
        .collect();
    assert_eq!(
        names,
        [
            "fence",
            "holders",
            "mode",
            "queue",
            "waiting",
            "delay",
            "holders_count",
            "waiters"
        ]
    );
}

/// A lone holder with LOCKDELAY and nobody waiting: its key lives until the delay's end, but the
/// hold itself ends at its expiry, counted and notified then, with no client action.
#[test]
fn a_lone_delayed_holder_expires_on_time_while_its_key_stays() {
    let server = Server::start();
    let mut c = server.client();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "k", "h", "100", "LOCKDELAY", "600000"],
    );
    wait_until(
        "the expiry is counted without a client command on the key",
        || info_field(&mut c, "expirations_total") == 1,
    );
    assert_eq!(info_field(&mut c, "writers"), 0);
    assert_eq!(info_field(&mut c, "locks_held"), 0);
    assert!(
        int(&mut c, &["PTTL", "k"]) > 590_000,
        "the delay keeps the key"
    );
}
