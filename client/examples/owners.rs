//! Owners of your choice: re-entry, hold counts, LOCK.INFO, and the upgrade deadlock.
//!
//! `cargo run -p redis-lock-client --example owners -- 6379`

use std::time::Duration;

use redis_lock_client::{Acquire, LockClient, LockError, OwnerIdentity};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "6379".into());
    let base = LockClient::new(
        &format!("redis://127.0.0.1:{port}/"),
        Duration::from_millis(500),
    )?;
    let ttl = Duration::from_secs(10);

    // One owner for every guard of this client: a job that locks a key in nested steps.
    let job = base.with_owner(OwnerIdentity::Fixed("job-42".into()))?;
    let outer = job.try_lock("example:account", ttl)?;
    let inner = job.try_lock("example:account", ttl)?; // re-entered: same token
    println!(
        "tokens {:?} and {:?}, hold count {}",
        outer.fencing_token(),
        inner.fencing_token(),
        inner.hold_count()?
    );
    drop(inner); // one hold released
    println!("hold count after one release: {}", outer.hold_count()?);
    if let Some(info) = base.info("example:account")? {
        println!("LOCK.INFO: mode {}, holders {:?}", info.mode, info.holders);
    }
    drop(outer);

    // An owner that reads a key cannot upgrade to writing it: the server says DEADLOCK.
    let read = job.try_read("example:doc", ttl)?;
    match job.acquire("example:doc", Acquire::write(ttl)) {
        Err(LockError::Deadlock { causes }) => println!("upgrade refused: {causes:?}"),
        other => println!("unexpected: {other:?}"),
    }
    drop(read);

    // A per-request owner wins over the client's.
    let g = job.acquire("example:doc", Acquire::write(ttl).owner("job-43"))?;
    println!("held by {}", g.owner());
    Ok(())
}
