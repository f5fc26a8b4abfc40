//! The async Redlock against three real servers: quorum with one server paused and with two,
//! tasks sharing one Redlock, quiet queued waits, `using` with the lock taken away, and the
//! requests it refuses.
#![cfg(feature = "tokio")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::AsyncRedlock;
use redis_lock_client::{Acquire, LockError, LossCause, Watchdog};
use redis_lock_testkit::{holders, int, lock_calls, Server, PATIENCE};

fn three() -> Vec<Server> {
    (0..3).map(|_| Server::start()).collect()
}

fn redlock(servers: &[Server]) -> AsyncRedlock {
    let urls: Vec<String> = servers.iter().map(url).collect();
    AsyncRedlock::new(&urls, TIMEOUT).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_with_paused_servers_and_release_everywhere() {
    let servers = three();
    let rl = redlock(&servers);
    assert_eq!(rl.quorum(), 2);
    let ttl = Duration::from_secs(10);
    let g = rl.acquire("k", Acquire::write(ttl)).await.unwrap();
    assert_eq!(g.tokens().len(), 3);
    assert_eq!(
        g.fencing_token(),
        None,
        "tokens of several servers are not comparable"
    );
    for s in &servers {
        let mut c = s.client();
        assert_eq!(holders(&mut c, "k"), vec![(g.owner().to_string(), 1)]);
    }
    assert!(matches!(
        rl.acquire("k", Acquire::write(ttl)).await,
        Err(LockError::Held { .. })
    ));
    let infos = rl.info("k").await;
    assert_eq!(infos.len(), 3);
    for (_, info) in &infos {
        let info = info.as_ref().unwrap().as_ref().unwrap();
        assert_eq!(info.hold_count(g.owner()), 1);
    }
    assert_eq!(g.hold_count().await.unwrap(), 1);
    assert!(g.extend().await.unwrap() > Duration::from_secs(9));
    g.release().await.unwrap();
    gone_from_every_server(&servers, "k");

    // One server paused: two of three still grant (the paused one costs one timeout).
    servers[2].signal("STOP");
    let g = rl.acquire("p", Acquire::write(ttl)).await;
    // Two paused: too few answer.
    servers[1].signal("STOP");
    let e = rl.acquire("q", Acquire::write(ttl)).await.unwrap_err();
    servers[1].signal("CONT");
    servers[2].signal("CONT");
    let g = g.unwrap();
    assert_eq!(g.tokens().len(), 2);
    assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_sharing_one_redlock_take_turns_and_queued_waiters_are_quiet() {
    let servers = three();
    let rl = redlock(&servers);
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (rl, inside, done) = (rl.clone(), inside.clone(), done.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let g = rl
                        .acquire(
                            "turns",
                            Acquire::write(Duration::from_secs(10)).wait(PATIENCE * 3),
                        )
                        .await
                        .expect("acquire");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.store(false, Ordering::SeqCst);
                    g.release().await.expect("release");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 80);

    // Two waiters on a held lock cost each server a few commands a second, not a hundred.
    let ttl = Duration::from_secs(30);
    let holder = rl.acquire("quiet", Acquire::write(ttl)).await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let rl = rl.clone();
            tokio::spawn(async move {
                rl.acquire("quiet", Acquire::write(ttl).wait(PATIENCE * 2))
                    .await
                    .map(drop)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before: Vec<u64> = servers
        .iter()
        .map(|s| lock_calls(&mut s.client()))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: Vec<u64> = servers
        .iter()
        .map(|s| lock_calls(&mut s.client()))
        .collect();
    let secs = started.elapsed().as_secs_f64();
    for (b, a) in before.iter().zip(&after) {
        let per_waiter = (a - b) as f64 / secs / 2.0;
        assert!(per_waiter < 10.0, "{per_waiter} commands/s per waiter");
    }
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn using_signals_a_redlock_taken_away_and_bad_requests_are_refused() {
    let servers = three();
    let rl = redlock(&servers).owner_prefix("async-batch-").unwrap();
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let deleter = std::thread::spawn(move || {
        let mut conns: Vec<_> = ports
            .iter()
            .map(|p| redis_lock_testkit::connect(*p).unwrap())
            .collect();
        redis_lock_testkit::wait_until("held everywhere", || {
            conns.iter_mut().all(|c| int(c, &["EXISTS", "job"]) == 1)
        });
        for c in &mut conns {
            int(c, &["DEL", "job"]);
        }
    });
    let started = Instant::now();
    let out = rl
        .using(
            "job",
            Acquire::write(Duration::from_secs(30)).watchdog(Watchdog::new().fraction(0.05)),
            |lost| async move {
                tokio::select! {
                    _ = lost.lost() => "lost",
                    _ = tokio::time::sleep(Duration::from_secs(20)) => "finished",
                }
            },
        )
        .await;
    deleter.join().unwrap();
    assert!(
        matches!(&out, Err(LockError::Lost(l)) if l.cause == LossCause::Deleted),
        "{out:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));

    let g = rl
        .acquire("o", Acquire::write(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(g.owner().starts_with("async-batch-"), "{}", g.owner());
    drop(g);

    let ttl = Duration::from_secs(5);
    for bad in [
        Acquire::permit(2, ttl),
        Acquire::write(ttl).owner("me"),
        Acquire::write(ttl).bind(),
        Acquire::write(ttl).min_replicas(1, ttl),
    ] {
        assert!(matches!(
            rl.acquire("x", bad).await,
            Err(LockError::InvalidRequest { .. })
        ));
    }
}
