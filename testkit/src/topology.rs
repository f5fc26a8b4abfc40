//! Several servers together: replication links, Redis Cluster creation and routing.

use std::process::Command;
use std::time::Duration;

use redis::{Connection, Value};

use crate::commands::query;
use crate::info::{info_section, parse_info};
use crate::server::Server;
use crate::wait_until;

/// A new connection to the server on `port` with a 5 s read timeout, or `None` while it is
/// unreachable (a node being killed or failed over).
pub fn connect(port: u16) -> Option<Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let c = client.get_connection().ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(c)
}

/// Waits until the replica's link to its master is up.
pub fn wait_for_link(replica: &mut Connection) {
    wait_until("replica linked", || {
        info_section(replica, "replication")
            .get("master_link_status")
            .is_some_and(|s| s == "up")
    });
}

/// A master and a replica of it, both started with `extra` arguments, once the replica's link
/// is up.
pub fn master_and_replica(extra: &[&str]) -> (Server, Server) {
    let master = Server::start_with(extra);
    let port = master.port.to_string();
    let mut replica_args = extra.to_vec();
    replica_args.extend(["--replicaof", "127.0.0.1", &port]);
    let replica = Server::start_with(&replica_args);
    let mut r = replica.client();
    wait_for_link(&mut r);
    (master, replica)
}

/// Makes a cluster of `nodes` (started with `--cluster-enabled yes`) with `redis-cli
/// --cluster create`, `replicas` replicas per master.
pub fn create_cluster(nodes: &[Server], replicas: u32) -> Result<(), String> {
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .output()
        .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "redis-cli --cluster create: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Starts `masters` cluster-enabled servers with the module (node timeout 5 s), makes them one
/// cluster without replicas, and waits until every node says the cluster is ok.
pub fn start_cluster(masters: usize) -> Vec<Server> {
    let nodes: Vec<Server> = (0..masters)
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
    create_cluster(&nodes, 0).unwrap_or_else(|e| panic!("{e}"));
    for n in &nodes {
        wait_until("cluster ok", || cluster_state_ok(n.port));
    }
    nodes
}

/// `CLUSTER INFO` of the node on `port` says `cluster_state:ok` (false when unreachable).
pub fn cluster_state_ok(port: u16) -> bool {
    let Some(mut c) = connect(port) else {
        return false;
    };
    let Some(text) = text_reply(query(&mut c, &["CLUSTER", "INFO"])) else {
        return false;
    };
    parse_info(&text)
        .get("cluster_state")
        .is_some_and(|s| s == "ok")
}

/// The text of a bulk (RESP2) or verbatim (RESP3) string reply, as INFO-like commands send.
pub fn text_reply(reply: redis::RedisResult<Value>) -> Option<String> {
    match reply {
        Ok(Value::BulkString(b)) => Some(String::from_utf8_lossy(&b).to_string()),
        Ok(Value::VerbatimString { text, .. }) => Some(text),
        _ => None,
    }
}

/// Sends `words` to the node on `port`, following MOVED redirects (at most 3); returns the
/// node that answered and its reply.
pub fn follow_moved(mut port: u16, words: &[&str]) -> (u16, redis::RedisResult<Value>) {
    for _ in 0..3 {
        let mut c = connect(port).unwrap_or_else(|| panic!("node {port} unreachable"));
        match query(&mut c, words) {
            Err(e) if e.code() == Some("MOVED") => {
                port = e
                    .detail()
                    .and_then(|d| d.split(' ').nth(1))
                    .and_then(|target| target.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .expect("MOVED target");
            }
            other => return (port, other),
        }
    }
    panic!("redirect loop for {words:?}");
}

/// The cluster node id of the node on `port`.
pub fn node_id(port: u16) -> String {
    let mut c = connect(port).unwrap_or_else(|| panic!("node {port} unreachable"));
    match query(&mut c, &["CLUSTER", "MYID"]) {
        Ok(Value::BulkString(b)) => String::from_utf8_lossy(&b).to_string(),
        Ok(Value::SimpleString(s)) => s,
        other => panic!("CLUSTER MYID: {other:?}"),
    }
}

/// Starts moving hash slot `slot` from the node on `from` to the node on `to` and moves its
/// keys, as `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` on the target, `SETSLOT
/// MIGRATING` on the source, then `MIGRATE ... KEYS` of every key of the slot. The slot is
/// then still served by `from` (ASK redirects for the moved keys) until [`finish_slot_move`].
pub fn start_slot_move(slot: u16, from: u16, to: u16) {
    let slot = slot.to_string();
    let (from_id, to_id) = (node_id(from), node_id(to));
    let mut src = connect(from).expect("source node");
    let mut dst = connect(to).expect("target node");
    query(
        &mut dst,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id],
    )
    .expect("IMPORTING");
    query(
        &mut src,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id],
    )
    .expect("MIGRATING");
    let Ok(Value::Array(keys)) = query(&mut src, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"])
    else {
        panic!("GETKEYSINSLOT");
    };
    if keys.is_empty() {
        return;
    }
    let mut migrate = redis::cmd("MIGRATE");
    migrate
        .arg("127.0.0.1")
        .arg(to)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS");
    for k in keys {
        if let Value::BulkString(k) = k {
            migrate.arg(k);
        }
    }
    let reply: redis::RedisResult<Value> = migrate.query(&mut src);
    assert_eq!(reply, Ok(Value::Okay), "MIGRATE");
}

/// Ends a slot move begun by [`start_slot_move`]: `SETSLOT slot NODE target` on every node of
/// `ports`, so the target owns the slot and the others answer MOVED.
pub fn finish_slot_move(slot: u16, to: u16, ports: &[u16]) {
    let slot = slot.to_string();
    let to_id = node_id(to);
    for p in ports {
        let mut c = connect(*p).expect("node");
        query(&mut c, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]).expect("SETSLOT NODE");
    }
}
