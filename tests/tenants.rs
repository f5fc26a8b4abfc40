//! Tenants kept apart (SPEC.md, "Tenants (ACL)") and bounded deadlock checks ("Bounded
//! cost"), against a real server: users limited by ACL key patterns (`~tenantA:*`) see only
//! their own queues in LOCK.QUEUES; deadlock detection follows only keys the requesting user
//! may read, so one tenant can neither make another's request fail with -DEADLOCK nor probe
//! who waits for whom there, while a real cycle within a tenant's keys is still found; a
//! per-user cap on waiters; a deadlock check cut by `lock.deadlock-budget` is counted and lets
//! the request wait, and 100,000 readers of one key do not use the budget up.

use std::thread::{self, JoinHandle};

use redis_lock_testkit::*;

const LONG: &str = "600000";

/// Creates the users `alice` (keys `tenantA:*`) and `bob` (keys `tenantB:*`), both allowed
/// every command.
fn add_tenants(admin: &mut Connection) {
    for (user, pattern) in [("alice", "~tenantA:*"), ("bob", "~tenantB:*")] {
        query(
            admin,
            &["ACL", "SETUSER", user, "on", ">pw", pattern, "+@all"],
        )
        .expect("ACL SETUSER");
    }
}

/// A connection authenticated as `user`.
fn login(server: &Server, user: &str) -> Connection {
    let mut c = server.client();
    query(&mut c, &["AUTH", user, "pw"]).expect("AUTH");
    c
}

/// A blocking request sent as `user` on its own connection and thread; returns once the
/// admin connection sees `expect_waiting` waiters on the request's key.
fn queue_as(
    server: &Server,
    admin: &mut Connection,
    user: &str,
    words: &[&str],
    expect_waiting: i64,
) -> JoinHandle<redis::RedisResult<Value>> {
    let mut c = login(server, user);
    let key = words[1].to_string();
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    let handle = thread::spawn(move || {
        let refs: Vec<&str> = words.iter().map(|w| w.as_str()).collect();
        query(&mut c, &refs)
    });
    wait_until(&format!("a waiter on {key}"), || {
        waiting(admin, &key) == expect_waiting
    });
    handle
}

fn token(handle: JoinHandle<redis::RedisResult<Value>>) -> i64 {
    match handle.join().expect("waiter thread") {
        Ok(Value::Int(t)) => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

/// LOCK.QUEUES rows as (key, db, waiting).
fn queues(c: &mut Connection, args: &[&str]) -> Vec<(String, i64, i64)> {
    lock_queues(c, args)
        .into_iter()
        .map(|(key, db, waiting, _)| (key, db, waiting))
        .collect()
}

#[test]
fn lock_queues_reports_only_keys_the_caller_may_read() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    let mut waiters = Vec::new();
    // tenantA:one with 1 waiter; tenantB:many with 3 (longer, and older); tenantB:other in
    // database 1 with 2; a key of nobody's tenant with 1.
    int(&mut admin, &["LOCK.ACQUIRE", "tenantB:many", "h", LONG]);
    for n in 1..=3 {
        let owner = format!("b{n}");
        waiters.push(queue_as(
            &server,
            &mut admin,
            "bob",
            &["LOCK.ACQUIRE", "tenantB:many", &owner, LONG, "WAIT", "0"],
            n,
        ));
    }
    int(&mut admin, &["LOCK.ACQUIRE", "tenantA:one", "h", LONG]);
    waiters.push(queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:one", "a1", LONG, "WAIT", "0"],
        1,
    ));
    int(&mut admin, &["LOCK.ACQUIRE", "shared:x", "h", LONG]);
    waiters.push(queue_as(
        &server,
        &mut admin,
        "default",
        &["LOCK.ACQUIRE", "shared:x", "d1", LONG, "WAIT", "0"],
        1,
    ));
    let mut admin1 = server.client();
    query(&mut admin1, &["SELECT", "1"]).unwrap();
    int(&mut admin1, &["LOCK.ACQUIRE", "tenantB:other", "h", LONG]);
    let in_db1: Vec<Waiter> = (1..=2)
        .map(|n| {
            let owner = format!("o{n}");
            spawn_waiter_in(
                &server,
                &mut admin1,
                "1",
                &["LOCK.ACQUIRE", "tenantB:other", &owner, LONG, "WAIT", "0"],
                n,
            )
        })
        .collect();
    // The default user (allkeys) sees every queue.
    assert_eq!(queues(&mut admin, &["COUNT", "10"]).len(), 4);
    // Alice sees her one queue, by age and by length, even with COUNT 1 (bob's longer and
    // older queue is not ranked before hers: it does not exist for her).
    let mut alice = login(&server, "alice");
    let mine = vec![("tenantA:one".to_string(), 0, 1)];
    assert_eq!(queues(&mut alice, &[]), mine);
    assert_eq!(queues(&mut alice, &["BY", "LENGTH"]), mine);
    assert_eq!(queues(&mut alice, &["BY", "LENGTH", "COUNT", "1"]), mine);
    assert_eq!(queues(&mut alice, &["COUNT", "1"]), mine);
    // Bob sees his two, in both databases, longest first.
    let mut bob = login(&server, "bob");
    assert_eq!(
        queues(&mut bob, &["BY", "LENGTH"]),
        vec![
            ("tenantB:many".to_string(), 0, 3),
            ("tenantB:other".to_string(), 1, 2)
        ]
    );
    // A user with no key pattern sees nothing at all.
    query(
        &mut admin,
        &["ACL", "SETUSER", "nobody", "on", ">pw", "+@all"],
    )
    .unwrap();
    let mut nobody = login(&server, "nobody");
    assert!(queues(&mut nobody, &[]).is_empty());
    // A user whose key patterns grant writing only (%W~) may not read: nothing either.
    query(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "writer",
            "on",
            ">pw",
            "%W~tenantA:*",
            "+@all",
        ],
    )
    .unwrap();
    let mut writer = login(&server, "writer");
    assert!(queues(&mut writer, &[]).is_empty());
    // Undo: every waiter's connection closes.
    query(
        &mut admin,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    )
    .unwrap();
    for w in waiters {
        let _ = w.join();
    }
    for w in in_db1 {
        let _ = w.join();
    }
}

/// Tenant A, queueing under tenant B's owner names on its own keys, cannot make B's request
/// fail with -DEADLOCK: the cycle runs through keys bob may not read, and (version 4) through
/// owners that are alice's, not bob's.
#[test]
fn a_tenant_cannot_make_anothers_request_a_deadlock() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    let mut alice = login(&server, "alice");
    let mut bob = login(&server, "bob");
    // Bob's owners: b-1 holds tenantB:x, b-2 holds tenantB:y.
    int(&mut bob, &["LOCK.ACQUIRE", "tenantB:x", "b-1", LONG]);
    int(&mut bob, &["LOCK.ACQUIRE", "tenantB:y", "b-2", LONG]);
    // Alice: b-1 (bob's name) holds tenantA:h, a-x holds tenantA:g; a-x waits for tenantA:h
    // (for b-1, on a key b-1 holds) and b-2 waits for tenantA:g (for a-x).
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:h", "b-1", LONG]);
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:g", "a-x", LONG]);
    let ax = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:h", "a-x", LONG, "WAIT", "0"],
        1,
    );
    let b2 = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:g", "b-2", LONG, "WAIT", "0"],
        1,
    );
    // b-1 waiting for tenantB:y (held by b-2) would close b-1 -> b-2 -> a-x -> b-1, but only
    // through alice's keys: bob's request queues.
    let b1 = queue_as(
        &server,
        &mut admin,
        "bob",
        &["LOCK.ACQUIRE", "tenantB:y", "b-1", LONG, "WAIT", "0"],
        1,
    );
    // Nor is it a cycle for anyone since version 4: an owner is (user, name), so alice's b-1
    // and b-2 are not bob's, and not the default user's either (who reads every key): the
    // same request from the default user waits too (and times out).
    assert!(is_nil(
        &mut admin,
        &["LOCK.ACQUIRE", "tenantB:y", "b-1", LONG, "WAIT", "200"]
    ));
    assert_eq!(info_field(&mut admin, "deadlocks_total"), 0);
    // Bob's request is served normally when b-2 lets go.
    int(&mut bob, &["LOCK.RELEASE", "tenantB:y", "b-2"]);
    assert!(token(b1) > 0);
    int(&mut alice, &["LOCK.RELEASE", "tenantA:h", "b-1"]);
    assert!(token(ax) > 0);
    int(&mut alice, &["LOCK.RELEASE", "tenantA:g", "a-x"]);
    assert!(token(b2) > 0);
}

/// Alice cannot probe whether bob's owner b-W waits for bob's owner b-H (a cycle that would
/// run through bob's key), while a real cycle within her own keys is still refused.
#[test]
fn a_tenant_cannot_probe_anothers_waits_and_its_own_cycles_are_found() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    let mut alice = login(&server, "alice");
    let mut bob = login(&server, "bob");
    // Bob: b-W waits for tenantB:k, which b-H holds.
    int(&mut bob, &["LOCK.ACQUIRE", "tenantB:k", "b-H", LONG]);
    let bw = queue_as(
        &server,
        &mut admin,
        "bob",
        &["LOCK.ACQUIRE", "tenantB:k", "b-W", LONG, "WAIT", "0"],
        1,
    );
    // Alice: "b-W" holds tenantA:m; "b-H" asks for it. If b-W waits for b-H (it does), that
    // closes a cycle through tenantB:k, which alice may not read: her request queues.
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:m", "b-W", LONG]);
    let probe = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:m", "b-H", LONG, "WAIT", "0"],
        1,
    );
    assert_eq!(info_field(&mut admin, "deadlocks_total"), 0);
    // A cycle within alice's keys: a-1 holds tenantA:p and waits for tenantA:q, held by a-2;
    // a-2 asking for tenantA:p is refused.
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:p", "a-1", LONG]);
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:q", "a-2", LONG]);
    let a1 = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:q", "a-1", LONG, "WAIT", "0"],
        1,
    );
    let e = err(
        &mut alice,
        &["LOCK.ACQUIRE", "tenantA:p", "a-2", LONG, "WAIT", "0"],
    );
    assert!(e.starts_with("DEADLOCK"), "{e}");
    // The error text is the fixed one: it names no key and no owner.
    assert!(!e.contains("tenant") && !e.contains("a-1"), "{e}");
    assert_eq!(
        waiting(&mut admin, "tenantA:p"),
        0,
        "the refused request queued"
    );
    // Undo.
    int(&mut alice, &["LOCK.RELEASE", "tenantA:q", "a-2"]);
    assert!(token(a1) > 0);
    int(&mut alice, &["LOCK.RELEASE", "tenantA:m", "b-W"]);
    assert!(token(probe) > 0);
    int(&mut bob, &["LOCK.RELEASE", "tenantB:k", "b-H"]);
    assert!(token(bw) > 0);
}

#[test]
fn waiters_per_user_are_capped() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    assert_eq!(
        value_texts(&query(&mut admin, &["CONFIG", "GET", "lock.max-waiters-per-user"]).unwrap()),
        ["lock.max-waiters-per-user", "0"],
        "no limit by default"
    );
    for bad in ["-1", "x", "2147483649"] {
        assert!(
            query(
                &mut admin,
                &["CONFIG", "SET", "lock.max-waiters-per-user", bad]
            )
            .is_err(),
            "{bad}"
        );
    }
    query(
        &mut admin,
        &["CONFIG", "SET", "lock.max-waiters-per-user", "2"],
    )
    .unwrap();
    let mut alice = login(&server, "alice");
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:k", "h", LONG]);
    int(&mut alice, &["LOCK.ACQUIRE", "tenantA:j", "h", LONG]);
    let first = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:k", "w1", LONG, "WAIT", "0"],
        1,
    );
    let second = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:j", "w2", LONG, "WAIT", "0"],
        1,
    );
    let before = info_field(&mut admin, "maxwaiters_total");
    // A third waiter of alice's, on any key: refused, naming the setting; nothing queued.
    for key in ["tenantA:k", "tenantA:j"] {
        let e = err(&mut alice, &["LOCK.ACQUIRE", key, "w3", LONG, "WAIT", "0"]);
        assert!(
            e.starts_with("MAXWAITERS") && e.contains("lock.max-waiters-per-user"),
            "{e}"
        );
        assert_eq!(waiting(&mut admin, key), 1);
    }
    assert_eq!(info_field(&mut admin, "maxwaiters_total"), before + 2);
    // Without WAIT nothing would queue: the usual nil.
    assert!(is_nil(
        &mut alice,
        &["LOCK.ACQUIRE", "tenantA:k", "w3", LONG]
    ));
    // Bob is not affected.
    let mut bob = login(&server, "bob");
    int(&mut bob, &["LOCK.ACQUIRE", "tenantB:k", "h", LONG]);
    let bobs: Vec<_> = (1..=2)
        .map(|n| {
            let owner = format!("b{n}");
            queue_as(
                &server,
                &mut admin,
                "bob",
                &["LOCK.ACQUIRE", "tenantB:k", &owner, LONG, "WAIT", "0"],
                n,
            )
        })
        .collect();
    // One of alice's waiters is served: she may queue one more.
    int(&mut alice, &["LOCK.RELEASE", "tenantA:k", "h"]);
    assert!(token(first) > 0);
    let third = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:k", "w3", LONG, "WAIT", "0"],
        1,
    );
    // 0 lifts the limit.
    query(
        &mut admin,
        &["CONFIG", "SET", "lock.max-waiters-per-user", "0"],
    )
    .unwrap();
    let fourth = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:k", "w4", LONG, "WAIT", "0"],
        2,
    );
    int(&mut alice, &["LOCK.RELEASE", "tenantA:j", "h"]);
    assert!(token(second) > 0);
    int(&mut alice, &["LOCK.RELEASE", "tenantA:k", "w1"]);
    assert!(token(third) > 0);
    int(&mut alice, &["LOCK.RELEASE", "tenantA:k", "w3"]);
    assert!(token(fourth) > 0);
    int(&mut bob, &["LOCK.RELEASE", "tenantB:k", "h"]);
    for (n, b) in bobs.into_iter().enumerate() {
        assert!(token(b) > 0);
        int(
            &mut bob,
            &["LOCK.RELEASE", "tenantB:k", &format!("b{}", n + 1)],
        );
    }
}

/// A chain of 40 owners into the requester's key: with `lock.deadlock-budget` too small to
/// walk it, the check is cut, counted, and the request waits; with the default it is refused.
#[test]
fn a_check_that_runs_out_of_budget_is_counted_and_the_request_waits() {
    let server = Server::start();
    let mut c = server.client();
    let n = 40;
    int(&mut c, &["LOCK.ACQUIRE", "own", "req", LONG]);
    for i in 0..=n {
        int(
            &mut c,
            &[
                "LOCK.ACQUIRE",
                &format!("chain:{i}"),
                &format!("c{i}"),
                LONG,
            ],
        );
    }
    let mut links = Vec::new();
    for i in 0..n {
        links.push(spawn_waiter(
            &server,
            &mut c,
            &[
                "LOCK.ACQUIRE",
                &format!("chain:{}", i + 1),
                &format!("c{i}"),
                LONG,
                "WAIT",
                "0",
            ],
            1,
        ));
    }
    links.push(spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "own", &format!("c{n}"), LONG, "WAIT", "0"],
        1,
    ));
    let default_budget =
        value_texts(&query(&mut c, &["CONFIG", "GET", "lock.deadlock-budget"]).unwrap());
    assert_eq!(default_budget[0], "lock.deadlock-budget");
    for bad in ["-1", "x"] {
        assert!(query(&mut c, &["CONFIG", "SET", "lock.deadlock-budget", bad]).is_err());
    }
    assert_eq!(info_field(&mut c, "deadlock_checks_cut_total"), 0);
    // req asking for chain:0 closes req -> c0 -> c1 -> ... -> c40 -> req.
    let refused = err(
        &mut c,
        &["LOCK.ACQUIRE", "chain:0", "req", LONG, "WAIT", "0"],
    );
    assert!(refused.starts_with("DEADLOCK"), "{refused}");
    query(&mut c, &["CONFIG", "SET", "lock.deadlock-budget", "10"]).unwrap();
    // Too small a budget: the request waits as if no cycle were found (WAIT 200: it times out).
    assert!(is_nil(
        &mut c,
        &["LOCK.ACQUIRE", "chain:0", "req", LONG, "WAIT", "200"]
    ));
    assert_eq!(info_field(&mut c, "deadlock_checks_cut_total"), 1);
    assert_eq!(info_field(&mut c, "deadlocks_total"), 1);
    // Back to the default: refused again, and the cut counter stays.
    query(
        &mut c,
        &["CONFIG", "SET", "lock.deadlock-budget", &default_budget[1]],
    )
    .unwrap();
    let again = err(
        &mut c,
        &["LOCK.ACQUIRE", "chain:0", "req", LONG, "WAIT", "0"],
    );
    assert!(again.starts_with("DEADLOCK"), "{again}");
    assert_eq!(info_field(&mut c, "deadlock_checks_cut_total"), 1);
    // Undo: req lets go of its key, and the chain unwinds from its end.
    int(&mut c, &["LOCK.RELEASE", "own", "req"]);
    let mut links = links.into_iter().rev();
    assert!(links.next().expect("the end").token() > 0);
    drop(links);
    query(&mut c, &["FLUSHALL"]).unwrap();
}

/// 100,000 readers of one key and a queued writer that waits for the requester: the requester's
/// exclusive request for the readers' key closes a cycle through the writer, found within a
/// budget of 20 visits (the readers wait for nothing and are never visited).
#[test]
fn readers_that_wait_for_nothing_do_not_use_the_budget() {
    let server = Server::start();
    let mut c = server.client();
    let readers = 100_000;
    for start in (0..readers).step_by(10_000) {
        let mut p = redis::pipe();
        for i in start..start + 10_000 {
            p.cmd("LOCK.RWREAD")
                .arg("many")
                .arg(format!("r{i}"))
                .arg(LONG)
                .ignore();
        }
        let () = p.query(&mut c).expect("readers");
    }
    int(&mut c, &["LOCK.ACQUIRE", "own", "req", LONG]);
    let writer = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "many", "writer", LONG, "WAIT", "0"],
        1,
    );
    let writer_own = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "own", "writer", LONG, "WAIT", "0"],
        1,
    );
    query(&mut c, &["CONFIG", "SET", "lock.deadlock-budget", "20"]).unwrap();
    for command in ["LOCK.ACQUIRE", "LOCK.RWREAD"] {
        let e = err(&mut c, &[command, "many", "req", LONG, "WAIT", "0"]);
        assert!(e.starts_with("DEADLOCK"), "{command}: {e}");
    }
    assert_eq!(info_field(&mut c, "deadlock_checks_cut_total"), 0);
    assert_eq!(info_field(&mut c, "deadlocks_total"), 2);
    query(&mut c, &["FLUSHALL"]).unwrap();
    assert!(writer.join().is_ok());
    assert!(writer_own.join().is_ok());
}

/// The limit on skipped queues never shortens the answer of a user who may read them all:
/// COUNT 1000 with 600 queues gives 600 rows, each queue once.
#[test]
fn a_user_with_every_key_gets_every_row() {
    let server = Server::start();
    let mut admin = server.client();
    let n = 600;
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("LOCK.ACQUIRE")
            .arg(format!("q:{i}"))
            .arg("h")
            .arg(LONG)
            .ignore();
    }
    let () = p.query(&mut admin).expect("holders");
    let mut conns = Vec::new();
    for i in 0..n {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        send_raw(
            &mut s,
            &["LOCK.ACQUIRE", &format!("q:{i}"), "w", LONG, "WAIT", "0"],
        )
        .expect("send");
        conns.push(s);
    }
    wait_until("every waiter queued", || {
        info_field(&mut admin, "waiters") == n as u64
    });
    let rows = queues(&mut admin, &["COUNT", "1000"]);
    assert_eq!(rows.len(), n);
    assert_eq!(
        queues(&mut admin, &["BY", "LENGTH", "COUNT", "1000"]).len(),
        n
    );
    let distinct: std::collections::HashSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(distinct.len(), n);
    drop(conns);
}

/// Alice's own two-owner cycle (a holds tenantA:1; "b-W" holds tenantA:2 and waits for
/// tenantA:1; a asks for tenantA:2) is refused whether or not bob's owner "b-W" has an older
/// request queued on a tenantB key, which alice may not read: an owner whose first queued
/// request is out of reach is not taken for one that waits for nothing (which hid the cycle,
/// and told alice that b-W waits somewhere in bob's keys). No check is cut.
#[test]
fn an_out_of_reach_queued_request_does_not_hide_a_cycle_within_reach() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    let mut alice = login(&server, "alice");
    let mut bob = login(&server, "bob");
    let mut waiters = Vec::new();
    for (round, bob_waits) in [(0, false), (1, true)] {
        let bw = format!("b-W-{round}");
        let k1 = format!("tenantA:1-{round}");
        let k2 = format!("tenantA:2-{round}");
        if bob_waits {
            let kb = format!("tenantB:k-{round}");
            int(&mut bob, &["LOCK.ACQUIRE", &kb, "b-H", LONG]);
            waiters.push(queue_as(
                &server,
                &mut admin,
                "bob",
                &["LOCK.ACQUIRE", &kb, &bw, LONG, "WAIT", "0"],
                1,
            ));
        }
        int(&mut alice, &["LOCK.ACQUIRE", &k1, "a", LONG]);
        int(&mut alice, &["LOCK.ACQUIRE", &k2, &bw, LONG]);
        waiters.push(queue_as(
            &server,
            &mut admin,
            "alice",
            &["LOCK.ACQUIRE", &k1, &bw, LONG, "WAIT", "0"],
            1,
        ));
        // WAIT 300 rather than 0: were the cycle missed, the request would time out.
        let verdict = query(&mut alice, &["LOCK.ACQUIRE", &k2, "a", LONG, "WAIT", "300"]);
        match verdict {
            Err(e) => assert!(
                e.to_string().contains("DEADLOCK"),
                "round {round} (bob waits: {bob_waits}): {e}"
            ),
            Ok(v) => panic!("round {round} (bob waits: {bob_waits}): not refused: {v:?}"),
        }
    }
    assert_eq!(info_field(&mut admin, "deadlocks_total"), 2);
    assert_eq!(info_field(&mut admin, "deadlock_checks_cut_total"), 0);
    // The waiters stay blocked until the server stops.
    drop(waiters);
}

/// The same through the keys an owner holds: carol's owner "b-W" holds 30 tenantB keys that
/// have waiters (taken while her patterns covered them, now out of her reach, and listed
/// before her keys, which sort after them) and
/// carol's tenantC:h, where c waits; c holds tenantC:r; b-W waits for a on tenantC:w; a asking
/// for tenantC:r closes a -> c -> b-W -> a. With `lock.deadlock-budget` 20, the 30 keys left
/// out are visits too: the check is cut and counted (it used to answer "no cycle", uncounted,
/// with the keys filtered out after the listing's limit). With the default it is refused.
#[test]
fn out_of_reach_held_keys_are_charged_and_cut_the_check() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    query(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "carol",
            "on",
            ">pw",
            "~tenantC:*",
            "+@all",
        ],
    )
    .expect("ACL SETUSER");
    // Carol may first use bob's keys too: she holds 30 of them as b-W, bob waits on each;
    // then her patterns are narrowed to her own keys (her connection stays). Her own holds
    // there are now out of her reach.
    query(&mut admin, &["ACL", "SETUSER", "carol", "~tenantB:*"]).expect("ACL SETUSER");
    let mut carol = login(&server, "carol");
    let n = 30;
    let mut waiters = Vec::new();
    for i in 0..n {
        let key = format!("tenantB:{i:02}");
        int(&mut carol, &["LOCK.ACQUIRE", &key, "b-W", LONG]);
        waiters.push(queue_as(
            &server,
            &mut admin,
            "bob",
            &["LOCK.ACQUIRE", &key, &format!("b-x{i}"), LONG, "WAIT", "0"],
            1,
        ));
    }
    query(
        &mut admin,
        &["ACL", "SETUSER", "carol", "resetkeys", "~tenantC:*"],
    )
    .expect("ACL SETUSER");
    int(&mut carol, &["LOCK.ACQUIRE", "tenantC:h", "b-W", LONG]);
    int(&mut carol, &["LOCK.ACQUIRE", "tenantC:r", "c", LONG]);
    int(&mut carol, &["LOCK.ACQUIRE", "tenantC:w", "a", LONG]);
    waiters.push(queue_as(
        &server,
        &mut admin,
        "carol",
        &["LOCK.ACQUIRE", "tenantC:h", "c", LONG, "WAIT", "0"],
        1,
    ));
    waiters.push(queue_as(
        &server,
        &mut admin,
        "carol",
        &["LOCK.ACQUIRE", "tenantC:w", "b-W", LONG, "WAIT", "0"],
        1,
    ));
    let default_budget =
        value_texts(&query(&mut admin, &["CONFIG", "GET", "lock.deadlock-budget"]).unwrap());
    query(&mut admin, &["CONFIG", "SET", "lock.deadlock-budget", "20"]).unwrap();
    assert!(is_nil(
        &mut carol,
        &["LOCK.ACQUIRE", "tenantC:r", "a", LONG, "WAIT", "200"]
    ));
    assert_eq!(info_field(&mut admin, "deadlock_checks_cut_total"), 1);
    assert_eq!(info_field(&mut admin, "deadlocks_total"), 0);
    query(
        &mut admin,
        &["CONFIG", "SET", "lock.deadlock-budget", &default_budget[1]],
    )
    .unwrap();
    let e = err(
        &mut carol,
        &["LOCK.ACQUIRE", "tenantC:r", "a", LONG, "WAIT", "0"],
    );
    assert!(e.starts_with("DEADLOCK"), "{e}");
    assert_eq!(info_field(&mut admin, "deadlock_checks_cut_total"), 1);
    // The waiters stay blocked until the server stops.
    drop(waiters);
}

/// LOCK.QUEUES elements as text: a row's key, or the status that ends a cut-short reply.
fn queue_reply(c: &mut Connection, args: &[&str]) -> Vec<String> {
    let mut words = vec!["LOCK.QUEUES"];
    words.extend_from_slice(args);
    match query(c, &words).expect("LOCK.QUEUES") {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Array(row) => value_text(&row[0]),
                Value::SimpleString(s) => format!("+{s}"),
                Value::Okay => "+OK".to_string(),
                other => panic!("LOCK.QUEUES element {other:?}"),
            })
            .collect(),
        other => panic!("LOCK.QUEUES: {other:?}"),
    }
}

/// Bob parks waiters on 600 of his keys, older than alice's one stuck queue: alice's
/// LOCK.QUEUES (which skips at most 500 queues she may not read) no longer answers as if
/// nothing waited (it used to reply an empty array): the reply says it stopped looking
/// (`TRUNCATED`), and `PREFIX tenantA:` finds her queue whatever bob queues.
#[test]
fn a_queues_reply_cut_short_says_so_and_a_prefix_finds_ones_own() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    let mut bob = login(&server, "bob");
    let n = 600;
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("LOCK.ACQUIRE")
            .arg(format!("tenantB:{i}"))
            .arg("h")
            .arg(LONG)
            .ignore();
    }
    let () = p.query(&mut bob).expect("bob's holders");
    let mut conns = Vec::new();
    for i in 0..n {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        send_raw(&mut s, &["AUTH", "bob", "pw"]).expect("send");
        send_raw(
            &mut s,
            &[
                "LOCK.ACQUIRE",
                &format!("tenantB:{i}"),
                "w",
                LONG,
                "WAIT",
                "0",
            ],
        )
        .expect("send");
        conns.push(s);
    }
    wait_until("bob's waiters queued", || {
        info_field(&mut admin, "waiters") == n as u64
    });
    let mut alice = login(&server, "alice");
    assert!(int(&mut alice, &["LOCK.ACQUIRE", "tenantA:stuck", "a", LONG]) > 0);
    let stuck = queue_as(
        &server,
        &mut admin,
        "alice",
        &["LOCK.ACQUIRE", "tenantA:stuck", "a2", LONG, "WAIT", "0"],
        1,
    );
    for by in ["AGE", "LENGTH"] {
        let reply = queue_reply(&mut alice, &["BY", by]);
        assert!(
            reply.last().map(String::as_str) == Some("+TRUNCATED"),
            "BY {by}: a reply cut short must say so, got {reply:?}"
        );
        assert!(reply
            .iter()
            .all(|k| k == "+TRUNCATED" || k.starts_with("tenantA:")));
    }
    assert_eq!(
        queue_reply(&mut alice, &["PREFIX", "tenantA:"]),
        vec!["tenantA:stuck".to_string()]
    );
    // Bob's own prefix: his 600 queues in key order, COUNT at a time, complete.
    let bobs = queue_reply(&mut bob, &["PREFIX", "tenantB:", "COUNT", "1000"]);
    assert_eq!(bobs.len(), n, "{:?}", bobs.last());
    let mut sorted = bobs.clone();
    sorted.sort();
    assert_eq!(bobs, sorted, "key order");
    assert_eq!(
        queue_reply(&mut bob, &["PREFIX", "tenantB:1", "COUNT", "3"]).len(),
        3
    );
    assert!(queue_reply(&mut bob, &["PREFIX", "tenantC:"]).is_empty());
    // The admin (allkeys) gets a complete answer, no marker.
    let all = queue_reply(&mut admin, &["COUNT", "1000"]);
    assert_eq!(all.len(), n + 1);
    assert!(!all.contains(&"+TRUNCATED".to_string()));
    assert!(err(&mut alice, &["LOCK.QUEUES", "PREFIX", "a", "BY", "AGE"]).contains("PREFIX"));
    int(&mut alice, &["LOCK.RELEASE", "tenantA:stuck", "a"]);
    assert!(token(stuck) > 0);
    drop(conns);
}

/// Holds that another user made under the same owner name are someone else's for deadlock
/// detection (docs/commands.md, "Deadlock detection"): alice holds 600 of her own keys as `w1`, each
/// with a waiter; bob's `w1` / `w2` two-owner cycle is still refused at once, and no check is
/// cut. (Before, alice's 600 entries were charged to bob's budget: bob's request waited out
/// its WAIT and got nil, and the cut counter rose.)
#[test]
fn another_users_holds_under_the_same_name_cost_nothing() {
    let server = Server::start();
    let mut admin = server.client();
    add_tenants(&mut admin);
    let mut alice = login(&server, "alice");
    let n = 600;
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("LOCK.ACQUIRE")
            .arg(format!("tenantA:{i:03}"))
            .arg("w1")
            .arg(LONG)
            .ignore();
    }
    let () = p.query(&mut alice).expect("alice's holds");
    let mut conns = Vec::new();
    for i in 0..n {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        send_raw(&mut s, &["AUTH", "alice", "pw"]).expect("send");
        send_raw(
            &mut s,
            &[
                "LOCK.ACQUIRE",
                &format!("tenantA:{i:03}"),
                &format!("x{i}"),
                LONG,
                "WAIT",
                "0",
            ],
        )
        .expect("send");
        conns.push(s);
    }
    wait_until("alice's 600 waiters", || {
        info_field(&mut admin, "waiters") == n
    });
    let mut bob = login(&server, "bob");
    int(&mut bob, &["LOCK.ACQUIRE", "tenantB:a", "w1", LONG]);
    int(&mut bob, &["LOCK.ACQUIRE", "tenantB:b", "w2", LONG]);
    let w2_waits = queue_as(
        &server,
        &mut admin,
        "bob",
        &["LOCK.ACQUIRE", "tenantB:a", "w2", LONG, "WAIT", "30000"],
        1,
    );
    let cut_before = info_field(&mut admin, "deadlock_checks_cut_total");
    let reply = query(
        &mut bob,
        &["LOCK.ACQUIRE", "tenantB:b", "w1", LONG, "WAIT", "2000"],
    );
    match reply {
        Err(e) => assert!(e.to_string().contains("DEADLOCK"), "{e}"),
        Ok(v) => panic!("bob's w1 closing its cycle was answered {v:?}, not -DEADLOCK"),
    }
    assert_eq!(
        info_field(&mut admin, "deadlock_checks_cut_total"),
        cut_before,
        "bob's check was cut"
    );
    assert_eq!(info_field(&mut admin, "deadlocks_total"), 1);
    // bob's w1 lets go: w2 is granted.
    int(&mut bob, &["LOCK.RELEASE", "tenantB:a", "w1"]);
    assert!(token(w2_waits) > 0);
    drop(conns);
}

/// The user of a request is the connection's user when it runs: a connection that
/// authenticates as another user makes its next holds and requests as that user (the module
/// keeps each connection's user between commands and must forget it on AUTH).
#[test]
fn a_connection_that_changes_user_asks_as_its_new_user() {
    let server = Server::start();
    let mut admin = server.client();
    for user in ["u1", "u2"] {
        query(
            &mut admin,
            &["ACL", "SETUSER", user, "on", ">pw", "~*", "+@all"],
        )
        .expect("ACL SETUSER");
    }
    let mut c = login(&server, "u1");
    int(&mut c, &["LOCK.ACQUIRE", "x", "w1", LONG]);
    let mut other = login(&server, "u1");
    int(&mut other, &["LOCK.ACQUIRE", "y", "w2", LONG]);
    // u1's w2 waits for u1's w1.
    let w2_waits = queue_as(
        &server,
        &mut admin,
        "u1",
        &["LOCK.ACQUIRE", "x", "w2", LONG, "WAIT", "30000"],
        1,
    );
    // As u2, "w1" is another owner: asking for y closes no cycle (it waits, and times out).
    query(&mut c, &["AUTH", "u2", "pw"]).expect("AUTH");
    assert!(is_nil(
        &mut c,
        &["LOCK.ACQUIRE", "y", "w1", LONG, "WAIT", "200"]
    ));
    // As u1 again, it is u1's w1, which w2 waits for: refused.
    query(&mut c, &["AUTH", "u1", "pw"]).expect("AUTH");
    let e = err(&mut c, &["LOCK.ACQUIRE", "y", "w1", LONG, "WAIT", "30000"]);
    assert!(e.starts_with("DEADLOCK"), "{e}");
    int(&mut c, &["LOCK.RELEASE", "x", "w1"]);
    assert!(token(w2_waits) > 0);
}
