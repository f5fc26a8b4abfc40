//! Issue 24, "a lost lock is never a success": against real servers, a release (or `using`)
//! whose lock was deleted, taken by another owner or overwritten reports `LockError::Lost`
//! with the cause, from the sync and the async single-server clients and from both Redlocks;
//! the new holder is left alone.
#![cfg(feature = "tokio")]

use std::fmt::Debug;
use std::time::Duration;

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockClient, LockError, LossCause};
use redis_lock_testkit::{holders, query, Connection, Server};

const TTL: Duration = Duration::from_secs(30);

/// The causes a DEL followed by another owner's grant may be reported as.
const DEL_THEN_TAKEN: [LossCause; 2] = [LossCause::Deleted, LossCause::Taken];

/// `result` is `Err(LockError::Lost(l))` with `l.cause == cause` and `l.key == key`.
fn assert_lost<T: Debug>(what: &str, result: Result<T, LockError>, key: &str, cause: LossCause) {
    assert_lost_as(what, result, key, &[cause]);
}

/// `result` is `Err(LockError::Lost(l))` with `l.cause` one of `causes` (the first event the
/// client noticed: a DEL followed by a takeover is noticed as the DEL when the watcher sees
/// it before the takeover, as the takeover otherwise).
fn assert_lost_as<T: Debug>(
    what: &str,
    result: Result<T, LockError>,
    key: &str,
    causes: &[LossCause],
) {
    match result {
        Err(LockError::Lost(l)) => {
            let cause = l.cause;
            assert!(causes.contains(&cause), "{what}: {l}");
            assert_eq!(l.key, key, "{what}: {l}");
            // The message says what happened.
            let text = LockError::Lost(l.clone()).to_string();
            assert!(text.contains(cause.describe()), "{what}: {text}");
        }
        other => panic!("{what}: expected Err(Lost({causes:?})), got {other:?}"),
    }
}

fn del(c: &mut Connection, key: &str) {
    query(c, &["DEL", key]).expect("DEL");
}

#[test]
fn sync_release_after_del_and_takeover_is_lost_taken() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let other = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let guard = client.try_lock("k", TTL).unwrap();
    del(&mut c, "k");
    let next = other.try_lock("k", TTL).expect("free after DEL");
    assert_lost_as("release", guard.release(), "k", &DEL_THEN_TAKEN);
    // The release did not disturb the new holder.
    assert_eq!(holders(&mut c, "k"), vec![(next.owner().to_string(), 1)]);
}

#[test]
fn async_release_after_del_and_takeover_is_lost_taken() {
    let server = Server::start();
    let mut c = server.client();
    multi_thread_runtime().block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let other = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let guard = client.try_lock("k", TTL).await.unwrap();
        del(&mut c, "k");
        let next = other.try_lock("k", TTL).await.expect("free after DEL");
        assert_lost_as("release", guard.release().await, "k", &DEL_THEN_TAKEN);
        assert_eq!(holders(&mut c, "k"), vec![(next.owner().to_string(), 1)]);
    });
}

#[test]
fn redlock_release_after_del_everywhere_and_takeover_is_lost_taken() {
    let servers = three();
    let lock = redlock(&servers);
    let other = redlock(&servers);
    let guard = lock.acquire("k", Acquire::write(TTL)).unwrap();
    for s in &servers {
        del(&mut s.client(), "k");
    }
    let next = other
        .acquire("k", Acquire::write(TTL))
        .expect("free after DEL");
    assert_lost_as("release", guard.release(), "k", &DEL_THEN_TAKEN);
    for s in &servers {
        assert_eq!(
            holders(&mut s.client(), "k"),
            vec![(next.owner().to_string(), 1)]
        );
    }
}

#[test]
fn async_redlock_release_after_del_everywhere_and_takeover_is_lost_taken() {
    let servers = three();
    multi_thread_runtime().block_on(async {
        let lock = async_redlock(&servers);
        let other = async_redlock(&servers);
        let guard = lock.acquire("k", Acquire::write(TTL)).await.unwrap();
        for s in &servers {
            del(&mut s.client(), "k");
        }
        let next = other
            .acquire("k", Acquire::write(TTL))
            .await
            .expect("free after DEL");
        assert_lost_as("release", guard.release().await, "k", &DEL_THEN_TAKEN);
        for s in &servers {
            assert_eq!(
                holders(&mut s.client(), "k"),
                vec![(next.owner().to_string(), 1)]
            );
        }
    });
}

#[test]
fn sync_using_whose_lock_is_deleted_mid_closure_is_lost() {
    let server = Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    let result = client.using("u", Acquire::write(TTL), |_guard| {
        del(&mut c, "u");
        42
    });
    assert_lost("using", result, "u", LossCause::Deleted);
    // Redlock's `using` too.
    let servers = three();
    let lock = redlock(&servers);
    let result = lock.using("u", Acquire::write(TTL), |_guard| {
        for s in &servers {
            del(&mut s.client(), "u");
        }
        42
    });
    assert_lost("Redlock using", result, "u", LossCause::Deleted);
}

#[test]
fn async_using_whose_lock_is_deleted_mid_closure_is_lost() {
    let server = Server::start();
    let servers = three();
    multi_thread_runtime().block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let result = client
            .using("u", Acquire::write(TTL), |_signal| async {
                del(&mut server.client(), "u");
                42
            })
            .await;
        assert_lost("using", result, "u", LossCause::Deleted);
        let lock = async_redlock(&servers);
        let result = lock
            .using("u", Acquire::write(TTL), |_signal| async {
                for s in &servers {
                    del(&mut s.client(), "u");
                }
                42
            })
            .await;
        assert_lost("AsyncRedlock using", result, "u", LossCause::Deleted);
    });
}

#[test]
fn release_after_the_key_was_overwritten_is_lost_overwritten() {
    let server = Server::start();
    let mut c = server.client();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let guard = client.try_lock("o", TTL).unwrap();
    query(&mut c, &["SET", "o", "something else"]).unwrap();
    assert_lost("sync release", guard.release(), "o", LossCause::Overwritten);
    assert_eq!(
        redis_lock_testkit::value_text(&query(&mut c, &["GET", "o"]).unwrap()),
        "something else",
        "the release left the new value alone"
    );
    query(&mut c, &["DEL", "o"]).unwrap();
    multi_thread_runtime().block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let guard = client.try_lock("o", TTL).await.unwrap();
        query(&mut c, &["SET", "o", "something else"]).unwrap();
        assert_lost(
            "async release",
            guard.release().await,
            "o",
            LossCause::Overwritten,
        );
    });
}
