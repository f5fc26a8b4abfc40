//! Section 12: the Rust client's async API (`AsyncLockClient`) on tokio, next to the raw
//! commands over redis's own async connections on the same runtime.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::aio::{AsyncLockClient, AsyncLockGuard};

use crate::measure::flush;
use crate::redlock::url;
use crate::server::Server;

const TIMEOUT: Duration = Duration::from_millis(500);
const KEY: &str = "async-handoff";

/// The runtime of the measurements: multi-threaded, two workers (the client's tests use the
/// same; the process is pinned to one CPU by `make bench`).
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

async fn raw_connection(server: &Server) -> Result<MultiplexedConnection, String> {
    redis::Client::open(url(server))
        .map_err(|e| format!("redis client: {e}"))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("async connection: {e}"))
}

/// `LOCK.ACQUIRE key owner ttl [WAIT ms]` on `c`; an error unless granted.
async fn raw_acquire(
    c: &mut MultiplexedConnection,
    key: &str,
    owner: &str,
    wait_ms: Option<u64>,
) -> Result<(), String> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(10_000);
    if let Some(ms) = wait_ms {
        cmd.arg("WAIT").arg(ms);
    }
    match cmd.query_async::<Value>(c).await {
        Ok(Value::Int(_)) => Ok(()),
        Ok(v) => Err(format!("LOCK.ACQUIRE {key} {owner}: not granted: {v:?}")),
        Err(e) => Err(format!("LOCK.ACQUIRE {key} {owner}: {e}")),
    }
}

async fn raw_release(c: &mut MultiplexedConnection, key: &str, owner: &str) -> Result<(), String> {
    match redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(owner)
        .query_async::<Value>(c)
        .await
    {
        Ok(Value::Int(_)) => Ok(()),
        Ok(v) => Err(format!("LOCK.RELEASE {key} {owner}: {v:?}")),
        Err(e) => Err(format!("LOCK.RELEASE {key} {owner}: {e}")),
    }
}

/// Uncontended acquire + release pairs, each from the call to the release's return: through
/// `AsyncLockClient` (`try_lock` + `release`) and as raw commands over one multiplexed
/// connection, taking turns sample by sample.
pub struct Uncontended {
    pub client: Vec<Duration>,
    pub raw: Vec<Duration>,
}

pub async fn uncontended(server: &Server, samples: usize) -> Result<Uncontended, String> {
    let client =
        AsyncLockClient::new(&url(server), TIMEOUT).map_err(|e| format!("AsyncLockClient: {e}"))?;
    let mut raw = raw_connection(server).await?;
    let ttl = Duration::from_secs(10);
    let mut out = Uncontended {
        client: Vec::with_capacity(samples),
        raw: Vec::with_capacity(samples),
    };
    // The first 20 rounds are not counted: they open the connections.
    for i in 0..samples + 20 {
        let key = format!("alat:{}", i % 1000);
        let t = Instant::now();
        let g = client
            .try_lock(&key, ttl)
            .await
            .map_err(|e| format!("AsyncLockClient acquire: {e}"))?;
        g.release()
            .await
            .map_err(|e| format!("AsyncLockClient release: {e}"))?;
        let ours = t.elapsed();

        let t = Instant::now();
        raw_acquire(&mut raw, &key, "bare", None).await?;
        raw_release(&mut raw, &key, "bare").await?;
        let bare = t.elapsed();
        if i >= 20 {
            out.client.push(ours);
            out.raw.push(bare);
        }
    }
    Ok(out)
}

/// One contender: through the client (sharing one `AsyncLockClient`), or raw commands on a
/// multiplexed connection of its own (a `WAIT` holds its connection until the grant).
enum Contender {
    Client(AsyncLockClient),
    Raw(MultiplexedConnection, String),
}

enum Held {
    Guard(AsyncLockGuard),
    Raw,
}

impl Contender {
    async fn acquire(&mut self) -> Result<Held, String> {
        match self {
            Contender::Client(c) => c
                .lock(KEY, Duration::from_secs(10), Duration::from_secs(30))
                .await
                .map(Held::Guard)
                .map_err(|e| format!("AsyncLockClient lock: {e}")),
            Contender::Raw(c, owner) => raw_acquire(c, KEY, owner, Some(30_000))
                .await
                .map(|()| Held::Raw),
        }
    }

    async fn release(&mut self, held: Held) -> Result<(), String> {
        match (self, held) {
            (_, Held::Guard(g)) => g
                .release()
                .await
                .map_err(|e| format!("AsyncLockClient release: {e}")),
            (Contender::Raw(c, owner), Held::Raw) => raw_release(c, KEY, owner).await,
            (Contender::Client(_), Held::Raw) => Err("a raw hold on a client contender".into()),
        }
    }
}

/// What a contended run saw.
pub struct Handoff {
    /// From a release being sent to the next grant's reply.
    pub samples: Vec<Duration>,
    /// Hand-overs per second over the chain.
    pub per_second: f64,
}

/// `tasks` tasks loop acquire (waiting) / release on one key, until `samples` hand-overs were
/// seen or `budget` ran out; as section 2, each sample is from a release being sent to the next
/// grant. `raw`: raw commands, one connection per task; otherwise one shared `AsyncLockClient`.
pub async fn handoff(
    server: &Server,
    raw: bool,
    tasks: usize,
    samples: usize,
    budget: Duration,
) -> Result<Handoff, String> {
    flush(&mut server.connect());
    let client =
        AsyncLockClient::new(&url(server), TIMEOUT).map_err(|e| format!("AsyncLockClient: {e}"))?;
    let mut starter = if raw {
        Contender::Raw(raw_connection(server).await?, "starter".into())
    } else {
        Contender::Client(client.clone())
    };
    let first = starter.acquire().await?;
    let released_at: Arc<Mutex<VecDeque<Instant>>> = Arc::default();
    let out: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let deadline = Instant::now() + budget;
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let mut me = if raw {
            Contender::Raw(raw_connection(server).await?, format!("t{t}"))
        } else {
            Contender::Client(client.clone())
        };
        let (released_at, out) = (Arc::clone(&released_at), Arc::clone(&out));
        let (stop, stopped_at) = (Arc::clone(&stop), Arc::clone(&stopped_at));
        set.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let held = me.acquire().await?;
                let granted = Instant::now();
                let since = released_at.lock().expect("release times").pop_front();
                if let Some(t0) = since {
                    let mut v = out.lock().expect("samples");
                    v.push(granted.duration_since(t0));
                    if (v.len() >= samples || Instant::now() >= deadline)
                        && !stop.swap(true, Ordering::Relaxed)
                    {
                        *stopped_at.lock().expect("stop time") = Some(Instant::now());
                    }
                }
                released_at
                    .lock()
                    .expect("release times")
                    .push_back(Instant::now());
                me.release(held).await?;
            }
            Ok::<(), String>(())
        });
    }
    // Let every task queue, then start the chain.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    released_at
        .lock()
        .expect("release times")
        .push_back(Instant::now());
    starter.release(first).await?;
    let mut result = Ok(());
    while let Some(r) = set.join_next().await {
        let r = r.unwrap_or_else(|e| Err(format!("a contender task failed: {e}")));
        if result.is_ok() {
            if let Err(e) = r {
                // One failure ends the run: the others stop at their next grant.
                stop.store(true, Ordering::Relaxed);
                result = Err(e);
            }
        }
    }
    result?;
    let samples = Arc::try_unwrap(out)
        .map_err(|_| "samples still shared".to_string())?
        .into_inner()
        .expect("samples");
    let end = stopped_at
        .lock()
        .expect("stop time")
        .unwrap_or_else(Instant::now);
    let per_second = samples.len() as f64 / end.duration_since(started).as_secs_f64();
    Ok(Handoff {
        samples,
        per_second,
    })
}
