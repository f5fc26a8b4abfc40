//! A 3-master Redis Cluster on loopback, the module loaded on every node: keys in different
//! slots lock independently, the wrong node answers MOVED, and a client that follows
//! redirects can lock any key.

use redis_lock_testkit::*;

#[test]
fn a_three_master_cluster_routes_lock_commands_by_key() {
    let nodes = start_cluster(3);

    // Keys spread over slots: find which node owns each and check they all lock.
    let keys: Vec<String> = (0..12).map(|i| format!("lock:{i}")).collect();
    let mut owners = std::collections::HashSet::new();
    for (i, key) in keys.iter().enumerate() {
        let start = nodes[i % 3].port;
        let (port, reply) = follow_moved(start, &["LOCK.ACQUIRE", key, "me", "60000"]);
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
        let (_, reply) = follow_moved(start, &["LOCK.RELEASE", key, "me"]);
        assert_eq!(reply.unwrap(), Value::Int(0));
    }
    assert_eq!(owners.len(), 3, "12 keys should spread over the 3 masters");
}
