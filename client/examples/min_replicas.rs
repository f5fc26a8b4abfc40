//! A grant that counts only once a replica acknowledged it (`min_replicas`).
//!
//! `cargo run -p redis-lock-client --example min_replicas -- 6379` (a master with a replica)

use std::time::Duration;

use redis_lock_client::{Acquire, LockClient, LockError};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "6379".into());
    let client = LockClient::new(
        &format!("redis://127.0.0.1:{port}/"),
        Duration::from_millis(500),
    )?;
    let request = Acquire::write(Duration::from_secs(10))
        .wait(Duration::from_secs(2))
        .min_replicas(1, Duration::from_millis(500));
    match client.acquire("example:replicated", request) {
        Ok(guard) => {
            println!(
                "held, and a replica has it: token {:?}",
                guard.fencing_token()
            );
            guard.release()?;
        }
        Err(LockError::ReplicasNotAcknowledged {
            wanted,
            acknowledged,
            ..
        }) => {
            println!("granted but only {acknowledged} of {wanted} replicas acknowledged: released")
        }
        Err(e) => println!("not acquired: {e}"),
    }
    Ok(())
}
