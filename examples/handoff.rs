//! Measures release-to-grant handoff latency on a running server with the module loaded:
//! a waiter blocks with `LOCK.ACQUIRE ... WAIT 0`; the holder's `LOCK.RELEASE` is timed from
//! just before it is sent to the moment the waiter's reply (its token) arrives.
//!
//! Usage: `cargo run --release --example handoff -- [port] [rounds]` (defaults 6379, 2000).

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|a| a.parse().ok()).unwrap_or(6379);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut holder = client.get_connection()?;
    let mut observer = client.get_connection()?;
    let mut waiter = client.get_connection()?;

    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<Instant>();
    let waiter_thread = thread::spawn(move || -> redis::RedisResult<()> {
        while go_rx.recv().is_ok() {
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg("handoff")
                .arg("waiter")
                .arg(10_000)
                .arg("WAIT")
                .arg(0)
                .query(&mut waiter)?;
            let granted = Instant::now();
            let _: i64 = redis::cmd("LOCK.RELEASE")
                .arg("handoff")
                .arg("waiter")
                .query(&mut waiter)?;
            let _ = done_tx.send(granted);
        }
        Ok(())
    });

    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let _: i64 = redis::cmd("LOCK.ACQUIRE")
            .arg("handoff")
            .arg("holder")
            .arg(10_000)
            .query(&mut holder)?;
        go_tx.send(()).expect("waiter thread");
        // Wait until the waiter is queued.
        loop {
            let info: Vec<redis::Value> = redis::cmd("LOCK.INFO")
                .arg("handoff")
                .query(&mut observer)?;
            let queued = info.chunks(2).any(|p| {
                matches!((&p[0], &p[1]), (redis::Value::BulkString(k), redis::Value::Int(n)) if k == b"waiting" && *n == 1)
            });
            if queued {
                break;
            }
            thread::sleep(Duration::from_micros(200));
        }
        let sent = Instant::now();
        let _: i64 = redis::cmd("LOCK.RELEASE")
            .arg("handoff")
            .arg("holder")
            .query(&mut holder)?;
        let granted = done_rx.recv().expect("waiter thread");
        samples.push(granted.duration_since(sent));
    }
    drop(go_tx);
    waiter_thread.join().expect("waiter thread")?;

    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "handoff over {} rounds: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        samples.len(),
        pct(0.50),
        pct(0.90),
        pct(0.99),
        samples[samples.len() - 1]
    );
    Ok(())
}
