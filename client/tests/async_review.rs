//! Review fixes of the async client, against real servers: cancelled acquires (the future
//! dropped, as `select!` or a timeout does) whose grant was already on its way are released,
//! not left to their ttl, and a cancelled wait still leaves the queue at once; an
//! `AsyncRedlock` over no servers fails instead of panicking; a Redlock wait too long for the
//! clock does not panic; guards dropped off the runtime, or after it shut down, do not panic;
//! `-ERR` refusals (another semaphore capacity) are typed as the sync client types them.
#![cfg(feature = "tokio")]

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

mod common;
use common::*;

use redis_lock_client::aio::{AsyncLockClient, AsyncRedlock};
use redis_lock_client::{Acquire, LockClient, LockError};
use redis_lock_testkit::{holders, waiting, Server};

const TTL: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Polls `fut` exactly once; `Some` if it completed.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *fut).poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

/// Polls `fut` for at most `d`; `Some` if it completed.
async fn poll_for<F: Future + Unpin>(fut: &mut F, d: Duration) -> Option<F::Output> {
    tokio::time::timeout(d, fut).await.ok()
}

/// Polls `cond` while the runtime keeps running (connection drivers included).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Runs the runtime (so that tasks spawned by drops get to run) until the key has no holder.
fn released_soon(rt: &tokio::runtime::Runtime, server: &Server, key: &str) {
    let mut c = server.client();
    rt.block_on(async {
        // Generous: the release runs on the runtime within moments; the ttl is a minute.
        for _ in 0..400 {
            if holders(&mut c, key).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "the cancelled acquire's grant is still held: {:?}",
            holders(&mut c, key)
        );
    });
}

#[test]
fn a_waited_grant_on_its_way_when_the_acquire_is_cancelled_is_released() {
    let server = Server::start();
    let rt = runtime();
    let sync = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let holder = sync.try_lock("w", TTL).unwrap();
    let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    rt.block_on(async {
        let fut = client.lock("w", TTL, Duration::from_secs(30));
        let mut fut: Pin<Box<_>> = Box::pin(fut);
        // Poll until the waiter is queued on the server.
        let mut queued = false;
        for _ in 0..400 {
            assert!(poll_for(&mut fut, Duration::from_millis(20))
                .await
                .is_none());
            if waiting(&mut c, "w") == 1 {
                queued = true;
                break;
            }
        }
        assert!(queued, "the waiter never queued");
        // The holder goes: the server grants the waiter and writes the reply, which nobody
        // reads (the future is not polled again) ...
        holder.release().unwrap();
        until("granted to the waiter", || holders(&mut c, "w").len() == 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // ... and the caller gives up.
        drop(fut);
    });
    released_soon(&rt, &server, "w");
}

#[test]
fn a_try_acquire_granted_after_it_was_cancelled_is_released() {
    let server = Server::start();
    let rt = runtime();
    let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut c = server.client();
    rt.block_on(async {
        // The shared connection is open and its tracking covers the key (it was locked
        // before), so one poll sends the request.
        client
            .try_lock("t", TTL)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let mut fut = Box::pin(client.try_lock("t", TTL));
        assert!(poll_once(&mut fut).await.is_none());
        // The connection's driver writes it and reads the grant; the future is never polled
        // again and is dropped.
        until("granted", || holders(&mut c, "t").len() == 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(fut);
    });
    released_soon(&rt, &server, "t");
}

#[test]
fn an_async_redlock_acquire_cancelled_after_its_grants_releases_them() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let rt = runtime();
    let urls: Vec<String> = servers.iter().map(url).collect();
    let redlock = AsyncRedlock::new(&urls, TIMEOUT).unwrap();
    rt.block_on(async {
        // Open every shared connection and cover the key first (it was locked before).
        redlock
            .acquire("r", Acquire::write(TTL))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let mut fut = Box::pin(redlock.acquire("r", Acquire::write(TTL)));
        assert!(poll_once(&mut fut).await.is_none());
        for s in &servers {
            let mut c = s.client();
            until("granted", || holders(&mut c, "r").len() == 1).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(fut);
    });
    for s in &servers {
        released_soon(&rt, s, "r");
    }
}

#[test]
fn an_async_redlock_over_no_servers_fails_instead_of_panicking() {
    let rt = runtime();
    let _ = &rt;
    let r = AsyncRedlock::new::<&str>(&[], TIMEOUT);
    assert!(
        matches!(r, Err(LockError::Config { .. })),
        "refused when built"
    );
}

#[test]
fn an_async_redlock_cancelled_in_its_queued_wait_leaves_the_queue_and_holds_nothing() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let rt = runtime();
    let urls: Vec<String> = servers.iter().map(url).collect();
    let holder = redis_lock_client::Redlock::new(&urls, TIMEOUT)
        .unwrap()
        .acquire("q", Acquire::write(TTL))
        .unwrap();
    let redlock = AsyncRedlock::new(&urls, TIMEOUT).unwrap();
    let mut conns: Vec<_> = servers.iter().map(|s| s.client()).collect();
    rt.block_on(async {
        let mut fut =
            Box::pin(redlock.acquire("q", Acquire::write(TTL).wait(Duration::from_secs(30))));
        let mut queued = false;
        for _ in 0..400 {
            assert!(poll_for(&mut fut, Duration::from_millis(20))
                .await
                .is_none());
            if conns.iter_mut().any(|c| waiting(c, "q") == 1) {
                queued = true;
                break;
            }
        }
        assert!(queued, "the waiter never queued on its designated server");
        drop(fut);
        until("the waiter left the queue", || {
            conns.iter_mut().all(|c| waiting(c, "q") == 0)
        })
        .await;
    });
    holder.release().unwrap();
    for s in &servers {
        released_soon(&rt, s, "q");
    }
}

#[test]
fn async_guards_dropped_off_the_runtime_or_after_it_shut_down_do_not_panic() {
    let server = Server::start();
    let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
    let watched = Acquire::write(TTL).watchdog(redis_lock_client::Watchdog::new());
    // Dropped on a thread of no runtime while the runtime runs: released there.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(client.acquire("a", watched.clone())).unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    released_soon(&runtime(), &server, "a");
    // Dropped after its runtime shut down: no panic, and released there and then (over a
    // blocking connection), not left to its ttl.
    let guard = rt.block_on(client.acquire("b", watched)).unwrap();
    drop(rt);
    drop(guard);
    let mut c = server.client();
    assert_eq!(holders(&mut c, "b").len(), 0);
}

#[test]
fn a_redlock_wait_too_long_for_the_clock_does_not_panic() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let urls: Vec<String> = servers.iter().map(url).collect();
    let forever = Acquire::write(Duration::from_secs(10)).wait(Duration::MAX);
    let guard = redis_lock_client::Redlock::new(&urls, TIMEOUT)
        .unwrap()
        .acquire("s", forever.clone())
        .unwrap();
    guard.release().unwrap();
    let rt = runtime();
    let redlock = AsyncRedlock::new(&urls, TIMEOUT).unwrap();
    let guard = rt.block_on(redlock.acquire("a", forever)).unwrap();
    rt.block_on(guard.release()).unwrap();
}

#[test]
fn async_refusals_are_typed_as_the_sync_ones() {
    let server = Server::start();
    let rt = runtime();
    let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
    rt.block_on(async {
        let ttl = Duration::from_secs(10);
        let _p = client
            .acquire("sem", Acquire::permit(2, ttl))
            .await
            .unwrap();
        for request in [
            Acquire::permit(3, ttl),
            Acquire::permit(3, ttl).wait(Duration::from_secs(1)),
        ] {
            let e = client.acquire("sem", request).await.unwrap_err();
            assert!(matches!(e, LockError::CapacityMismatch { .. }), "{e}");
        }
        let e = client
            .acquire("sem", Acquire::write(ttl))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::WrongKind { .. }), "{e}");
    });
}

#[test]
fn a_cancelled_wait_leaves_the_queue_for_a_user_without_client_unblock() {
    let server = Server::start();
    let mut admin = server.client();
    redis_lock_testkit::query(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-client|unblock",
        ],
    )
    .unwrap();
    let rt = runtime();
    let sync = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let _holder = sync.try_lock("u", TTL).unwrap();
    let app = format!("redis://app:pw@127.0.0.1:{}/", server.port);
    let client = AsyncLockClient::new(&app, TIMEOUT).unwrap();
    rt.block_on(async {
        let mut fut = Box::pin(client.lock("u", TTL, Duration::from_secs(30)));
        let mut queued = false;
        for _ in 0..400 {
            assert!(poll_for(&mut fut, Duration::from_millis(20))
                .await
                .is_none());
            if waiting(&mut admin, "u") == 1 {
                queued = true;
                break;
            }
        }
        assert!(queued, "the waiter never queued");
        drop(fut);
        until("the waiter left the queue", || {
            waiting(&mut admin, "u") == 0
        })
        .await;
    });
}
