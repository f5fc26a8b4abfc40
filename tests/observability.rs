//! What an operator sees: LOCK.INFO's `waiters`, the keyspace events of every state change, and
//! the INFO figures, each checked against a scripted sequence with known counts and durations.
//! Durations are checked only against bounds the script guarantees (a wait that lasted at least
//! the sleep before its release), never against an upper bound a slow machine could break.

use std::collections::BTreeSet;
use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use redis_lock_testkit::*;

const LONG: &str = "600000";

/// LOCK.INFO `waiters` of `key`: (owner, mode, waited ms, client id), head first.
fn waiters_of(c: &mut Connection, key: &str) -> Vec<(String, String, i64, i64)> {
    let map = info(c, key).expect("the key exists");
    let Value::Array(entries) = &map["waiters"] else {
        panic!("waiters: {map:?}")
    };
    entries
        .iter()
        .map(|e| match e {
            Value::Array(parts) => match &parts[..] {
                [owner, mode, Value::Int(waited), Value::Int(id)] => {
                    (value_text(owner), value_text(mode), *waited, *id)
                }
                other => panic!("waiter entry {other:?}"),
            },
            other => panic!("waiter entry {other:?}"),
        })
        .collect()
}

/// The ids of the clients blocked in `cmd` (CLIENT LIST).
fn blocked_in(c: &mut Connection, cmd: &str) -> BTreeSet<i64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(c)
        .expect("CLIENT LIST");
    list.lines()
        .filter(|l| l.contains(&format!(" cmd={cmd} ")) && l.contains(" flags=b "))
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn lock_info_lists_each_waiter_with_owner_mode_waited_time_and_client() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "holder", LONG]);
    assert!(waiters_of(&mut c, "k").is_empty(), "nobody waits yet");
    let w1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "first", LONG, "WAIT", "0"],
        1,
    );
    let w2 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "k", "second", LONG, "WAIT", "0"],
        2,
    );
    thread::sleep(Duration::from_millis(200));
    let shown = waiters_of(&mut c, "k");
    let owners: Vec<(&str, &str)> = shown
        .iter()
        .map(|(o, m, _, _)| (o.as_str(), m.as_str()))
        .collect();
    assert_eq!(owners, [("first", "write"), ("second", "read")]);
    // Both were queued before the 200 ms sleep; the first no later than the second.
    assert!(shown[0].2 >= 200 && shown[1].2 >= 200, "waited: {shown:?}");
    assert!(shown[0].2 >= shown[1].2, "head waited longest: {shown:?}");
    let ids: BTreeSet<i64> = shown.iter().map(|w| w.3).collect();
    assert_eq!(ids.len(), 2, "two different clients: {shown:?}");
    assert_eq!(
        ids,
        blocked_in(&mut c, "lock.acquire")
            .union(&blocked_in(&mut c, "lock.rwread"))
            .copied()
            .collect()
    );
    // The figures of INFO follow the same queue.
    assert!(info_field(&mut c, "oldest_wait_ms") >= 200);
    assert_eq!(info_field(&mut c, "longest_queue"), 2);

    int(&mut c, &["LOCK.RELEASE", "k", "holder"]);
    w1.token();
    let left = waiters_of(&mut c, "k");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, "second");
    int(&mut c, &["LOCK.RELEASE", "k", "first"]);
    w2.token();
    assert!(waiters_of(&mut c, "k").is_empty());
    assert_eq!(info_field(&mut c, "oldest_wait_ms"), 0);
    assert_eq!(info_field(&mut c, "longest_queue"), 0);
}

#[test]
fn every_state_change_has_a_keyspace_event() {
    let server = Server::start();
    let mut c = server.client();
    query(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Ed"]).unwrap();
    let sub_client =
        redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).expect("client");
    let mut sub = sub_client.get_connection().expect("connect");
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:lock.*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    int(&mut c, &["LOCK.ACQUIRE", "ev", "h", LONG]);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "ev", "h", LONG]), 1);
    // A waiter that times out, one whose connection closes, one that is granted.
    let timed_out = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "ev", "t", LONG, "WAIT", "50"],
        1,
    );
    assert_eq!(timed_out.join().unwrap(), Value::Nil);
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    send_raw(&mut raw, &["LOCK.ACQUIRE", "ev", "gone", LONG, "WAIT", "0"]).unwrap();
    wait_until("the raw waiter is queued", || waiting(&mut c, "ev") == 1);
    drop(raw);
    wait_until("the closed waiter left the queue", || {
        waiting(&mut c, "ev") == 0
    });
    let granted = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "ev", "g", LONG, "WAIT", "0"],
        1,
    );
    int(&mut c, &["LOCK.RELEASE", "ev", "h"]);
    granted.token();

    let expected = [
        "lock.acquire",
        "lock.extend",
        "lock.queued",
        "lock.timeout",
        "lock.queued",
        "lock.cancel",
        "lock.queued",
        "lock.release",
        "lock.acquire",
    ];
    let mut seen = Vec::new();
    for (name, key) in next_events(&mut pubsub, expected.len()) {
        assert_eq!(key, "ev");
        seen.push(name);
    }
    // The release's event and the grant it made may come in either order.
    let (head, tail) = seen.split_at(expected.len() - 2);
    assert_eq!(head, &expected[..expected.len() - 2], "events: {seen:?}");
    let mut tail = tail.to_vec();
    tail.sort();
    assert_eq!(tail, ["lock.acquire", "lock.release"], "events: {seen:?}");
}

#[test]
fn info_counts_handoffs_releases_extends_refusals_and_wait_times() {
    let server = Server::start_with(&["--lock.max-waiters", "1"]);
    let mut c = server.client();
    let before = |c: &mut Connection, f: &str| info_field(c, f);
    for f in [
        "handoffs_total",
        "reentries_total",
        "releases_total",
        "extends_total",
        "maxwaiters_total",
        "given_back_total",
        "wait_ms_count",
        "wait_ms_sum",
    ] {
        assert_eq!(before(&mut c, f), 0, "{f} starts at 0");
    }
    // An immediate grant and its re-entry: not hand-overs.
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", LONG]);
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", LONG]);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "k", "h", LONG]), 1);
    assert!(err(&mut c, &["LOCK.EXTEND", "k", "nobody", LONG]).starts_with("NOTOWNER"));
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", "0"],
        1,
    );
    // The queue is full (max-waiters 1): refused with MAXWAITERS.
    assert!(err(&mut c, &["LOCK.ACQUIRE", "k", "x", LONG, "WAIT", "0"]).starts_with("MAXWAITERS"));
    // The waiter waits at least 150 ms (it was queued before the sleep).
    thread::sleep(Duration::from_millis(150));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "h"]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "h"]), 0);
    waiter.token();
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "w"]), 0);
    assert!(err(&mut c, &["LOCK.RELEASE", "k", "w"]).starts_with("NOTOWNER"));

    assert_eq!(info_field(&mut c, "handoffs_total"), 1);
    assert_eq!(info_field(&mut c, "reentries_total"), 1);
    assert_eq!(
        info_field(&mut c, "releases_total"),
        3,
        "two by h, one by w"
    );
    assert_eq!(info_field(&mut c, "extends_total"), 1);
    assert_eq!(info_field(&mut c, "maxwaiters_total"), 1);
    assert_eq!(info_field(&mut c, "grants_total"), 3);
    assert_eq!(info_field(&mut c, "wait_ms_count"), 1);
    assert!(info_field(&mut c, "wait_ms_sum") >= 150);
    // Cumulative buckets: the wait is above 100 ms, and every bucket above counts it once
    // it fits (60 s certainly).
    assert_eq!(info_field(&mut c, "wait_ms_le_100"), 0);
    assert_eq!(info_field(&mut c, "wait_ms_le_60000"), 1);
    let buckets: Vec<u64> = [1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000]
        .iter()
        .map(|b| info_field(&mut c, &format!("wait_ms_le_{b}")))
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
}

/// The shipped collect script for Prometheus's redis_exporter publishes every `INFO lock`
/// field under the name docs/operations.md gives it (times in seconds, histogram buckets with
/// their `le`, the count also as the `+Inf` bucket): scraped over HTTP from the real exporter
/// after a scripted sequence, each equals the server's own figure, and the known ones have
/// their known values. (tests/prometheus.rs runs the same through a Prometheus server.)
#[test]
fn redis_exporter_with_the_shipped_script_publishes_every_lock_figure() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", LONG]);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "k", "h", LONG]), 1);
    let timed_out = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "t", LONG, "WAIT", "20"],
        1,
    );
    assert_eq!(timed_out.join().unwrap(), Value::Nil);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "k", "r", LONG, "WAIT", "0"],
        1,
    );
    thread::sleep(Duration::from_millis(150));
    int(&mut c, &["LOCK.RELEASE", "k", "h"]);
    waiter.token();

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib/redis_exporter/lock-metrics.lua");
    let exporter = Exporter::start(server.port, &script);
    let metrics = exporter.scrape();
    let values = script_values(&metrics, "redis_script_values");
    let info = info_section(&mut c, "lock");
    let series = lock_series(&info);
    assert!(series.len() >= 25, "INFO lock: {info:?}");
    let mut keys = BTreeSet::new();
    for (name, le, value) in series {
        let key = match le {
            Some(le) => format!("{name} le={le}"),
            None => name,
        };
        let shown = values
            .get(&key)
            .unwrap_or_else(|| panic!("{key} not exported:\n{metrics}"));
        // Nothing changes between the two reads but the ages, which are 0 with nobody waiting.
        assert_eq!(
            *shown, value,
            "{key} exported as {shown}, INFO says {value}"
        );
        keys.insert(key);
    }
    let extra: Vec<&String> = values.keys().filter(|k| !keys.contains(*k)).collect();
    assert!(extra.is_empty(), "exported but not in INFO lock: {extra:?}");
    for (key, value) in [
        ("lock_grants_total", 2.0),
        ("lock_handoffs_total", 1.0),
        ("lock_reentries_total", 0.0),
        ("lock_timeouts_total", 1.0),
        ("lock_extends_total", 1.0),
        ("lock_releases_total", 1.0),
        ("lock_readers", 1.0),
        ("lock_writers", 0.0),
        ("lock_waiters", 0.0),
        ("lock_oldest_wait_seconds", 0.0),
        ("lock_wait_seconds_count", 1.0),
        ("lock_wait_seconds_bucket le=0.1", 0.0),
        ("lock_wait_seconds_bucket le=60", 1.0),
        ("lock_wait_seconds_bucket le=+Inf", 1.0),
    ] {
        assert_eq!(values[key], value, "{key}");
    }
    assert!(values["lock_wait_seconds_sum"] >= 0.15);
    // Seconds keep every ms: the sum is INFO's ms count over 1000, exactly.
    assert_eq!(
        values["lock_wait_seconds_sum"],
        info["lock_wait_ms_sum"].parse::<f64>().unwrap() / 1000.0
    );
}

/// LOCK.QUEUES [key, db, waiting, oldest ms] rows.
fn queues(c: &mut Connection, args: &[&str]) -> Vec<(String, i64, i64, i64)> {
    lock_queues(c, args)
}

#[test]
fn lock_queues_ranks_the_servers_queues_by_age_or_length_across_databases() {
    let server = Server::start();
    let mut c = server.client();
    let mut c1 = server.client();
    query(&mut c1, &["SELECT", "1"]).unwrap();
    for k in ["old", "long", "free"] {
        int(&mut c, &["LOCK.ACQUIRE", k, "h", LONG]);
    }
    int(&mut c1, &["LOCK.ACQUIRE", "other", "h", LONG]);
    assert!(queues(&mut c, &[]).is_empty(), "no waiters, no queues");
    let mut waiters = vec![spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "old", "w", LONG, "WAIT", "0"],
        1,
    )];
    thread::sleep(Duration::from_millis(100));
    for (i, n) in (1..=3).enumerate() {
        let owner = format!("w{i}");
        waiters.push(spawn_waiter(
            &server,
            &mut c,
            &["LOCK.ACQUIRE", "long", &owner, LONG, "WAIT", "0"],
            n,
        ));
    }
    for n in 1..=2 {
        let owner = format!("v{n}");
        waiters.push(spawn_waiter_in(
            &server,
            &mut c1,
            "1",
            &["LOCK.ACQUIRE", "other", &owner, LONG, "WAIT", "0"],
            n,
        ));
    }
    let by_age = queues(&mut c, &[]);
    let names: Vec<(&str, i64, i64)> = by_age
        .iter()
        .map(|(k, db, n, _)| (k.as_str(), *db, *n))
        .collect();
    assert_eq!(
        names,
        [("old", 0, 1), ("long", 0, 3), ("other", 1, 2)],
        "{by_age:?}"
    );
    // The first queued 100 ms before the others.
    assert!(by_age[0].3 >= by_age[1].3 + 100, "{by_age:?}");
    let by_length = queues(&mut c, &["BY", "length"]);
    let names: Vec<&str> = by_length.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ["long", "other", "old"]);
    assert_eq!(queues(&mut c, &["count", "1", "by", "LENGTH"]).len(), 1);
    assert_eq!(queues(&mut c, &["COUNT", "1"])[0].0, "old");
    // The same from any database.
    assert_eq!(queues(&mut c1, &[]).len(), 3);
    for (args, error) in [
        (&["BY", "size"][..], "ERR BY must be AGE or LENGTH"),
        (&["COUNT", "0"][..], "ERR COUNT must be between 1 and 1000"),
        (&["COUNT", "x"][..], "ERR COUNT is not an integer"),
        (&["COUNT"][..], "ERR syntax error"),
        (
            &["COUNT", "1", "COUNT", "2"][..],
            "ERR an option was given more than once",
        ),
        (&["LIMIT", "1"][..], "ERR unknown option"),
    ] {
        let mut words = vec!["LOCK.QUEUES"];
        words.extend_from_slice(args);
        let e = err(&mut c, &words);
        assert!(e.starts_with(error), "{args:?}: {e}");
    }
    assert_eq!(queues(&mut c, &[]).len(), 3, "errors changed nothing");
    // Every waiter's connection closes: no queue is left.
    drop(c1);
    query(
        &mut c,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    )
    .unwrap();
    for w in waiters {
        assert!(w.join().is_err(), "a killed waiter gets no grant");
    }
    wait_until("no queue left", || queues(&mut c, &[]).is_empty());
}

/// A grant decided for a waiter whose connection closes before the reply reaches it is given
/// back (SPEC: such a waiter never holds the lock), counted in `given_back_total`. The release
/// and the kill run in one MULTI, so the kill comes before the server sends any reply.
#[test]
fn a_grant_whose_waiter_closes_before_the_reply_is_given_back_and_counted() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", LONG]);
    let mut w = server.client();
    let id = client_id(&mut w);
    let waiter =
        std::thread::spawn(move || query(&mut w, &["LOCK.ACQUIRE", "k", "w", LONG, "WAIT", "0"]));
    wait_until("the waiter is queued", || waiting(&mut c, "k") == 1);
    let (released, killed): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("LOCK.RELEASE")
        .arg(&["k", "h"][..])
        .cmd("CLIENT")
        .arg(&["KILL", "ID", &id.to_string()][..])
        .query(&mut c)
        .unwrap();
    assert_eq!((released, killed), (0, 1));
    assert!(
        waiter.join().unwrap().is_err(),
        "the killed waiter got no reply"
    );
    assert!(
        info(&mut c, "k").is_none(),
        "the grant was given back: {:?}",
        info(&mut c, "k")
    );
    assert_eq!(info_field(&mut c, "given_back_total"), 1);
    assert_eq!(
        info_field(&mut c, "handoffs_total"),
        1,
        "the grant itself was made"
    );
}

/// The hold-time histogram: one sample per hold that ends by release, expiry (the module's
/// timer or Redis's own key expiry) or disconnect, none for a hold restored from an RDB file.
/// An expired hold counts exactly its TTL, so those samples are known to the millisecond.
#[test]
fn info_hold_times_cover_releases_expiries_and_disconnects() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    let figures = |c: &mut Connection| {
        (
            info_field(c, "hold_ms_count"),
            info_field(c, "hold_ms_sum"),
            info_field(c, "hold_ms_le_50"),
            info_field(c, "hold_ms_le_100"),
        )
    };
    assert_eq!(figures(&mut c), (0, 0, 0, 0));
    // Released after at least 120 ms, with a re-entry and an extend on the way.
    int(&mut c, &["LOCK.ACQUIRE", "released", "h", LONG]);
    int(&mut c, &["LOCK.ACQUIRE", "released", "h", LONG]);
    thread::sleep(Duration::from_millis(120));
    int(&mut c, &["LOCK.EXTEND", "released", "h", LONG]);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "released", "h"]), 1);
    assert_eq!(figures(&mut c).0, 0, "still held once");
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "released", "h"]), 0);
    let (count, sum, le50, le100) = figures(&mut c);
    assert_eq!((count, le50, le100), (1, 0, 0));
    assert!(sum >= 120, "{sum}");

    // Expired with a waiter (the module's timer drops it and hands over): exactly 200 ms.
    int(&mut c, &["LOCK.ACQUIRE", "timed", "e", "200"]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "timed", "w", LONG, "WAIT", "0"],
        1,
    );
    waiter.token();
    let after_expiry = figures(&mut c);
    assert_eq!(after_expiry, (2, sum + 200, 0, 0));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "timed", "w"]), 0);
    let (count, sum, le50, le100) = figures(&mut c);
    assert_eq!(count, 3);

    // Expired alone (Redis removes the key; a compact value): exactly 100 ms.
    int(&mut c, &["LOCK.ACQUIRE", "alone", "x", "100"]);
    wait_until("the key expired", || {
        thread::sleep(Duration::from_millis(20));
        int(&mut c, &["EXISTS", "alone"]) == 0
    });
    assert_eq!(figures(&mut c), (4, sum + 100, le50, le100 + 1));
    let sum = sum + 100;

    // A bound hold whose connection closes after at least 80 ms.
    {
        let mut holder = server.client();
        int(&mut holder, &["LOCK.ACQUIRE", "bound", "b", LONG, "BIND"]);
        thread::sleep(Duration::from_millis(80));
    }
    wait_until("the bound hold ended", || {
        int(&mut c, &["EXISTS", "bound"]) == 0
    });
    let (count, after_bound, _, _) = figures(&mut c);
    assert_eq!(count, 5);
    assert!(after_bound >= sum + 80, "{after_bound} {sum}");

    // Restored from an RDB file, which keeps when the hold began (encoding 3): its end is
    // sampled with the time since its first grant, across the reload.
    int(&mut c, &["LOCK.ACQUIRE", "restored", "r", LONG]);
    thread::sleep(Duration::from_millis(60));
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "restored", "r"]), 0);
    let (count, after_reload, _, _) = figures(&mut c);
    assert_eq!(count, 6);
    assert!(
        after_reload >= after_bound + 60,
        "{after_reload} {after_bound}"
    );

    let buckets: Vec<u64> = [
        1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000, 300000, 3600000,
    ]
    .iter()
    .map(|b| info_field(&mut c, &format!("hold_ms_le_{b}")))
    .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert_eq!(buckets.last(), Some(&6), "every hold here is under an hour");
}

/// A lock with one plain holder is stored compactly (the owner inline, no other allocation);
/// anything more (a waiter, a second reader, an option) is the full form, and a lock that is
/// one plain holder again goes back. MEMORY USAGE shows the form.
#[test]
fn a_lone_plain_holder_is_stored_compactly_and_back_after_anything_more() {
    let server = Server::start();
    let mut c = server.client();
    let usage = |c: &mut Connection, key: &str| int(c, &["MEMORY", "USAGE", key, "SAMPLES", "0"]);
    let owner = "0123456789abcdef0123456789abcdef";
    int(&mut c, &["LOCK.ACQUIRE", "plain", owner, LONG]);
    let compact = usage(&mut c, "plain");
    // The owner is inline: a 1-byte and a 32-byte owner take the same room; a 33-byte one does
    // not fit and takes the full form.
    int(&mut c, &["LOCK.ACQUIRE", "short", "s", LONG]);
    assert_eq!(usage(&mut c, "short"), compact);
    int(
        &mut c,
        &["LOCK.ACQUIRE", "long1", &format!("{owner}x"), LONG],
    );
    assert!(usage(&mut c, "long1") > compact);
    int(
        &mut c,
        &["LOCK.ACQUIRE", "opts", owner, LONG, "LOCKDELAY", "10"],
    );
    let full = usage(&mut c, "opts");
    assert!(compact < full, "compact {compact}, full {full}");
    // A semaphore's lone holder too, with two permits; a second holder makes it full.
    int(&mut c, &["LOCK.SEMACQUIRE", "sem1", owner, "3", LONG]);
    int(&mut c, &["LOCK.SEMACQUIRE", "sem1", owner, "3", LONG]);
    assert_eq!(usage(&mut c, "sem1"), compact);
    int(&mut c, &["LOCK.SEMACQUIRE", "sem1", "other", "3", LONG]);
    assert!(usage(&mut c, "sem1") > compact);
    // Two readers, then one: full, then compact only if its token is the lock's last.
    int(&mut c, &["LOCK.RWREAD", "rw", owner, LONG]);
    assert_eq!(usage(&mut c, "rw"), compact);
    int(&mut c, &["LOCK.RWREAD", "rw", "other", LONG]);
    assert!(usage(&mut c, "rw") > compact);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rw", "other"]), 0);
    // The lock's last token is other's, above the remaining reader's: that takes the full
    // form (the compact one has no room for a separate fence).
    assert!(usage(&mut c, "rw") > compact);
    // A waiter makes it full; once served and gone, a lone holder is compact again.
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "plain", "w", LONG, "WAIT", "0"],
        1,
    );
    assert!(usage(&mut c, "plain") > compact);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "plain", owner]), 0);
    waiter.token();
    assert_eq!(usage(&mut c, "plain"), compact);
    // Every form answers the same: re-entry, extend, release on the compact value.
    int(&mut c, &["LOCK.ACQUIRE", "plain", "w", LONG]);
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "plain", "w", LONG]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "plain", "w"]), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "plain", "w"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "plain"]), 0);
}
