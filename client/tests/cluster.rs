//! The async client on a real 3-master Redis Cluster (module loaded on every node): a key on
//! every master, waits on dedicated connections, LOCK.INFO routed by key.
#![cfg(feature = "cluster")]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockError};
use redis_lock_testkit::{follow_moved, start_cluster, Server, Value, PATIENCE};

const TIMEOUT: Duration = Duration::from_millis(500);

/// One key per master: port -> key.
fn key_per_master(nodes: &[Server]) -> HashMap<u16, String> {
    let mut keys = HashMap::new();
    for i in 0..64 {
        let key = format!("ck:{i}");
        let (port, reply) = follow_moved(nodes[0].port, &["LOCK.INFO", &key]);
        assert!(matches!(reply, Ok(Value::Nil)), "{reply:?}");
        keys.entry(port).or_insert(key);
        if keys.len() == nodes.len() {
            break;
        }
    }
    assert_eq!(keys.len(), nodes.len(), "64 keys should reach every master");
    keys
}

/// The owners holding `key`, asked of the node that owns it.
fn holders_on(port: u16, key: &str) -> Vec<String> {
    let (answered, reply) = follow_moved(port, &["LOCK.INFO", key]);
    assert_eq!(answered, port, "{key} moved");
    let Ok(Value::Array(fields)) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for pair in fields.chunks(2) {
        if let [Value::BulkString(k), Value::Array(hs)] = pair {
            if k == b"holders" {
                for h in hs {
                    if let Value::Array(f) = h {
                        if let Some(Value::BulkString(o)) = f.first() {
                            out.push(String::from_utf8_lossy(o).into_owned());
                        }
                    }
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_on_every_master_and_waits_across_the_cluster() {
    let nodes = start_cluster(3);
    let keys = key_per_master(&nodes);
    // Reached through one node only: the client learns the slot map from it.
    let client =
        AsyncLockClient::cluster(&[format!("redis://127.0.0.1:{}/", nodes[1].port)], TIMEOUT)
            .unwrap();
    let ttl = Duration::from_secs(10);

    let mut guards = Vec::new();
    for (port, key) in &keys {
        let g = client.try_lock(key, ttl).await.unwrap();
        assert_eq!(holders_on(*port, key), vec![g.owner().to_string()]);
        let info = client.info(key).await.unwrap().unwrap();
        assert_eq!(info.hold_count(g.owner()), 1);
        assert!(matches!(
            client.try_lock(key, ttl).await,
            Err(LockError::Held { .. })
        ));
        guards.push(g);
    }

    // A waiter on each master; meanwhile the shared connection keeps answering.
    let waiters: Vec<_> = keys
        .values()
        .map(|key| {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move {
                client
                    .lock(&key, ttl, Duration::from_secs(8))
                    .await
                    .map(|g| g.fencing_token().unwrap())
            })
        })
        .collect();
    let deadline = Instant::now() + PATIENCE;
    for key in keys.values() {
        loop {
            let info = client.info(key).await.unwrap().unwrap();
            if info.waiting == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "waiter on {key} not queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token().unwrap()).collect();
    for g in guards {
        g.release().await.unwrap();
    }
    // (Both iterate the same map: the waiter of each key comes with its first guard's token.)
    for (w, before) in waiters.into_iter().zip(tokens) {
        assert!(w.await.unwrap().unwrap() > before);
    }
    // Dropped in their tasks: released by spawned releases.
    for key in keys.values() {
        let deadline = Instant::now() + PATIENCE;
        while client.info(key).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "{key} not released on drop");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    // `using` and min_replicas on a cluster.
    let key = keys.values().next().unwrap().clone();
    let out = client
        .using(
            &key,
            Acquire::write(ttl),
            |lost| async move { lost.is_lost() },
        )
        .await
        .unwrap();
    assert!(!out);
    assert!(matches!(
        client
            .acquire(&key, Acquire::write(ttl).min_replicas(1, TIMEOUT))
            .await,
        Err(LockError::InvalidRequest { .. })
    ));
    assert!(matches!(
        client.acquire(&key, Acquire::write(ttl).bind()).await,
        Err(LockError::InvalidRequest { .. })
    ));
}
