//! Hash slots a node does not serve (a cluster): a node never grants, creates or re-creates a
//! lock key in a slot that another node now serves. When another master claims a slot (`CLUSTER
//! SETSLOT <slot> NODE <self>` + `CLUSTER BUMPEPOCH` on the claimant, what a by-hand resharding
//! whose MIGRATE failed ends with), the old owner deletes its keys of that slot itself ("dirty
//! slot"); its waiters for them are answered TRYAGAIN as after a MIGRATE, nothing is made anew
//! there, and the loss is counted in `INFO lock` (`lock_slot_losses_total`).

use std::time::Duration;

use redis_lock_testkit::*;

/// The error code of a waiter's reply, panicking if it was not an error.
fn error_code(reply: redis::RedisResult<Value>) -> String {
    match reply {
        Err(e) => e.code().unwrap_or("").to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn key_slot(c: &mut Connection, key: &str) -> u16 {
    u16::try_from(int(c, &["CLUSTER", "KEYSLOT", key])).expect("slot")
}

fn keys_in_slot(port: u16, slot: u16) -> i64 {
    let mut c = connect(port).expect("node");
    int(&mut c, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
}

/// Does the node on `port` say that `owner` serves `slot` (CLUSTER SLOTS)?
fn serves(port: u16, slot: u16, owner: u16) -> bool {
    let Some(mut c) = connect(port) else {
        return false;
    };
    let Ok(Value::Array(ranges)) = query(&mut c, &["CLUSTER", "SLOTS"]) else {
        return false;
    };
    ranges.iter().any(|r| match r {
        Value::Array(parts) => match (parts.first(), parts.get(1), parts.get(2)) {
            (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(node))) => {
                *a <= i64::from(slot)
                    && i64::from(slot) <= *b
                    && node.get(1) == Some(&Value::Int(i64::from(owner)))
            }
            _ => false,
        },
        _ => false,
    })
}

#[test]
fn a_slot_claimed_by_another_master_sends_the_old_owners_waiters_away() {
    let nodes = start_cluster(3);
    let key = "slots:{a}";
    let (a_port, reply) = follow_moved(nodes[0].port, &["LOCK.ACQUIRE", key, "H", "60000"]);
    assert!(matches!(reply, Ok(Value::Int(_))), "{reply:?}");
    let a = nodes.iter().find(|n| n.port == a_port).expect("owner");
    let b = nodes
        .iter()
        .find(|n| n.port != a_port)
        .expect("another master");
    let mut ca = a.client();
    let slot = key_slot(&mut ca, key);
    let w0 = spawn_waiter(
        a,
        &mut ca,
        &["LOCK.ACQUIRE", key, "W0", "60000", "WAIT", "60000"],
        1,
    );
    let w1 = spawn_waiter(
        a,
        &mut ca,
        &["LOCK.ACQUIRE", key, "W1", "60000", "WAIT", "60000"],
        2,
    );
    let grants_before = info_u64(&mut ca, "lock", "lock_grants_total");

    // B claims the slot with a newer epoch: A learns it by gossip and deletes its keys there.
    let mut cb = b.client();
    let b_id = node_id(b.port);
    query(
        &mut cb,
        &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &b_id],
    )
    .expect("SETSLOT");
    query(&mut cb, &["CLUSTER", "BUMPEPOCH"]).expect("BUMPEPOCH");
    wait_until("A learns that B serves the slot", || {
        serves(a.port, slot, b.port)
    });

    // Both waiters are sent away; neither is granted on A.
    // (The first waiter was granted here before: a second holder beside B's.)
    wait_until("the first waiter is answered", || w0.is_finished());
    let code0 = error_code(w0.join());
    wait_until("the second waiter is answered", || w1.is_finished());
    let code1 = error_code(w1.join());
    for code in [&code0, &code1] {
        assert!(code == "TRYAGAIN" || code == "MOVED", "{code}");
    }
    // A makes no key anew in the slot, now or after its settle pass.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(keys_in_slot(a.port, slot), 0, "no lock key left on A");
    assert_eq!(
        info_u64(&mut ca, "lock", "lock_grants_total"),
        grants_before
    );
    assert_eq!(info_u64(&mut ca, "lock", "lock_locks_held"), 0);
    assert_eq!(info_u64(&mut ca, "lock", "lock_waiters"), 0);
    assert!(info_u64(&mut ca, "lock", "lock_slot_losses_total") >= 1);

    // A newcomer on B (the slot's owner now) is the one holder there.
    let (port, reply) = follow_moved(a.port, &["LOCK.ACQUIRE", key, "N", "60000"]);
    assert_eq!(port, b.port);
    assert!(matches!(reply, Ok(Value::Int(_))), "{reply:?}");
    assert_eq!(holders(&mut cb, key), vec![("N".to_string(), 1)]);
    assert_eq!(keys_in_slot(a.port, slot), 0, "still nothing on A");
}

/// A slot deleted with `CLUSTER DELSLOTS` keeps its keys on the node, but nobody is served
/// there: its waiter is sent away and nobody is granted the lock when the holder's time runs
/// out (the timer's hand-over asks who serves the slot). A guard: the server answers such a
/// blocked client itself, so this passes without the module's check too.
#[test]
fn a_deleted_slot_grants_nothing_when_a_holder_expires() {
    let nodes = start_cluster(3);
    let key = "slots:{c}";
    // H's hold ends in 3 s; W waits behind it.
    let (a_port, reply) = follow_moved(nodes[0].port, &["LOCK.ACQUIRE", key, "H", "3000"]);
    assert!(matches!(reply, Ok(Value::Int(_))), "{reply:?}");
    let a = nodes.iter().find(|n| n.port == a_port).expect("owner");
    let mut ca = a.client();
    let slot = key_slot(&mut ca, key);
    let w = spawn_waiter(
        a,
        &mut ca,
        &["LOCK.ACQUIRE", key, "W", "60000", "WAIT", "60000"],
        1,
    );
    let grants_before = info_u64(&mut ca, "lock", "lock_grants_total");
    query(&mut ca, &["CLUSTER", "DELSLOTS", &slot.to_string()]).expect("DELSLOTS");

    // The server itself answers a client blocked on a key of a slot nobody serves
    // (CLUSTERDOWN, at its next cron tick); the module's timer, if it fires first, sends it
    // away too (TRYAGAIN). Either way nobody is granted here, before or after H's expiry.
    wait_until("the waiter is answered", || w.is_finished());
    let code = error_code(w.join());
    assert!(
        ["TRYAGAIN", "MOVED", "CLUSTERDOWN"].contains(&code.as_str()),
        "{code}"
    );
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(
        info_u64(&mut ca, "lock", "lock_grants_total"),
        grants_before
    );
    assert_eq!(info_u64(&mut ca, "lock", "lock_waiters"), 0);
}

/// The server's flavour is Valkey 9 or later (atomic slot migration).
fn has_atomic_slot_migration(c: &mut Connection) -> bool {
    matches!(flavor(c), Flavor::Valkey(major, _) if major >= 9)
}

/// Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) moves a slot with a held lock, a
/// waiter and a semaphore: the holds, their tokens, the capacity arrive on the target; the
/// source's waiter is sent there; the source grants nothing and keeps no key.
#[test]
fn valkey_atomic_slot_migration_moves_the_locks_of_a_slot() {
    let nodes = start_cluster(3);
    let mut c0 = nodes[0].client();
    if !has_atomic_slot_migration(&mut c0) {
        eprintln!("skipped: the server has no CLUSTER MIGRATESLOTS (Valkey 9+)");
        return;
    }
    let key = "asm:{b}";
    let sem = "asm:{b}:sem";
    let (a_port, reply) = follow_moved(nodes[0].port, &["LOCK.ACQUIRE", key, "H", "60000"]);
    let Ok(Value::Int(token)) = reply else {
        panic!("{reply:?}");
    };
    let a = nodes.iter().find(|n| n.port == a_port).expect("owner");
    let b = nodes
        .iter()
        .find(|n| n.port != a_port)
        .expect("another master");
    let mut ca = a.client();
    let sem_token = int(&mut ca, &["LOCK.SEMACQUIRE", sem, "S", "2", "60000"]);
    let slot = key_slot(&mut ca, key);
    let w = spawn_waiter(
        a,
        &mut ca,
        &["LOCK.ACQUIRE", key, "W", "60000", "WAIT", "60000"],
        1,
    );
    let grants_before = info_u64(&mut ca, "lock", "lock_grants_total");

    let b_id = node_id(b.port);
    let s = slot.to_string();
    let reply = query(
        &mut ca,
        &[
            "CLUSTER",
            "MIGRATESLOTS",
            "SLOTSRANGE",
            &s,
            &s,
            "NODE",
            &b_id,
        ],
    );
    assert_eq!(reply, Ok(Value::Okay), "MIGRATESLOTS");
    wait_until("the target serves the slot", || {
        serves(a.port, slot, b.port) && serves(b.port, slot, b.port)
    });

    // The source's waiter is sent to the target; the source grants nothing.
    wait_until("the waiter is answered", || w.is_finished());
    let code = error_code(w.join());
    assert!(code == "TRYAGAIN" || code == "MOVED", "{code}");
    wait_until("the source's keys of the slot are gone", || {
        keys_in_slot(a.port, slot) == 0
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        keys_in_slot(a.port, slot),
        0,
        "nothing made anew on the source"
    );
    assert_eq!(
        info_u64(&mut ca, "lock", "lock_grants_total"),
        grants_before
    );

    // A migration, not a loss: the waiter counts as moved away.
    assert_eq!(info_u64(&mut ca, "lock", "lock_slot_losses_total"), 0);
    assert_eq!(info_u64(&mut ca, "lock", "lock_migrated_waiters_total"), 1);
    // The holds go on at the target, with their tokens and the semaphore's capacity.
    let mut cb = b.client();
    assert_eq!(holders(&mut cb, key), vec![("H".to_string(), 1)]);
    assert_eq!(info_int(&mut cb, key, "fence"), token);
    assert_eq!(int(&mut cb, &["LOCK.ACQUIRE", key, "H", "60000"]), token);
    assert_eq!(holders(&mut cb, sem), vec![("S".to_string(), 1)]);
    assert_eq!(info_int(&mut cb, sem, "capacity"), 2);
    assert_eq!(
        int(&mut cb, &["LOCK.SEMACQUIRE", sem, "S", "2", "60000"]),
        sem_token
    );
    // A newcomer on the target queues behind H (the lock is held there, not free).
    assert!(is_nil(&mut cb, &["LOCK.ACQUIRE", key, "N", "60000"]));
}
