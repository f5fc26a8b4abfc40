//! Issue 24, "bounded resources": a ttl the module would refuse (zero, under `MIN_TTL`, over
//! 2^47 ms) is refused by the client before anything is sent, sync and async; `extend_for`
//! sets the hold's ttl on the server; a Redlock release with one of three servers paused
//! answers at the quorum, well before the per-server timeout.
#![cfg(feature = "tokio")]

use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::{AsyncLockClient, AsyncRedlock};
use redis_lock_client::{Acquire, LockClient, LockError, Redlock, MIN_TTL};
use redis_lock_testkit::{lock_calls, Server};

/// ttls the client must refuse: zero, just under the minimum, just over the module's 2^47 ms.
fn bad_ttls() -> [Duration; 3] {
    [
        Duration::ZERO,
        MIN_TTL - Duration::from_millis(1),
        Duration::from_millis((1 << 47) + 1),
    ]
}

#[test]
fn a_ttl_out_of_bounds_is_refused_before_anything_is_sent() {
    let server = Server::start();
    let mut c = server.client();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let rt = multi_thread_runtime();
    let aio = rt.block_on(async { AsyncLockClient::new(&url(&server), TIMEOUT).unwrap() });
    let before = lock_calls(&mut c);
    for ttl in bad_ttls() {
        let sync = client.try_lock("b", ttl);
        assert!(
            matches!(sync, Err(LockError::InvalidRequest { .. })),
            "sync, ttl {ttl:?}: {:?}",
            sync.map(|g| g.owner().to_string())
        );
        let sync_wait = client.lock("b", ttl, Duration::from_secs(1));
        assert!(
            matches!(sync_wait, Err(LockError::InvalidRequest { .. })),
            "sync wait, ttl {ttl:?}"
        );
        let not_sync = rt.block_on(aio.try_lock("b", ttl));
        assert!(
            matches!(not_sync, Err(LockError::InvalidRequest { .. })),
            "async, ttl {ttl:?}: {:?}",
            not_sync.map(|g| g.owner().to_string())
        );
    }
    assert_eq!(
        lock_calls(&mut c),
        before,
        "a LOCK.* command reached the server"
    );
}

#[test]
fn extend_for_sets_the_holds_ttl_on_the_server() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let holder_ttl = |key: &str| {
        let info = client.info(key).unwrap().expect("held");
        assert_eq!(info.holders.len(), 1, "{info:?}");
        info.holders[0].ttl
    };
    let guard = client.try_lock("s", Duration::from_secs(10)).unwrap();
    let validity = guard.extend_for(Duration::from_secs(600)).unwrap();
    assert!(validity > Duration::from_secs(500), "validity {validity:?}");
    assert!(
        holder_ttl("s") > Duration::from_secs(590),
        "{:?}",
        holder_ttl("s")
    );
    guard.extend_for(Duration::from_secs(2)).unwrap();
    assert!(
        holder_ttl("s") <= Duration::from_secs(2),
        "{:?}",
        holder_ttl("s")
    );
    assert!(
        guard.validity() <= Duration::from_secs(2),
        "validity {:?}",
        guard.validity()
    );
    guard.release().unwrap();

    multi_thread_runtime().block_on(async {
        let aio = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let guard = aio.try_lock("a", Duration::from_secs(10)).await.unwrap();
        guard.extend_for(Duration::from_secs(600)).await.unwrap();
        assert!(
            holder_ttl("a") > Duration::from_secs(590),
            "{:?}",
            holder_ttl("a")
        );
        guard.extend_for(Duration::from_secs(2)).await.unwrap();
        assert!(
            holder_ttl("a") <= Duration::from_secs(2),
            "{:?}",
            holder_ttl("a")
        );
        guard.release().await.unwrap();
    });
}

/// Sends SIGSTOP to a server, and SIGCONT when dropped (also when an assert fails).
struct Paused<'a>(&'a Server);

impl<'a> Paused<'a> {
    fn new(server: &'a Server) -> Self {
        server.signal("STOP");
        Paused(server)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// Per-server timeout of these Redlocks: long, so that waiting it out would show.
const SLOW_TIMEOUT: Duration = Duration::from_secs(2);
const QUORUM_BOUND: Duration = Duration::from_secs(1);

#[test]
fn async_redlock_release_with_one_of_three_servers_paused_answers_at_the_quorum() {
    let servers = three();
    let urls: Vec<String> = servers.iter().map(url).collect();
    multi_thread_runtime().block_on(async {
        let lock = AsyncRedlock::new(&urls, SLOW_TIMEOUT).unwrap();
        let guard = lock
            .acquire("q", Acquire::write(Duration::from_secs(30)))
            .await
            .unwrap();
        let _paused = Paused::new(&servers[2]);
        let started = Instant::now();
        let released = guard.release().await;
        let took = started.elapsed();
        eprintln!("AsyncRedlock release, 1 of 3 paused: {released:?} in {took:?}");
        assert_eq!(released, Ok(()));
        assert!(
            took < QUORUM_BOUND,
            "took {took:?} (per-server timeout {SLOW_TIMEOUT:?})"
        );
    });
}

#[test]
fn redlock_release_with_one_of_three_servers_paused_answers_at_the_quorum() {
    let servers = three();
    let urls: Vec<String> = servers.iter().map(url).collect();
    let lock = Redlock::new(&urls, SLOW_TIMEOUT).unwrap();
    let guard = lock
        .acquire("q", Acquire::write(Duration::from_secs(30)))
        .unwrap();
    let _paused = Paused::new(&servers[2]);
    let started = Instant::now();
    let released = guard.release();
    let took = started.elapsed();
    eprintln!("Redlock release, 1 of 3 paused: {released:?} in {took:?}");
    assert_eq!(released, Ok(()));
    assert!(
        took < QUORUM_BOUND,
        "took {took:?} (per-server timeout {SLOW_TIMEOUT:?})"
    );
}
