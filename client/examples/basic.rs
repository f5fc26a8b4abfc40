//! A tour of the client helper against servers you started with the module loaded.
//!
//! `cargo run -p redis-lock-client --example basic -- 6379`            (one server)
//! `cargo run -p redis-lock-client --example basic -- 7001 7002 7003`  (adds a Redlock run)

use std::time::Duration;

use redis_lock_client::{Acquire, LockClient, LockError, Redlock, Watchdog};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ports: Vec<String> = std::env::args().skip(1).collect();
    let ports = if ports.is_empty() {
        vec!["6379".to_string()]
    } else {
        ports
    };
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();

    // One server: the server queues waiters and hands out fencing tokens.
    let client = LockClient::new(&urls[0], Duration::from_millis(500))?;
    let guard = client.lock(
        "example:orders",
        Duration::from_secs(10),
        Duration::from_secs(2),
    )?;
    println!(
        "locked {} with fencing token {:?}, valid for {:?}",
        guard.key(),
        guard.fencing_token(),
        guard.validity()
    );
    match client.try_lock("example:orders", Duration::from_secs(10)) {
        Err(LockError::Held { .. }) => println!("a second try is refused while it is held"),
        other => println!("unexpected: {other:?}"),
    }
    guard.release()?;

    // A watchdog keeps a short lease alive for as long as the guard lives.
    let guard = client.acquire(
        "example:report",
        Acquire::write(Duration::from_millis(300))
            .watchdog(Watchdog::new().on_lost(|lost| eprintln!("lost {}", lost.key))),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "after 1 s with a 300 ms lease: lost = {}, validity {:?}",
        guard.is_lost(),
        guard.validity()
    );
    drop(guard);

    // A semaphore of 2 permits: each guard holds one; a third waits (FIFO) or is refused.
    let first = client.try_permit("example:slots", 2, Duration::from_secs(10))?;
    let second = client.try_permit("example:slots", 2, Duration::from_secs(10))?;
    match client.try_permit("example:slots", 2, Duration::from_secs(10)) {
        Err(LockError::Held { .. }) => println!("both permits are taken; a third is refused"),
        other => println!("unexpected: {other:?}"),
    }
    drop(first); // gives its permit back
    let third = client.permit(
        "example:slots",
        2,
        Duration::from_secs(10),
        Duration::from_secs(1),
    )?;
    println!(
        "permit tokens {:?} and {:?}",
        second.fencing_token(),
        third.fencing_token()
    );
    drop((second, third));

    if urls.len() >= 3 {
        let redlock = Redlock::new(&urls, Duration::from_millis(50))?;
        let guard = redlock.acquire(
            "example:nightly",
            Acquire::write(Duration::from_secs(10)).wait(Duration::from_secs(1)),
        )?;
        println!(
            "quorum {} of {}: tokens per server {:?}",
            redlock.quorum(),
            urls.len(),
            guard.tokens()
        );
        guard.release()?;
    }
    Ok(())
}
