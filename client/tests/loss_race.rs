//! A `DEL` of a held key that the loss watcher never noticed, when it met a replacement of the
//! watcher's registered prefixes.
//!
//! Found by tests/loss_latency.rs (`async_del_is_noticed_within_50_ms` failed in about 2 % of
//! runs: a `DEL` still not noticed after 5 s, ttl 30 s). The cause: the watcher replaces its set
//! of broadcast-tracking prefixes with `MULTI`, `CLIENT TRACKING off`, `CLIENT TRACKING on ...`,
//! `EXEC` (after pushes for keys no longer held, or once many prefixes are stale). Redis sends
//! broadcast invalidations only at the end of an event-loop iteration, and `CLIENT TRACKING off`
//! drops the ones still pending for that client's prefixes. A `DEL` of a held key run by the
//! server in the same iteration as the replacement, before it, was therefore never pushed; and
//! the watcher did not re-read its keys after a replacement, so the guard kept saying "held".
//!
//! The deterministic tests below make the server run the `DEL` and the replacement in one
//! iteration: `CLIENT PAUSE ALL` holds both (the `DEL` first), and when the pause ends the server
//! runs the held commands in order, before sending any invalidation. The replacement is the one a
//! release does once more than 64 registered prefixes are stale (client/src/proto/watch.rs).
//!
//! The soak tests (ignored; run with `-- --ignored`) are the race as found: rounds of 20 guards,
//! each key deleted by another connection right after the grant and one round trip.
#![cfg(feature = "tokio")]

use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockClient};
use redis_lock_testkit::{int, query, scaled, Server};

const TTL: Duration = Duration::from_secs(30);

/// The clients' per-server timeout here: well above the pause, so that no request times out
/// while the server is paused (a timeout reopens the connection, which re-reads every key and
/// would hide a missed push).
const PATIENT: Duration = Duration::from_secs(5);

/// How long the server is paused: the `DEL` and the replacement both arrive within it.
const PAUSE_MS: u64 = 600;

/// More stale prefixes than the watcher keeps (its `MAX_STALE` is 64).
const STALE: usize = 65;

/// Every `DEL` must be noticed well before the ttl; normally it is within a few ms.
fn notice_bound() -> Duration {
    scaled(Duration::from_secs(3))
}

/// Lets the watcher's registrations and re-reads go out and be answered (there is nothing to
/// observe them by from outside). Too short a wait can only hide the bug, never fail the test.
fn settle() {
    std::thread::sleep(scaled(Duration::from_millis(300)));
}

/// Pauses `server` and, from a thread of its own, sends `DEL key`, which the server holds until
/// the pause ends. Returns once the `DEL` has surely reached the server; join the handle after.
fn paused_del(server: &Server, key: &str) -> std::thread::JoinHandle<()> {
    let mut deleter = server.client();
    let mut admin = server.client();
    query(
        &mut admin,
        &["CLIENT", "PAUSE", &PAUSE_MS.to_string(), "ALL"],
    )
    .unwrap();
    let key = key.to_string();
    let handle = std::thread::spawn(move || {
        assert_eq!(int(&mut deleter, &["DEL", &key]), 1, "the key was held");
    });
    // The DEL is queued in the server before the watcher's replacement.
    std::thread::sleep(Duration::from_millis(PAUSE_MS / 6));
    handle
}

/// The race itself: with `held` held and the watcher one release away from replacing its
/// prefixes, a `DEL held` reaches the paused server, then `replace` (that release) does; when
/// the pause ends both run in one event-loop iteration. The loss must be noticed.
fn del_met_by_replacement(server: &Server, is_lost: impl Fn() -> bool, replace: impl FnOnce()) {
    settle();
    assert!(!is_lost());
    let del = paused_del(server, "held");
    replace();
    del.join().unwrap();
    let noticed = poll_1ms(notice_bound(), is_lost);
    assert!(
        noticed.is_some(),
        "the DEL of a held key was not noticed within {:?}",
        notice_bound()
    );
}

fn stale_key(i: usize) -> String {
    format!("stale-{i:03}")
}

#[test]
fn async_a_del_met_by_a_replacement_of_the_prefixes_is_noticed() {
    let server = Server::start();
    let rt = multi_thread_runtime();
    let client = rt.block_on(async { AsyncLockClient::new(&url(&server), PATIENT).unwrap() });
    let held = rt
        .block_on(client.acquire("held", Acquire::write(TTL)))
        .unwrap();
    for i in 0..STALE - 1 {
        let g = rt
            .block_on(client.acquire(&stale_key(i), Acquire::write(TTL)))
            .unwrap();
        rt.block_on(g.release()).unwrap();
    }
    let last = rt
        .block_on(client.acquire(&stale_key(STALE - 1), Acquire::write(TTL)))
        .unwrap();
    // This release makes the prefixes stale enough for a replacement, which reaches the server
    // (paused) after the DEL.
    del_met_by_replacement(
        &server,
        || held.is_lost(),
        || rt.block_on(last.release()).unwrap(),
    );
}

#[test]
fn sync_a_del_met_by_a_replacement_of_the_prefixes_is_noticed() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), PATIENT).unwrap();
    // The first request opens the watch link in the background (requests use pooled
    // connections meanwhile, and their grants push to the link): let it come up first, so
    // the stale keys' grants and releases below go over it and push nothing. A read, so that
    // nothing is registered yet (the count of stale prefixes must be exact).
    assert!(client.info("warm-up").unwrap().is_none());
    settle();
    let held = client.acquire("held", Acquire::write(TTL)).unwrap();
    for i in 0..STALE - 1 {
        client
            .acquire(&stale_key(i), Acquire::write(TTL))
            .unwrap()
            .release()
            .unwrap();
    }
    let last = client
        .acquire(&stale_key(STALE - 1), Acquire::write(TTL))
        .unwrap();
    del_met_by_replacement(&server, || held.is_lost(), || last.release().unwrap());
}

const ROUNDS: usize = 300;
const TRIALS: usize = 20;

/// Rounds of `TRIALS` guards (sync or async face); the (round, trial) of each missed `DEL`.
fn missed_dels(sync_face: bool) -> Vec<(usize, usize)> {
    let mut missed = Vec::new();
    for round in 0..ROUNDS {
        let server = Server::start();
        let rt = multi_thread_runtime();
        let aio = rt.block_on(async { AsyncLockClient::new(&url(&server), TIMEOUT).unwrap() });
        let sync = LockClient::new(&url(&server), TIMEOUT).unwrap();
        let mut c = server.client();
        for trial in 0..TRIALS {
            let key = format!("Del-{trial}");
            let lost: Box<dyn Fn() -> bool> = if sync_face {
                let g = sync.acquire(&key, Acquire::write(TTL)).unwrap();
                Box::new(move || g.is_lost())
            } else {
                let g = rt.block_on(aio.acquire(&key, Acquire::write(TTL))).unwrap();
                Box::new(move || g.is_lost())
            };
            assert_eq!(int(&mut c, &["EXISTS", &key]), 1);
            query(&mut c, &["DEL", &key]).unwrap();
            let at = Instant::now();
            if poll_1ms(notice_bound(), &lost).is_none() {
                eprintln!(
                    "round {round}, trial {trial}: DEL not noticed within {:?} ({:?} since)",
                    notice_bound(),
                    at.elapsed()
                );
                missed.push((round, trial));
            }
        }
    }
    missed
}

#[test]
#[ignore = "soak (about 30 s): the race as found; the deterministic tests above cover it"]
fn async_every_del_right_after_a_grant_is_noticed() {
    let missed = missed_dels(false);
    assert!(missed.is_empty(), "missed (round, trial): {missed:?}");
}

#[test]
#[ignore = "soak (about 30 s): the sync twin of the race as found"]
fn sync_every_del_right_after_a_grant_is_noticed() {
    let missed = missed_dels(true);
    assert!(missed.is_empty(), "missed (round, trial): {missed:?}");
}
