//! Deadlock detection against a real server: a WAIT request that would close a wait-for cycle
//! is refused with `-DEADLOCK` and queues nothing (2-cycles and 3-cycles, across keys and
//! databases, read-write cases), and a request that closes no cycle is never refused.

use std::thread;
use std::time::{Duration, Instant};

use redis_lock_testkit::*;

const LONG: &str = "600000";

/// `owner` holds `key` (exclusively unless `read`) in database `db`.
fn hold(c: &mut Connection, db: &str, key: &str, owner: &str, read: bool) {
    query(c, &["SELECT", db]).unwrap();
    let command = if read { "LOCK.RWREAD" } else { "LOCK.ACQUIRE" };
    assert!(
        int(c, &[command, key, owner, LONG]) > 0,
        "{owner} holds {key}"
    );
}

/// Queues a blocking request of `owner` on `key` in `db` from its own connection and waits
/// until the key shows `expect_waiting` waiters. The request waits up to 30 s.
fn queue(
    server: &Server,
    db: &str,
    key: &str,
    owner: &str,
    read: bool,
    expect_waiting: i64,
) -> Waiter {
    let mut observer = server.client();
    query(&mut observer, &["SELECT", db]).unwrap();
    let command = if read { "LOCK.RWREAD" } else { "LOCK.ACQUIRE" };
    spawn_waiter_in(
        server,
        &mut observer,
        db,
        &[command, key, owner, LONG, "WAIT", "30000"],
        expect_waiting,
    )
}

/// The request is refused with -DEADLOCK and nothing is queued on its key.
fn assert_refused(c: &mut Connection, db: &str, words: &[&str]) {
    query(c, &["SELECT", db]).unwrap();
    let before = waiting(c, words[1]);
    let e = err(c, words);
    assert!(e.starts_with("DEADLOCK"), "{words:?}: {e}");
    assert_eq!(waiting(c, words[1]), before, "{words:?} queued something");
}

#[test]
fn two_workers_two_accounts() {
    let server = Server::start();
    let mut w1 = server.client();
    let mut w2 = server.client();
    hold(&mut w1, "0", "account:A", "worker-1", false);
    hold(&mut w2, "0", "account:B", "worker-2", false);
    let waiter = queue(&server, "0", "account:B", "worker-1", false, 1);
    // worker-2 waiting for A would wait for worker-1, who waits for B, which worker-2 holds.
    assert_refused(
        &mut w2,
        "0",
        &[
            "LOCK.ACQUIRE",
            "account:A",
            "worker-2",
            LONG,
            "WAIT",
            "30000",
        ],
    );
    assert_eq!(info_field(&mut w2, "deadlocks_total"), 1);
    // The refused worker backs off (releases B): worker-1 gets it.
    int(&mut w2, &["LOCK.RELEASE", "account:B", "worker-2"]);
    assert!(waiter.token() > 0);
    // worker-1 now holds A and B; worker-2, holding nothing, may wait for A: no cycle.
    let w2_waits = queue(&server, "0", "account:A", "worker-2", false, 1);
    int(&mut w1, &["LOCK.RELEASE", "account:A", "worker-1"]);
    assert!(w2_waits.token() > 0);
}

#[test]
fn a_three_cycle_across_databases_is_refused_and_a_chain_is_not() {
    let server = Server::start();
    let mut a = server.client();
    let mut b = server.client();
    let mut c = server.client();
    hold(&mut a, "0", "k1", "A", false);
    hold(&mut b, "1", "k2", "B", false);
    hold(&mut c, "2", "k3", "C", false);
    // A waits for B (k2 in db 1), B waits for C (k3 in db 2).
    let a_waits = queue(&server, "1", "k2", "A", false, 1);
    let b_waits = queue(&server, "2", "k3", "B", false, 1);
    // C waiting for k1 (held by A) closes A -> B -> C -> A.
    assert_refused(
        &mut c,
        "0",
        &["LOCK.ACQUIRE", "k1", "C", LONG, "WAIT", "30000"],
    );
    // D, who holds nothing anyone waits for, may wait for k1: a chain, no cycle.
    let d_waits = queue(&server, "0", "k1", "D", false, 1);
    // Undo: C releases k3, B gets it and releases both, A gets k2 and releases k1, D gets k1.
    query(&mut c, &["SELECT", "2"]).unwrap();
    int(&mut c, &["LOCK.RELEASE", "k3", "C"]);
    assert!(b_waits.token() > 0);
    query(&mut b, &["SELECT", "2"]).unwrap();
    int(&mut b, &["LOCK.RELEASE", "k3", "B"]);
    query(&mut b, &["SELECT", "1"]).unwrap();
    int(&mut b, &["LOCK.RELEASE", "k2", "B"]);
    assert!(a_waits.token() > 0);
    query(&mut a, &["SELECT", "0"]).unwrap();
    int(&mut a, &["LOCK.RELEASE", "k1", "A"]);
    assert!(d_waits.token() > 0);
}

#[test]
fn read_write_cases_are_exact() {
    let server = Server::start();
    let mut o = server.client();
    let mut r1 = server.client();
    let mut r2 = server.client();

    // A writer behind readers: O writing "shared" waits for both readers holding it; R2 waits
    // for "o", which O holds. Refused.
    hold(&mut r1, "0", "shared", "R1", true);
    hold(&mut r2, "0", "shared", "R2", true);
    hold(&mut o, "0", "o", "O", false);
    let r2_waits = queue(&server, "0", "o", "R2", false, 1);
    assert_refused(
        &mut o,
        "0",
        &["LOCK.ACQUIRE", "shared", "O", LONG, "WAIT", "30000"],
    );

    // A reader behind a queued writer: O reading "shared2" queues behind the writer W2 (no
    // writer starvation), so it waits for W2, who waits for the reader R3 holding "shared2",
    // who waits for "o" held by O. Refused.
    let mut r3 = server.client();
    hold(&mut r3, "0", "shared2", "R3", true);
    let w2_waits = queue(&server, "0", "shared2", "W2", false, 1);
    let r3_waits = queue(&server, "0", "o", "R3", false, 2);
    assert_refused(
        &mut o,
        "0",
        &["LOCK.RWREAD", "shared2", "O", LONG, "WAIT", "30000"],
    );

    // A reader behind a queued reader is not waiting for it (they are granted together): R4
    // waits to read "s3" (held by the writer H) and for "o"; O reading "s3" waits for H only,
    // and H waits for nobody. Not refused.
    let mut h = server.client();
    hold(&mut h, "0", "s3", "H", false);
    let r4_reads = queue(&server, "0", "s3", "R4", true, 1);
    let r4_waits = queue(&server, "0", "o", "R4", false, 3);
    let o_reads = queue(&server, "0", "s3", "O", true, 2);
    int(&mut h, &["LOCK.RELEASE", "s3", "H"]);
    assert!(r4_reads.token() > 0);
    assert!(o_reads.token() > 0, "both readers granted together");

    // Undo the rest: O lets "o" go; its waiters are served in order.
    int(&mut o, &["LOCK.RELEASE", "o", "O"]);
    assert!(r2_waits.token() > 0);
    int(&mut r2, &["LOCK.RELEASE", "o", "R2"]);
    assert!(r3_waits.token() > 0);
    int(&mut r3, &["LOCK.RELEASE", "o", "R3"]);
    assert!(r4_waits.token() > 0);
    int(&mut r3, &["LOCK.RELEASE", "shared2", "R3"]);
    assert!(w2_waits.token() > 0);
    assert_eq!(info_field(&mut o, "deadlocks_total"), 2);
}

#[test]
fn readers_sharing_a_key_are_not_a_cycle() {
    let server = Server::start();
    let mut a = server.client();
    let mut b = server.client();
    hold(&mut a, "0", "p", "A", true);
    hold(&mut b, "0", "q", "B", true);
    // Reads only: nobody waits, nobody is refused.
    assert!(int(&mut b, &["LOCK.RWREAD", "p", "B", LONG, "WAIT", "1000"]) > 0);
    assert!(int(&mut a, &["LOCK.RWREAD", "q", "A", LONG, "WAIT", "1000"]) > 0);
}

#[test]
fn semaphore_waits_are_not_part_of_detection() {
    let server = Server::start();
    let mut a = server.client();
    let mut b = server.client();
    hold(&mut a, "0", "lock", "A", false);
    assert!(int(&mut b, &["LOCK.SEMACQUIRE", "sem", "B", "1", LONG]) > 0);
    // A waits for a permit held by B; B waiting for "lock" (held by A) would be a cycle if
    // semaphore waits counted. They do not: B queues.
    let a_waits = {
        let mut observer = server.client();
        spawn_waiter(
            &server,
            &mut observer,
            &["LOCK.SEMACQUIRE", "sem", "A", "1", LONG, "WAIT", "30000"],
            1,
        )
    };
    let b_waits = queue(&server, "0", "lock", "B", false, 1);
    int(&mut a, &["LOCK.RELEASE", "lock", "A"]);
    assert!(b_waits.token() > 0);
    int(&mut b, &["LOCK.RELEASE", "sem", "B"]);
    assert!(a_waits.token() > 0);
}

/// Owners take keys in one global order (the classic way to avoid deadlock): no request is
/// ever part of a cycle, so none may be refused, however the waits interleave.
#[test]
fn no_refusal_when_owners_never_form_cycles() {
    let seconds: u64 = std::env::var("STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
        .min(20);
    let server = Server::start();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let refusals = std::sync::atomic::AtomicU64::new(0);
    let grants = std::sync::atomic::AtomicU64::new(0);
    thread::scope(|s| {
        for w in 0..12u64 {
            let (server, refusals, grants) = (&server, &refusals, &grants);
            s.spawn(move || {
                let mut c = server.client();
                let mut seed = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut n = 0;
                while Instant::now() < deadline {
                    n += 1;
                    let owner = format!("w{w}-{n}");
                    // 1 to 3 keys of 6, taken in increasing order, some shared.
                    let mut keys: Vec<u64> = (0..1 + next() % 3).map(|_| next() % 6).collect();
                    keys.sort();
                    keys.dedup();
                    let mut held = Vec::new();
                    for k in keys {
                        let key = format!("ordered:{k}");
                        let read = next() % 3 == 0;
                        let command = if read { "LOCK.RWREAD" } else { "LOCK.ACQUIRE" };
                        match query(&mut c, &[command, &key, &owner, "5000", "WAIT", "5000"]) {
                            Ok(Value::Int(_)) => {
                                grants.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                held.push(key);
                            }
                            Ok(_) => break,
                            Err(e) => {
                                if e.code() == Some("DEADLOCK") {
                                    refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                                break;
                            }
                        }
                    }
                    thread::sleep(Duration::from_micros(next() % 2000));
                    for key in held {
                        let _ = query(&mut c, &["LOCK.RELEASE", &key, &owner, "ALL"]);
                    }
                }
            });
        }
    });
    let (refused, granted) = (
        refusals.load(std::sync::atomic::Ordering::Relaxed),
        grants.load(std::sync::atomic::Ordering::Relaxed),
    );
    let mut c = server.client();
    let waited = info_field(&mut c, "grants_total");
    eprintln!("ordered owners: {granted} grants ({waited} by the server), {refused} refusals");
    assert!(granted > 100, "too few grants to mean anything: {granted}");
    assert_eq!(refused, 0, "a request that closes no cycle was refused");
    assert_eq!(info_field(&mut c, "deadlocks_total"), 0);
}

/// A hold granted from the queue while others still wait behind it counts as much as one
/// taken directly: W1 gets K when H releases, W2 still waits for K, and W1 asking for J (held
/// by W2) closes W1 -> W2 -> W1.
#[test]
fn a_hold_granted_from_the_queue_closes_cycles_too() {
    let server = Server::start();
    let mut h = server.client();
    let mut w2 = server.client();
    hold(&mut h, "0", "K", "H", false);
    hold(&mut w2, "0", "J", "W2", false);
    let w1_waits = queue(&server, "0", "K", "W1", false, 1);
    let w2_waits = queue(&server, "0", "K", "W2", false, 2);
    int(&mut h, &["LOCK.RELEASE", "K", "H"]);
    assert!(w1_waits.token() > 0);
    let mut w1 = server.client();
    assert_refused(
        &mut w1,
        "0",
        &["LOCK.ACQUIRE", "J", "W1", LONG, "WAIT", "30000"],
    );
    // Once nobody waits for what W1 holds, W1 may wait for J.
    int(&mut w1, &["LOCK.RELEASE", "K", "W1"]);
    assert!(w2_waits.token() > 0);
    int(&mut w2, &["LOCK.RELEASE", "K", "W2"]);
    let w1_waits_j = queue(&server, "0", "J", "W1", false, 1);
    int(&mut w2, &["LOCK.RELEASE", "J", "W2"]);
    assert!(w1_waits_j.token() > 0);
}

/// Blocks the module holds (LOCK.DEBUG-ALLOC, a `test-hooks` build).
fn module_blocks(c: &mut Connection) -> i64 {
    match query(c, &["LOCK.DEBUG-ALLOC"]) {
        Ok(Value::Array(v)) => match v.first() {
            Some(Value::Int(blocks)) => *blocks,
            other => panic!("LOCK.DEBUG-ALLOC: {other:?}"),
        },
        other => panic!("LOCK.DEBUG-ALLOC (a test-hooks build is needed): {other:?}"),
    }
}

/// Entries the deadlock index has added or removed so far (LOCK.DEBUG-INDEX).
fn index_writes(c: &mut Connection) -> i64 {
    int(c, &["LOCK.DEBUG-INDEX"])
}

/// Grants `n` holds on `key` in one pipeline: reads by `r0`.. or, with `capacity`, one permit
/// each to `p0`.. of a semaphore of that capacity.
fn many_holders(c: &mut Connection, key: &str, n: usize, capacity: Option<usize>) {
    let mut p = redis::pipe();
    for i in 0..n {
        match capacity {
            None => p.cmd("LOCK.RWREAD").arg(key).arg(format!("r{i}")).arg(LONG),
            Some(cap) => p
                .cmd("LOCK.SEMACQUIRE")
                .arg(key)
                .arg(format!("p{i}"))
                .arg(cap)
                .arg(LONG),
        };
    }
    let tokens: Vec<i64> = p.query(c).unwrap();
    assert!(tokens.iter().all(|t| *t > 0), "every hold granted");
}

/// The first waiter on a key with many holders, its timeout and the queue emptying do work
/// that does not grow with the holders (docs/commands.md and docs/benchmarks.md, section 14): the module
/// allocates nothing per holder for them, and the deadlock index files the key once. (Before
/// version 4 every holder was copied into the deadlock index when the queue appeared, and
/// dropped when it emptied.) Nor do the holders cost the index anything while nobody waits
/// (the first version 4 index filed every reader of a shared key at its grant).
#[test]
fn the_first_waiter_costs_nothing_per_holder() {
    const N: usize = 3_000;
    let server = Server::start();
    let mut c = server.client();
    // Holders of a key nobody waits for cost the index nothing, shared or not.
    let writes_before = index_writes(&mut c);
    many_holders(&mut c, "wide", N, None);
    many_holders(&mut c, "sem", N, Some(N));
    assert_eq!(
        index_writes(&mut c),
        writes_before,
        "readers of a key nobody waits for were indexed"
    );
    let requests: [(&str, &[&str]); 2] = [
        ("wide", &["LOCK.ACQUIRE", "wide", "w", LONG, "WAIT", "300"]),
        (
            "sem",
            &["LOCK.SEMACQUIRE", "sem", "w", "3000", LONG, "WAIT", "300"],
        ),
    ];
    for (key, words) in requests {
        let blocks_before = module_blocks(&mut c);
        let mut observer = server.client();
        let waiter = spawn_waiter(&server, &mut observer, words, 1);
        let blocks_waiting = module_blocks(&mut c);
        assert!(
            blocks_waiting - blocks_before < (N / 10) as i64,
            "{key}: the first waiter allocated {} blocks beside {N} holders",
            blocks_waiting - blocks_before
        );
        let writes_waiting = index_writes(&mut c);
        // Filed once (under the one user of its holders), not per holder; a semaphore never.
        assert!(
            writes_waiting - writes_before <= 2,
            "{key}: the first waiter wrote {} index entries",
            writes_waiting - writes_before
        );
        // Its timeout empties the queue again.
        assert_eq!(waiter.join().unwrap(), Value::Nil, "{key}: times out");
        wait_until("the queue is empty", || waiting(&mut c, key) == 0);
        let blocks_after = module_blocks(&mut c);
        assert!(
            (blocks_after - blocks_before).abs() < (N / 10) as i64,
            "{key}: {} blocks moved by the queue emptying",
            blocks_after - blocks_before
        );
        assert!(
            index_writes(&mut c) - writes_waiting <= 1,
            "{key}: the queue emptying wrote {} index entries",
            index_writes(&mut c) - writes_waiting
        );
    }
}

/// A cycle through one of many readers is still found: a writer queued behind the readers
/// waits for each of them, so a reader asking for the writer's key closes a cycle; a reader
/// asking for a key nobody in a cycle holds is not refused.
#[test]
fn a_cycle_through_one_of_many_readers_is_refused() {
    const N: usize = 3_000;
    let server = Server::start();
    let mut c = server.client();
    many_holders(&mut c, "wide", N, None);
    hold(&mut c, "0", "other", "X", false);
    hold(&mut c, "0", "free-ish", "Y", false);
    let before = index_writes(&mut c);
    // X queues behind the readers (the key's first waiter).
    let x_waits = queue(&server, "0", "wide", "X", false, 1);
    assert!(
        index_writes(&mut c) - before <= 2,
        "the first waiter rewrote the index"
    );
    // r1234 waiting for "other" would wait for X, who waits for r1234.
    assert_refused(
        &mut c,
        "0",
        &["LOCK.ACQUIRE", "other", "r1234", LONG, "WAIT", "30000"],
    );
    // r99 waiting for "free-ish" waits for Y, who waits for nobody.
    let mut r99 = server.client();
    let r99_waits = spawn_waiter(
        &server,
        &mut r99,
        &["LOCK.ACQUIRE", "free-ish", "r99", LONG, "WAIT", "30000"],
        1,
    );
    int(&mut c, &["LOCK.RELEASE", "free-ish", "Y"]);
    assert!(r99_waits.token() > 0);
    // The readers leave: X is granted.
    let mut p = redis::pipe();
    for i in 0..N {
        p.cmd("LOCK.RELEASE")
            .arg("wide")
            .arg(format!("r{i}"))
            .ignore();
    }
    p.query::<()>(&mut c).unwrap();
    assert!(x_waits.token() > 0);
}
