//! The async client (tokio) against real servers: acquire, wait, extend, release, drop, sharing
//! one client among 16 tasks, owners of the caller's choice (re-entry, upgrade deadlock,
//! deadlock detection), LOCK.INFO, `using` with a lost-lock signal, `min_replicas`, and typed
//! errors.
#![cfg(feature = "tokio")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{
    Acquire, LockClient, LockError, LossCause, Outcome, OwnerIdentity, Watchdog,
};
use redis_lock_testkit::{int, master_and_replica, query, wait_until, waiting, Server, PATIENCE};

fn client(server: &Server) -> AsyncLockClient {
    AsyncLockClient::new(&url(server), TIMEOUT).unwrap()
}

/// Polls `cond` (async) until it holds, failing after the kit's patience.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

async fn queued(client: &AsyncLockClient, key: &str) -> u64 {
    client
        .info(key)
        .await
        .unwrap()
        .map_or(0, |info| info.waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_try_wait_extend_release_and_release_on_drop() {
    let server = Server::start();
    let client = client(&server);
    let ttl = Duration::from_secs(10);
    let first = client.try_lock("res", ttl).await.unwrap();
    let t1 = first.fencing_token().unwrap();
    assert!(first.validity() > Duration::from_secs(9));
    assert!(matches!(
        client.try_lock("res", ttl).await,
        Err(LockError::Held { .. })
    ));

    // A waiter of the same client blocks on the server, on a connection of its own ...
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let guard = client.lock("res", ttl, Duration::from_secs(8)).await?;
            let token = guard.fencing_token().unwrap();
            drop(guard); // released by a task spawned on the runtime
            Ok::<u64, LockError>(token)
        })
    };
    eventually("waiter queued", || async {
        queued(&client, "res").await == 1
    })
    .await;
    // ... so the shared connection still answers at once (its reply timeout is 200 ms).
    for _ in 0..5 {
        let other = client.try_lock("other", ttl).await.unwrap();
        other.release().await.unwrap();
    }
    assert!(first.extend().await.unwrap() > Duration::from_secs(9));
    first.release().await.unwrap();
    let t2 = waiter.await.unwrap().unwrap();
    assert!(t2 > t1);
    eventually("released on drop", || async {
        client.info("res").await.unwrap().is_none()
    })
    .await;

    // A wait that runs out is `Held`; a missing key's info is None.
    let _holder = client.try_lock("res", ttl).await.unwrap();
    let started = Instant::now();
    assert!(matches!(
        client.lock("res", ttl, Duration::from_millis(150)).await,
        Err(LockError::Held { .. })
    ));
    assert!(started.elapsed() >= Duration::from_millis(140));
    assert!(client.info("nothing").await.unwrap().is_none());

    // Readers share; a permit of a lock key is WRONGKIND.
    let r1 = client.try_read("shared", ttl).await.unwrap();
    let r2 = client.try_read("shared", ttl).await.unwrap();
    let info = client.info("shared").await.unwrap().unwrap();
    assert_eq!(info.mode, "read");
    assert_eq!(info.holders.len(), 2);
    assert!(matches!(
        client
            .acquire("shared", Acquire::permit(2, ttl))
            .await
            .unwrap_err(),
        LockError::WrongKind { .. }
    ));
    drop((r1, r2));
    eventually("readers released on drop", || async {
        client.info("shared").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_cloned_into_16_tasks_never_overlaps() {
    let server = Server::start();
    let client = client(&server);
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (client, inside, done) = (client.clone(), inside.clone(), done.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = client
                        .lock(
                            "shared:counter",
                            Duration::from_secs(10),
                            Duration::from_secs(30),
                        )
                        .await
                        .expect("lock within the wait");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.store(false, Ordering::SeqCst);
                    guard.release().await.expect("release");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 80);
    assert!(client.info("shared:counter").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn owners_of_the_callers_choice_reenter_upgrade_and_deadlock() {
    let server = Server::start();
    let base = client(&server);
    let ttl = Duration::from_secs(10);

    // A prefix: random owners that show whose they are.
    let svc = base
        .with_owner(OwnerIdentity::Prefix("billing-".into()))
        .unwrap();
    let g = svc.try_lock("p", ttl).await.unwrap();
    assert!(g.owner().starts_with("billing-"), "{}", g.owner());
    let info = base.info("p").await.unwrap().unwrap();
    assert_eq!(info.holders[0].owner, g.owner());
    // Module 0.3.0+: the hold's age, from its first grant.
    let held = info.holders[0]
        .held
        .expect("the server says how long it has been held");
    assert!(held < Duration::from_secs(5), "{held:?}");
    assert_eq!(g.hold_count().await.unwrap(), 1);
    g.release().await.unwrap();

    // A fixed owner per client: its guards re-enter one another's locks.
    let job = base
        .with_owner(OwnerIdentity::Fixed("job-1".into()))
        .unwrap();
    let a = job.try_lock("r", ttl).await.unwrap();
    let b = job.try_lock("r", ttl).await.unwrap();
    assert_eq!(a.fencing_token().unwrap(), b.fencing_token().unwrap());
    assert_eq!(a.hold_count().await.unwrap(), 2);
    a.release().await.unwrap(); // one hold
    assert_eq!(b.hold_count().await.unwrap(), 1);
    // Another owner still cannot have it.
    assert!(matches!(
        base.try_lock("r", ttl).await,
        Err(LockError::Held { .. })
    ));
    // A per-call owner wins over the client's.
    let c = job
        .acquire("r", Acquire::write(ttl).owner("job-2"))
        .await
        .unwrap_err();
    assert!(matches!(c, LockError::Held { .. }), "{c}");
    b.release().await.unwrap();
    assert!(base.info("r").await.unwrap().is_none());

    // An owner that reads a key and asks to write it: DEADLOCK, typed per server.
    let read = job.try_read("u", ttl).await.unwrap();
    let e = job.try_lock("u", ttl).await.unwrap_err();
    assert!(matches!(e, LockError::Deadlock { .. }), "{e}");
    assert!(matches!(e.causes()[0].1, Outcome::Deadlock(_)), "{e}");
    read.release().await.unwrap();

    // Deadlock detection across keys: A holds k1 and waits for k2, B holds k2 and asks k1.
    let a = base.with_owner(OwnerIdentity::Fixed("A".into())).unwrap();
    let b = base.with_owner(OwnerIdentity::Fixed("B".into())).unwrap();
    let a1 = a.try_lock("k1", ttl).await.unwrap();
    let b2 = b.try_lock("k2", ttl).await.unwrap();
    let a_waits = {
        let a = a.clone();
        tokio::spawn(async move { a.lock("k2", ttl, Duration::from_secs(8)).await })
    };
    eventually("A queued on k2", || async {
        queued(&base, "k2").await == 1
    })
    .await;
    let e = b.lock("k1", ttl, Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(e, LockError::Deadlock { .. }), "{e}");
    b2.release().await.unwrap();
    let a2 = a_waits.await.unwrap().unwrap();
    drop((a1, a2));

    // The same owners through the sync client.
    let sync = LockClient::new(&url(&server), TIMEOUT)
        .unwrap()
        .with_owner(OwnerIdentity::Fixed("sync-job".into()))
        .unwrap();
    let s1 = sync.try_lock("s", ttl).unwrap();
    let s2 = sync.try_lock("s", ttl).unwrap();
    assert_eq!(s1.fencing_token().unwrap(), s2.fencing_token().unwrap());
    assert_eq!(s2.hold_count().unwrap(), 2);
    assert_eq!(sync.info("s").unwrap().unwrap().hold_count("sync-job"), 2);
    drop(s1);
    assert_eq!(s2.hold_count().unwrap(), 1);
    drop(s2);
    assert!(sync.info("s").unwrap().is_none());

    // Bad identities are refused before anything is sent.
    for bad in [
        OwnerIdentity::Fixed(String::new()),
        OwnerIdentity::Fixed("o".repeat(1025)),
        OwnerIdentity::Prefix("p".repeat(1000)),
    ] {
        assert!(matches!(
            base.with_owner(bad),
            Err(LockError::InvalidRequest { .. })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn using_signals_a_lock_taken_away_mid_closure() {
    let server = Server::start();
    let client = client(&server);
    let mut c = server.client();

    // Held throughout: the closure's result comes back and the lock is released after it.
    let out = client
        .using(
            "job",
            Acquire::write(Duration::from_secs(5)),
            |lost| async move {
                assert!(!lost.is_lost());
                lost.fencing_token()
            },
        )
        .await
        .unwrap();
    assert!(out.is_some_and(|t| t > 0));
    assert_eq!(int(&mut c, &["EXISTS", "job"]), 0);

    // The key is deleted while the closure works: the watchdog's next extend (every 1.5 s)
    // gets NOTOWNER and the signal fires, long before the closure's own 20 s and the lease's
    // 30 s validity.
    let deleter = {
        let port = server.port;
        std::thread::spawn(move || {
            let mut c = redis_lock_testkit::connect(port).unwrap();
            wait_until("lock taken", || int(&mut c, &["EXISTS", "job"]) == 1);
            int(&mut c, &["DEL", "job"])
        })
    };
    let started = Instant::now();
    let out = client
        .using(
            "job",
            Acquire::write(Duration::from_secs(30)).watchdog(Watchdog::new().fraction(0.05)),
            |lost| async move {
                tokio::select! {
                    _ = lost.lost() => "stopped: lock lost",
                    _ = tokio::time::sleep(Duration::from_secs(20)) => "finished",
                }
            },
        )
        .await;
    // The closure stopped early, and the lost lock is not reported as a success.
    assert!(
        matches!(&out, Err(LockError::Lost(l)) if l.cause == LossCause::Deleted),
        "{out:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(deleter.join().unwrap(), 1);

    // A guard without a watchdog: the signal fires when its validity runs out.
    let guard = client
        .try_lock("short", Duration::from_millis(300))
        .await
        .unwrap();
    let signal = guard.lost_signal();
    tokio::time::timeout(Duration::from_secs(5), signal.lost())
        .await
        .expect("signal at the end of validity");
    assert!(guard.is_lost());
    assert_eq!(guard.validity(), Duration::ZERO);
    // A lost guard's extend: lost (its validity ran out first), for good.
    let e = guard.extend().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Lost(l) if l.cause == LossCause::Expired),
        "{e}"
    );

    // A watchdog keeps a short lease alive well past its ttl.
    let kept = client
        .using(
            "kept",
            Acquire::write(Duration::from_millis(1500)),
            |lost| async move {
                tokio::time::sleep(Duration::from_secs(4)).await;
                lost.is_lost()
            },
        )
        .await
        .unwrap();
    assert!(!kept, "the watchdog should have kept the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn min_replicas_with_a_replica_and_with_it_stopped() {
    let (master, replica) = master_and_replica(&[]);
    let client = client(&master);
    let ttl = Duration::from_secs(10);

    // The replica acknowledges: granted.
    let g = client
        .acquire(
            "rep",
            Acquire::write(ttl).min_replicas(1, Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let mut r = replica.client();
    wait_until("grant replicated", || int(&mut r, &["EXISTS", "rep"]) == 1);
    g.release().await.unwrap();
    // The sync client too.
    let sync = LockClient::new(&url(&master), TIMEOUT).unwrap();
    let s = sync
        .acquire(
            "rep-sync",
            Acquire::write(ttl)
                .wait(Duration::from_secs(1))
                .min_replicas(1, Duration::from_secs(5)),
        )
        .unwrap();
    drop(s);

    // The replica is stopped: WAIT times out with 0 acknowledgements, the grant is released
    // and the error says so.
    replica.signal("STOP");
    let e = client
        .acquire(
            "rep",
            Acquire::write(ttl).min_replicas(1, Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    let e2 = sync
        .acquire(
            "rep-sync",
            Acquire::write(ttl).min_replicas(1, Duration::from_millis(300)),
        )
        .unwrap_err();
    replica.signal("CONT");
    for e in [e, e2] {
        assert!(
            matches!(
                e,
                LockError::ReplicasNotAcknowledged {
                    wanted: 1,
                    acknowledged: 0,
                    ..
                }
            ),
            "{e}"
        );
    }
    let mut m = master.client();
    assert_eq!(
        int(&mut m, &["EXISTS", "rep"]),
        0,
        "released after the refusal"
    );
    assert_eq!(int(&mut m, &["EXISTS", "rep-sync"]), 0);
    // Refused before anything is sent where it cannot work.
    assert!(matches!(
        sync.acquire(
            "x",
            Acquire::write(ttl)
                .bind()
                .min_replicas(1, Duration::from_secs(1))
        ),
        Err(LockError::InvalidRequest { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_wait_queue_is_max_waiters_and_a_dead_server_unreachable() {
    let server = Server::start_with(&["--lock.max-waiters", "1"]);
    let client = client(&server);
    let ttl = Duration::from_secs(10);
    let _held = client.try_lock("q", ttl).await.unwrap();
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("q", ttl, Duration::from_secs(3)).await })
    };
    let mut c = server.client();
    wait_until("one waiter", || waiting(&mut c, "q") == 1);
    let e = client
        .lock("q", ttl, Duration::from_secs(3))
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::MaxWaiters { .. }), "{e}");
    assert!(matches!(e.causes()[0].1, Outcome::MaxWaiters(_)), "{e}");
    // The sync client types it the same way.
    let sync = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let e = sync.lock("q", ttl, Duration::from_secs(3)).unwrap_err();
    assert!(matches!(e, LockError::MaxWaiters { .. }), "{e}");
    assert!(matches!(first.await.unwrap(), Err(LockError::Held { .. })));

    // Another Redis type stays a plain refusal.
    query(&mut c, &["SET", "str", "x"]).unwrap();
    assert!(matches!(
        client.try_lock("str", ttl).await,
        Err(LockError::Refused { .. })
    ));

    let u = url(&server);
    drop(server);
    let gone = AsyncLockClient::new(&u, TIMEOUT).unwrap();
    let e = gone.try_lock("x", ttl).await.unwrap_err();
    assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
    assert!(matches!(
        gone.acquire("x", Acquire::write(ttl).bind()).await,
        Err(LockError::Unreachable { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bound_holds_end_with_their_connection() {
    let server = Server::start();
    let client = client(&server);
    let mut c = server.client();
    let ttl = Duration::from_secs(30);

    // Killed connection: the server ends the hold at once (not after 30 s), and the guard's
    // watchdog (an extend every 1.5 s) finds it lost.
    let g = client
        .acquire(
            "b",
            Acquire::write(ttl)
                .bind()
                .watchdog(Watchdog::new().fraction(0.05)),
        )
        .await
        .unwrap();
    assert!(g.is_bound());
    let bound = bound_clients(&mut c);
    assert_eq!(bound.len(), 1, "{bound:?}");
    let id = bound[0].0.to_string();
    query(&mut c, &["CLIENT", "KILL", "ID", &id]).unwrap();
    wait_until("hold ended with its connection", || {
        int(&mut c, &["EXISTS", "b"]) == 0
    });
    tokio::time::timeout(Duration::from_secs(15), g.lost_signal().lost())
        .await
        .expect("the watchdog reports the closed connection");
    let e = g.extend().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Lost(l) if l.cause == LossCause::ConnectionClosed),
        "{e}"
    );
    // Releasing a lost guard is not a success either.
    let e = g.release().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Lost(l) if l.cause == LossCause::ConnectionClosed),
        "{e}"
    );

    // Release: over the guard's connection, which then closes.
    let g = client
        .acquire("b2", Acquire::write(ttl).bind())
        .await
        .unwrap();
    assert_eq!(bound_clients(&mut c).len(), 1);
    g.release().await.unwrap();
    assert_eq!(int(&mut c, &["EXISTS", "b2"]), 0);
    wait_until("bound connection closed", || {
        bound_clients(&mut c).is_empty()
    });

    // A bound waiter is granted on its own connection; its drop releases and closes it.
    let holder = client.try_lock("b3", ttl).await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let g = client
                .acquire(
                    "b3",
                    Acquire::write(ttl).bind().wait(Duration::from_secs(10)),
                )
                .await?;
            let bound = g.is_bound();
            drop(g);
            Ok::<bool, LockError>(bound)
        })
    };
    eventually("bound waiter queued", || async {
        queued(&client, "b3").await == 1
    })
    .await;
    holder.release().await.unwrap();
    assert!(waiter.await.unwrap().unwrap());
    wait_until("dropped bound guard released", || {
        int(&mut c, &["EXISTS", "b3"]) == 0 && bound_clients(&mut c).is_empty()
    });
}

/// The latency of an uncontended acquire through the async client, next to a bare
/// `LOCK.ACQUIRE` over a multiplexed connection of the same runtime (medians of 2000).
/// Run with `cargo test --release -p redis-lock-client --test async_client measure -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_async_acquire_latency() {
    let server = Server::start();
    let client = client(&server);
    let raw = redis::Client::open(url(&server))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl = Duration::from_secs(10);
    const N: usize = 4000;
    // One key over and over (the common case: the watcher's tracking already covers it), and
    // a new key each time (each first use registers it, sent ahead of the acquire).
    for (what, same_key) in [("one key", true), ("a new key each time", false)] {
        let mut ours = Vec::with_capacity(N);
        let mut bare = Vec::with_capacity(N);
        for i in 0..N {
            let key = if same_key {
                "lat".to_string()
            } else {
                format!("lat:{i}")
            };
            let t = Instant::now();
            let g = client.try_lock(&key, ttl).await.unwrap();
            g.release().await.unwrap();
            ours.push(t.elapsed());

            let mut conn = raw.clone();
            let t = Instant::now();
            let v: redis::Value = redis::cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg("bare")
                .arg(10_000)
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: redis::Value = redis::cmd("LOCK.RELEASE")
                .arg(&key)
                .arg("bare")
                .query_async(&mut conn)
                .await
                .unwrap();
            bare.push(t.elapsed());
            assert!(matches!(v, redis::Value::Int(_)));
        }
        ours.sort();
        bare.sort();
        let ratio = ours[N / 2].as_secs_f64() / bare[N / 2].as_secs_f64();
        println!(
            "uncontended acquire+release, {what}, median of {N}: async client {:?}, raw \
             LOCK.ACQUIRE+LOCK.RELEASE {:?} (ratio {ratio:.3}; p99 {:?} vs {:?})",
            ours[N / 2],
            bare[N / 2],
            ours[N * 99 / 100],
            bare[N * 99 / 100]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_wait_leaves_the_queue() {
    let server = Server::start();
    let client = client(&server);
    let ttl = Duration::from_secs(10);
    let holder = client.try_lock("c", ttl).await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("c", ttl, Duration::from_secs(20)).await })
    };
    eventually("waiter queued", || async {
        queued(&client, "c").await == 1
    })
    .await;
    // Cancelling the acquire (as a select! or a timeout does) drops its dedicated connection:
    // the server takes the waiter out of the queue.
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    eventually("waiter gone", || async { queued(&client, "c").await == 0 }).await;
    // A timeout around the acquire does the same.
    let timed = tokio::time::timeout(
        Duration::from_millis(300),
        client.lock("c", ttl, Duration::from_secs(20)),
    )
    .await;
    assert!(timed.is_err());
    eventually("timed-out waiter gone", || async {
        queued(&client, "c").await == 0
    })
    .await;
    holder.release().await.unwrap();
    assert!(client.info("c").await.unwrap().is_none(), "nobody got it");
}
