//! Both clients over TLS (feature `tls`), trusting a CA given as a PEM file.
//!
//! `cargo run -p redis-lock-client --features tls --example tls -- 6380 ca.crt`

use std::time::Duration;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::redis::{self, TlsCertificates};
use redis_lock_client::LockClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port = args.next().unwrap_or_else(|| "6380".into());
    let ca = std::fs::read(args.next().unwrap_or_else(|| "ca.crt".into()))?;
    let redis_client = redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}/"),
        TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )?;
    let timeout = Duration::from_millis(500);

    let sync = LockClient::from_client(&redis_client, timeout)?;
    let guard = sync.try_lock("example:tls", Duration::from_secs(10))?;
    println!("sync: token {:?}", guard.fencing_token());
    guard.release()?;

    let client = AsyncLockClient::from_client(redis_client, timeout);
    let guard = client
        .try_lock("example:tls", Duration::from_secs(10))
        .await?;
    println!("async: token {:?}", guard.fencing_token());
    guard.release().await?;
    Ok(())
}
