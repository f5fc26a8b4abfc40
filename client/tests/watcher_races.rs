//! Races of the loss watcher and the guards' bookkeeping, found in review (each failed on the
//! client before its fix): a quorum lock on exactly a majority losing one server, a key
//! changed again while its re-read is out, a change between a waited grant and the guard's
//! registration, a cancelled async release, a timeout too large for the clock.
//!
//! What these races got wrong was a loss never noticed (or a hold never released) before the
//! 30 s ttl, so each check waits for the event up to [`notice_bound`] (5 s), far below the ttl
//! and far above what a loaded machine adds (the loss is normally noticed within a few ms; the
//! time taken is printed), instead of looking once after a fixed sleep.
#![cfg(feature = "tokio")]

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis_lock_client::Acquire;
use redis_lock_testkit::{query, scaled, waiting, PATIENCE};

const TTL: Duration = Duration::from_secs(30);

/// How long a check waits for the loss (or the release) to show: a sixth of [`TTL`], times
/// `REDIS_LOCK_TEST_TIME_FACTOR`.
fn notice_bound() -> Duration {
    scaled(Duration::from_secs(5))
}

/// Polls `cond` until it holds or [`notice_bound`] passes: how long it took, or `None`.
fn within_bound(cond: impl FnMut() -> bool) -> Option<Duration> {
    poll_1ms(notice_bound(), cond)
}

/// The async twin of [`within_bound`] (yields to the runtime between checks).
async fn within_bound_async(mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    let bound = notice_bound();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= bound {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until `key` has a waiter on the server (the waited grant's set-up).
fn wait_until_queued(c: &mut redis_lock_testkit::Connection, key: &str) {
    redis_lock_testkit::wait_until("the client's wait is queued", || waiting(c, key) == 1);
}

#[test]
fn a_redlock_on_exactly_a_quorum_is_lost_when_one_of_its_servers_is() {
    let servers = three();
    // Server 2 is held by someone else: the Redlock gets servers 0 and 1 only (a quorum).
    let mut c2 = servers[2].client();
    let _ = query(&mut c2, &["LOCK.ACQUIRE", "k", "someone-else", "30000"]);
    let lock = redlock(&servers);
    let guard = lock.acquire("k", Acquire::write(TTL)).unwrap();
    println!("tokens: {:?}", guard.tokens());
    // The hold on server 0 is deleted: only server 1 of 3 holds for us now.
    let _ = query(&mut servers[0].client(), &["DEL", "k"]);
    // Someone else can now take a quorum (servers 0 and 2).
    let _ = query(
        &mut servers[0].client(),
        &["LOCK.ACQUIRE", "k", "someone-else", "30000"],
    );
    let took = within_bound(|| guard.is_lost());
    println!("noticed after {took:?}; validity {:?}", guard.validity());
    assert!(
        took.is_some(),
        "another owner holds 2 of 3 servers; our guard still says held after {:?}",
        notice_bound()
    );
}

#[test]
fn an_async_redlock_on_exactly_a_quorum_is_lost_when_one_of_its_servers_is() {
    let servers = three();
    let mut c2 = servers[2].client();
    let _ = query(&mut c2, &["LOCK.ACQUIRE", "k", "someone-else", "30000"]);
    multi_thread_runtime().block_on(async {
        let lock = async_redlock(&servers);
        let guard = lock.acquire("k", Acquire::write(TTL)).await.unwrap();
        println!("tokens: {:?}", guard.tokens());
        let _ = query(&mut servers[0].client(), &["DEL", "k"]);
        let _ = query(
            &mut servers[0].client(),
            &["LOCK.ACQUIRE", "k", "someone-else", "30000"],
        );
        let took = within_bound_async(|| guard.is_lost()).await;
        println!("noticed after {took:?}; validity {:?}", guard.validity());
        assert!(
            took.is_some(),
            "another owner holds 2 of 3 servers; our guard still says held after {:?}",
            notice_bound()
        );
    });
}

#[test]
fn async_a_key_changed_again_while_its_reread_is_out_is_reread() {
    use redis_lock_client::aio::AsyncLockClient;
    let server = redis_lock_testkit::Server::start();
    let rt = multi_thread_runtime();
    let mut raw = server.client();
    let (mut missed, n) = (0, 60);
    rt.block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let _keep = client.try_lock("keep", TTL).await.unwrap();
        for i in 0..n {
            let key = format!("r{i}");
            let guard = client.try_lock(&key, TTL).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await; // registered and first re-read done
            let _ = query(&mut raw, &["PEXPIRE", &key, "100000"]); // push 1: held still
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_micros(25 * (i as u64 % 40)) {}
            let _ = query(&mut raw, &["DEL", &key]); // push 2, while re-read 1 may be out
            if within_bound_async(|| guard.is_lost()).await.is_none() {
                missed += 1;
            }
            drop(guard);
        }
    });
    println!(
        "async: DEL not noticed within {:?} in {missed} of {n} rounds",
        notice_bound()
    );
    assert_eq!(missed, 0);
}

#[test]
fn sync_a_key_changed_again_while_its_reread_is_out_is_reread() {
    use redis_lock_client::LockClient;
    let server = redis_lock_testkit::Server::start();
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut raw = server.client();
    let _keep = client.try_lock("keep", TTL).unwrap();
    let (mut missed, n) = (0, 60);
    for i in 0..n {
        let key = format!("r{i}");
        let guard = client.try_lock(&key, TTL).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let _ = query(&mut raw, &["PEXPIRE", &key, "100000"]);
        let _ = query(&mut raw, &["DEL", &key]);
        if within_bound(|| guard.is_lost()).is_none() {
            missed += 1;
        }
        drop(guard);
    }
    println!(
        "sync: DEL not noticed within {:?} in {missed} of {n} rounds",
        notice_bound()
    );
    assert_eq!(missed, 0);
}

#[test]
fn a_cancelled_async_release_still_releases() {
    use redis_lock_client::aio::AsyncLockClient;
    let server = redis_lock_testkit::Server::start();
    let rt = multi_thread_runtime();
    let mut raw = server.client();
    let mut left = 0;
    rt.block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        for i in 0..20 {
            let key = format!("c{i}");
            let guard = client.try_lock(&key, TTL).await.unwrap();
            // A caller's timeout (or select!) on the release, cancelled before the reply.
            let _ = tokio::time::timeout(Duration::from_micros(1), guard.release()).await;
            let released =
                within_bound_async(|| redis_lock_testkit::holders(&mut raw, &key).is_empty()).await;
            if released.is_none() {
                left += 1;
            }
        }
    });
    println!("cancelled async release: hold left (until ttl) in {left} of 20");
    assert_eq!(left, 0);
}

#[test]
fn a_timeout_of_duration_max_does_not_panic() {
    use redis_lock_client::aio::AsyncLockClient;
    use redis_lock_client::LockClient;
    let server = redis_lock_testkit::Server::start();
    let sync = std::panic::catch_unwind(|| {
        let c = LockClient::new(&url(&server), Duration::MAX).unwrap();
        c.try_lock("h", TTL).map(|_| ())
    });
    assert!(
        sync.is_ok(),
        "the sync client panicked with a timeout of Duration::MAX"
    );
    let rt = multi_thread_runtime();
    let asy = rt.block_on(async {
        tokio::spawn(async move {
            let c = AsyncLockClient::new(&url(&server), Duration::MAX).unwrap();
            c.try_lock("h2", TTL).await.map(|_| ())
        })
        .await
    });
    assert!(
        asy.is_ok(),
        "the async client panicked with a timeout of Duration::MAX"
    );
}

/// Our waiter is granted by the holder's release, and the key is deleted in the same server
/// event-loop turn: the push reaches the watcher before the new guard is watched, and the key's
/// prefix is still registered from an earlier hold (covered: no re-read).
#[test]
fn a_change_between_a_waited_grant_and_the_guards_registration_is_noticed() {
    use redis_lock_client::aio::AsyncLockClient;
    use redis_lock_client::LockClient;
    let server = redis_lock_testkit::Server::start();
    let n = 20;
    let mut missed_sync = 0;
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let _keep = client.try_lock("keep", TTL).unwrap();
    for i in 0..n {
        let key = format!("s{i}");
        client.try_lock(&key, TTL).unwrap().release().unwrap(); // prefix registered, stays
        let mut raw = redis_lock_client::redis::Client::open(url(&server))
            .unwrap()
            .get_connection()
            .unwrap();
        let _: redis_lock_client::redis::Value = redis_lock_client::redis::cmd("LOCK.ACQUIRE")
            .arg(&key)
            .arg("raw")
            .arg(30000)
            .query(&mut raw)
            .unwrap();
        let k2 = key.clone();
        let mut watch = server.client();
        let t = std::thread::spawn(move || {
            // Once the client's wait is queued (not after a guessed delay: under load the
            // wait could come after the release, and then nothing is lost).
            wait_until_queued(&mut watch, &k2);
            let _: Vec<redis_lock_client::redis::Value> = redis_lock_client::redis::pipe()
                .cmd("LOCK.RELEASE")
                .arg(&k2)
                .arg("raw")
                .cmd("DEL")
                .arg(&k2)
                .query(&mut raw)
                .unwrap_or_default();
        });
        let guard = client.lock(&key, TTL, scaled(PATIENCE)).unwrap();
        t.join().unwrap();
        if within_bound(|| guard.is_lost()).is_none() {
            missed_sync += 1;
        }
    }
    let rt = multi_thread_runtime();
    let missed_async = rt.block_on(async {
        let mut missed = 0;
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let _keep = client.try_lock("akeep", TTL).await.unwrap();
        for i in 0..n {
            let key = format!("a{i}");
            client
                .try_lock(&key, TTL)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            let mut raw = redis_lock_client::redis::Client::open(url(&server))
                .unwrap()
                .get_connection()
                .unwrap();
            let _: redis_lock_client::redis::Value = redis_lock_client::redis::cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg("raw")
                .arg(30000)
                .query(&mut raw)
                .unwrap();
            let k2 = key.clone();
            let mut watch = server.client();
            let t = std::thread::spawn(move || {
                wait_until_queued(&mut watch, &k2);
                let _: Vec<redis_lock_client::redis::Value> = redis_lock_client::redis::pipe()
                    .cmd("LOCK.RELEASE")
                    .arg(&k2)
                    .arg("raw")
                    .cmd("DEL")
                    .arg(&k2)
                    .query(&mut raw)
                    .unwrap_or_default();
            });
            let guard = client
                .acquire(&key, Acquire::write(TTL).wait(scaled(PATIENCE)))
                .await
                .unwrap();
            t.join().unwrap();
            if within_bound_async(|| guard.is_lost()).await.is_none() {
                missed += 1;
            }
        }
        missed
    });
    println!(
        "DEL right after a waited grant, not noticed within {:?}: sync {missed_sync}/{n}, async \
         {missed_async}/{n}",
        notice_bound()
    );
    assert_eq!((missed_sync, missed_async), (0, 0));
}
