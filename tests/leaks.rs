//! Memory does not leak: after many acquire / release / timeout / disconnect cycles (and bound
//! holds on ever new keys over one connection), the module's own live allocations return to
//! where they were.
//!
//! The primary figure is the module's allocation count (blocks and bytes it holds, counted by
//! the `test-hooks` build's allocator and read with LOCK.DEBUG-ALLOC): it moves only with the
//! module's code. `used_memory` is not: Redis pools two temp clients (about 17 KB each on Redis
//! 7.0) per module-blocked client and trims the pool gradually on a cron, so it steps by tens
//! of KB with timing. It is checked only against a bound far above what that pool can hold.
//!
//! LEAK_CYCLES sets the acquire / release pairs per round (default 100,000; the closing figures
//! use 1,000,000); timeouts and disconnects scale with it.

use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

/// One round of every kind of cycle: `pairs` acquire / release pairs (with reentry and
/// readers), `timeouts` waiters timing out, `disconnects` waiters whose connection closes.
fn churn(server: &Server, pairs: usize, timeouts: usize, disconnects: usize) {
    let mut c = server.client();
    for start in (0..pairs).step_by(1000) {
        let mut p = redis::pipe();
        for i in start..(start + 1000).min(pairs) {
            let key = format!("leak:{}", i % 5000);
            let owner = format!("owner-{i}");
            if i % 3 == 0 {
                p.cmd("LOCK.RWREAD")
                    .arg(&key)
                    .arg(&owner)
                    .arg(60_000)
                    .ignore();
            } else {
                p.cmd("LOCK.ACQUIRE")
                    .arg(&key)
                    .arg(&owner)
                    .arg(60_000)
                    .ignore();
                p.cmd("LOCK.ACQUIRE")
                    .arg(&key)
                    .arg(&owner)
                    .arg(60_000)
                    .ignore();
            }
            p.cmd("LOCK.RELEASE")
                .arg(&key)
                .arg(&owner)
                .arg("ALL")
                .ignore();
        }
        p.query::<()>(&mut c).unwrap();
    }
    // Waiters that time out, and waiters whose connection closes, on held locks.
    int(&mut c, &["LOCK.ACQUIRE", "leak:held", "holder", "600000"]);
    thread::scope(|s| {
        for t in 0..20 {
            s.spawn(move || {
                let mut w = server.client();
                for i in 0..timeouts / 20 {
                    let owner = format!("t{t}-{i}");
                    let r = query(
                        &mut w,
                        &["LOCK.ACQUIRE", "leak:held", &owner, "1000", "WAIT", "1"],
                    );
                    assert!(matches!(r, Ok(Value::Nil)), "{r:?}");
                }
            });
        }
        for t in 0..20 {
            s.spawn(move || {
                for i in 0..disconnects / 20 {
                    let mut sock = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
                    let owner = format!("d{t}-{i}");
                    send_raw(
                        &mut sock,
                        &["LOCK.ACQUIRE", "leak:held", &owner, "1000", "WAIT", "0"],
                    )
                    .unwrap();
                    thread::sleep(Duration::from_micros(200));
                    drop(sock);
                }
            });
        }
    });
    wait_until("disconnected waiters gone", || {
        waiting(&mut c, "leak:held") == 0
    });
    int(&mut c, &["LOCK.RELEASE", "leak:held", "holder"]);
}

/// Bound holds taken on `n` keys new to this round on one long-lived connection, each released
/// or deleted: the module must forget where the connection held them, not keep a record per key
/// until the connection closes.
fn bound_churn(c: &mut Connection, round: &str, n: usize) {
    for start in (0..n).step_by(1000) {
        let mut p = redis::pipe();
        for i in start..(start + 1000).min(n) {
            let key = format!("bound:{round}:{i}");
            p.cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg("b")
                .arg(60_000)
                .arg("BIND")
                .ignore();
            if i % 2 == 0 {
                p.cmd("LOCK.RELEASE").arg(&key).arg("b").ignore();
            } else {
                p.cmd("DEL").arg(&key).ignore();
            }
        }
        p.query::<()>(c).unwrap();
    }
}

/// Blocks and bytes the module holds (LOCK.DEBUG-ALLOC).
fn module_allocations(c: &mut Connection) -> (i64, i64) {
    match query(c, &["LOCK.DEBUG-ALLOC"]) {
        Ok(Value::Array(v)) => match v.as_slice() {
            [Value::Int(blocks), Value::Int(bytes)] => (*blocks, *bytes),
            other => panic!("LOCK.DEBUG-ALLOC: {other:?}"),
        },
        other => panic!("LOCK.DEBUG-ALLOC (a test-hooks build is needed): {other:?}"),
    }
}

#[derive(Clone, Copy, Debug)]
struct Snapshot {
    blocks: i64,
    bytes: i64,
    used_memory: i64,
}

#[test]
fn module_allocations_return_to_their_baseline_after_many_cycles() {
    let cycles: usize = std::env::var("LEAK_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let server = Server::start();
    let mut c = server.client();
    let settle = |c: &mut Connection| {
        // Every waiter answered and gone, every key deleted: the module holds only what it
        // keeps for the life of the server (tables that keep their capacity, the counters).
        wait_until("settled", || {
            info_field(c, "waiters") == 0
                && info_field(c, "locks_held") == 0
                && int(c, &["DBSIZE"]) == 0
        });
        // The server gives memory back over a few cron runs after such a burst (its pool of
        // temp clients for blocked clients, closed connections): up to 20 MB here, gone within
        // about 3 s. Wait until used_memory has not fallen for a second, at most 30 s.
        let deadline = std::time::Instant::now() + scaled(Duration::from_secs(30));
        let mut last = used_memory(c);
        while std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_secs(1));
            let now = used_memory(c);
            if now >= last {
                break;
            }
            last = now;
        }
        let (blocks, bytes) = module_allocations(c);
        Snapshot {
            blocks,
            bytes,
            used_memory: used_memory(c),
        }
    };
    // Warm up, then two identical rounds: whatever grows once (tables reaching their working
    // size) shows in the warm-up or the first round; a leak grows again in the second.
    let mut bound_conn = server.client();
    churn(&server, 20_000, 400, 200);
    bound_churn(&mut bound_conn, "warm-up", 2_000);
    let baseline = settle(&mut c);
    churn(&server, cycles, cycles / 50, cycles / 100);
    bound_churn(&mut bound_conn, "first", cycles / 10);
    let first = settle(&mut c);
    churn(&server, cycles, cycles / 50, cycles / 100);
    bound_churn(&mut bound_conn, "second", cycles / 10);
    let second = settle(&mut c);
    eprintln!(
        "leaks: 2 rounds of {cycles} acquire/release pairs, {} timeouts, {} disconnects, {} \
         bound holds on new keys: \
         module blocks {} -> {} -> {}, module bytes {} -> {} -> {}, \
         used_memory {} -> {} -> {}",
        cycles / 50,
        cycles / 100,
        cycles / 10,
        baseline.blocks,
        first.blocks,
        second.blocks,
        baseline.bytes,
        first.bytes,
        second.bytes,
        baseline.used_memory,
        first.used_memory,
        second.used_memory,
    );
    // A leak of one allocation per cycle adds `cycles` blocks per round. A table that is empty
    // but keeps its capacity is one block however large, so the count barely moves without a
    // leak (a table may allocate or free its one block between snapshots).
    for (what, from, to) in [
        ("warm-up -> first", baseline, first),
        ("first -> second", first, second),
    ] {
        let blocks = to.blocks - from.blocks;
        assert!(
            blocks.abs() <= 16,
            "{what} round: the module's live allocations changed by {blocks} blocks"
        );
    }
    // Bytes: a table keeps the capacity of the most entries it ever held at once, and that
    // peak depends on timing (waiters whose connections close pile up until the server
    // processes the closes): a few hundred KB at most here. A container that grows by even
    // 16 bytes per cycle would pass 1 MB in a round.
    let bytes = second.bytes - first.bytes;
    assert!(
        bytes.abs() < 1024 * 1024,
        "the module's live bytes changed by {bytes} in the second round"
    );
    // used_memory also moves with the server's temp-client pool: at most 40 clients block at
    // once here, two pooled temp clients of under 25 KB each per blocked client, about 2 MB.
    // Anything the module made the server keep per cycle (a string, a timer, a client) would
    // pass 8 MB well before 100,000 cycles.
    let used = second.used_memory - first.used_memory;
    assert!(
        used < 8 * 1024 * 1024,
        "used_memory grew by {used} bytes in the second round"
    );
}
