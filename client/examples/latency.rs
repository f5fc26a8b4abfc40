//! Acquire latency of a quorum lock over N servers next to a lock on one server, uncontended.
//!
//! `cargo run --release -p redis-lock-client --example latency -- 1000 7001 7002 7003 7004 7005`
//! (count, then ports; the single-server figure uses the first port).

use std::time::{Duration, Instant};

use redis_lock_client::{Acquire, LockClient, Redlock};

fn percentiles(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    format!(
        "median {:?}  p99 {:?}  max {:?}",
        at(0.5),
        at(0.99),
        samples[samples.len() - 1]
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let urls: Vec<String> = args.map(|p| format!("redis://127.0.0.1:{p}/")).collect();
    if urls.is_empty() {
        return Err("give a count and at least one port".into());
    }
    let ttl = Duration::from_secs(10);
    let timeout = Duration::from_millis(200);

    let single = LockClient::new(&urls[0], timeout)?;
    let redlock = Redlock::new(&urls, timeout)?;
    // Warm up the connections.
    single.try_lock("latency:warm", ttl)?.release()?;
    redlock
        .acquire("latency:warm", Acquire::write(ttl))?
        .release()?;

    let mut one = Vec::with_capacity(count);
    let mut quorum = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("latency:{i}");
        let t = Instant::now();
        let g = single.try_lock(&key, ttl)?;
        one.push(t.elapsed());
        g.release()?;
        let t = Instant::now();
        let g = redlock.acquire(&key, Acquire::write(ttl))?;
        quorum.push(t.elapsed());
        g.release()?;
    }
    println!("acquire, {count} times, uncontended:");
    println!("  one server:           {}", percentiles(one));
    println!(
        "  quorum of {} servers:  {}",
        urls.len(),
        percentiles(quorum)
    );
    Ok(())
}
