//! Semaphores (`LOCK.SEMACQUIRE key owner capacity ttl [WAIT timeout] [BIND]`) against a real
//! redis-server: capacity under random concurrent load with a checked history, FIFO grants,
//! refusals that change nothing, crashed and disconnected holders, one more permit for an owner,
//! RELEASE / ALL / EXTEND, persistence (RDB, AOF, rewrite), replicas and promotion, LOCK.INFO and
//! INFO fields, keyspace notifications, command metadata, MULTI / Lua, deletion.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_testkit::*;

/// A TTL far longer than any test.
const LONG: &str = "600000";

/// STRESS_SECONDS, default 10 for this file.
fn stress_seconds() -> u64 {
    std::env::var("STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

fn refs(words: &[String]) -> Vec<&str> {
    words.iter().map(String::as_str).collect()
}

/// `LOCK.SEMACQUIRE key owner capacity ttl`, expecting a token.
fn sem(c: &mut Connection, key: &str, owner: &str, capacity: u32, ttl: &str) -> i64 {
    int(
        c,
        &["LOCK.SEMACQUIRE", key, owner, &capacity.to_string(), ttl],
    )
}

/// LOCK.INFO `mode`.
fn mode(c: &mut Connection, key: &str) -> String {
    let map = info(c, key).unwrap_or_else(|| panic!("{key} does not exist"));
    value_text(&map["mode"])
}

/// LOCK.INFO `capacity` (None for a lock key or a missing key).
fn capacity(c: &mut Connection, key: &str) -> Option<i64> {
    info(c, key).and_then(|m| match m.get("capacity") {
        Some(Value::Int(n)) => Some(*n),
        None => None,
        other => panic!("capacity: {other:?}"),
    })
}

/// The permits held on `key` (the sum of the holders' counts).
fn permits(c: &mut Connection, key: &str) -> i64 {
    holders(c, key).iter().map(|(_, n)| n).sum()
}

/// LOCK.INFO as (field, value) pairs in reply order (RESP2), with each holder's remaining ttl
/// blanked: what must be equal between two servers or before and after a refused command.
fn info_shape(c: &mut Connection, key: &str) -> Option<Vec<(String, Value)>> {
    match query(c, &["LOCK.INFO", key]).expect("LOCK.INFO") {
        Value::Nil => None,
        Value::Array(items) => Some(
            items
                .chunks(2)
                .map(|pair| {
                    let name = value_text(&pair[0]);
                    let mut value = pair[1].clone();
                    // Times move: a holder's ttl (third) and hold age (fourth), a waiter's
                    // waited ms (third).
                    if name == "holders" || name == "waiters" {
                        if let Value::Array(hs) = &mut value {
                            for h in hs {
                                if let Value::Array(parts) = h {
                                    parts[2] = Value::Nil;
                                    if name == "holders" && parts.len() > 3 {
                                        parts[3] = Value::Nil;
                                    }
                                }
                            }
                        }
                    }
                    (name, value)
                })
                .collect(),
        ),
        other => panic!("LOCK.INFO reply {other:?}"),
    }
}

/// What must survive for a semaphore key: holders with their permits, fence, capacity, mode.
type SemState = (Vec<(String, i64)>, i64, Option<i64>, String);

fn sem_state(c: &mut Connection, key: &str) -> SemState {
    (
        holders(c, key),
        info_int(c, key, "fence"),
        capacity(c, key),
        mode(c, key),
    )
}

/// The INFO lock figures a refused command must leave alone.
fn lock_figures(c: &mut Connection) -> Vec<(&'static str, u64)> {
    [
        "locks_held",
        "readers",
        "writers",
        "waiters",
        "permits",
        "grants_total",
        "expirations_total",
    ]
    .into_iter()
    .map(|f| (f, info_field(c, f)))
    .collect()
}

fn sorted_keys(c: &mut Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys
}

/// Makes sure everything `c` wrote, and everything propagated before it, reached the replica:
/// WAIT only counts the writes of the connection that sends it, and grants made by the expiry
/// timer belong to no connection, so write a marker first.
fn replicate(c: &mut Connection) {
    query(c, &["SET", "replication-marker", "x"]).unwrap();
    assert_eq!(
        int(c, &["WAIT", "1", "5000"]),
        1,
        "replica did not acknowledge"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Random concurrent load: never more than `capacity` permits held at once.
// ---------------------------------------------------------------------------------------------

/// Keys `sem:0..` and their capacities.
const CAPACITIES: [u32; 4] = [1, 2, 3, 5];
const WORKERS: usize = 32;

/// One permit, as a *definite* interval: from the grant's reply arriving to the earliest of the
/// release (of one permit, or ALL) being sent, the owner's lease lower bound (every grant and
/// EXTEND of the owner resets its one expiry to `now + ttl`, so the owner surely holds until
/// the smallest `sent + ttl` among them, minus the clock margin), and for a BIND hold a CLIENT
/// KILL of its connection that may have run after its first grant. The server held the permit
/// during all of that interval.
#[derive(Clone, Debug)]
struct Permit {
    key: usize,
    owner: String,
    token: i64,
    /// The request of this grant was sent.
    sent: Instant,
    /// The first grant of the owner's hold was requested (a kill after that may end it).
    hold_sent: Instant,
    start: Instant,
    end: Instant,
    /// The connection the hold is bound to (BIND on its first grant).
    bound: Option<i64>,
    /// The first grant of a hold (a new token), not one more permit for a holder.
    fresh: bool,
    /// What the owner's attempt did, for failure messages.
    story: Arc<String>,
}

/// One owner's hold being recorded by a worker.
struct Hold {
    key: usize,
    owner: String,
    token: i64,
    hold_sent: Instant,
    bound: Option<i64>,
    lease_end: Instant,
    /// Permits not yet released: (request sent, reply arrived, fresh).
    open: Vec<(Instant, Instant, bool)>,
}

impl Hold {
    fn end_one(&mut self, at: Instant, out: &mut Vec<Permit>) {
        if let Some((sent, start, fresh)) = self.open.pop() {
            out.push(self.permit(sent, start, fresh, at));
        }
    }

    fn end_all(&mut self, at: Instant, out: &mut Vec<Permit>) {
        while !self.open.is_empty() {
            self.end_one(at, out);
        }
    }

    fn permit(&self, sent: Instant, start: Instant, fresh: bool, at: Instant) -> Permit {
        Permit {
            key: self.key,
            owner: self.owner.clone(),
            token: self.token,
            sent,
            hold_sent: self.hold_sent,
            start,
            end: at.min(self.lease_end),
            bound: self.bound,
            fresh,
            story: Arc::default(),
        }
    }
}

#[derive(Default)]
struct History {
    permits: Vec<Permit>,
    /// (client id, CLIENT KILL sent, its reply received); also a worker closing its last
    /// connection at the end.
    kills: Vec<(i64, Instant, Instant)>,
    /// Replies that contradict what the client knows for certain.
    wrong_replies: Vec<String>,
}

fn connect(server: &Server, ids: &Mutex<HashMap<usize, i64>>, me: usize) -> (Connection, i64) {
    let mut c = server.client();
    let id = client_id(&mut c);
    ids.lock().unwrap().insert(me, id);
    (c, id)
}

fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

/// The largest number of intervals of `key` that overlap at one instant, and that instant.
fn max_overlap(permits: &[Permit], key: usize) -> (usize, Option<Instant>) {
    // (instant, +1 / -1); at the same instant an end sorts before a start (half-open).
    let mut events: Vec<(Instant, i32)> = permits
        .iter()
        .filter(|p| p.key == key && p.start < p.end)
        .flat_map(|p| [(p.start, 1), (p.end, -1)])
        .collect();
    events.sort();
    let (mut now, mut max, mut at) = (0i32, 0i32, None);
    for (t, d) in events {
        now += d;
        if now > max {
            max = now;
            at = Some(t);
        }
    }
    (max as usize, at)
}

/// The permits of `key` held at `at`, for a failure message.
fn held_at(permits: &[Permit], key: usize, at: Instant, t0: Instant) -> Vec<String> {
    permits
        .iter()
        .filter(|p| p.key == key && p.start <= at && at < p.end)
        .map(|p| {
            format!(
                "{} (token {}, {} permit, bound {:?}, requested {:?} / granted {:?} before the \
                 instant, ends {:?} after it; instant at {:?}): {}",
                p.owner,
                p.token,
                if p.fresh { "first" } else { "one more" },
                p.bound,
                at - p.sent,
                at - p.start,
                p.end - at,
                at - t0,
                p.story,
            )
        })
        .collect()
}

/// One worker: asks for permits as fresh owners, sometimes one or two more for the same owner,
/// extends, releases one by one or ALL, or abandons; random TTLs, WAITs and BIND.
fn worker(
    w: usize,
    t0: Instant,
    server: &Server,
    deadline: Instant,
    history: &Mutex<History>,
    ids: &Mutex<HashMap<usize, i64>>,
    counters: &StressCounters,
) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w as u64 + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let (mut conn, mut conn_id) = connect(server, ids, w);
    let mut n = 0u64;
    let wrong = |what: String| history.lock().unwrap().wrong_replies.push(what);
    while Instant::now() < deadline {
        n += 1;
        let key = rng.below(CAPACITIES.len() as u64) as usize;
        let name = format!("sem:{key}");
        let cap = CAPACITIES[key];
        let owner = format!("w{w}-{n}");
        let asks = if rng.below(3) == 0 {
            2 + rng.below(2)
        } else {
            1
        };
        let mut hold: Option<Hold> = None;
        let mut done: Vec<Permit> = Vec::new();
        let mut story: Vec<String> = vec![format!("conn {conn_id}")];
        let mut note = |sent: Instant, arrived: Instant, what: String| {
            story.push(format!("at {:?} ({:?}): {what}", sent - t0, arrived - sent));
        };
        let mut broken = false;
        for _ in 0..asks {
            let ttl = 20 + rng.below(300);
            let mut words = vec![
                "LOCK.SEMACQUIRE".to_string(),
                name.clone(),
                owner.clone(),
                cap.to_string(),
                ttl.to_string(),
            ];
            let mut options: Vec<Vec<String>> = Vec::new();
            match rng.below(16) {
                0 => options.push(vec!["WAIT".into(), "0".into()]),
                1..=3 => {}
                _ => options.push(vec!["WAIT".into(), (1 + rng.below(250)).to_string()]),
            }
            let bind = rng.below(3) == 0;
            if bind {
                options.push(vec!["BIND".into()]);
            }
            // Options in any order.
            if rng.below(2) == 0 {
                options.reverse();
            }
            words.extend(options.into_iter().flatten());
            counters.requests.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            let reply = query(&mut conn, &refs(&words));
            let arrived = Instant::now();
            note(sent, arrived, format!("{:?} -> {reply:?}", &words[3..]));
            if arrived - sent > Duration::from_secs(20) {
                counters.lost.fetch_add(1, Ordering::Relaxed);
                eprintln!("no reply to {words:?} for {:?}: {reply:?}", arrived - sent);
            }
            let lease = sent + Duration::from_millis(ttl) - CLOCK_MARGIN;
            match reply {
                Ok(Value::Int(token)) => {
                    counters.grants.fetch_add(1, Ordering::Relaxed);
                    match &mut hold {
                        Some(h) if h.token == token => {
                            counters.regrants.fetch_add(1, Ordering::Relaxed);
                            h.lease_end = h.lease_end.min(lease);
                            h.open.push((sent, arrived, false));
                        }
                        other => {
                            if let Some(h) = other {
                                // A new token: the earlier hold had ended before this grant.
                                if arrived < h.lease_end {
                                    wrong(format!(
                                        "{owner} on {name}: token {token} instead of its own {} \
                                         while its lease surely ran",
                                        h.token
                                    ));
                                }
                                let end = h.lease_end;
                                h.end_all(end, &mut done);
                            }
                            *other = Some(Hold {
                                key,
                                owner: owner.clone(),
                                token,
                                hold_sent: sent,
                                bound: bind.then_some(conn_id),
                                lease_end: lease,
                                open: vec![(sent, arrived, true)],
                            });
                        }
                    }
                }
                Ok(Value::Nil) => {
                    counters.nils.fetch_add(1, Ordering::Relaxed);
                }
                Ok(other) => panic!("{words:?}: {other:?}"),
                Err(e) if is_connection_error(&e) => {
                    // The connection was killed: the request may or may not have been granted
                    // (and reset the owner's expiry). Give the hold up.
                    if let Some(h) = &mut hold {
                        h.lease_end = h.lease_end.min(lease);
                    }
                    broken = true;
                    break;
                }
                Err(e) => panic!("{words:?}: {e:?}"),
            };
            thread::sleep(Duration::from_millis(rng.below(20)));
        }
        if !broken {
            if let Some(h) = &mut hold {
                if rng.below(4) == 0 {
                    let ext = 20 + rng.below(300);
                    let sent = Instant::now();
                    let reply = query(&mut conn, &["LOCK.EXTEND", &name, &owner, &ext.to_string()]);
                    let arrived = Instant::now();
                    note(sent, arrived, format!("EXTEND {ext} -> {reply:?}"));
                    match reply {
                        Ok(Value::Int(1)) => {
                            h.lease_end = h
                                .lease_end
                                .min(sent + Duration::from_millis(ext) - CLOCK_MARGIN);
                        }
                        Err(e) if is_connection_error(&e) => {
                            h.lease_end = h
                                .lease_end
                                .min(sent + Duration::from_millis(ext) - CLOCK_MARGIN);
                            broken = true;
                        }
                        Err(e) if e.code() == Some("NOTOWNER") => {
                            if arrived < h.lease_end {
                                wrong(format!("EXTEND {name} {owner}: NOTOWNER during its lease"));
                            }
                        }
                        other => panic!("EXTEND: {other:?}"),
                    }
                }
            }
        }
        if !broken {
            if let Some(h) = &mut hold {
                match rng.below(8) {
                    // Abandon: the lease ends it.
                    0 => {}
                    // Release ALL.
                    1..=3 => {
                        let sent = Instant::now();
                        let reply = query(&mut conn, &["LOCK.RELEASE", &name, &owner, "ALL"]);
                        let arrived = Instant::now();
                        note(sent, arrived, format!("RELEASE ALL -> {reply:?}"));
                        h.end_all(sent, &mut done);
                        match reply {
                            Ok(Value::Int(0)) => {}
                            Err(e) if is_connection_error(&e) => broken = true,
                            Err(e) if e.code() == Some("NOTOWNER") => {
                                if arrived < h.lease_end {
                                    wrong(format!("RELEASE {name} {owner} ALL: NOTOWNER"));
                                }
                            }
                            other => wrong(format!("RELEASE {name} {owner} ALL: {other:?}")),
                        }
                    }
                    // One permit at a time, maybe abandoning the last ones.
                    _ => {
                        let keep = if rng.below(4) == 0 { 1 } else { 0 };
                        while h.open.len() > keep {
                            let expected = h.open.len() as i64 - 1;
                            let sent = Instant::now();
                            let reply = query(&mut conn, &["LOCK.RELEASE", &name, &owner]);
                            let arrived = Instant::now();
                            note(sent, arrived, format!("RELEASE -> {reply:?}"));
                            h.end_one(sent, &mut done);
                            let alive = arrived < h.lease_end;
                            match reply {
                                Ok(Value::Int(left)) if left == expected || !alive => {}
                                Err(e) if is_connection_error(&e) => {
                                    broken = true;
                                    break;
                                }
                                Err(e) if e.code() == Some("NOTOWNER") && !alive => break,
                                other => wrong(format!(
                                    "RELEASE {name} {owner}: {other:?}, expected {expected}"
                                )),
                            }
                            thread::sleep(Duration::from_millis(rng.below(10)));
                        }
                    }
                }
            }
        }
        if let Some(h) = &mut hold {
            let end = h.lease_end;
            h.end_all(end, &mut done);
        }
        let story = Arc::new(story.join("; "));
        for p in done.iter_mut() {
            p.story = story.clone();
        }
        history.lock().unwrap().permits.extend(done);
        if broken {
            (conn, conn_id) = connect(server, ids, w);
        }
    }
    // Closing the connection ends its bound holds like a CLIENT KILL: record it as one.
    ids.lock().unwrap().remove(&w);
    let closed = Instant::now();
    drop(conn);
    history
        .lock()
        .unwrap()
        .kills
        .push((conn_id, closed, Instant::now()));
}

#[derive(Default)]
struct StressCounters {
    requests: AtomicU64,
    grants: AtomicU64,
    regrants: AtomicU64,
    nils: AtomicU64,
    lost: AtomicU64,
}

#[test]
fn random_clients_never_hold_more_permits_than_the_capacity() {
    let seconds = stress_seconds();
    let server = Server::start();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(seconds);
    let history = Mutex::new(History::default());
    let ids: Mutex<HashMap<usize, i64>> = Mutex::new(HashMap::new());
    let counters = StressCounters::default();
    let stop = AtomicBool::new(false);
    // What LOCK.INFO showed while the run went on: the most permits per key, anomalies.
    let seen_max = Mutex::new([0i64; CAPACITIES.len()]);
    let anomalies: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let samples = AtomicU64::new(0);

    thread::scope(|s| {
        for w in 0..WORKERS {
            let (history, ids, counters, server) = (&history, &ids, &counters, &server);
            s.spawn(move || worker(w, t0, server, deadline, history, ids, counters));
        }
        // Chaos: kill random workers' connections.
        s.spawn(|| {
            let mut rng = Rng(0xdead_beef_cafe_f00d);
            let mut c = server.client();
            while Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20 + rng.below(60)));
                let victim = ids
                    .lock()
                    .unwrap()
                    .get(&(rng.below(WORKERS as u64) as usize))
                    .copied();
                if let Some(id) = victim {
                    let sent = Instant::now();
                    let _ = query(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
                    history
                        .lock()
                        .unwrap()
                        .kills
                        .push((id, sent, Instant::now()));
                }
            }
        });
        // Monitor: the server's own view never shows more permits than the capacity, and the
        // key always shows its capacity.
        s.spawn(|| {
            let mut c = server.client();
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                for (k, cap) in CAPACITIES.iter().enumerate() {
                    let key = format!("sem:{k}");
                    let Some(map) = info(&mut c, &key) else {
                        continue;
                    };
                    samples.fetch_add(1, Ordering::Relaxed);
                    let held: i64 = match map.get("holders") {
                        Some(Value::Array(hs)) => hs
                            .iter()
                            .map(|h| match h {
                                Value::Array(parts) => match parts[1] {
                                    Value::Int(n) => n,
                                    _ => 0,
                                },
                                _ => 0,
                            })
                            .sum(),
                        other => panic!("holders {other:?}"),
                    };
                    let mode = value_text(&map["mode"]);
                    let mut problems = Vec::new();
                    if held > i64::from(*cap) {
                        problems.push(format!("{held} permits"));
                    }
                    if map.get("capacity") != Some(&Value::Int(i64::from(*cap))) {
                        problems.push(format!("capacity {:?}", map.get("capacity")));
                    }
                    if (held > 0 && mode != "semaphore") || (held == 0 && mode != "free") {
                        problems.push(format!("mode {mode} with {held} permits"));
                    }
                    if !problems.is_empty() {
                        anomalies
                            .lock()
                            .unwrap()
                            .push(format!("{key}: {problems:?} in {map:?}"));
                    }
                    let mut m = seen_max.lock().unwrap();
                    m[k] = m[k].max(held);
                }
                thread::sleep(Duration::from_millis(3));
            }
        });
    });
    stop.store(true, Ordering::Relaxed);

    // Every lease is short: once the run is over everything goes away.
    let mut c = server.client();
    wait_until("every permit and waiter gone after the run", || {
        info_field(&mut c, "permits") == 0
            && info_field(&mut c, "waiters") == 0
            && info_field(&mut c, "locks_held") == 0
    });
    assert!(sorted_keys(&mut c).is_empty(), "keys left after the run");

    let history = history.lock().unwrap();
    let mut permits = history.permits.clone();
    for p in permits.iter_mut() {
        if let Some(id) = p.bound {
            for (killed, kill_sent, kill_reply) in &history.kills {
                if *killed == id && *kill_reply > p.hold_sent && *kill_sent < p.end {
                    p.end = p.end.min((*kill_sent).max(p.hold_sent));
                }
            }
        }
    }
    let overlaps: Vec<(usize, Option<Instant>)> = (0..CAPACITIES.len())
        .map(|k| max_overlap(&permits, k))
        .collect();
    let maxima: Vec<usize> = overlaps.iter().map(|(n, _)| *n).collect();
    let mut misordered = Vec::new();
    let fresh: Vec<&Permit> = permits.iter().filter(|p| p.fresh).collect();
    for (i, a) in fresh.iter().enumerate() {
        for b in fresh.iter().skip(i + 1) {
            if a.key != b.key {
                continue;
            }
            if (a.start < b.sent && a.token >= b.token) || (b.start < a.sent && b.token >= a.token)
            {
                misordered.push(((*a).clone(), (*b).clone()));
            }
        }
    }
    let definite = permits.iter().filter(|p| p.start < p.end).count();
    let bound = fresh.iter().filter(|p| p.bound.is_some()).count();
    let seen = *seen_max.lock().unwrap();
    let anomalies = anomalies.lock().unwrap();
    eprintln!(
        "semaphore stress: {seconds} s, {WORKERS} clients, capacities {CAPACITIES:?}, {} requests, \
         {} grants ({} more permits for a holder, {} holds bound), {} nil, {} CLIENT KILLs, \
         {} definite permit intervals, most permits held at once (history) {maxima:?}, \
         (LOCK.INFO, {} samples) {seen:?}, {} misordered tokens, {} wrong replies, {} anomalies",
        counters.requests.load(Ordering::Relaxed),
        counters.grants.load(Ordering::Relaxed),
        counters.regrants.load(Ordering::Relaxed),
        bound,
        counters.nils.load(Ordering::Relaxed),
        history.kills.len() - WORKERS,
        definite,
        samples.load(Ordering::Relaxed),
        misordered.len(),
        history.wrong_replies.len(),
        anomalies.len(),
    );
    for (k, cap) in CAPACITIES.iter().enumerate() {
        if let (n, Some(at)) = overlaps[k] {
            let kills: Vec<String> = history
                .kills
                .iter()
                .filter(|(_, sent, _)| *sent < at + Duration::from_secs(1))
                .filter(|(_, _, reply)| *reply + Duration::from_secs(1) > at)
                .map(|(id, sent, reply)| {
                    format!("kill {id} at {:?} ({:?})", *sent - t0, *reply - *sent)
                })
                .collect();
            assert!(
                n <= *cap as usize,
                "sem:{k} (capacity {cap}): {n} permits held at once: {:#?}\nkills nearby: {kills:?}",
                held_at(&permits, k, at, t0)
            );
        }
        assert!(
            seen[k] <= i64::from(*cap),
            "sem:{k}: LOCK.INFO showed {}",
            seen[k]
        );
    }
    assert!(
        anomalies.is_empty(),
        "LOCK.INFO anomalies: {:?}",
        &anomalies[..anomalies.len().min(3)]
    );
    assert!(
        history.wrong_replies.is_empty(),
        "wrong replies: {:?}",
        &history.wrong_replies[..history.wrong_replies.len().min(5)]
    );
    assert!(
        misordered.is_empty(),
        "tokens out of order: {:?}",
        &misordered[..misordered.len().min(3)]
    );
    assert!(
        counters.grants.load(Ordering::Relaxed) > 100,
        "too few grants to mean anything"
    );
    assert!(
        counters.regrants.load(Ordering::Relaxed) > 0,
        "no owner ever got a second permit"
    );
    assert!(
        maxima[CAPACITIES.len() - 1] >= 2,
        "the largest semaphore never had two permits out at once: {maxima:?}"
    );
    assert!(history.kills.len() > WORKERS, "no connection was killed");
    assert_eq!(
        counters.lost.load(Ordering::Relaxed),
        0,
        "requests left without a reply"
    );
}

// ---------------------------------------------------------------------------------------------
// FIFO
// ---------------------------------------------------------------------------------------------

/// Rounds of: a semaphore filled by holders with short random leases (some bound to
/// connections that get killed, some released), then waiters arriving one at a time with random
/// WAIT timeouts (0 = none), some killed while queued or holding. A waiter's arrival is known
/// before the next one is sent: the key's queue length plus the waiters that already got a reply
/// must account for it. Every fresh grant gets a new, larger token, so among the waiters that
/// were granted, tokens must increase in arrival order (FIFO), whatever expired, timed out or
/// disconnected in between.
#[test]
fn queued_requests_are_granted_in_arrival_order_under_expiry_timeouts_and_kills() {
    let seconds = (stress_seconds() / 2).max(2);
    let server = Server::start();
    let mut c = server.client();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let (mut rounds, mut arrived_total, mut granted, mut nils, mut killed_total) = (0, 0, 0, 0, 0);
    let mut max_queue = 0;
    while rounds < 3 || Instant::now() < deadline {
        rounds += 1;
        let key = format!("fifo:{rounds}");
        let cap = 1 + rng.below(3) as u32;
        // Holders fill the semaphore; some hold two permits, some are bound.
        let mut holder_conns: Vec<(Connection, i64, String, bool)> = Vec::new();
        let mut held = 0;
        let mut first_tokens = Vec::new();
        while held < cap {
            let mut hc = server.client();
            let id = client_id(&mut hc);
            let owner = format!("h{}", holder_conns.len());
            let ttl = (200 + rng.below(600)).to_string();
            let bind = rng.below(3) == 0;
            let cap_text = cap.to_string();
            let mut words = vec!["LOCK.SEMACQUIRE", &key, &owner, &cap_text, &ttl];
            if bind {
                words.push("BIND");
            }
            first_tokens.push(int(&mut hc, &words));
            held += 1;
            if held < cap && rng.below(3) == 0 {
                int(&mut hc, &words);
                held += 1;
            }
            holder_conns.push((hc, id, owner, bind));
        }
        let finished = Arc::new(AtomicUsize::new(0));
        let n = 6 + rng.below(6) as usize;
        let mut handles = Vec::new();
        let mut waiter_ids = Vec::new();
        let mut killed = Vec::new();
        for i in 0..n {
            let mut wc = server.client();
            waiter_ids.push(client_id(&mut wc));
            let ttl = (20 + rng.below(150)).to_string();
            let wait = match rng.below(4) {
                0 => "0".to_string(),
                _ => (100 + rng.below(1500)).to_string(),
            };
            let hold = Duration::from_millis(rng.below(40));
            let release = rng.below(4) != 0;
            let (key2, finished2) = (key.clone(), finished.clone());
            let cap_text = cap.to_string();
            handles.push(thread::spawn(move || {
                let owner = format!("w{i}");
                let reply = query(
                    &mut wc,
                    &[
                        "LOCK.SEMACQUIRE",
                        &key2,
                        &owner,
                        &cap_text,
                        &ttl,
                        "WAIT",
                        &wait,
                    ],
                );
                finished2.fetch_add(1, Ordering::SeqCst);
                if let Ok(Value::Int(_)) = reply {
                    thread::sleep(hold);
                    if release {
                        let _ = query(&mut wc, &["LOCK.RELEASE", &key2, &owner]);
                    }
                }
                reply
            }));
            // Arrived: queued, or already answered (granted at once, timed out, killed).
            // Replies counted first, then the queue: a waiter that leaves in between is then
            // missed (and the condition retried), never counted twice.
            wait_until(&format!("waiter {i} arrived on {key}"), || {
                let answered = finished.load(Ordering::SeqCst) as i64;
                waiting(&mut c, &key) + answered == i as i64 + 1
            });
            max_queue = max_queue.max(waiting(&mut c, &key));
            // Churn while the queue builds.
            match rng.below(6) {
                0 if i > 0 => {
                    let victim = rng.below(i as u64) as usize;
                    if !killed.contains(&victim) {
                        let id = waiter_ids[victim].to_string();
                        int(&mut c, &["CLIENT", "KILL", "ID", &id]);
                        killed.push(victim);
                    }
                }
                1 => {
                    let h = rng.below(holder_conns.len() as u64) as usize;
                    let (hc, id, owner, bind) = &mut holder_conns[h];
                    if *bind {
                        int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
                    } else {
                        let _ = query(hc, &["LOCK.RELEASE", &key, owner, "ALL"]);
                    }
                }
                _ => {}
            }
        }
        arrived_total += n;
        killed_total += killed.len();
        let replies: Vec<redis::RedisResult<Value>> = handles
            .into_iter()
            .map(|h| h.join().expect("waiter thread"))
            .collect();
        let mut last: Option<(usize, i64)> = None;
        for (i, reply) in replies.iter().enumerate() {
            match reply {
                Ok(Value::Int(token)) => {
                    granted += 1;
                    assert!(
                        first_tokens.iter().all(|t| t < token),
                        "{key}: w{i} token {token} not above the holders' {first_tokens:?}"
                    );
                    if let Some((j, prev)) = last {
                        assert!(
                            prev < *token,
                            "{key} (capacity {cap}): w{i} (token {token}) arrived after w{j} \
                             (token {prev}) but was granted first; replies {replies:?}"
                        );
                    }
                    last = Some((i, *token));
                }
                Ok(Value::Nil) => nils += 1,
                Err(e) if killed.contains(&i) && is_connection_error(e) => {}
                other => panic!("{key}: w{i} got {other:?} (killed: {killed:?})"),
            }
        }
        drop(holder_conns);
    }
    wait_until("every FIFO round's permits expired", || {
        info_field(&mut c, "permits") == 0 && info_field(&mut c, "waiters") == 0
    });
    eprintln!(
        "semaphore FIFO: {rounds} rounds, {arrived_total} arrivals, {granted} granted in \
         arrival order, {nils} timed out, {killed_total} killed, longest queue {max_queue}"
    );
    assert!(granted > rounds, "too few grants: {granted}");
}

/// Ten waiters queued one after the other on a full semaphore of capacity 2; each release of a
/// permit grants exactly the head of the queue, inside the RELEASE (a LOCK.INFO pipelined
/// after it shows it), and tokens increase in queue order.
#[test]
fn permits_are_granted_in_queue_order_one_release_at_a_time() {
    let server = Server::start();
    let mut c = server.client();
    let first = sem(&mut c, "q", "a", 2, LONG);
    sem(&mut c, "q", "b", 2, LONG);
    let mut waiters = Vec::new();
    for i in 1..=10 {
        let owner = format!("w{i:02}");
        waiters.push(spawn_waiter(
            &server,
            &mut c,
            &["LOCK.SEMACQUIRE", "q", &owner, "2", LONG, "WAIT", "0"],
            i,
        ));
    }
    let queue = value_texts(&info(&mut c, "q").unwrap()["queue"]);
    assert_eq!(queue, vec!["permit".to_string(); 10]);
    // Without WAIT, a newcomer does not overtake the queue.
    assert!(is_nil(&mut c, &["LOCK.SEMACQUIRE", "q", "late", "2", LONG]));
    let mut release_order: Vec<String> = vec!["a".into(), "b".into()];
    release_order.extend((1..=10).map(|i| format!("w{i:02}")));
    let mut tokens = Vec::new();
    let mut waiters = waiters.into_iter();
    for step in 0..12 {
        let owner = &release_order[step];
        let (left, after): (i64, Value) = redis::pipe()
            .cmd("LOCK.RELEASE")
            .arg("q")
            .arg(owner)
            .cmd("LOCK.INFO")
            .arg("q")
            .query(&mut c)
            .unwrap();
        assert_eq!(left, 0);
        let expected: Vec<String> = release_order[step + 1..(step + 3).min(12)].to_vec();
        let shown = format!("{after:?}");
        for o in &expected {
            assert!(shown.contains(o), "step {step}: {o} not shown in {shown}");
        }
        if step < 10 {
            tokens.push(waiters.next().unwrap().token());
        }
        let mut now: Vec<String> = holders(&mut c, "q").into_iter().map(|(o, _)| o).collect();
        now.sort();
        assert_eq!(now, expected, "holders after releasing {owner}");
        assert_eq!(waiting(&mut c, "q"), (9 - step as i64).max(0));
    }
    assert!(tokens[0] > first);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing in queue order: {tokens:?}"
    );
    assert_eq!(
        int(&mut c, &["EXISTS", "q"]),
        0,
        "an empty semaphore goes away"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Refusals change nothing.
// ---------------------------------------------------------------------------------------------

#[test]
fn capacity_mismatch_wrong_kind_and_bad_arguments_change_nothing() {
    let server = Server::start();
    let mut c = server.client();
    // A semaphore of 3 with one permit free (a refused request must not take it), a full one
    // with a waiter, an exclusive lock, a read lock, a string.
    sem(&mut c, "sem", "a", 3, LONG);
    sem(&mut c, "sem", "b", 3, LONG);
    sem(&mut c, "full", "f", 1, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "full", "fw", "1", LONG, "WAIT", "0"],
        1,
    );
    int(&mut c, &["LOCK.ACQUIRE", "lk", "writer", LONG]);
    int(&mut c, &["LOCK.RWREAD", "rd", "reader", LONG]);
    // A lock key with nobody holding it, only a lock-delay pending, is still a lock key.
    int(
        &mut c,
        &["LOCK.ACQUIRE", "dl", "gone", "50", "LOCKDELAY", LONG],
    );
    wait_until("the delayed hold expired", || {
        holders(&mut c, "dl").is_empty() && info_int(&mut c, "dl", "delay") > 0
    });
    // With nobody waiting no timer ends the expired hold; a lock command does.
    assert!(is_nil(&mut c, &["LOCK.ACQUIRE", "dl", "early", "1000"]));
    assert_eq!(info_field(&mut c, "expirations_total"), 1);
    query(&mut c, &["SET", "str", "value"]).unwrap();

    const MISMATCH: &str = "ERR the semaphore has another capacity";
    const NOT_A_LOCK: &str = "WRONGKIND the key holds a semaphore, not a lock";
    const NOT_A_SEMAPHORE: &str = "WRONGKIND the key holds a lock, not a semaphore";
    const RANGE: &str = "ERR capacity must be between 1 and 2147483647";
    const NOT_INTEGER: &str = "ERR capacity is not an integer or out of range";
    let long_owner = "o".repeat(1025);
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        // Another capacity, from a newcomer or from a holder, with or without WAIT.
        (vec!["LOCK.SEMACQUIRE", "sem", "x", "2", "1000"], MISMATCH),
        (vec!["LOCK.SEMACQUIRE", "sem", "x", "4", "1000"], MISMATCH),
        (
            vec!["LOCK.SEMACQUIRE", "sem", "x", "4", "1000", "WAIT", "0"],
            MISMATCH,
        ),
        (vec!["LOCK.SEMACQUIRE", "sem", "a", "2", "1000"], MISMATCH),
        (
            vec!["LOCK.SEMACQUIRE", "full", "x", "2", "1000", "WAIT", "100"],
            MISMATCH,
        ),
        (
            vec!["LOCK.SEMACQUIRE", "sem", "x", "2147483647", "1000", "BIND"],
            MISMATCH,
        ),
        // Locks on a semaphore key.
        (vec!["LOCK.ACQUIRE", "sem", "x", "1000"], NOT_A_LOCK),
        (vec!["LOCK.ACQUIRE", "sem", "a", "1000"], NOT_A_LOCK),
        (
            vec!["LOCK.ACQUIRE", "sem", "x", "1000", "WAIT", "0"],
            NOT_A_LOCK,
        ),
        (
            vec!["LOCK.ACQUIRE", "full", "x", "1000", "WAIT", "100", "BIND"],
            NOT_A_LOCK,
        ),
        (vec!["LOCK.RWREAD", "sem", "x", "1000"], NOT_A_LOCK),
        (
            vec!["LOCK.RWREAD", "sem", "b", "1000", "WAIT", "0"],
            NOT_A_LOCK,
        ),
        // A semaphore on a lock key.
        (
            vec!["LOCK.SEMACQUIRE", "lk", "x", "1", "1000"],
            NOT_A_SEMAPHORE,
        ),
        (
            vec!["LOCK.SEMACQUIRE", "lk", "writer", "1", "1000"],
            NOT_A_SEMAPHORE,
        ),
        (
            vec!["LOCK.SEMACQUIRE", "rd", "x", "5", "1000", "WAIT", "0"],
            NOT_A_SEMAPHORE,
        ),
        (
            vec!["LOCK.SEMACQUIRE", "rd", "reader", "5", "1000"],
            NOT_A_SEMAPHORE,
        ),
        (
            vec!["LOCK.SEMACQUIRE", "dl", "x", "1", "1000"],
            NOT_A_SEMAPHORE,
        ),
        // Another type.
        (
            vec!["LOCK.SEMACQUIRE", "str", "x", "1", "1000"],
            "WRONGTYPE",
        ),
        // Arguments are checked before the key is looked at.
        (vec!["LOCK.SEMACQUIRE", "lk", "x", "0", "1000"], RANGE),
        (vec!["LOCK.SEMACQUIRE", "str", "x", "0", "1000"], RANGE),
        (vec!["LOCK.SEMACQUIRE", "sem", "x", "3", "0"], "ttl must be"),
        (vec!["LOCK.SEMACQUIRE", "sem", "x", "2", "0"], "ttl must be"),
        (
            vec!["LOCK.SEMACQUIRE", "lk", "x", "3", "1000", "LOCKDELAY", "5"],
            "LOCKDELAY applies to exclusive locks only",
        ),
    ];
    // The same malformed requests on the semaphore, on the lock and on a key that does not
    // exist (which must not be created).
    for key in ["sem", "lk", "fresh"] {
        let bad: Vec<(Vec<&str>, &str)> = vec![
            (vec!["LOCK.SEMACQUIRE", key, "x", "0", "1000"], RANGE),
            (vec!["LOCK.SEMACQUIRE", key, "x", "-1", "1000"], RANGE),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "2147483648", "1000"],
                RANGE,
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "4294967297", "1000"],
                RANGE,
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "-9223372036854775808", "1000"],
                RANGE,
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "abc", "1000"],
                NOT_INTEGER,
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "1.5", "1000"],
                NOT_INTEGER,
            ),
            (vec!["LOCK.SEMACQUIRE", key, "x", "", "1000"], NOT_INTEGER),
            (vec!["LOCK.SEMACQUIRE", key, "x", " 3", "1000"], NOT_INTEGER),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "18446744073709551616", "1000"],
                NOT_INTEGER,
            ),
            (vec!["LOCK.SEMACQUIRE", key, "x", "3", "-1"], "ttl must be"),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "abc"],
                "ttl is not an integer",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "140737488355329"],
                "ttl must be",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "100", "WAIT"],
                "syntax error",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "100", "WAIT", "-1"],
                "timeout must be",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "100", "WAIT", "x"],
                "timeout is not an integer",
            ),
            (
                vec![
                    "LOCK.SEMACQUIRE",
                    key,
                    "x",
                    "3",
                    "100",
                    "WAIT",
                    "1",
                    "WAIT",
                    "1",
                ],
                "more than once",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "100", "BIND", "bind"],
                "more than once",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "100", "FOO"],
                "unknown option",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3", "100", "LOCKDELAY", "10"],
                "LOCKDELAY applies to exclusive locks only",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "", "3", "100"],
                "owner must be",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, &long_owner, "3", "100"],
                "owner must be",
            ),
            (
                vec!["LOCK.SEMACQUIRE", key, "x", "3"],
                "wrong number of arguments",
            ),
            (vec!["LOCK.SEMACQUIRE", key], "wrong number of arguments"),
            (vec!["LOCK.RELEASE", key, "nobody"], "NOTOWNER"),
            (vec!["LOCK.EXTEND", key, "nobody", "1000"], "NOTOWNER"),
        ];
        cases.extend(bad);
    }
    let keys_before = sorted_keys(&mut c);
    let figures_before = lock_figures(&mut c);
    let shapes_before: Vec<_> = ["sem", "full", "lk", "rd"]
        .iter()
        .map(|k| info_shape(&mut c, k))
        .collect();
    let pttl_before = int(&mut c, &["PTTL", "sem"]);
    for (words, expected) in &cases {
        let e = err(&mut c, words);
        assert!(
            e.contains(expected),
            "{words:?}: got {e:?}, expected {expected:?}"
        );
        assert_eq!(
            int(&mut c, &["EXISTS", "fresh"]),
            0,
            "{words:?} created the key"
        );
    }
    assert_eq!(
        sorted_keys(&mut c),
        keys_before,
        "an error created or removed a key"
    );
    assert_eq!(lock_figures(&mut c), figures_before, "INFO lock changed");
    let shapes_after: Vec<_> = ["sem", "full", "lk", "rd"]
        .iter()
        .map(|k| info_shape(&mut c, k))
        .collect();
    assert_eq!(
        shapes_after, shapes_before,
        "a refused command changed a key"
    );
    let pttl_after = int(&mut c, &["PTTL", "sem"]);
    assert!(
        pttl_after <= pttl_before && pttl_after > pttl_before - 60_000,
        "PTTL {pttl_before} -> {pttl_after}"
    );
    assert_eq!(capacity(&mut c, "sem"), Some(3));
    assert_eq!(capacity(&mut c, "lk"), None, "a lock has no capacity");
    assert!(holders(&mut c, "dl").is_empty());
    assert_eq!(mode(&mut c, "dl"), "free");
    assert_eq!(capacity(&mut c, "dl"), None);
    let value: String = redis::cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(value, "value");
    // The free permit is still there for a request naming the right capacity.
    sem(&mut c, "sem", "x", 3, "1000");
    assert_eq!(permits(&mut c, "sem"), 3);
    assert!(!waiter.is_finished());
    int(&mut c, &["LOCK.RELEASE", "full", "f"]);
    waiter.token();
}

/// The capacity belongs to the key while it exists; once the key is gone (released or expired)
/// the next request sets it anew; the limits 1 and 2^31 - 1 are accepted.
#[test]
fn a_key_keeps_its_capacity_while_it_exists_and_a_new_one_takes_another() {
    let server = Server::start();
    let mut c = server.client();
    let t1 = sem(&mut c, "k", "a", 1, LONG);
    assert!(is_nil(&mut c, &["LOCK.SEMACQUIRE", "k", "b", "1", LONG]));
    assert!(err(&mut c, &["LOCK.SEMACQUIRE", "k", "b", "2", LONG]).contains("another capacity"));
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "a"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    let t2 = sem(&mut c, "k", "a", 5, "1500");
    assert!(t2 > t1, "tokens continue across the key's lives");
    assert_eq!(capacity(&mut c, "k"), Some(5));
    assert!(err(&mut c, &["LOCK.SEMACQUIRE", "k", "b", "1", LONG]).contains("another capacity"));
    // Expired rather than released: the key goes too.
    wait_until("the permit expired", || int(&mut c, &["EXISTS", "k"]) == 0);
    let t3 = sem(&mut c, "k", "b", 2, LONG);
    assert!(t3 > t2);
    assert_eq!(capacity(&mut c, "k"), Some(2));
    // A semaphore key that went away may become a lock, and a lock key a semaphore.
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "b"]), 0);
    let t4 = int(&mut c, &["LOCK.ACQUIRE", "k", "w", LONG]);
    assert!(t4 > t3);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "k", "w"]), 0);
    let t5 = sem(&mut c, "k", "s", 4, LONG);
    assert!(t5 > t4);
    assert_eq!(capacity(&mut c, "k"), Some(4));
    // The limits.
    sem(&mut c, "max", "a", 2_147_483_647, LONG);
    sem(&mut c, "max", "a", 2_147_483_647, LONG);
    sem(&mut c, "max", "b", 2_147_483_647, LONG);
    assert_eq!(capacity(&mut c, "max"), Some(2_147_483_647));
    assert_eq!(
        holders(&mut c, "max"),
        vec![("a".to_string(), 2), ("b".to_string(), 1)]
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Crashed and disconnected holders.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_crashed_holders_permit_returns_at_its_lease_not_before() {
    let server = Server::start();
    let mut c = server.client();
    sem(&mut c, "crash", "steady", 2, LONG);
    let ttl = 1000u64;
    let acquired = Instant::now();
    sem(&mut c, "crash", "crashed", 2, &ttl.to_string());
    let expirations = info_field(&mut c, "expirations_total");
    let mut w = server.client();
    let waiter = thread::spawn(move || {
        let token = int(
            &mut w,
            &["LOCK.SEMACQUIRE", "crash", "heir", "2", LONG, "WAIT", "0"],
        );
        (token, Instant::now())
    });
    wait_until("heir queued", || waiting(&mut c, "crash") == 1);
    let (token, granted) = waiter.join().unwrap();
    let after = granted.duration_since(acquired);
    assert!(
        after >= Duration::from_millis(ttl) - CLOCK_MARGIN,
        "granted {after:?} after the crashed holder's grant, before its {ttl} ms lease"
    );
    let late = after.saturating_sub(Duration::from_millis(ttl));
    assert!(
        late < Duration::from_millis(3000),
        "hand-over {late:?} after the lease"
    );
    eprintln!("semaphore crash hand-over: granted {late:?} after the holder's lease");
    assert!(token > 0);
    assert_eq!(
        holders(&mut c, "crash"),
        vec![("heir".to_string(), 1), ("steady".to_string(), 1)]
    );
    assert_eq!(info_field(&mut c, "expirations_total"), expirations + 1);
    assert_eq!(info_field(&mut c, "permits"), 2);
}

#[test]
fn a_bound_holders_permits_return_when_its_connection_is_killed() {
    let server = Server::start();
    let mut c = server.client();
    let mut bound = server.client();
    let id = client_id(&mut bound);
    let t = int(
        &mut bound,
        &["LOCK.SEMACQUIRE", "bk", "b", "3", LONG, "BIND"],
    );
    assert_eq!(
        int(&mut bound, &["LOCK.SEMACQUIRE", "bk", "b", "3", LONG]),
        t
    );
    sem(&mut c, "bk", "other", 3, LONG);
    let w1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "bk", "w1", "3", LONG, "WAIT", "0"],
        1,
    );
    let w2 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "bk", "w2", "3", LONG, "WAIT", "0"],
        2,
    );
    let w3 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "bk", "w3", "3", LONG, "WAIT", "0"],
        3,
    );
    let disconnects = info_field(&mut c, "disconnects_total");
    let start = Instant::now();
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    let (t1, t2) = (w1.token(), w2.token());
    let took = start.elapsed();
    eprintln!("semaphore BIND hand-over: two waiters granted {took:?} after the kill");
    assert!(took < Duration::from_secs(5), "hand-over took {took:?}");
    assert!(t < t1 && t1 < t2);
    assert_eq!(
        holders(&mut c, "bk"),
        vec![
            ("other".to_string(), 1),
            ("w1".to_string(), 1),
            ("w2".to_string(), 1)
        ]
    );
    assert_eq!(waiting(&mut c, "bk"), 1);
    assert!(!w3.is_finished());
    assert_eq!(info_field(&mut c, "disconnects_total"), disconnects + 1);
    int(&mut c, &["LOCK.RELEASE", "bk", "other"]);
    w3.token();
}

/// BIND is set by an owner's first permit; its later permits (from other connections, with or
/// without BIND) keep that binding: only the first connection's close ends them all.
#[test]
fn an_owners_permits_keep_the_binding_of_its_first_permit() {
    let server = Server::start();
    let mut c = server.client();
    let mut first = server.client();
    let mut second = server.client();
    let mut third = server.client();
    let (id1, id2, id3) = (
        client_id(&mut first),
        client_id(&mut second),
        client_id(&mut third),
    );
    let t = int(
        &mut first,
        &["LOCK.SEMACQUIRE", "kb", "o", "3", LONG, "BIND"],
    );
    assert_eq!(
        int(&mut second, &["LOCK.SEMACQUIRE", "kb", "o", "3", LONG]),
        t
    );
    assert_eq!(
        int(
            &mut third,
            &["LOCK.SEMACQUIRE", "kb", "o", "3", LONG, "BIND"]
        ),
        t
    );
    for id in [id2, id3] {
        int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    }
    thread::sleep(Duration::from_millis(200));
    assert_eq!(holders(&mut c, "kb"), vec![("o".to_string(), 3)]);
    int(&mut c, &["CLIENT", "KILL", "ID", &id1.to_string()]);
    wait_until(
        "the first connection's close ended all three permits",
        || int(&mut c, &["EXISTS", "kb"]) == 0,
    );
    assert_eq!(info_field(&mut c, "permits"), 0);
}

/// A semaphore waiter that times out or disconnects leaves the queue; the next is served.
#[test]
fn waiters_that_time_out_or_disconnect_leave_the_queue() {
    let server = Server::start();
    let mut c = server.client();
    sem(&mut c, "tq", "holder", 1, LONG);
    let timeouts = info_field(&mut c, "timeouts_total");
    let started = Instant::now();
    assert!(is_nil(
        &mut c,
        &["LOCK.SEMACQUIRE", "tq", "late", "1", LONG, "WAIT", "300"]
    ));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(295) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(info_field(&mut c, "timeouts_total"), timeouts + 1);
    let mut gone = server.client();
    let gone_id = client_id(&mut gone);
    let gone_thread = thread::spawn(move || {
        query(
            &mut gone,
            &["LOCK.SEMACQUIRE", "tq", "gone", "1", LONG, "WAIT", "0"],
        )
    });
    wait_until("gone queued", || waiting(&mut c, "tq") == 1);
    let next = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "tq", "next", "1", LONG, "WAIT", "0"],
        2,
    );
    int(&mut c, &["CLIENT", "KILL", "ID", &gone_id.to_string()]);
    wait_until("the killed waiter left", || waiting(&mut c, "tq") == 1);
    assert!(gone_thread.join().unwrap().is_err());
    int(&mut c, &["LOCK.RELEASE", "tq", "holder"]);
    next.token();
    assert_eq!(holders(&mut c, "tq"), vec![("next".to_string(), 1)]);
    assert_eq!(info_field(&mut c, "waiters"), 0);
}

// ---------------------------------------------------------------------------------------------
// 4. One more permit, RELEASE / ALL, freed permits to the head waiters, EXTEND.
// ---------------------------------------------------------------------------------------------

#[test]
fn an_owner_asking_for_another_permit_queues_behind_others_and_gets_its_own_token() {
    let server = Server::start();
    let mut c = server.client();
    let ta = sem(&mut c, "more", "a", 2, LONG);
    sem(&mut c, "more", "b", 2, LONG);
    let w1 = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "more", "w1", "2", LONG, "WAIT", "0"],
        1,
    );
    let again = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "more", "a", "2", LONG, "WAIT", "0"],
        2,
    );
    // Without WAIT the holder gets nil: no re-entry ahead of the queue.
    assert!(is_nil(&mut c, &["LOCK.SEMACQUIRE", "more", "a", "2", LONG]));
    assert_eq!(
        value_texts(&info(&mut c, "more").unwrap()["queue"]),
        vec!["permit".to_string(), "permit".to_string()]
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "more", "b"]), 0);
    let t1 = w1.token();
    assert!(t1 > ta);
    thread::sleep(Duration::from_millis(200));
    assert!(!again.is_finished(), "the holder overtook the queue");
    assert_eq!(
        holders(&mut c, "more"),
        vec![("a".to_string(), 1), ("w1".to_string(), 1)]
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "more", "w1"]), 0);
    assert_eq!(
        again.token(),
        ta,
        "one more permit replies the owner's own token"
    );
    assert_eq!(holders(&mut c, "more"), vec![("a".to_string(), 2)]);
    assert_eq!(
        info_int(&mut c, "more", "fence"),
        t1,
        "no new token was issued"
    );

    // With a permit free and nobody queued, the holder's request is granted at once; each
    // grant resets the owner's expiry to now + ttl, shorter or longer.
    let tb = sem(&mut c, "now", "o", 3, "10000");
    assert_eq!(sem(&mut c, "now", "o", 3, LONG), tb);
    assert!(int(&mut c, &["PTTL", "now"]) > 500_000);
    assert_eq!(sem(&mut c, "now", "o", 3, "2000"), tb);
    let pttl = int(&mut c, &["PTTL", "now"]);
    assert!((1..=2000).contains(&pttl), "PTTL {pttl}");
    assert_eq!(holders(&mut c, "now"), vec![("o".to_string(), 3)]);
    // Full: a fourth is nil (and with WAIT it would wait for itself).
    assert!(is_nil(&mut c, &["LOCK.SEMACQUIRE", "now", "o", "3", LONG]));
    assert!(is_nil(
        &mut c,
        &["LOCK.SEMACQUIRE", "now", "o", "3", LONG, "WAIT", "50"]
    ));
    assert_eq!(holders(&mut c, "now"), vec![("o".to_string(), 3)]);
}

#[test]
fn release_drops_one_permit_and_all_drops_every_one() {
    let server = Server::start();
    let mut c = server.client();
    let t = sem(&mut c, "rel", "a", 5, LONG);
    sem(&mut c, "rel", "a", 5, LONG);
    sem(&mut c, "rel", "a", 5, LONG);
    sem(&mut c, "rel", "b", 5, LONG);
    assert_eq!(info_field(&mut c, "permits"), 4);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rel", "a"]), 2);
    assert_eq!(
        holders(&mut c, "rel"),
        vec![("a".to_string(), 2), ("b".to_string(), 1)]
    );
    assert_eq!(info_field(&mut c, "permits"), 3);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rel", "a", "ALL"]), 0);
    assert!(err(&mut c, &["LOCK.RELEASE", "rel", "a"]).starts_with("NOTOWNER"));
    assert!(err(&mut c, &["LOCK.EXTEND", "rel", "a", "1000"]).starts_with("NOTOWNER"));
    assert_eq!(holders(&mut c, "rel"), vec![("b".to_string(), 1)]);
    assert_eq!(info_field(&mut c, "permits"), 1);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "rel", "b", "ALL"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "rel"]), 0);
    assert_eq!(info_field(&mut c, "permits"), 0);
    assert!(
        sem(&mut c, "rel", "c", 5, LONG) > t,
        "the fence outlives the key"
    );
}

#[test]
fn freed_permits_go_to_as_many_head_waiters_as_fit() {
    let server = Server::start();
    let mut c = server.client();
    // Two holders whose leases end together, one that stays; three waiters.
    let _: (i64, i64, i64) = redis::pipe()
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["fit", "x", "3", "1500"][..])
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["fit", "y", "3", "1500"][..])
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["fit", "z", "3", LONG][..])
        .query(&mut c)
        .unwrap();
    let mut ws = Vec::new();
    for i in 1..=3 {
        let owner = format!("w{i}");
        ws.push(spawn_waiter(
            &server,
            &mut c,
            &["LOCK.SEMACQUIRE", "fit", &owner, "3", LONG, "WAIT", "0"],
            i,
        ));
    }
    let w3 = ws.pop().unwrap();
    let w2 = ws.pop().unwrap();
    let w1 = ws.pop().unwrap();
    let (t1, t2) = (w1.token(), w2.token());
    assert!(t1 < t2);
    assert_eq!(
        holders(&mut c, "fit"),
        vec![
            ("w1".to_string(), 1),
            ("w2".to_string(), 1),
            ("z".to_string(), 1)
        ]
    );
    assert_eq!(waiting(&mut c, "fit"), 1);
    thread::sleep(Duration::from_millis(100));
    assert!(
        !w3.is_finished(),
        "a waiter was granted beyond the capacity"
    );

    // RELEASE ALL of an owner with two permits serves two waiters inside the RELEASE.
    sem(&mut c, "two", "big", 3, LONG);
    sem(&mut c, "two", "big", 3, LONG);
    sem(&mut c, "two", "small", 3, LONG);
    let mut ws = Vec::new();
    for i in 1..=3 {
        let owner = format!("v{i}");
        ws.push(spawn_waiter(
            &server,
            &mut c,
            &["LOCK.SEMACQUIRE", "two", &owner, "3", LONG, "WAIT", "0"],
            i,
        ));
    }
    let (left, after): (i64, Value) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg(&["two", "big", "ALL"][..])
        .cmd("LOCK.INFO")
        .arg("two")
        .query(&mut c)
        .unwrap();
    assert_eq!(left, 0);
    // The holders field only (v3 still shows among the waiters).
    let shown = match &after {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| value_text(&pair[0]) == "holders")
            .map(|pair| format!("{:?}", pair[1]))
            .unwrap_or_default(),
        other => panic!("LOCK.INFO reply {other:?}"),
    };
    assert!(
        shown.contains("v1") && shown.contains("v2") && !shown.contains("v3"),
        "LOCK.INFO holders pipelined after the RELEASE: {shown}"
    );
    let v3 = ws.pop().unwrap();
    for w in ws {
        w.token();
    }
    assert_eq!(waiting(&mut c, "two"), 1);
    assert!(!v3.is_finished());
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "two", "small"]), 0);
    v3.token();
    assert_eq!(permits(&mut c, "two"), 3);
    drop(w3);
}

#[test]
fn extend_resets_the_owners_expiry() {
    let server = Server::start();
    let mut c = server.client();
    sem(&mut c, "ext", "a", 2, "1000");
    sem(&mut c, "ext", "a", 2, "1000");
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "ext", "a", LONG]), 1);
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(holders(&mut c, "ext"), vec![("a".to_string(), 2)]);
    assert!(int(&mut c, &["PTTL", "ext"]) > 500_000);
    // A waiter behind the full semaphore is served when the extended-down lease ends.
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "ext", "w", "2", LONG, "WAIT", "0"],
        1,
    );
    let extended = Instant::now();
    assert_eq!(int(&mut c, &["LOCK.EXTEND", "ext", "a", "300"]), 1);
    waiter.token();
    assert!(extended.elapsed() >= Duration::from_millis(300) - CLOCK_MARGIN);
    assert_eq!(holders(&mut c, "ext"), vec![("w".to_string(), 1)]);
}

// ---------------------------------------------------------------------------------------------
// 5. Persistence and replication.
// ---------------------------------------------------------------------------------------------

/// Semaphores to persist: `sa` (capacity 3, full: p1 with two permits, p2 with one), `sb`
/// (capacity 5, q with one), and `sc` that came and went. Returns the largest token and p1's.
fn build_semaphores(c: &mut Connection) -> (i64, i64) {
    let p1 = sem(c, "sa", "p1", 3, LONG);
    assert_eq!(sem(c, "sa", "p1", 3, LONG), p1);
    let mut max = p1.max(sem(c, "sa", "p2", 3, LONG));
    max = max.max(sem(c, "sb", "q", 5, LONG));
    max = max.max(sem(c, "sc", "gone", 2, LONG));
    assert_eq!(int(c, &["LOCK.RELEASE", "sc", "gone"]), 0);
    (max, p1)
}

/// After a restart or on a promoted replica: the same state, still enforced.
fn assert_semaphores_survived(
    c: &mut Connection,
    before_a: &SemState,
    before_b: &SemState,
    max: i64,
    p1: i64,
) {
    assert_eq!(&sem_state(c, "sa"), before_a);
    assert_eq!(&sem_state(c, "sb"), before_b);
    assert_eq!(before_a.2, Some(3));
    assert_eq!(int(c, &["EXISTS", "sc"]), 0);
    let pttl = int(c, &["PTTL", "sa"]);
    assert!(pttl > 500_000, "absolute expiry lost: PTTL {pttl}");
    assert_eq!(info_field(c, "permits"), 4);
    // The capacity is still the key's.
    assert!(err(c, &["LOCK.SEMACQUIRE", "sa", "x", "4", "1000"]).contains("another capacity"));
    assert!(err(c, &["LOCK.SEMACQUIRE", "sb", "x", "3", "1000"]).contains("another capacity"));
    assert!(err(c, &["LOCK.ACQUIRE", "sa", "x", "1000"]).starts_with("WRONGKIND"));
    // Still full.
    assert!(is_nil(c, &["LOCK.SEMACQUIRE", "sa", "x", "3", "1000"]));
    let next = sem(c, "sb", "new", 5, LONG);
    assert!(next > max, "token {next} not above {max}");
    // The owner's token survived too: one more permit replies it.
    assert_eq!(int(c, &["LOCK.RELEASE", "sa", "p2"]), 0);
    assert_eq!(sem(c, "sa", "p1", 3, LONG), p1);
    assert_eq!(holders(c, "sa"), vec![("p1".to_string(), 3)]);
}

fn semaphore_restart_round_trip(extra: &[&str], persist: &str) {
    let mut server = Server::start_with(extra);
    let mut c = server.client();
    let (max, p1) = build_semaphores(&mut c);
    // A bound permit: its connection is gone after a restart, so is the permit.
    let mut bound = server.client();
    int(
        &mut bound,
        &["LOCK.SEMACQUIRE", "sbound", "b", "2", LONG, "BIND"],
    );
    match persist {
        "save" => {
            query(&mut c, &["SAVE"]).unwrap();
        }
        "bgrewriteaof" => {
            query(&mut c, &["BGREWRITEAOF"]).unwrap();
            wait_until("AOF rewrite finished", || aof_rewrite_finished(&mut c));
            // Changes after the rewrite, appended to the new AOF.
            assert_eq!(
                sem(&mut c, "sb", "q", 5, LONG),
                info_int(&mut c, "sb", "fence")
            );
            assert_eq!(int(&mut c, &["LOCK.RELEASE", "sb", "q"]), 1);
        }
        _ => {}
    }
    let a = sem_state(&mut c, "sa");
    let b = sem_state(&mut c, "sb");
    drop(c);
    server.crash_and_restart();
    drop(bound);
    let mut c = server.client();
    wait_until("the bound permit ended with the restart", || {
        int(&mut c, &["EXISTS", "sbound"]) == 0
    });
    assert_semaphores_survived(&mut c, &a, &b, max, p1);
}

#[test]
fn rdb_restart_keeps_permits_owners_tokens_and_capacity() {
    semaphore_restart_round_trip(&[], "save");
}

#[test]
fn aof_without_preamble_restart_keeps_semaphores() {
    semaphore_restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "no",
        ],
        "none",
    );
}

#[test]
fn aof_with_preamble_restart_keeps_semaphores() {
    semaphore_restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "yes",
        ],
        "none",
    );
}

#[test]
fn aof_rewrite_without_preamble_keeps_semaphores() {
    semaphore_restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "no",
        ],
        "bgrewriteaof",
    );
}

#[test]
fn aof_rewrite_with_preamble_keeps_semaphores() {
    semaphore_restart_round_trip(
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "yes",
        ],
        "bgrewriteaof",
    );
}

/// DUMP / RESTORE, COPY and DEBUG RELOAD go through the same serialization: the copies keep
/// permits, owners, tokens and capacity, and enforce it.
#[test]
fn dump_restore_copy_and_debug_reload_keep_the_capacity() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut c = server.client();
    let t = sem(&mut c, "src", "a", 3, LONG);
    sem(&mut c, "src", "a", 3, LONG);
    sem(&mut c, "src", "b", 3, LONG);
    let before = sem_state(&mut c, "src");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(int(&mut c, &["COPY", "src", "copied"]), 1);
    query(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    for key in ["src", "restored", "copied"] {
        assert_eq!(sem_state(&mut c, key), before, "{key}");
        assert!(
            is_nil(&mut c, &["LOCK.SEMACQUIRE", key, "x", "3", LONG]),
            "{key}: full"
        );
        assert!(
            err(&mut c, &["LOCK.SEMACQUIRE", key, "x", "2", LONG]).contains("another capacity"),
            "{key}"
        );
        assert_eq!(int(&mut c, &["LOCK.RELEASE", key, "b"]), 0);
        assert_eq!(
            sem(&mut c, key, "a", 3, LONG),
            t,
            "{key}: the owner's token"
        );
    }
    assert_eq!(info_field(&mut c, "permits"), 9);
}

#[test]
fn a_waiters_permit_grant_reaches_the_aof() {
    let mut server = Server::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        "no",
    ]);
    let mut c = server.client();
    sem(&mut c, "bw", "holder", 2, LONG);
    sem(&mut c, "bw", "other", 2, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "bw", "heir", "2", LONG, "WAIT", "0"],
        1,
    );
    int(&mut c, &["LOCK.RELEASE", "bw", "holder"]);
    let token = waiter.token();
    let before = sem_state(&mut c, "bw");
    drop(c);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(sem_state(&mut c, "bw"), before);
    assert_eq!(info_int(&mut c, "bw", "fence"), token);
    assert_eq!(
        holders(&mut c, "bw"),
        vec![("heir".to_string(), 1), ("other".to_string(), 1)]
    );
    assert!(err(&mut c, &["LOCK.SEMACQUIRE", "bw", "x", "3", "1000"]).contains("another capacity"));
}

#[test]
fn a_replica_has_the_same_semaphores_and_a_promoted_one_keeps_them() {
    let (master, replica) = master_and_replica(&["--enable-debug-command", "yes"]);
    let mut m = master.client();
    let mut r = replica.client();
    let (mut max, p1) = build_semaphores(&mut m);
    // A waiter granted by a release, and one granted by the expiry timer.
    sem(&mut m, "sq", "holder", 1, LONG);
    let by_release = spawn_waiter(
        &master,
        &mut m,
        &["LOCK.SEMACQUIRE", "sq", "heir", "1", LONG, "WAIT", "0"],
        1,
    );
    int(&mut m, &["LOCK.RELEASE", "sq", "holder"]);
    max = max.max(by_release.token());
    sem(&mut m, "se", "brief", 2, "1000");
    sem(&mut m, "se", "stays", 2, LONG);
    let by_expiry = spawn_waiter(
        &master,
        &mut m,
        &["LOCK.SEMACQUIRE", "se", "heir", "2", LONG, "WAIT", "0"],
        1,
    );
    max = max.max(by_expiry.token());
    replicate(&mut m);
    for key in ["sa", "sb", "sc", "sq", "se"] {
        assert_eq!(info_shape(&mut r, key), info_shape(&mut m, key), "{key}");
    }
    assert_eq!(
        holders(&mut r, "se"),
        vec![("heir".to_string(), 1), ("stays".to_string(), 1)]
    );
    assert_eq!(capacity(&mut r, "sa"), Some(3));
    assert_eq!(info_field(&mut r, "permits"), info_field(&mut m, "permits"));
    let dm: String = redis::cmd("DEBUG").arg("DIGEST").query(&mut m).unwrap();
    let dr: String = redis::cmd("DEBUG").arg("DIGEST").query(&mut r).unwrap();
    assert_eq!(
        dm, dr,
        "datasets differ (permits, capacities, expiries, tokens)"
    );
    let e = err(&mut r, &["LOCK.SEMACQUIRE", "sb", "x", "5", "1000"]);
    assert!(e.starts_with("READONLY"), "{e}");

    let a = sem_state(&mut m, "sa");
    let b = sem_state(&mut m, "sb");
    drop(m);
    drop(master);
    query(&mut r, &["REPLICAOF", "NO", "ONE"]).unwrap();
    assert_eq!(info_field(&mut r, "permits"), 7);
    // The promoted node enforces the capacities and the tokens continue above all.
    assert!(is_nil(&mut r, &["LOCK.SEMACQUIRE", "sq", "x", "1", "1000"]));
    assert!(err(&mut r, &["LOCK.SEMACQUIRE", "sq", "x", "2", "1000"]).contains("another capacity"));
    for key in ["sq", "se"] {
        int(&mut r, &["DEL", key]);
    }
    assert_semaphores_survived(&mut r, &a, &b, max, p1);
}

// ---------------------------------------------------------------------------------------------
// 6. LOCK.INFO and INFO fields, notifications, command metadata, MULTI / Lua, deletion.
// ---------------------------------------------------------------------------------------------

/// RESP2 clients may read LOCK.INFO by position: the first five fields keep their places, then
/// `delay`, then `capacity` for a semaphore (and only for one), then `holders_count` (version
/// 4), then `waiters`.
#[test]
fn lock_info_of_a_semaphore_keeps_field_positions_and_adds_capacity_last() {
    let server = Server::start();
    let mut c = server.client();
    let t = sem(&mut c, "li", "a", 2, LONG);
    sem(&mut c, "li", "a", 2, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "li", "w", "2", "1000", "WAIT", "0"],
        1,
    );
    let shape = info_shape(&mut c, "li").unwrap();
    let names: Vec<&str> = shape.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "fence",
            "holders",
            "mode",
            "queue",
            "waiting",
            "delay",
            "capacity",
            "holders_count",
            "waiters"
        ]
    );
    let map = info(&mut c, "li").unwrap();
    assert_eq!(value_text(&map["mode"]), "semaphore");
    assert_eq!(map["fence"], Value::Int(t));
    assert_eq!(map["waiting"], Value::Int(1));
    assert_eq!(value_texts(&map["queue"]), vec!["permit".to_string()]);
    assert_eq!(map["delay"], Value::Int(0));
    assert_eq!(map["capacity"], Value::Int(2));
    let Value::Array(hs) = &map["holders"] else {
        panic!("holders {map:?}")
    };
    let Value::Array(h) = &hs[0] else {
        panic!("holder {hs:?}")
    };
    assert_eq!(value_text(&h[0]), "a");
    assert_eq!(h[1], Value::Int(2), "a holder's count is its permits");
    assert!(matches!(h[2], Value::Int(ttl) if ttl > 500_000 && ttl <= 600_000));

    // RESP3: a map with the same fields.
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/?protocol=resp3", server.port))
        .expect("client");
    let mut c3 = client.get_connection().expect("connect");
    match query(&mut c3, &["LOCK.INFO", "li"]).unwrap() {
        Value::Map(items) => {
            let fields: HashMap<String, Value> = items
                .into_iter()
                .map(|(k, v)| (value_text(&k), v))
                .collect();
            assert_eq!(fields["capacity"], Value::Int(2));
            assert_eq!(value_text(&fields["mode"]), "semaphore");
            assert_eq!(fields.len(), 9);
        }
        other => panic!("RESP3 LOCK.INFO: {other:?}"),
    }

    // A lock key has no capacity field.
    int(&mut c, &["LOCK.ACQUIRE", "lock", "w", LONG]);
    let names: Vec<String> = info_shape(&mut c, "lock")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "fence",
            "holders",
            "mode",
            "queue",
            "waiting",
            "delay",
            "holders_count",
            "waiters"
        ]
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "li", "a", "ALL"]), 0);
    waiter.token();
    assert_eq!(
        value_text(&info(&mut c, "li").unwrap()["mode"]),
        "semaphore"
    );
}

#[test]
fn info_lock_counts_permits_holders_and_waiters() {
    let server = Server::start();
    let mut c = server.client();
    assert_eq!(info_field(&mut c, "permits"), 0);
    // `permits` sits after the four gauges of version 1.
    let text = info_text(&mut c, "lock");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once(':').map(|(n, _)| n))
        .collect();
    assert_eq!(
        &names[..6],
        [
            "lock_locks_held",
            "lock_readers",
            "lock_writers",
            "lock_waiters",
            "lock_permits",
            "lock_grants_total"
        ]
    );
    sem(&mut c, "ia", "a", 3, LONG);
    sem(&mut c, "ia", "a", 3, LONG);
    sem(&mut c, "ia", "b", 3, LONG);
    sem(&mut c, "ib", "c", 2, "50");
    int(&mut c, &["LOCK.ACQUIRE", "il", "w", LONG]);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "ia", "x", "3", LONG, "WAIT", "0"],
        1,
    );
    wait_until("the brief permit expired", || {
        info_field(&mut c, "expirations_total") == 1
    });
    assert_eq!(info_field(&mut c, "locks_held"), 2);
    assert_eq!(info_field(&mut c, "permits"), 3);
    assert_eq!(info_field(&mut c, "writers"), 1);
    assert_eq!(info_field(&mut c, "readers"), 0);
    assert_eq!(info_field(&mut c, "waiters"), 1);
    // Re-entries (one more permit for a holder) count as grants.
    assert_eq!(info_field(&mut c, "grants_total"), 5);
    int(&mut c, &["LOCK.RELEASE", "ia", "a", "ALL"]);
    waiter.token();
    assert_eq!(info_field(&mut c, "permits"), 2);
    assert_eq!(info_field(&mut c, "waiters"), 0);
    assert_eq!(info_field(&mut c, "grants_total"), 6);
}

#[test]
fn keyspace_events_for_permits() {
    let server = Server::start_with(&["--notify-keyspace-events", "Ed"]);
    let mut c = server.client();
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:lock.*").unwrap();
    pubsub.set_read_timeout(Some(PATIENCE)).unwrap();
    sem(&mut c, "ev", "a", 1, LONG);
    sem(&mut c, "ev2", "a", 2, LONG);
    sem(&mut c, "ev2", "a", 2, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "ev", "w", "1", "50", "WAIT", "0"],
        1,
    );
    int(&mut c, &["LOCK.RELEASE", "ev", "a"]);
    waiter.token();
    int(&mut c, &["LOCK.RELEASE", "ev2", "a"]);
    int(&mut c, &["LOCK.RELEASE", "ev2", "a"]);
    let mut bound = server.client();
    let id = client_id(&mut bound);
    int(
        &mut bound,
        &["LOCK.SEMACQUIRE", "ev3", "b", "2", LONG, "BIND"],
    );
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    let expected = [
        ("lock.acquire", "ev"),
        ("lock.acquire", "ev2"),
        ("lock.acquire", "ev2"),
        ("lock.queued", "ev"),
        ("lock.release", "ev"),
        ("lock.acquire", "ev"),
        ("lock.expire", "ev"),
        ("lock.release", "ev2"),
        ("lock.release", "ev2"),
        ("lock.acquire", "ev3"),
        ("lock.disconnect", "ev3"),
    ];
    let seen = next_events(&mut pubsub, expected.len());
    // The waiter's expiry (50 ms) may come before or after the releases of ev2, and a
    // release's own event may come after the grant it made.
    let mut got: Vec<(String, String)> = seen.clone();
    let mut want: Vec<(String, String)> = expected
        .iter()
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "events: {seen:?}");
    let pos = |e: (&str, &str)| seen.iter().position(|(n, k)| n == e.0 && k == e.1).unwrap();
    assert!(pos(("lock.release", "ev")) < pos(("lock.expire", "ev")));
    assert!(pos(("lock.acquire", "ev3")) < pos(("lock.disconnect", "ev3")));
    // The three grants before anything was released come first, in order.
    assert_eq!(&seen[..3], &want_sorted_prefix(&expected), "{seen:?}");
    // The waiter's expiry is the last event of its key.
    let last_ev = seen.iter().rposition(|(_, k)| k == "ev").unwrap();
    assert_eq!(seen[last_ev].0, "lock.expire", "{seen:?}");
}

fn want_sorted_prefix(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected[..3]
        .iter()
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect()
}

#[test]
fn command_docs_info_and_getkeys_for_semacquire() {
    let server = Server::start();
    let mut c = server.client();
    let pairs = |v: &Value| -> HashMap<String, Value> {
        match v {
            Value::Array(items) => items
                .chunks(2)
                .map(|p| (value_text(&p[0]), p[1].clone()))
                .collect(),
            Value::Map(items) => items
                .iter()
                .map(|(k, v)| (value_text(k), v.clone()))
                .collect(),
            other => panic!("expected pairs, got {other:?}"),
        }
    };
    let reply = query(&mut c, &["COMMAND", "DOCS", "lock.semacquire"]).unwrap();
    let all = pairs(&reply);
    let doc = pairs(&all["lock.semacquire"]);
    assert!(value_text(&doc["summary"]).len() > 20, "{doc:?}");
    assert!(value_text(&doc["complexity"]).starts_with("O("), "{doc:?}");
    // Every command came with the first version.
    assert_eq!(value_text(&doc["since"]), "0.1.0");
    assert_eq!(value_text(&doc["module"]), "lock");
    let Value::Array(args) = &doc["arguments"] else {
        panic!("{doc:?}")
    };
    let args: Vec<(String, String, Option<String>, bool)> = args
        .iter()
        .map(|a| {
            let a = pairs(a);
            let optional = a
                .get("flags")
                .map(|f| value_texts(f).iter().any(|s| s == "optional"))
                .unwrap_or(false);
            (
                value_text(&a["name"]),
                value_text(&a["type"]),
                a.get("token").map(value_text),
                optional,
            )
        })
        .collect();
    let arg = |n: &str, t: &str, token: Option<&str>, optional: bool| {
        (
            n.to_string(),
            t.to_string(),
            token.map(String::from),
            optional,
        )
    };
    assert_eq!(
        args,
        vec![
            arg("key", "key", None, false),
            arg("owner", "string", None, false),
            arg("capacity", "integer", None, false),
            arg("ttl", "integer", None, false),
            arg("timeout", "integer", Some("WAIT"), true),
            arg("bind", "pure-token", Some("BIND"), true),
        ]
    );
    let Value::Array(outer) = query(&mut c, &["COMMAND", "INFO", "lock.semacquire"]).unwrap()
    else {
        panic!("COMMAND INFO")
    };
    let Some(Value::Array(info)) = outer.first() else {
        panic!("{outer:?}")
    };
    assert_eq!(info[1], Value::Int(-5), "arity");
    let flags = value_texts(&info[2]);
    for flag in ["write", "blocking"] {
        assert!(flags.iter().any(|f| f == flag), "{flags:?}");
    }
    for words in [
        vec!["k1", "o", "2", "1000"],
        vec!["k1", "o", "2", "1000", "WAIT", "0"],
        vec!["k1", "o", "2", "1000", "BIND", "WAIT", "5"],
    ] {
        let mut all = vec!["COMMAND", "GETKEYS", "LOCK.SEMACQUIRE"];
        all.extend(words);
        let keys: Vec<String> = cmd(&all).query(&mut c).unwrap();
        assert_eq!(keys, vec!["k1".to_string()], "{all:?}");
    }
}

#[test]
fn acl_key_patterns_apply_to_semacquire() {
    let server = Server::start();
    let mut c = server.client();
    query(
        &mut c,
        &["ACL", "SETUSER", "app", "on", ">secret", "~app:*", "+@all"],
    )
    .unwrap();
    let mut u = server.client();
    query(&mut u, &["AUTH", "app", "secret"]).unwrap();
    assert!(matches!(
        query(&mut u, &["LOCK.SEMACQUIRE", "app:1", "me", "2", "1000"]),
        Ok(Value::Int(_))
    ));
    let e = err(&mut u, &["LOCK.SEMACQUIRE", "other:1", "me", "2", "1000"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    assert_eq!(int(&mut c, &["EXISTS", "other:1"]), 0);
}

#[test]
fn multi_and_scripts_never_block_on_a_semaphore() {
    let server = Server::start();
    let mut c = server.client();
    sem(&mut c, "m", "holder", 1, LONG);
    let started = Instant::now();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["m", "tx", "1", "1000", "WAIT", "0"][..])
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["free-in-tx", "tx", "2", "1000", "WAIT", "0"][..])
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["free-in-tx", "tx", "2", "1000", "WAIT", "0"][..])
        .cmd("LOCK.SEMACQUIRE")
        .arg(&["free-in-tx", "tx", "2", "1000", "WAIT", "0"][..])
        .query(&mut c)
        .unwrap();
    assert_eq!(replies[0], Value::Nil);
    let Value::Int(t) = replies[1] else {
        panic!("a free permit is granted inside MULTI: {replies:?}")
    };
    assert_eq!(
        replies[2],
        Value::Int(t),
        "one more permit for the same owner"
    );
    assert_eq!(replies[3], Value::Nil, "the semaphore of 2 is full");

    let script = "return redis.call('LOCK.SEMACQUIRE', KEYS[1], 'lua', '1', '1000', 'WAIT', '0')";
    assert!(is_nil(&mut c, &["EVAL", script, "1", "m"]));
    let bind = "return redis.call('LOCK.SEMACQUIRE', KEYS[1], 'lua', '3', '1000', 'BIND')";
    let e = err(&mut c, &["EVAL", bind, "1", "new-in-lua"]);
    assert!(e.contains("BIND is not allowed in scripts"), "{e}");
    assert_eq!(int(&mut c, &["EXISTS", "new-in-lua"]), 0);
    let library = "#!lua name=semlib\nredis.register_function('try_permit', function(keys, args) \
                   return redis.call('LOCK.SEMACQUIRE', keys[1], 'fn', '1', '1000', 'WAIT', '0') end)";
    query(&mut c, &["FUNCTION", "LOAD", library]).unwrap();
    assert!(is_nil(&mut c, &["FCALL", "try_permit", "1", "m"]));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(waiting(&mut c, "m"), 0);
    assert_eq!(holders(&mut c, "m"), vec![("holder".to_string(), 1)]);
}

#[test]
fn deleting_a_semaphore_serves_its_waiters_in_order_and_an_overwrite_refuses_them() {
    let server = Server::start();
    let mut c = server.client();
    sem(&mut c, "del", "holder", 1, LONG);
    let first = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "del", "w1", "1", LONG, "WAIT", "0"],
        1,
    );
    let second = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "del", "w2", "1", LONG, "WAIT", "0"],
        2,
    );
    assert_eq!(int(&mut c, &["DEL", "del"]), 1);
    let t1 = first.token();
    wait_until("w2 still queued behind w1", || waiting(&mut c, "del") == 1);
    assert_eq!(holders(&mut c, "del"), vec![("w1".to_string(), 1)]);
    assert_eq!(capacity(&mut c, "del"), Some(1));
    assert!(!second.is_finished());
    int(&mut c, &["LOCK.RELEASE", "del", "w1"]);
    assert!(second.token() > t1);

    sem(&mut c, "ow", "holder", 1, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "ow", "w", "1", LONG, "WAIT", "0"],
        1,
    );
    query(&mut c, &["SET", "ow", "plain"]).unwrap();
    let e = waiter.join().expect_err("the waiter should get an error");
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e:?}");
    assert_eq!(info_field(&mut c, "permits"), 1);

    // FLUSHALL: the waiters are served on a fresh key, which takes their capacity.
    sem(&mut c, "fl", "holder", 2, LONG);
    sem(&mut c, "fl", "holder", 2, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "fl", "w", "2", LONG, "WAIT", "0"],
        1,
    );
    query(&mut c, &["FLUSHALL"]).unwrap();
    waiter.token();
    assert_eq!(holders(&mut c, "fl"), vec![("w".to_string(), 1)]);
    assert_eq!(capacity(&mut c, "fl"), Some(2));
}

// ---------------------------------------------------------------------------------------------
// Waiters whose key Redis replaced with a value of the other kind or another capacity.
// ---------------------------------------------------------------------------------------------

/// Waiters of a key whose value Redis replaced behind the module's back (RENAME, MOVE,
/// SWAPDB, RESTORE ... REPLACE, COPY ... REPLACE) rejoin the queue of whatever lock value the
/// key now holds (`settle::settle` → `Lock::requeue`). A permit waiter that finds an exclusive
/// lock there must not be granted beside the writer (this test found that it was: the key
/// then held a writer and a permit, and an RDB saved then could not be loaded): it gets
/// -WRONGKIND, as a waiter whose key now holds another type gets -WRONGTYPE.
#[test]
fn a_lock_renamed_over_a_semaphore_with_waiters_is_never_shared_with_a_permit() {
    let mut server = Server::start();
    let mut c = server.client();
    sem(&mut c, "s", "a", 2, LONG);
    sem(&mut c, "s", "b", 2, LONG);
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "s", "w", "2", LONG, "WAIT", "3000"],
        1,
    );
    int(&mut c, &["LOCK.ACQUIRE", "l", "x", LONG]);
    query(&mut c, &["RENAME", "l", "s"]).unwrap();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        holders(&mut c, "s"),
        vec![("x".to_string(), 1)],
        "a permit was granted beside the exclusive lock"
    );
    assert_eq!(info_field(&mut c, "writers"), 1);
    let reply = waiter.join();
    assert!(
        matches!(&reply, Err(e) if e.code() == Some("WRONGKIND")),
        "the permit waiter should get WRONGKIND on a lock key: {reply:?}"
    );
    query(&mut c, &["SAVE"]).unwrap();
    drop(c);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(holders(&mut c, "s"), vec![("x".to_string(), 1)]);
}

/// The same path with two semaphores: a waiter of a capacity-3 semaphore that finds a
/// capacity-1 semaphore renamed over its key must not be granted up to *its* capacity (this
/// test found that it was, leaving more permits than the capacity and an RDB that could not be
/// loaded): it gets the capacity-mismatch error.
#[test]
fn a_smaller_semaphore_renamed_over_one_with_waiters_keeps_its_capacity() {
    let mut server = Server::start();
    let mut c = server.client();
    for _ in 0..3 {
        sem(&mut c, "s", "a", 3, LONG);
    }
    let waiter = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.SEMACQUIRE", "s", "w", "3", LONG, "WAIT", "3000"],
        1,
    );
    sem(&mut c, "t", "x", 1, LONG);
    query(&mut c, &["RENAME", "t", "s"]).unwrap();
    thread::sleep(Duration::from_millis(300));
    let cap = capacity(&mut c, "s").expect("capacity");
    assert!(
        permits(&mut c, "s") <= cap,
        "{} permits held on a semaphore of capacity {cap}: {:?}",
        permits(&mut c, "s"),
        holders(&mut c, "s")
    );
    let reply = waiter.join();
    assert!(
        matches!(&reply, Err(e) if format!("{e:?}").contains("another capacity")),
        "the waiter should get the capacity error: {reply:?}"
    );
    query(&mut c, &["SAVE"]).unwrap();
    drop(c);
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(holders(&mut c, "s"), vec![("x".to_string(), 1)]);
}

#[test]
fn the_interval_sweep_counts_half_open_overlaps() {
    // A tiny self-check of the interval sweep used by the stress test.
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let p = |start: u64, end: u64| Permit {
        key: 0,
        owner: String::new(),
        token: 1,
        sent: at(start),
        hold_sent: at(start),
        start: at(start),
        end: at(end),
        bound: None,
        fresh: true,
        story: Arc::default(),
    };
    assert_eq!(
        max_overlap(&[p(0, 10), p(10, 20), p(5, 15)], 0),
        (2, Some(at(5)))
    );
    assert_eq!(
        max_overlap(&[p(0, 10), p(1, 9), p(2, 8), p(9, 9)], 0),
        (3, Some(at(2)))
    );
    assert_eq!(max_overlap(&[], 0), (0, None));
    assert_eq!(held_at(&[p(0, 10), p(10, 20)], 0, at(10), t0).len(), 1);
}
