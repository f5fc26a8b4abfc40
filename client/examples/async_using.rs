//! The async client: a lock shared by tasks, `using` with a lost-lock signal, and a guard
//! released on drop.
//!
//! `cargo run -p redis-lock-client --example async_using -- 6379`

use std::time::Duration;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, OwnerIdentity};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "6379".into());
    let url = format!("redis://127.0.0.1:{port}/");
    // Owners named after the service, so LOCK.INFO shows whose holds they are.
    let client = AsyncLockClient::new(&url, Duration::from_millis(500))?
        .with_owner(OwnerIdentity::Prefix("example-svc:".into()))?;

    // Eight tasks share one client (clones share its connections) and take turns.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let guard = client
                    .lock(
                        "example:async",
                        Duration::from_secs(5),
                        Duration::from_secs(10),
                    )
                    .await?;
                println!("task {i} holds token {:?}", guard.fencing_token());
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.release().await
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }

    // `using`: a watchdog keeps the lease while the closure runs; the closure stops early if
    // the lock is lost (try `DEL example:job` from redis-cli while it runs).
    let outcome = client
        .using(
            "example:job",
            Acquire::write(Duration::from_secs(3)).wait(Duration::from_secs(5)),
            |lost| async move {
                tokio::select! {
                    _ = lost.lost() => "lock lost: stopped before publishing",
                    _ = tokio::time::sleep(Duration::from_secs(5)) => "work done under the lock",
                }
            },
        )
        .await?;
    println!("{outcome}");

    // Dropping a guard releases it from a task spawned on the runtime: no blocking.
    let guard = client
        .try_lock("example:dropped", Duration::from_secs(30))
        .await?;
    drop(guard);
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!(
        "after drop: {:?}",
        client.info("example:dropped").await?.map(|i| i.holders)
    );
    Ok(())
}
