//! The async client on a Redis Cluster whose masters all load the module.
//!
//! `cargo run -p redis-lock-client --example cluster -- 7000 7001 7002`

use std::time::Duration;

use redis_lock_client::aio::AsyncLockClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes: Vec<String> = std::env::args()
        .skip(1)
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let nodes = if nodes.is_empty() {
        vec!["redis://127.0.0.1:7000/".to_string()]
    } else {
        nodes
    };
    let client = AsyncLockClient::cluster(&nodes, Duration::from_millis(500))?;
    // Keys in different slots live on different masters; each is routed to its own.
    for key in ["example:a", "example:b", "example:c"] {
        let guard = client
            .lock(key, Duration::from_secs(10), Duration::from_secs(2))
            .await?;
        println!("{key}: token {:?}", guard.fencing_token());
        guard.release().await?;
    }
    Ok(())
}
