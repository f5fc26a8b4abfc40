//! Memory does not leak: after many acquire / release / timeout / disconnect cycles,
//! `used_memory` returns to its baseline within a small margin.
//!
//! LEAK_CYCLES sets the acquire / release pairs per round (default 100,000; the closing figures
//! use 1,000,000); timeouts and disconnects scale with it.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use common::*;

fn used_memory(c: &mut Connection) -> i64 {
    let text: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

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
                    let cmd = format!(
                        "*6\r\n$12\r\nLOCK.ACQUIRE\r\n$9\r\nleak:held\r\n${}\r\n{owner}\r\n$4\r\n1000\r\n$4\r\nWAIT\r\n$1\r\n0\r\n",
                        owner.len()
                    );
                    sock.write_all(cmd.as_bytes()).unwrap();
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

#[test]
fn used_memory_returns_to_its_baseline_after_many_cycles() {
    let cycles: usize = std::env::var("LEAK_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let server = Server::start();
    let mut c = server.client();
    let settle = |c: &mut Connection| {
        wait_until("settled", || {
            info_field(c, "waiters") == 0 && info_field(c, "locks_held") == 0
        });
        // Redis trims its pool of temp clients (two per module-blocked client) once a second.
        thread::sleep(Duration::from_millis(2500));
        used_memory(c)
    };
    // Warm up, then two identical rounds: whatever grows once (allocator classes, pools and
    // tables reaching a larger working size) shows in the first; a leak grows again in the
    // second.
    churn(&server, 20_000, 400, 200);
    let baseline = settle(&mut c);
    churn(&server, cycles, cycles / 50, cycles / 100);
    let first = settle(&mut c);
    churn(&server, cycles, cycles / 50, cycles / 100);
    let second = settle(&mut c);
    eprintln!(
        "leaks: 2 rounds of {cycles} acquire/release pairs, {} timeouts, {} disconnects: \
         used_memory {baseline} -> {first} ({:+}) -> {second} ({:+} in the second round)",
        cycles / 50,
        cycles / 100,
        first - baseline,
        second - first
    );
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
    // A leak of even one byte per cycle would show as more than this in the second round.
    let again = second - first;
    assert!(
        again.abs() < 64 * 1024,
        "used_memory grew by {again} bytes in the second round"
    );
    let once = first - baseline;
    assert!(once.abs() < 1024 * 1024, "used_memory grew by {once} bytes");
}
