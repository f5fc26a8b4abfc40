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

/// A waiting acquire whose key is moved to another node while another owner holds it (a slot
/// resharded as `redis-cli --cluster reshard` does): the old node answers TRYAGAIN, the
/// client sends the wait again where the key now lives, and it is granted there once the
/// holder releases, with a larger token. Never a token while the holder still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_follows_its_key_when_the_slot_is_resharded() {
    use redis_lock_testkit::{finish_slot_move, int, start_slot_move};
    let nodes = start_cluster(3);
    let key = "moving:{slot}";
    let (src, reply) = follow_moved(nodes[0].port, &["LOCK.ACQUIRE", key, "holder", "60000"]);
    let Ok(Value::Int(held)) = reply else {
        panic!("{reply:?}");
    };
    let dst = nodes.iter().map(|n| n.port).find(|p| *p != src).unwrap();
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let client =
        AsyncLockClient::cluster(&[format!("redis://127.0.0.1:{}/", nodes[0].port)], TIMEOUT)
            .unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let got = client
                .lock(key, Duration::from_secs(30), Duration::from_secs(20))
                .await
                .map(|g| (g.fencing_token().unwrap(), g));
            (got, started.elapsed())
        })
    };
    let deadline = Instant::now() + PATIENCE;
    while client.info(key).await.unwrap().map_or(0, |i| i.waiting) != 1 {
        assert!(Instant::now() < deadline, "the wait did not queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let slot = {
        let mut c = redis_lock_testkit::connect(src).unwrap();
        u16::try_from(int(&mut c, &["CLUSTER", "KEYSLOT", key])).unwrap()
    };
    tokio::task::spawn_blocking(move || start_slot_move(slot, src, dst))
        .await
        .unwrap();
    // The wait is queued again on the new node, behind the holder that moved with the key.
    let on_target = || {
        // The slot is importing there: only a request after ASKING is served.
        let mut c = redis_lock_testkit::connect(dst).unwrap();
        redis_lock_testkit::query(&mut c, &["ASKING"]).unwrap();
        redis_lock_testkit::waiting(&mut c, key)
    };
    let deadline = Instant::now() + PATIENCE;
    while on_target() != 1 {
        assert!(!waiter.is_finished(), "the wait ended on the old node");
        assert!(
            Instant::now() < deadline,
            "the wait was not queued on the new node"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::task::spawn_blocking(move || finish_slot_move(slot, dst, &ports))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "granted while the holder still holds"
    );
    let (answered, released) = follow_moved(dst, &["LOCK.RELEASE", key, "holder"]);
    assert_eq!((answered, released), (dst, Ok(Value::Int(0))));
    let (got, waited) = waiter.await.unwrap();
    let (token, guard) = got.unwrap();
    assert!(token > held as u64, "{token} after {held}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    assert_eq!(holders_on(dst, key), vec![guard.owner().to_string()]);
    guard.release().await.unwrap();
}

/// The same move while the holder keeps the lock: the wait ends within its time (plus the
/// client's margins) with no lock, and leaves nothing queued or held on either node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_wait_still_ends_in_time_without_the_lock() {
    use redis_lock_testkit::{int, start_slot_move};
    let nodes = start_cluster(3);
    let key = "moving:{bounded}";
    let (src, reply) = follow_moved(nodes[0].port, &["LOCK.ACQUIRE", key, "holder", "60000"]);
    assert!(matches!(reply, Ok(Value::Int(_))), "{reply:?}");
    let dst = nodes.iter().map(|n| n.port).find(|p| *p != src).unwrap();
    let client =
        AsyncLockClient::cluster(&[format!("redis://127.0.0.1:{}/", nodes[0].port)], TIMEOUT)
            .unwrap();
    let wait = Duration::from_secs(3);
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let got = client.lock(key, Duration::from_secs(30), wait).await;
            (got.map(|g| g.fencing_token()), started.elapsed())
        })
    };
    let deadline = Instant::now() + PATIENCE;
    while client.info(key).await.unwrap().map_or(0, |i| i.waiting) != 1 {
        assert!(Instant::now() < deadline, "the wait did not queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let slot = {
        let mut c = redis_lock_testkit::connect(src).unwrap();
        u16::try_from(int(&mut c, &["CLUSTER", "KEYSLOT", key])).unwrap()
    };
    tokio::task::spawn_blocking(move || start_slot_move(slot, src, dst))
        .await
        .unwrap();
    let (got, waited) = waiter.await.unwrap();
    // Not granted, as any wait whose time ran out; and within its time (the client's own
    // bound, were the wait sent again in full on the new node, is wait + timeout + 1 s).
    assert!(matches!(got, Err(LockError::Held { .. })), "{got:?}");
    assert!(
        waited < wait + TIMEOUT + Duration::from_millis(500),
        "{waited:?}"
    );
    // Nothing of it stays queued where the key went.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut c = redis_lock_testkit::connect(dst).unwrap();
        redis_lock_testkit::query(&mut c, &["ASKING"]).unwrap();
        if redis_lock_testkit::waiting(&mut c, key) == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wait stayed queued on the new node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
