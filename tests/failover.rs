//! Fencing tokens never go backwards across failovers done by the real machinery: Redis
//! Sentinel promoting a replica, and a Redis Cluster replica taking over its failed master.
//! In both the promoted replica missed the last grants of the dead master (it was stopped and
//! its link dropped, as a network partition would do), and every token the new master hands
//! out must still be above every token the dead master replied.
//!
//! Before the fault the dead master reloads its data (`DEBUG RELOAD`, as a master restarted
//! from its RDB with its replicas resyncing partially would): its counter then stands on a
//! wall-clock floor newer than anything the replica loaded or received, so only the floor the
//! replica takes when it is promoted puts its tokens above the master's. A module that jumped
//! to the floor only at load and at the end of loading would fail these tests.

use std::collections::{HashMap, HashSet};
use std::thread;
use std::time::Duration;

use redis_lock_testkit::*;

/// How long a failover may take on a loaded 2-core machine (it takes a few seconds).
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

/// Tokens stay exact for every client (a double's 2^53 - 1) through a promotion.
const MAX_EXACT: i64 = (1 << 53) - 1;

fn acquire(c: &mut Connection, key: &str, owner: &str) -> i64 {
    int(c, &["LOCK.ACQUIRE", key, owner, "600000"])
}

/// A LOCK.RELEASE reply: the remaining count, or NOTOWNER where the holder is missing.
fn check_release(key: &str, reply: redis::RedisResult<Value>) {
    match reply {
        Ok(Value::Int(_)) => {}
        Err(e) if e.code() == Some("NOTOWNER") => {}
        other => panic!("LOCK.RELEASE {key}: {other:?}"),
    }
}

/// Releases `key` if `owner` holds it.
fn release(c: &mut Connection, key: &str, owner: &str) {
    check_release(key, query(c, &["LOCK.RELEASE", key, owner]));
}

/// `INFO replication` of the server on `port` says `role:master` (false when unreachable).
fn is_master(port: u16) -> bool {
    let Some(mut c) = connect(port) else {
        return false;
    };
    text_reply(query(&mut c, &["INFO", "replication"]))
        .is_some_and(|text| parse_info(&text).get("role").is_some_and(|r| r == "master"))
}

/// The last `n` lines of a log file.
fn log_tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---- Sentinel ----

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

/// A `SENTINEL replicas|sentinels <name>` reply: one map of fields per entry (RESP2 flat
/// arrays or RESP3 maps).
fn sentinel_table(c: &mut Connection, words: &[&str]) -> Vec<HashMap<String, String>> {
    let Ok(Value::Array(entries)) = query(c, words) else {
        return Vec::new();
    };
    entries
        .iter()
        .map(|entry| match entry {
            Value::Array(fields) => fields
                .chunks(2)
                .map(|kv| (text(&kv[0]), text(&kv[1])))
                .collect(),
            Value::Map(fields) => fields.iter().map(|(k, v)| (text(k), text(v))).collect(),
            _ => HashMap::new(),
        })
        .collect()
}

/// The sentinel sees the replica on `replica_port` healthy and linked to its master, and
/// knows the other two sentinels: what it needs before it can fail over to that replica.
fn sentinel_ready(sentinel: &Sentinel, replica_port: u16) -> bool {
    let Some(mut c) = connect(sentinel.port) else {
        return false;
    };
    let replica_ok = sentinel_table(&mut c, &["SENTINEL", "REPLICAS", "m"])
        .iter()
        .any(|r| {
            r.get("port") == Some(&replica_port.to_string())
                && r.get("flags").is_some_and(|f| f == "slave")
                && r.get("master-link-status").is_some_and(|s| s == "ok")
        });
    replica_ok && sentinel_table(&mut c, &["SENTINEL", "SENTINELS", "m"]).len() == 2
}

/// The port `SENTINEL get-master-addr-by-name m` names on this sentinel.
fn master_port_by_sentinel(sentinel: &Sentinel) -> Option<u16> {
    let mut c = connect(sentinel.port)?;
    match query(&mut c, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"]) {
        Ok(Value::Array(addr)) if addr.len() == 2 => text(&addr[1]).parse().ok(),
        _ => None,
    }
}

fn sentinel_logs(sentinels: &[Sentinel]) -> String {
    sentinels
        .iter()
        .map(|s| format!("--- sentinel {} ---\n{}", s.port, log_tail(&s.log(), 40)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_replica_promoted_by_sentinel_after_missing_the_last_grants_continues_above_them() {
    let master = Server::start_with(&["--enable-debug-command", "yes"]);
    let master_port = master.port.to_string();
    // Priority 100 (the default, spelled out): 0 would make Sentinel never promote it.
    let replica = Server::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &master_port,
        "--replica-priority",
        "100",
    ]);
    let mut m = master.client();
    let mut r = replica.client();
    wait_for_link(&mut r);
    drop(r);
    let replicated = grant_many(&mut m, "seen", 10);
    assert_eq!(
        int(&mut m, &["WAIT", "1", "5000"]),
        1,
        "replica acknowledged"
    );

    // Three sentinels (quorum 2). They learn the replica from the master's INFO and each
    // other from hello messages; wait until each of them could pick the replica.
    let sentinels: Vec<Sentinel> = (0..3)
        .map(|_| Sentinel::monitor("m", master.port, 2, 4000))
        .collect();
    if let Err(after) = poll_within(FAILOVER_BOUND, || {
        sentinels.iter().all(|s| sentinel_ready(s, replica.port))
    }) {
        panic!(
            "sentinels did not see the replica and each other within {after:?}\n{}",
            sentinel_logs(&sentinels)
        );
    }

    // The replica stops and the master drops its link (a partition): what the master grants
    // next never reaches the replica. The master reloads its data first (see the top of this
    // file), then grants, then dies. The replica resumes at once, well before the sentinels
    // notice the master is down (1 s), so it is a healthy candidate.
    replica.signal("STOP");
    int(&mut m, &["CLIENT", "KILL", "TYPE", "replica"]);
    thread::sleep(Duration::from_millis(5));
    assert_eq!(query(&mut m, &["DEBUG", "RELOAD"]).unwrap(), Value::Okay);
    let mut max = grant_many(&mut m, "missed", 100);
    // A replicated key changes hands on the master only: its fence there moves past what the
    // replica has for it.
    release(&mut m, "seen:0", "owner");
    max = max.max(acquire(&mut m, "seen:0", "late"));
    assert!(max > replicated);
    drop(m);
    drop(master); // SIGKILL, and waits until it is gone
    replica.signal("CONT");

    let promoted = poll_within(FAILOVER_BOUND, || {
        sentinels
            .iter()
            .any(|s| master_port_by_sentinel(s) == Some(replica.port))
            && is_master(replica.port)
    });
    let took = promoted.unwrap_or_else(|after| {
        panic!(
            "sentinel did not promote the replica within {after:?}\n{}",
            sentinel_logs(&sentinels)
        )
    });
    eprintln!("sentinel promoted the replica {took:?} after the master died");

    // Sentinel kills the normal clients of the promoted replica: connect afresh.
    let mut r = replica.client();
    assert_eq!(
        int(&mut r, &["EXISTS", "missed:0"]),
        0,
        "the replica missed them"
    );
    assert_eq!(
        int(&mut r, &["EXISTS", "seen:1"]),
        1,
        "the replica had the rest"
    );
    // Keys the dead master granted and the replica never heard of, a replicated key (still
    // held there by its first owner), and keys nobody locked before.
    for key in [
        "missed:0",
        "missed:99",
        "missed:shared",
        "seen:0",
        "seen:1",
        "fresh",
    ] {
        release(&mut r, key, "owner");
        let next = acquire(&mut r, key, "after");
        assert!(
            next > max && next <= MAX_EXACT,
            "{key}: token {next} after the Sentinel failover, {max} before"
        );
    }
    let reader = int(&mut r, &["LOCK.RWREAD", "fresh-shared", "reader", "600000"]);
    assert!(reader > max, "reader token {reader}, {max} before");
}

// ---- Cluster ----

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The master's id, for a replica.
    master: Option<String>,
    has_slots: bool,
}

impl NodeLine {
    fn is(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
    fn failing(&self) -> bool {
        self.is("fail") || self.is("fail?")
    }
}

fn cluster_nodes_text(port: u16) -> Option<String> {
    let mut c = connect(port)?;
    text_reply(query(&mut c, &["CLUSTER", "NODES"]))
}

fn cluster_nodes(port: u16) -> Vec<NodeLine> {
    let Some(text) = cluster_nodes_text(port) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 8 {
                return None;
            }
            // ip:port@cport[,hostname]
            let port = parts[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            Some(NodeLine {
                id: parts[0].to_string(),
                port,
                flags: parts[2].split(',').map(str::to_string).collect(),
                master: (parts[3] != "-").then(|| parts[3].to_string()),
                has_slots: parts.len() > 8,
            })
        })
        .collect()
}

/// A token from the node owning `words[1]`, reached from `start`; returns (node, token).
fn follow_int(start: u16, words: &[&str]) -> (u16, i64) {
    match follow_moved(start, words) {
        (port, Ok(Value::Int(t))) => (port, t),
        (port, other) => panic!("{words:?} on {port}: expected an integer, got {other:?}"),
    }
}

fn cluster_report(nodes: &[Server]) -> String {
    nodes
        .iter()
        .map(|n| {
            format!(
                "--- node {} ---\n{}\n{}",
                n.port,
                cluster_nodes_text(n.port).unwrap_or_else(|| "(unreachable)".into()),
                log_tail(
                    &std::fs::read_to_string(n.dir.join("node.log")).unwrap_or_default(),
                    15
                )
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_cluster_replica_that_missed_the_last_grants_takes_over_above_them() {
    let mut nodes: Vec<Server> = (0..6)
        .map(|_| {
            Server::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                // The replica's link was down while its master failed: let it take over
                // however long that was.
                "--cluster-replica-validity-factor",
                "0",
                "--enable-debug-command",
                "yes",
                "--logfile",
                "node.log",
            ])
        })
        .collect();
    create_cluster(&nodes, 1).unwrap_or_else(|e| panic!("{e}"));
    // Every node sees 3 masters with slots and 3 healthy replicas, the cluster is ok, and
    // every replica's link is up.
    let ready = poll_within(FAILOVER_BOUND, || {
        nodes.iter().all(|n| {
            let view = cluster_nodes(n.port);
            let masters = view
                .iter()
                .filter(|l| l.is("master") && l.has_slots && !l.failing())
                .count();
            let replicas = view
                .iter()
                .filter(|l| l.is("slave") && l.master.is_some() && !l.failing())
                .count();
            let linked = !view.iter().any(|l| l.is("myself") && l.is("slave"))
                || connect(n.port).is_some_and(|mut c| {
                    info_section(&mut c, "replication")
                        .get("master_link_status")
                        .is_some_and(|s| s == "up")
                });
            masters == 3 && replicas == 3 && linked && cluster_state_ok(n.port)
        })
    });
    if let Err(after) = ready {
        panic!(
            "cluster not ready within {after:?}\n{}",
            cluster_report(&nodes)
        );
    }

    // Keys over the three masters, one grant each; tokens recorded per node.
    let keys: Vec<String> = (0..12).map(|i| format!("lock:{i}")).collect();
    let mut owner_of: HashMap<String, u16> = HashMap::new();
    let mut max_of: HashMap<u16, i64> = HashMap::new();
    for key in &keys {
        let (port, token) = follow_int(nodes[0].port, &["LOCK.ACQUIRE", key, "owner", "600000"]);
        owner_of.insert(key.clone(), port);
        let max = max_of.entry(port).or_default();
        *max = (*max).max(token);
    }
    assert_eq!(max_of.len(), 3, "12 keys should spread over the 3 masters");

    // The master that will die (the owner of lock:0) and its replica.
    let a_port = owner_of["lock:0"];
    let view = cluster_nodes(a_port);
    let a_id = view
        .iter()
        .find(|l| l.port == a_port)
        .expect("A in CLUSTER NODES")
        .id
        .clone();
    let r_port = view
        .iter()
        .find(|l| l.master.as_deref() == Some(a_id.as_str()))
        .expect("A has a replica")
        .port;
    let a_keys: Vec<String> = keys
        .iter()
        .filter(|k| owner_of[*k] == a_port)
        .cloned()
        .collect();
    let a = nodes.iter().position(|n| n.port == a_port).unwrap();
    let r = nodes.iter().position(|n| n.port == r_port).unwrap();
    let mut ca = nodes[a].client();
    assert_eq!(
        int(&mut ca, &["WAIT", "1", "5000"]),
        1,
        "replica acknowledged"
    );

    // Partition the replica (stopped, link dropped), reload the master's data (see the top of
    // this file), then grants on A's slots only A will ever know of: the replicated keys
    // change hands, and new keys with the same hash tags are locked.
    nodes[r].signal("STOP");
    int(&mut ca, &["CLIENT", "KILL", "TYPE", "replica"]);
    thread::sleep(Duration::from_millis(5));
    assert_eq!(query(&mut ca, &["DEBUG", "RELOAD"]).unwrap(), Value::Okay);
    let mut max = 0;
    for key in &a_keys {
        release(&mut ca, key, "owner");
        max = max.max(acquire(&mut ca, key, "late"));
        max = max.max(grant_many(&mut ca, &format!("{{{key}}}:missed"), 20));
    }
    assert!(max > max_of[&a_port]);
    drop(ca);
    nodes[a].signal("KILL");
    wait_until("the master is dead", || !nodes[a].alive());
    nodes[r].signal("CONT");

    // The replica takes over once the other masters flag A as failed and vote for it.
    let survivors: Vec<u16> = nodes
        .iter()
        .map(|n| n.port)
        .filter(|p| *p != a_port)
        .collect();
    // Done when the replica says it is a master, and every survivor sees it owning slots, sees
    // A as failed and is in cluster_state:ok (so every survivor routes A's slots to it).
    let promoted = poll_within(FAILOVER_BOUND, || {
        is_master(r_port)
            && survivors.iter().all(|p| {
                let view = cluster_nodes(*p);
                view.iter()
                    .any(|l| l.port == r_port && l.is("master") && l.has_slots)
                    && view.iter().any(|l| l.port == a_port && l.is("fail"))
                    && cluster_state_ok(*p)
            })
    });
    let took = promoted.unwrap_or_else(|after| {
        panic!(
            "the replica did not take over within {after:?}\n{}",
            cluster_report(&nodes)
        )
    });
    eprintln!("the cluster promoted the replica {took:?} after the master died");

    // A's keys now route to the promoted replica (asked through another master), which missed
    // the last grants; every token it hands out is above every token A replied.
    let other = *max_of.keys().find(|p| **p != a_port).unwrap();
    let tag0 = format!("{{{}}}:missed:0", a_keys[0]);
    let (port, exists) = follow_int(other, &["EXISTS", &tag0]);
    assert_eq!(port, r_port, "{tag0} routes to the promoted replica");
    assert_eq!(exists, 0, "the replica missed the last grants");
    for key in &a_keys {
        let missed = format!("{{{key}}}:missed:0");
        let shared = format!("{{{key}}}:missed:shared");
        let fresh = format!("{{{key}}}:fresh");
        for k in [key, &missed, &shared, &fresh] {
            let (port, reply) = follow_moved(other, &["LOCK.RELEASE", k, "owner"]);
            check_release(k, reply);
            assert_eq!(port, r_port, "{k} routes to the promoted replica");
            let (_, next) = follow_int(other, &["LOCK.ACQUIRE", k, "after", "600000"]);
            assert!(
                next > max && next <= MAX_EXACT,
                "{k}: token {next} after the cluster failover, {max} before"
            );
        }
    }

    // Keys on the other masters stay there, and their tokens keep increasing.
    let mut others_checked = HashSet::new();
    for key in keys.iter().filter(|k| owner_of[*k] != a_port) {
        let before = max_of[&owner_of[key]];
        let (_, reply) = follow_moved(other, &["LOCK.RELEASE", key, "owner"]);
        check_release(key, reply);
        let (port, next) = follow_int(other, &["LOCK.ACQUIRE", key, "after", "600000"]);
        assert_eq!(port, owner_of[key], "{key} stays on its master");
        assert!(
            next > before,
            "{key}: token {next} on {port}, {before} before"
        );
        others_checked.insert(port);
    }
    assert_eq!(
        others_checked.len(),
        2,
        "both surviving masters were checked"
    );
    nodes.clear();
}
