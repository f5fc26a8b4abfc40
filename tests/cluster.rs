//! A 3-master Redis Cluster on loopback, the module loaded on every node: keys in different
//! slots lock independently, the wrong node answers MOVED, and a client that follows
//! redirects can lock any key.

use std::process::Command;

use redis_lock_testkit::*;

/// Sends `words` to the node on `port`, following MOVED redirects (at most 3).
fn follow(nodes: &[Server], mut port: u16, words: &[&str]) -> (u16, redis::RedisResult<Value>) {
    for _ in 0..3 {
        let node = nodes.iter().find(|n| n.port == port).expect("known node");
        let mut c = node.client();
        match query(&mut c, words) {
            Err(e) if e.code() == Some("MOVED") => {
                let target = e
                    .detail()
                    .and_then(|d| d.split(' ').nth(1))
                    .expect("MOVED target");
                port = target
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("port");
            }
            other => return (port, other),
        }
    }
    panic!("redirect loop for {words:?}");
}

#[test]
fn a_three_master_cluster_routes_lock_commands_by_key() {
    let nodes: Vec<Server> = (0..3)
        .map(|_| {
            Server::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            ])
        })
        .collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let status = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("redis-cli --cluster create");
    assert!(status.success());
    for n in &nodes {
        let mut c = n.client();
        wait_until("cluster ok", || {
            let text: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
            parse_info(&text)
                .get("cluster_state")
                .is_some_and(|s| s == "ok")
        });
    }

    // Keys spread over slots: find which node owns each and check they all lock.
    let keys: Vec<String> = (0..12).map(|i| format!("lock:{i}")).collect();
    let mut owners = std::collections::HashSet::new();
    for (i, key) in keys.iter().enumerate() {
        let start = nodes[i % 3].port;
        let (port, reply) = follow(&nodes, start, &["LOCK.ACQUIRE", key, "me", "60000"]);
        assert!(matches!(reply, Ok(Value::Int(_))), "{key}: {reply:?}");
        owners.insert(port);
        // The owning node answers directly; the others redirect.
        for n in &nodes {
            let mut c = n.client();
            let r = query(&mut c, &["LOCK.INFO", key]);
            if n.port == port {
                assert!(
                    matches!(r, Ok(Value::Array(_)) | Ok(Value::Map(_))),
                    "{r:?}"
                );
            } else {
                assert_eq!(r.unwrap_err().code(), Some("MOVED"));
            }
        }
        let (_, reply) = follow(&nodes, start, &["LOCK.RELEASE", key, "me"]);
        assert_eq!(reply.unwrap(), Value::Int(0));
    }
    assert_eq!(owners.len(), 3, "12 keys should spread over the 3 masters");
}
