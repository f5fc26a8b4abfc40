//! LOCK.INFO's bounded forms: `OWNER o` (one owner's holder entry, or none) and `COUNT n` (at
//! most n entries), the `holders_count` every reply carries, and each holder entry's bound
//! connection id (what the stuck-lock procedure kills by).

use std::collections::HashMap;

use redis_lock_testkit::*;

fn entries(map: &HashMap<String, Value>) -> Vec<Vec<Value>> {
    match map.get("holders") {
        Some(Value::Array(hs)) => hs
            .iter()
            .map(|h| match h {
                Value::Array(parts) => parts.clone(),
                other => panic!("holder entry {other:?}"),
            })
            .collect(),
        other => panic!("holders: {other:?}"),
    }
}

fn owners(map: &HashMap<String, Value>) -> Vec<String> {
    entries(map).iter().map(|e| value_text(&e[0])).collect()
}

fn field(map: &HashMap<String, Value>, name: &str) -> i64 {
    match map.get(name) {
        Some(Value::Int(i)) => *i,
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn owner_lists_only_that_owners_entry_and_counts_every_holder() {
    let server = Server::start();
    let mut c = server.client();
    for r in ["r1", "r2", "r3"] {
        int(&mut c, &["LOCK.RWREAD", "rw", r, "60000"]);
    }
    int(&mut c, &["LOCK.RWREAD", "rw", "r2", "60000"]);
    let full = info(&mut c, "rw").expect("held");
    assert_eq!(owners(&full), ["r1", "r2", "r3"]);
    assert_eq!(field(&full, "holders_count"), 3);

    let mine = info_with(&mut c, "rw", &["OWNER", "r2"]).expect("held");
    assert_eq!(owners(&mine), ["r2"]);
    assert_eq!(entries(&mine)[0][1], Value::Int(2), "r2's count");
    assert_eq!(field(&mine, "holders_count"), 3);
    assert_eq!(value_text(&mine["mode"]), "read");
    assert_eq!(mine["fence"], full["fence"]);

    let none = info_with(&mut c, "rw", &["owner", "nobody"]).expect("held");
    assert!(owners(&none).is_empty(), "{none:?}");
    assert_eq!(field(&none, "holders_count"), 3);
    assert_eq!(value_text(&none["mode"]), "read");

    // Released: its entry is gone from the bounded form too.
    int(&mut c, &["LOCK.RELEASE", "rw", "r2", "ALL"]);
    let gone = info_with(&mut c, "rw", &["OWNER", "r2"]).expect("held");
    assert!(owners(&gone).is_empty());
    assert_eq!(field(&gone, "holders_count"), 2);
}

#[test]
fn count_lists_at_most_n_entries_sorted_by_owner() {
    let server = Server::start();
    let mut c = server.client();
    // Past the size where the holder set builds its indexes (see core/src/indexed.rs).
    for i in 0..300 {
        int(
            &mut c,
            &[
                "LOCK.SEMACQUIRE",
                "pool",
                &format!("p{i:03}"),
                "1000",
                "60000",
            ],
        );
    }
    let some = info_with(&mut c, "pool", &["COUNT", "7"]).expect("held");
    let listed = owners(&some);
    assert_eq!(listed.len(), 7);
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "{listed:?}");
    assert_eq!(field(&some, "holders_count"), 300);
    assert_eq!(value_text(&some["mode"]), "semaphore");
    assert_eq!(field(&some, "capacity"), 1000);
    let all = info_with(&mut c, "pool", &["COUNT", "1000"]).expect("held");
    assert_eq!(owners(&all).len(), 300);
    // Both options together: OWNER decides the entry.
    let both = info_with(&mut c, "pool", &["COUNT", "1", "OWNER", "p150"]).expect("held");
    assert_eq!(owners(&both), ["p150"]);
}

#[test]
fn bounded_forms_keep_the_queue_count_and_list_its_head() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "h", "60000"]);
    let w1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "k", "w1", "60000", "WAIT", "60000"],
        1,
    );
    let w2 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.RWREAD", "k", "w2", "60000", "WAIT", "60000"],
        2,
    );
    let mine = info_with(&mut c, "k", &["OWNER", "h"]).expect("held");
    assert_eq!(field(&mine, "waiting"), 2);
    assert_eq!(
        value_texts(&mine["queue"]),
        ["write", "read"],
        "a short queue is listed whole"
    );
    assert_eq!(field(&mine, "holders_count"), 1);
    int(&mut c, &["LOCK.RELEASE", "k", "h"]);
    assert!(w1.join().is_ok());
    int(&mut c, &["LOCK.RELEASE", "k", "w1"]);
    assert!(w2.join().is_ok());
}

#[test]
fn a_free_key_or_one_only_queued_on_reports_zero_holders() {
    let server = Server::start();
    let mut c = server.client();
    // A pending lock-delay: the key exists with no holder.
    let mut holder = server.client();
    int(
        &mut holder,
        &[
            "LOCK.ACQUIRE",
            "d2",
            "o",
            "60000",
            "LOCKDELAY",
            "60000",
            "BIND",
        ],
    );
    drop(holder);
    wait_until("the bound hold ended", || {
        info(&mut c, "d2").is_some_and(|m| owners(&m).is_empty())
    });
    let delayed = info_with(&mut c, "d2", &["COUNT", "5"]).expect("delay pending");
    assert_eq!(field(&delayed, "holders_count"), 0);
    assert_eq!(value_text(&delayed["mode"]), "free");
    assert!(field(&delayed, "delay") > 0);
    assert!(is_nil(&mut c, &["LOCK.INFO", "missing", "OWNER", "o"]));
}

#[test]
fn each_entry_names_the_connection_a_bound_hold_is_bound_to() {
    let server = Server::start();
    let mut c = server.client();
    let mut bound = server.client();
    let id = client_id(&mut bound);
    int(&mut bound, &["LOCK.ACQUIRE", "b", "mine", "60000", "BIND"]);
    int(&mut c, &["LOCK.ACQUIRE", "u", "mine", "60000"]);
    for form in [&[][..], &["OWNER", "mine"][..], &["COUNT", "1"][..]] {
        let b = info_with(&mut c, "b", form).expect("held");
        assert_eq!(entries(&b)[0].get(4), Some(&Value::Int(id)), "{form:?}");
        let u = info_with(&mut c, "u", form).expect("held");
        assert_eq!(entries(&u)[0].get(4), Some(&Value::Int(0)), "{form:?}");
    }
    // What the stuck-lock procedure does with it: the hold ends with its connection.
    let killed = int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    assert_eq!(killed, 1);
    wait_until("the bound hold ended", || {
        info(&mut c, "b").map_or(true, |m| owners(&m).is_empty())
    });
}

#[test]
fn bad_options_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "k", "o", "60000"]);
    let before = info(&mut c, "k");
    for (args, message) in [
        (&["COUNT", "0"][..], "COUNT must be between 1 and 1000"),
        (&["COUNT", "1001"][..], "COUNT must be between 1 and 1000"),
        (&["COUNT", "x"][..], "COUNT is not an integer"),
        (&["OWNER", ""][..], "owner must be 1 to 1024 bytes"),
        (&["OWNER"][..], "syntax error"),
        (&["OWNER", "a", "OWNER", "b"][..], "more than once"),
        (&["LIMIT", "3"][..], "unknown option"),
    ] {
        let mut words = vec!["LOCK.INFO", "k"];
        words.extend_from_slice(args);
        let e = err(&mut c, &words);
        assert!(e.contains(message), "{args:?}: {e}");
    }
    // Everything but the holders' remaining ttl is as it was.
    let strip = |m: Option<HashMap<String, Value>>| {
        m.map(|mut m| {
            m.remove("holders");
            m
        })
    };
    assert_eq!(strip(before), strip(info(&mut c, "k")));
    assert_eq!(holders(&mut c, "k"), [("o".to_string(), 1)]);
}
