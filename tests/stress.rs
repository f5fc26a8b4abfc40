//! Randomized stress against a real server, with a checker over the recorded history.
//!
//! Workers acquire / read / extend / release / abandon locks on a few keys with random TTLs,
//! WAIT timeouts, BIND and LOCKDELAY, a chaos thread kills their connections and deletes keys,
//! and a monitor PINGs throughout. Every grant is recorded as a *definite* hold interval, from
//! the grant's reply arriving to the earliest of: the release being sent, the request being sent
//! plus the TTL (after an EXTEND: the extend being sent plus its TTL), a DEL that may have run
//! after the grant, or (for a BIND hold) the close of its connection that may have run after
//! the grant: a CLIENT KILL from the chaos thread, or the worker dropping the connection (after
//! an error, and when it stops at the deadline while other workers still wait). The server held the lock for that owner during all of that interval, so:
//! - two conflicting definite intervals (a writer and anyone else) on one key must not overlap;
//! - when one grant's reply arrived before another grant's request was sent on the same key,
//!   the server granted it first, so its token must be smaller;
//! - a LOCKDELAY hold that was not released and not cut by a DEL ended no earlier than its
//!   definite end, so no grant requested after it was granted may arrive before that end plus
//!   its delay.
//!
//! Time-bounded: STRESS_SECONDS (default 30).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_testkit::*;

const KEYS: usize = 4;
const WORKERS: usize = 12;

#[derive(Clone, Debug)]
struct Hold {
    key: usize,
    owner: String,
    write: bool,
    token: i64,
    sent: Instant,
    start: Instant,
    end: Instant,
    /// The connection's client id, for a BIND hold.
    bound: Option<i64>,
    /// LOCKDELAY (exclusive holds only).
    delay: Duration,
    released: bool,
}

#[derive(Default)]
struct History {
    holds: Vec<Hold>,
    /// (key, DEL sent, DEL reply received): it ran somewhere in between.
    dels: Vec<(usize, Instant, Instant)>,
    /// Connections closed: (client id, close started, close done). A CLIENT KILL (sent, its
    /// reply received) or a worker dropping its connection (before and after the drop; the
    /// server sees the close after it started). Every close ends the connection's bound holds.
    closes: Vec<(i64, Instant, Instant)>,
    /// How many of the closes were CLIENT KILLs.
    kills: usize,
}

/// Drops a worker's connection `conn` (client id `id`) and records the close: the server ends
/// the connection's bound holds when it sees it, after the drop started.
fn close(history: &Mutex<History>, conn: Connection, id: i64) {
    let started = Instant::now();
    drop(conn);
    history
        .lock()
        .unwrap()
        .closes
        .push((id, started, Instant::now()));
}

fn connect(server: &Server, ids: &Mutex<HashMap<usize, i64>>, me: usize) -> (Connection, i64) {
    let mut c = server.client();
    let id = client_id(&mut c);
    ids.lock().unwrap().insert(me, id);
    (c, id)
}

#[test]
fn random_operations_never_grant_conflicting_holds() {
    let seconds: u64 = std::env::var("STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let mut server = Server::start();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let history = Arc::new(Mutex::new(History::default()));
    let ids: Arc<Mutex<HashMap<usize, i64>>> = Arc::new(Mutex::new(HashMap::new()));
    let ops = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ping_failures = Arc::new(AtomicU64::new(0));
    let max_ping = Arc::new(Mutex::new(Duration::ZERO));

    thread::scope(|s| {
        for w in 0..WORKERS {
            let (history, ids, ops, lost, server) = (
                history.clone(),
                ids.clone(),
                ops.clone(),
                lost.clone(),
                &server,
            );
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((w as u64 + 1) * 0x1234_5678_9abc_def1));
                let (mut conn, mut conn_id) = connect(server, &ids, w);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n += 1;
                    ops.fetch_add(1, Ordering::Relaxed);
                    let key = rng.below(KEYS as u64) as usize;
                    let name = format!("stress:{key}");
                    let owner = format!("w{w}-{n}");
                    let write = rng.below(3) == 0;
                    let ttl = 20 + rng.below(300);
                    let mut words = vec![
                        if write { "LOCK.ACQUIRE" } else { "LOCK.RWREAD" }.to_string(),
                        name.clone(),
                        owner.clone(),
                        ttl.to_string(),
                    ];
                    if rng.below(4) != 0 {
                        words.push("WAIT".into());
                        words.push(rng.below(200).to_string());
                    }
                    let bind = rng.below(3) == 0;
                    if bind {
                        words.push("BIND".into());
                    }
                    let mut delay = Duration::ZERO;
                    if write && rng.below(3) == 0 {
                        delay = Duration::from_millis(rng.below(100));
                        words.push("LOCKDELAY".into());
                        words.push(delay.as_millis().to_string());
                    }
                    let refs: Vec<&str> = words.iter().map(|s| s.as_str()).collect();
                    let sent = Instant::now();
                    let reply = query(&mut conn, &refs);
                    // Every request has a short WAIT (or none): a request still without a
                    // reply after 10 s is a lost reply. Show the server's view of it.
                    if sent.elapsed() > Duration::from_secs(10) {
                        lost.fetch_add(1, Ordering::Relaxed);
                        let mut d = server.client();
                        let clients: String = redis::cmd("CLIENT")
                            .arg("LIST")
                            .query(&mut d)
                            .unwrap_or_default();
                        eprintln!(
                            "no reply to {refs:?} after {:?}: {reply:?}\n{clients}",
                            sent.elapsed()
                        );
                    }
                    let start = Instant::now();
                    let token = match reply {
                        Ok(Value::Int(t)) => t,
                        Ok(_) => continue,
                        Err(e)
                            if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() =>
                        {
                            // Killed: the close is already recorded, the drop changes nothing.
                            close(&history, conn, conn_id);
                            (conn, conn_id) = connect(server, &ids, w);
                            continue;
                        }
                        Err(e) => panic!("{refs:?}: {e:?}"),
                    };
                    let mut end = sent + Duration::from_millis(ttl) - CLOCK_MARGIN;
                    // Hold for a while, maybe extend, then release or abandon.
                    thread::sleep(Duration::from_millis(rng.below(30)));
                    // A delayed hold is not extended: its delay check assumes the first lease.
                    if delay.is_zero() && rng.below(4) == 0 {
                        let ext = 20 + rng.below(300);
                        let ext_sent = Instant::now();
                        if let Ok(Value::Int(1)) =
                            query(&mut conn, &["LOCK.EXTEND", &name, &owner, &ext.to_string()])
                        {
                            // EXTEND replaces the expiry (longer or shorter): from then on the
                            // lease runs to at least ext_sent + ext, and no further for certain.
                            end = ext_sent + Duration::from_millis(ext) - CLOCK_MARGIN;
                        }
                    }
                    // Delayed holds are abandoned more often, so the delay check has cases.
                    let released = rng.below(if delay.is_zero() { 8 } else { 2 }) != 0;
                    if released {
                        let release_sent = Instant::now();
                        end = end.min(release_sent);
                        let _ = query(&mut conn, &["LOCK.RELEASE", &name, &owner, "ALL"]);
                    }
                    history.lock().unwrap().holds.push(Hold {
                        key,
                        owner,
                        write,
                        token,
                        sent,
                        start,
                        end,
                        bound: bind.then_some(conn_id),
                        delay,
                        released,
                    });
                }
                // The other workers may still be waiting: this close ends bound holds that
                // this worker abandoned with time left on their leases.
                close(&history, conn, conn_id);
            });
        }
        // Chaos: kill random workers' connections, delete random keys.
        {
            let (history, ids, stop, server) =
                (history.clone(), ids.clone(), stop.clone(), &server);
            s.spawn(move || {
                let mut rng = Rng(0xdead_beef_cafe_f00d);
                let mut c = server.client();
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(20 + rng.below(60)));
                    if rng.below(3) == 0 {
                        let key = rng.below(KEYS as u64) as usize;
                        let sent = Instant::now();
                        let _ = query(&mut c, &["DEL", &format!("stress:{key}")]);
                        history
                            .lock()
                            .unwrap()
                            .dels
                            .push((key, sent, Instant::now()));
                    } else {
                        let victim = ids
                            .lock()
                            .unwrap()
                            .get(&(rng.below(WORKERS as u64) as usize))
                            .copied();
                        if let Some(id) = victim {
                            let sent = Instant::now();
                            let _ = query(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
                            let mut history = history.lock().unwrap();
                            history.closes.push((id, sent, Instant::now()));
                            history.kills += 1;
                        }
                    }
                }
            });
        }
        // Monitor: the server answers PING throughout.
        {
            let (ping_failures, max_ping, server) =
                (ping_failures.clone(), max_ping.clone(), &server);
            s.spawn(move || {
                let mut c = server.client();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match query(&mut c, &["PING"]) {
                        Ok(_) => {
                            let mut m = max_ping.lock().unwrap();
                            *m = (*m).max(t.elapsed());
                        }
                        Err(_) => {
                            ping_failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            });
        }
    });
    stop.store(true, Ordering::Relaxed);
    assert!(server.alive(), "the server died");

    let history = history.lock().unwrap();
    let mut holds = history.holds.clone();
    // A DEL ends every hold on its key granted before it ran. The grant ran somewhere between
    // the request being sent and its reply, the DEL between its own send and reply: a DEL whose
    // reply came after the grant's request was sent may have run after the grant, as early as
    // max(DEL sent, request sent). Cut the definite interval there (possibly to nothing).
    // A DEL also ends a lock-delay: a hold with a DEL anywhere near it is left out of the delay
    // check. A close of a bound hold's connection (CLIENT KILL, or the worker's drop) ends the
    // hold like a DEL would, and starts its delay (no earlier than the close started: the
    // definite end covers that).
    let mut delay_checked = vec![true; holds.len()];
    for (i, h) in holds.iter_mut().enumerate() {
        for (key, del_sent, del_reply) in &history.dels {
            if *key == h.key && *del_reply > h.sent && *del_sent < h.end {
                h.end = h.end.min((*del_sent).max(h.sent));
            }
            if *key == h.key && *del_reply > h.sent && *del_sent < h.end + h.delay {
                delay_checked[i] = false;
            }
        }
        if let Some(id) = h.bound {
            for (closed, close_started, close_done) in &history.closes {
                if *closed == id && *close_done > h.sent && *close_started < h.end {
                    h.end = h.end.min((*close_started).max(h.sent));
                }
            }
        }
    }
    let mut early = Vec::new();
    let mut after_delay = 0;
    for (i, a) in holds.iter().enumerate() {
        if a.delay.is_zero() || a.released || !delay_checked[i] {
            continue;
        }
        // The server starts the delay on its truncated millisecond clock: from a close, as early
        // as 1 ms before the close started by this process's clock (a lease end already has the
        // margin in `end`).
        let delay_end = a.end + a.delay - CLOCK_MARGIN;
        // The first grant requested after `a` was granted: it had to wait for the delay.
        let next = holds
            .iter()
            .filter(|b| b.key == a.key && b.owner != a.owner && b.sent > a.start)
            .min_by_key(|b| b.start);
        if let Some(b) = next {
            after_delay += 1;
            if b.start < delay_end {
                early.push((a.clone(), b.clone()));
            }
        }
    }
    let mut overlaps = Vec::new();
    let mut misordered = Vec::new();
    for (i, a) in holds.iter().enumerate() {
        for b in holds.iter().skip(i + 1) {
            if a.key != b.key || a.owner == b.owner {
                continue;
            }
            if (a.write || b.write) && a.start.max(b.start) < a.end.min(b.end) {
                overlaps.push((a.clone(), b.clone()));
            }
            if a.start < b.sent && a.token >= b.token {
                misordered.push((a.clone(), b.clone()));
            }
            if b.start < a.sent && b.token >= a.token {
                misordered.push((b.clone(), a.clone()));
            }
        }
    }
    let grants = holds.len();
    let writes = holds.iter().filter(|h| h.write).count();
    let bound = holds.iter().filter(|h| h.bound.is_some()).count();
    let delayed = holds
        .iter()
        .enumerate()
        .filter(|(i, h)| !h.delay.is_zero() && !h.released && delay_checked[*i])
        .count();
    eprintln!(
        "stress: {seconds} s, {} operations, {grants} grants ({writes} exclusive, {bound} bound, \
         {delayed} abandoned with a lock-delay, {after_delay} grants after one), {} DELs, {} kills, {} closes in all, max PING {:?}, \
         {} PING failures, {} overlaps, {} misordered tokens, {} grants inside a lock-delay",
        ops.load(Ordering::Relaxed),
        history.dels.len(),
        history.kills,
        history.closes.len(),
        *max_ping.lock().unwrap(),
        ping_failures.load(Ordering::Relaxed),
        overlaps.len(),
        misordered.len(),
        early.len()
    );
    assert!(
        early.is_empty(),
        "granted inside a lock-delay: {:?}",
        &early[..early.len().min(3)]
    );
    assert!(grants > 100, "too few grants to mean anything: {grants}");
    // For a failure: the closes and DELs around the first overlap, on this process's clock.
    let around = |(a, _): &(Hold, Hold)| {
        let (from, to) = (a.sent, a.end);
        let closes: Vec<_> = history
            .closes
            .iter()
            .filter(|(_, s, r)| *r >= from && *s <= to)
            .map(|(id, s, r)| (id, s.duration_since(from), r.duration_since(from)))
            .collect();
        let dels: Vec<_> = history
            .dels
            .iter()
            .filter(|(k, s, r)| *k == a.key && *r >= from && *s <= to)
            .map(|(_, s, r)| (s.duration_since(from), r.duration_since(from)))
            .collect();
        format!("connection closes (id, started, done after the first hold's request): {closes:?}; DELs of its key: {dels:?}")
    };
    assert!(
        overlaps.is_empty(),
        "conflicting holds overlapped: {:?}\n{}",
        &overlaps[..overlaps.len().min(3)],
        overlaps.first().map(around).unwrap_or_default()
    );
    assert!(
        misordered.is_empty(),
        "tokens out of order: {:?}",
        &misordered[..misordered.len().min(3)]
    );
    assert_eq!(ping_failures.load(Ordering::Relaxed), 0, "PING failed");
    assert_eq!(
        lost.load(Ordering::Relaxed),
        0,
        "requests left without a reply"
    );
}
