//! The async API, on tokio (cargo feature `tokio`): [`AsyncLockClient`] and
//! [`AsyncLockGuard`], with the same [`Acquire`] requests, [`Watchdog`]s and [`LockError`]s as
//! the sync client.
//!
//! # Connections
//!
//! An [`AsyncLockClient`] is cheap to clone and can be shared by any number of tasks and
//! threads: clones share one multiplexed connection (opened on first use, reopened after an
//! I/O failure) for every request the server answers at once: try-acquires, extends, releases,
//! `LOCK.INFO`. A request that makes the server wait (an acquire with [`Acquire::wait`], or
//! with [`Acquire::min_replicas`], whose `WAIT` blocks its connection) never goes over the
//! shared connection, where it would hold up every other request behind it: it takes a
//! dedicated connection from a small pool of idle ones (or opens one), and puts it back after
//! a complete reply. A dedicated connection whose reply did not come in time is closed, which
//! also takes its waiter out of the server's queue. One whose request was cancelled (the
//! acquire future dropped) gets a release behind the request and a `CLIENT UNBLOCK` of its
//! wait (over the shared connection), from a task spawned on the runtime, and is closed once
//! the release is answered: the waiter leaves the queue at once, and a grant that was already
//! on its way is released rather than left to its ttl (see [`AsyncLockClient::acquire`]).
//!
//! [`AsyncRedlock`] is the quorum lock over N independent servers, one [`AsyncLockClient`]
//! per server, with queued waits as [`crate::Redlock`] has them.
//!
//! With the cargo feature `cluster`, [`AsyncLockClient::cluster`] speaks to a Redis Cluster
//! through the `redis` crate's cluster client (slot routing by key, `MOVED` and `ASK`
//! followed): the same API, with dedicated cluster connections for waits.
//!
//! # Guards
//!
//! An [`AsyncLockGuard`] releases its hold on [`AsyncLockGuard::release`], or when dropped: the
//! drop never blocks the runtime, it spawns the release on the runtime the guard was acquired
//! on (best effort: a release that cannot run, for instance because the runtime is shutting
//! down, leaves the hold to its ttl). A [`Watchdog`] runs as a task that extends the lease and
//! reports a loss. [`AsyncLockGuard::lost_signal`] hands out a [`LostSignal`], a future-based
//! signal that fires once the lock is lost (the watchdog found the owner no longer holds it,
//! or its validity ran out), for a `select!` next to the work the lock protects;
//! [`AsyncLockClient::using`] wraps all of this around a closure.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{aio::AsyncLockClient, Acquire};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = AsyncLockClient::new("redis://127.0.0.1:6379/", Duration::from_millis(500))?;
//! let report = client
//!     .using("reports:daily", Acquire::write(Duration::from_secs(10)).wait(Duration::from_secs(5)),
//!         |lost| async move {
//!             tokio::select! {
//!                 _ = lost.lost() => Err("lock lost: stopped early"),
//!                 _ = tokio::time::sleep(Duration::from_secs(1)) => Ok("report written"),
//!             }
//!         })
//!     .await?;
//! # let _ = report;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, Value};
use tokio::sync::watch;

use crate::info::OwnerIdentity;
use crate::instance::{error_outcome, WAIT_REPLY_MARGIN};
use rand::Rng;

use crate::{
    acquire_outcome, classify, drift, extend_cmd, millis, release_cmd, release_one_cmd, Acquire,
    LockError, LockInfo, LostLock, Mode, Outcome, WaitStrategy, Watchdog, SINGLE_SERVER_MARGIN,
    WAITED_GRANT_MARGIN,
};

/// Idle dedicated connections kept for waits.
const MAX_IDLE: usize = 8;

/// A connection of either kind; both are multiplexed and cheap to clone.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn query(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// `cmd` where `route` says: by the key's slot, or to the node a redirect named (after
    /// `ASKING` for an `ASK`). One server ignores the route.
    async fn query_routed(&mut self, cmd: &Cmd, route: &Route) -> redis::RedisResult<Value> {
        match (self, route) {
            #[cfg(feature = "cluster")]
            (Conn::Cluster(c), Route::To { host, port, asking }) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let node = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                if !*asking {
                    return c
                        .route_command(cmd.clone(), RoutingInfo::SingleNode(node))
                        .await;
                }
                let mut pipe = redis::pipe();
                pipe.cmd("ASKING").add_command(cmd.clone());
                let mut replies = c.route_pipeline(pipe, 1, 1, node).await?;
                replies
                    .pop()
                    .ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ServerErrorKind::ResponseError.into(),
                            "no reply",
                        ))
                    })?
                    .extract_error()
            }
            (conn, _) => conn.query(cmd).await,
        }
    }
}

/// Where a cluster wait's next attempt (and a release behind it) goes: by the key's slot, or
/// to the node that an `ASK` or `MOVED` named, when the key moved while the request waited
/// (see [`AsyncLockClient::acquire`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Route {
    #[default]
    BySlot,
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    To {
        host: String,
        port: u16,
        asking: bool,
    },
}

impl Route {
    /// The route after `e`, when `e` says the key is elsewhere: `TRYAGAIN` (the module: the
    /// key was moved away while the request waited; ask by the slot map again), `ASK` or
    /// `MOVED`. `None` for any other error.
    fn after(e: &redis::RedisError) -> Option<Route> {
        let to = |asking| {
            let (addr, _slot) = e.redirect_node()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some(Route::To {
                host: host.to_string(),
                port: port.parse().ok()?,
                asking,
            })
        };
        match e.kind() {
            redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain) => Some(Route::BySlot),
            redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => to(true),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => to(false),
            _ => None,
        }
    }
}

/// How many times one waiting acquire follows its key to another cluster node before giving
/// up (a reshard moves a slot once; more means the slot is moving back and forth).
const MAX_KEY_MOVES: usize = 5;

/// Reads a route shared between a wait and the release that may be sent behind it.
fn route_of(route: &Mutex<Route>) -> Route {
    route.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Where the client connects.
// One per client, behind its Arc: a redis 1.x `Client` (240 bytes) inline costs nothing.
#[allow(clippy::large_enum_variant)]
enum Target {
    Single(redis::Client),
    #[cfg(feature = "cluster")]
    Cluster {
        /// With a response timeout: for the shared connection.
        shared: Box<redis::cluster::ClusterClient>,
        /// Without one (waits are bounded by the client): for dedicated connections.
        waits: Box<redis::cluster::ClusterClient>,
    },
}

struct Inner {
    target: Target,
    /// `host:port` (the first node for a cluster), as errors name the server.
    name: String,
    timeout: Duration,
    shared: tokio::sync::Mutex<Option<Conn>>,
    /// Idle dedicated connections, each with its server-side client id where known.
    idle: Mutex<Vec<(Conn, Option<i64>)>>,
}

impl Inner {
    fn idle(&self) -> MutexGuard<'_, Vec<(Conn, Option<i64>)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a connection: `dedicated` ones have no response timeout of their own (the caller
    /// bounds each request), the shared one has the client's timeout.
    async fn open(&self, dedicated: bool) -> redis::RedisResult<Conn> {
        let connect = async {
            match &self.target {
                Target::Single(client) => {
                    // redis 1.x gives a response timeout by default (500 ms): a dedicated
                    // connection must have none.
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout((!dedicated).then_some(self.timeout));
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Conn::Single)
                }
                #[cfg(feature = "cluster")]
                Target::Cluster { shared, waits } => {
                    let client = if dedicated { waits } else { shared };
                    client.get_async_connection().await.map(Conn::Cluster)
                }
            }
        };
        // A cluster connection fetches the slot map first: allow a few round trips.
        match tokio::time::timeout(self.timeout * 4, connect).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "connect timed out",
            ))),
        }
    }

    async fn shared(&self) -> Result<Conn, Outcome> {
        let mut slot = self.shared.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let conn = self.open(false).await.map_err(|e| unreachable(&e))?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// A short command over the shared connection, bounded by the timeout. After an I/O
    /// failure the shared connection is reopened by the next request.
    async fn short(&self, cmd: &Cmd) -> Result<Value, Outcome> {
        let mut conn = self.shared().await?;
        let reply = tokio::time::timeout(self.timeout + WAIT_REPLY_MARGIN, conn.query(cmd)).await;
        match reply {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if !is_io(&e) => Err(error_outcome(&e)),
            Ok(Err(e)) => {
                *self.shared.lock().await = None;
                Err(unreachable(&e))
            }
            Err(_) => {
                *self.shared.lock().await = None;
                Err(Outcome::Unreachable("no reply in time".into()))
            }
        }
    }

    /// A dedicated connection (from the idle ones, or opened), with its client id.
    async fn dedicated(&self) -> Result<(Conn, Option<i64>), Outcome> {
        let idle = self.idle().pop();
        match idle {
            Some(c) => Ok(c),
            None => {
                let conn = self.open(true).await.map_err(|e| unreachable(&e))?;
                Ok(self.with_id(conn).await)
            }
        }
    }

    /// The connection's `CLIENT ID` (one server only; `None` for a cluster connection, or when
    /// the server refuses it): what a cancelled wait is taken out of the queue by
    /// (`CLIENT UNBLOCK`, see [`ReleaseOnCancel`]).
    async fn with_id(&self, conn: Conn) -> (Conn, Option<i64>) {
        if !matches!(conn, Conn::Single(_)) {
            return (conn, None);
        }
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("ID");
        let copy = conn.clone();
        match on_dedicated(conn, &cmd, self.timeout + WAIT_REPLY_MARGIN).await {
            (Some(conn), Ok(Value::Int(id))) => (conn, Some(id)),
            (Some(conn), _) => (conn, None),
            (None, _) => (copy, None),
        }
    }

    fn put_back(&self, conn: Conn, id: Option<i64>) {
        let mut idle = self.idle();
        if idle.len() < MAX_IDLE {
            idle.push((conn, id));
        }
    }
}

fn is_io(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

fn unreachable(e: &redis::RedisError) -> Outcome {
    Outcome::Unreachable(e.to_string())
}

/// A command on a dedicated connection, with its reply bounded by `bound`. `Ok(conn)` with the
/// result when the connection can carry another request.
async fn on_dedicated(
    mut conn: Conn,
    cmd: &Cmd,
    bound: Duration,
) -> (Option<Conn>, Result<Value, Outcome>) {
    match tokio::time::timeout(bound, conn.query(cmd)).await {
        Ok(Ok(v)) => (Some(conn), Ok(v)),
        Ok(Err(e)) if !is_io(&e) => (Some(conn), Err(error_outcome(&e))),
        Ok(Err(e)) => (None, Err(unreachable(&e))),
        Err(_) => (None, Err(Outcome::Unreachable("no reply in time".into()))),
    }
}

/// Where a cancelled request's release goes: behind the request on its own dedicated
/// connection, or over a client's shared connection (where the request went too).
enum Behind {
    /// A request on a dedicated connection, which may still be waiting on the server: the
    /// release goes behind it, and `CLIENT UNBLOCK id` (over the shared connection) ends the
    /// wait at once, so the waiter leaves the queue and the release is answered. Without an id
    /// (a cluster, or a server that refused `CLIENT ID`) the release is answered when the wait
    /// ends: granted (and released) or timed out. The connection closes after the release's
    /// answer.
    Waiting {
        conn: Conn,
        id: Option<i64>,
        client: AsyncLockClient,
        /// Where the request went last (a cluster wait that followed its key).
        route: Arc<Mutex<Route>>,
    },
    Shared(AsyncLockClient),
}

/// Armed while acquire requests of a random owner are out (the owner holds nothing else, so a
/// `LOCK.RELEASE key owner ALL` can only undo them). If the acquire's future is dropped before
/// [`ReleaseOnCancel::disarm`] (a `select!`, a timeout, an aborted task), its drop spawns that
/// release on the runtime, on the connection each request went over: the server answers it after
/// the request, so a grant that was already on its way (or comes at the end of a wait) is
/// released at once instead of staying held, unknown to anyone, until its ttl.
struct ReleaseOnCancel {
    pending: Option<(Vec<(Behind, Duration)>, Cmd)>,
}

impl ReleaseOnCancel {
    fn new(via: Vec<(Behind, Duration)>, key: &str, owner: &str) -> Self {
        ReleaseOnCancel {
            pending: Some((via, release_cmd(key, owner))),
        }
    }

    /// Not armed: for an owner that may hold the key through other guards.
    fn none() -> Self {
        ReleaseOnCancel { pending: None }
    }

    /// The request's reply was read: nothing to undo here any more.
    fn disarm(mut self) {
        self.pending = None;
    }
}

impl Drop for ReleaseOnCancel {
    fn drop(&mut self) {
        let Some((via, cmd)) = self.pending.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for (behind, bound) in via {
            let cmd = cmd.clone();
            rt.spawn(async move {
                match behind {
                    // Dropped afterwards: a bound connection then closes behind its release.
                    Behind::Waiting {
                        mut conn,
                        id,
                        client,
                        route,
                    } => {
                        let route = route_of(&route);
                        let mut release =
                            Box::pin(tokio::time::timeout(bound, conn.query_routed(&cmd, &route)));
                        let Some(id) = id else {
                            let _ = release.await;
                            return;
                        };
                        let mut unblock = redis::cmd("CLIENT");
                        unblock.arg("UNBLOCK").arg(id);
                        // The release is queued on the connection first (biased), then the wait
                        // is ended. If the server refuses CLIENT UNBLOCK (an ACL without
                        // @admin), the connection is closed at once instead, which also takes
                        // the waiter out of the queue.
                        let unblocked = tokio::select! {
                            biased;
                            _ = &mut release => return,
                            r = client.inner.short(&unblock) => r,
                        };
                        if matches!(unblocked, Ok(Value::Int(_))) {
                            let _ = release.await;
                        }
                    }
                    Behind::Shared(client) => {
                        let _ = client.inner.short(&cmd).await;
                    }
                }
            });
        }
    }
}

/// An async lock client for one Redis server with the module, or (feature `cluster`) a Redis
/// Cluster whose masters all load it. Clone it freely: clones share connections. See the
/// [module documentation](self).
#[derive(Clone)]
pub struct AsyncLockClient {
    inner: Arc<Inner>,
    owner: OwnerIdentity,
}

impl AsyncLockClient {
    /// A client for `url` (`redis://[user:password@]host:port/db`, or `rediss://` with the
    /// `tls` feature). `timeout` bounds connecting and each reply (a waiting acquire's reply
    /// may also take its wait and a one-second margin). Fails only on a malformed URL: the
    /// server is contacted on first use.
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<Self> {
        Ok(Self::from_client(redis::Client::open(url)?, timeout))
    }

    /// A client over an existing `redis::Client` (its address, login, database and TLS
    /// settings; for instance one made with `redis::Client::build_with_tls`).
    pub fn from_client(client: redis::Client, timeout: Duration) -> Self {
        let name = client.get_connection_info().addr().to_string();
        // No CLIENT SETINFO on each new connection (a round trip more for every wait).
        let info = client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let client = redis::Client::open(info.set_redis_settings(settings)).unwrap_or(client);
        Self::with_target(Target::Single(client), name, timeout)
    }

    /// A client for a Redis Cluster reached through any of `nodes` (URLs as for
    /// [`AsyncLockClient::new`]): each key's commands go to the master of its slot, `MOVED`
    /// and `ASK` are followed. Every master must load the module. [`Acquire::min_replicas`]
    /// is refused.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<S: AsRef<str>>(nodes: &[S], timeout: Duration) -> redis::RedisResult<Self> {
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let shared = redis::cluster::ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()?;
        // No retries of its own: a wait whose key moved comes back with TRYAGAIN, ASK or
        // MOVED, and `acquire` sends it again where the key is with what is left of the wait
        // (the crate would send the same WAIT again, after a backoff of a second or more).
        let waits = redis::cluster::ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .retries(0)
            .build()?;
        let name = nodes.first().map(|n| n.to_string()).unwrap_or_default();
        Ok(Self::with_target(
            Target::Cluster {
                shared: Box::new(shared),
                waits: Box::new(waits),
            },
            name,
            timeout,
        ))
    }

    fn with_target(target: Target, name: String, timeout: Duration) -> Self {
        AsyncLockClient {
            inner: Arc::new(Inner {
                target,
                name,
                timeout: timeout.max(Duration::from_millis(1)),
                shared: tokio::sync::Mutex::new(None),
                idle: Mutex::new(Vec::new()),
            }),
            owner: OwnerIdentity::Random,
        }
    }

    /// How this client names owners when a request names none (see [`OwnerIdentity`]); the
    /// clone returned shares the connections. Fails on an owner the server would refuse.
    pub fn with_owner(&self, owner: OwnerIdentity) -> Result<Self, LockError> {
        owner.check()?;
        Ok(AsyncLockClient {
            inner: Arc::clone(&self.inner),
            owner,
        })
    }

    fn is_cluster(&self) -> bool {
        !matches!(self.inner.target, Target::Single(_))
    }

    fn named(&self, outcome: Outcome) -> Vec<(String, Outcome)> {
        vec![(self.inner.name.clone(), outcome)]
    }

    /// `LOCK.INFO key`: holders (owner, hold count, ttl), mode, queue; `None` when the key
    /// does not exist.
    pub async fn info(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(key);
        match self.inner.short(&cmd).await {
            Ok(v) => LockInfo::from_reply(&v).map_err(|e| LockError::Refused {
                causes: self.named(Outcome::Refused(e)),
            }),
            Err(o) => Err(classify(&self.named(o), 1)),
        }
    }

    /// Acquires a lock, or a semaphore permit, as `request` says. Waiting is done by the server
    /// (FIFO queue) on a dedicated connection. With [`Acquire::bind`] the acquire opens a
    /// connection of the guard's own, which carries its extends and release and closes with
    /// it; a closing by the server is found at the next extend ([`LockError::Disconnected`]).
    /// A cluster client refuses `bind` and `min_replicas` ([`LockError::InvalidRequest`]).
    ///
    /// Cancelling the returned future (dropping it, as a `select!` or a timeout does) once the
    /// request is out spawns, on the runtime, a `LOCK.RELEASE key owner ALL` behind the request
    /// on the connection it went over; a waiting request is also ended (`CLIENT UNBLOCK` of its
    /// dedicated connection, which then closes), so the waiter leaves the queue at once. A grant
    /// that was already on its way is so released, not left held, unknown to anyone, until its
    /// ttl. Not with an explicit owner ([`Acquire::owner`], [`OwnerIdentity::Fixed`]): a release
    /// could take one of the owner's other holds, so a late grant there is left to its ttl.
    /// On a cluster client the waiter is not unblocked: the release is answered (and the
    /// connection closed) when its wait ends, granted or not.
    pub async fn acquire(
        &self,
        key: &str,
        mut request: Acquire,
    ) -> Result<AsyncLockGuard, LockError> {
        let owner = self.owner.apply(&mut request);
        request.check()?;
        if request.bind && self.is_cluster() {
            return Err(LockError::InvalidRequest {
                reason: "bind() is not supported on a cluster client".into(),
            });
        }
        if request.min_replicas.is_some() && self.is_cluster() {
            return Err(LockError::InvalidRequest {
                reason: "min_replicas is not supported on a cluster client".into(),
            });
        }
        let started = Instant::now();
        let cmd = request.command(key, &owner, request.wait);
        let dedicated = request.wait.is_some() || request.min_replicas.is_some();
        let bound = request
            .wait
            .unwrap_or_default()
            .saturating_add(self.inner.timeout + WAIT_REPLY_MARGIN);
        // If this future is dropped while the request is out, its grant is released (see
        // `ReleaseOnCancel`); not for an explicit owner, whose other holds a release could take.
        let armed = |behind: Behind| {
            if request.release_all() {
                ReleaseOnCancel::new(vec![(behind, bound)], key, &owner)
            } else {
                ReleaseOnCancel::none()
            }
        };
        let mut conn_id = None;
        let (mut conn, reply) = if request.bind || dedicated {
            let opened = if request.bind {
                self.bound_connection().await
            } else {
                self.inner.dedicated().await
            };
            let (conn, id) = match opened {
                Ok(c) => c,
                Err(o) => return Err(classify(&self.named(o), 1)),
            };
            conn_id = id;
            let route = Arc::new(Mutex::new(Route::BySlot));
            let cancel = armed(Behind::Waiting {
                conn: conn.clone(),
                id,
                client: self.clone(),
                route: Arc::clone(&route),
            });
            let done = if self.is_cluster() && request.wait.is_some() {
                self.wait_following(conn, key, &owner, &request, started, &route)
                    .await
            } else {
                on_dedicated(conn, &cmd, bound).await
            };
            cancel.disarm();
            done
        } else {
            let cancel = armed(Behind::Shared(self.clone()));
            let reply = self.inner.short(&cmd).await;
            cancel.disarm();
            (None, reply)
        };
        let outcome = acquire_outcome(reply);
        let Outcome::Granted(token) = outcome else {
            // A bound connection is closed (dropped): a grant that comes late ends with it.
            if let Some(conn) = conn.filter(|_| !request.bind) {
                self.inner.put_back(conn, conn_id);
            }
            return Err(classify(&self.named(outcome), 1));
        };
        let bound = if request.bind { conn.take() } else { None };
        // As for the sync client: a grant without WAIT starts after `started`; a waited grant
        // is replied at once, so it started at the reply's arrival less its transit.
        let deadline = match request.wait {
            None => started + request.ttl,
            Some(_) => Instant::now() + request.ttl.saturating_sub(WAITED_GRANT_MARGIN),
        };
        let deadline = deadline
            .checked_sub(SINGLE_SERVER_MARGIN)
            .unwrap_or_else(Instant::now);
        let min_replicas = request.min_replicas;
        let guard = AsyncLockGuard::new(
            Arc::new([self.clone()]),
            1,
            key,
            owner,
            request,
            vec![(0, token)],
            deadline,
            bound,
        );
        let Some((replicas, timeout)) = min_replicas else {
            if let Some(conn) = conn {
                self.inner.put_back(conn, conn_id);
            }
            return Ok(guard);
        };
        // Redis's WAIT counts the writes of the connection it is sent on: the grant's.
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(millis(timeout));
        let acked = match conn {
            Some(conn) => {
                let bound = timeout.saturating_add(self.inner.timeout + WAIT_REPLY_MARGIN);
                let (conn, reply) = on_dedicated(conn, &wait, bound).await;
                if let Some(conn) = conn {
                    self.inner.put_back(conn, conn_id);
                }
                reply
            }
            None => Err(Outcome::Unreachable(
                "the grant's connection is gone".into(),
            )),
        };
        match acked {
            Ok(Value::Int(n)) if n >= i64::from(replicas) => Ok(guard),
            Ok(Value::Int(n)) => {
                let _ = guard.release().await;
                Err(LockError::ReplicasNotAcknowledged {
                    wanted: replicas,
                    acknowledged: u32::try_from(n).unwrap_or(0),
                    causes: self.named(Outcome::Granted(token)),
                })
            }
            other => {
                let _ = guard.release().await;
                let why = match other {
                    Err(o) => o.error_text().unwrap_or_default().to_string(),
                    Ok(v) => format!("unexpected WAIT reply {v:?}"),
                };
                Err(LockError::Unreachable {
                    causes: self.named(Outcome::Unreachable(format!("WAIT failed: {why}"))),
                })
            }
        }
    }

    /// A cluster wait that follows its key: when the node answers that the key is elsewhere
    /// (`TRYAGAIN`: a reshard's MIGRATE moved it while the request waited; `ASK` or `MOVED`),
    /// the request is sent again to the node that has it, with what is left of the wait, so
    /// it queues there and the whole acquire still ends when its wait does. `route` records
    /// where the request went, for a release sent behind it if the acquire is cancelled.
    async fn wait_following(
        &self,
        mut conn: Conn,
        key: &str,
        owner: &str,
        request: &Acquire,
        started: Instant,
        route: &Mutex<Route>,
    ) -> (Option<Conn>, Result<Value, Outcome>) {
        let wait = request.wait.unwrap_or_default();
        for attempt in 0..=MAX_KEY_MOVES {
            // WAIT 0 is no limit: a limited wait that is spent ends here instead.
            let remaining = if wait.is_zero() {
                Duration::ZERO
            } else {
                let left = wait.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return (Some(conn), Ok(Value::Nil));
                }
                left.max(Duration::from_millis(1))
            };
            let cmd = request.command(key, owner, Some(remaining));
            let bound = remaining.saturating_add(self.inner.timeout + WAIT_REPLY_MARGIN);
            let to = route_of(route);
            match tokio::time::timeout(bound, conn.query_routed(&cmd, &to)).await {
                Ok(Ok(v)) => return (Some(conn), Ok(v)),
                Ok(Err(e)) => match Route::after(&e) {
                    Some(next) if attempt < MAX_KEY_MOVES => {
                        *route.lock().unwrap_or_else(|p| p.into_inner()) = next;
                    }
                    _ if !is_io(&e) => return (Some(conn), Err(error_outcome(&e))),
                    _ => return (None, Err(unreachable(&e))),
                },
                Err(_) => return (None, Err(Outcome::Unreachable("no reply in time".into()))),
            }
        }
        (Some(conn), Ok(Value::Nil))
    }

    /// A new connection for one bound hold, named [`crate::BOUND_CLIENT_NAME`]; never pooled.
    async fn bound_connection(&self) -> Result<(Conn, Option<i64>), Outcome> {
        let conn = self.inner.open(true).await.map_err(|e| unreachable(&e))?;
        let mut name = redis::cmd("CLIENT");
        name.arg("SETNAME").arg(crate::BOUND_CLIENT_NAME);
        let (conn, reply) = on_dedicated(conn, &name, self.inner.timeout + WAIT_REPLY_MARGIN).await;
        reply?;
        let conn = conn.ok_or_else(|| Outcome::Unreachable("connection closed".into()))?;
        Ok(self.inner.with_id(conn).await)
    }

    /// Exclusive lock now, or [`LockError::Held`].
    pub async fn try_lock(&self, key: &str, ttl: Duration) -> Result<AsyncLockGuard, LockError> {
        self.acquire(key, Acquire::write(ttl)).await
    }

    /// Exclusive lock, waiting up to `wait`.
    pub async fn lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, LockError> {
        self.acquire(key, Acquire::write(ttl).wait(wait)).await
    }

    /// Shared lock now, or [`LockError::Held`].
    pub async fn try_read(&self, key: &str, ttl: Duration) -> Result<AsyncLockGuard, LockError> {
        self.acquire(key, Acquire::read(ttl)).await
    }

    /// Shared lock, waiting up to `wait`.
    pub async fn read(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, LockError> {
        self.acquire(key, Acquire::read(ttl).wait(wait)).await
    }

    /// One permit of the semaphore `key` of `capacity` permits, waiting up to `wait` (FIFO).
    pub async fn permit(
        &self,
        key: &str,
        capacity: u32,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, LockError> {
        self.acquire(key, Acquire::permit(capacity, ttl).wait(wait))
            .await
    }

    /// Acquires as `request` says (with a [`Watchdog`] added when it has none), runs `work`
    /// with a [`LostSignal`] of the hold, then releases it and returns what `work` returned.
    /// The signal fires if the lock is lost while `work` runs (its key deleted, its lease
    /// ended): `work` should `select!` on [`LostSignal::lost`] next to what it does and stop
    /// early. If `work` panics or is cancelled, the guard's drop releases the hold.
    pub async fn using<T, F, Fut>(
        &self,
        key: &str,
        request: Acquire,
        work: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(key, crate::with_watchdog(request)).await?;
        let out = work(guard.lost_signal()).await;
        // A release that fails leaves the hold to its ttl; `work`'s result stands.
        let _ = guard.release().await;
        Ok(out)
    }

    /// Sends a raw command over the shared connection (what the client uses for short
    /// requests): for comparisons and tools, such as timing a bare `LOCK.ACQUIRE`.
    pub async fn raw(&self, cmd: &Cmd) -> Result<Value, LockError> {
        self.inner
            .short(cmd)
            .await
            .map_err(|o| classify(&self.named(o), 1))
    }
}

/// The same command to every server at once (each over its shared connection); one result
/// per server, in order. `cmds[i] == None` skips server `i` (its result is "not sent").
async fn on_all(
    clients: &[AsyncLockClient],
    cmds: Vec<Option<Cmd>>,
) -> Vec<Result<Value, Outcome>> {
    if let ([client], [Some(cmd)]) = (clients, cmds.as_slice()) {
        return vec![client.inner.short(cmd).await];
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, (client, cmd)) in clients.iter().zip(cmds).enumerate() {
        if let Some(cmd) = cmd {
            let client = client.clone();
            set.spawn(async move { (i, client.inner.short(&cmd).await) });
        }
    }
    let mut results: Vec<Result<Value, Outcome>> = (0..clients.len())
        .map(|_| Err(Outcome::Unreachable("not sent".into())))
        .collect();
    while let Some(done) = set.join_next().await {
        if let Ok((i, r)) = done {
            results[i] = r;
        }
    }
    results
}

fn named_all(clients: &[AsyncLockClient], outcomes: Vec<Outcome>) -> Vec<(String, Outcome)> {
    clients
        .iter()
        .map(|c| c.inner.name.clone())
        .zip(outcomes)
        .collect()
}

/// The lease as far as the client knows it (see the sync guard's `Lease`).
struct Lease {
    valid_until: Instant,
    loss: Option<LockError>,
}

struct GuardState {
    /// The servers (one for an [`AsyncLockClient`], N for an [`AsyncRedlock`]).
    clients: Arc<[AsyncLockClient]>,
    quorum: usize,
    key: String,
    owner: String,
    mode: Mode,
    ttl: Duration,
    release_all: bool,
    /// (server index, token) for every server that granted.
    tokens: Vec<(usize, u64)>,
    lease: Mutex<Lease>,
    released: AtomicBool,
    /// Set to true, once, when the lock is known lost.
    lost: watch::Sender<bool>,
    /// A bound hold's connection (one server only); `None` inside once it closed.
    bound: Option<tokio::sync::Mutex<Option<Conn>>>,
}

impl GuardState {
    /// `cmd` on every server (shared connections), or on a bound hold's own connection. The
    /// flag says the bound connection is closed (the server ended the hold with it).
    async fn run(&self, cmd: Cmd) -> (Vec<Result<Value, Outcome>>, bool) {
        let Some(bound) = &self.bound else {
            let n = self.clients.len();
            return (on_all(&self.clients, vec![Some(cmd); n]).await, false);
        };
        let mut slot = bound.lock().await;
        let Some(conn) = slot.as_mut() else {
            let closed = Outcome::Unreachable("the bound connection is closed".into());
            return (vec![Err(closed)], true);
        };
        let limit = self
            .clients
            .first()
            .map_or(WAIT_REPLY_MARGIN, |c| c.inner.timeout + WAIT_REPLY_MARGIN);
        match tokio::time::timeout(limit, conn.query(&cmd)).await {
            Ok(Ok(v)) => (vec![Ok(v)], false),
            Ok(Err(e)) if !is_io(&e) => (vec![Err(error_outcome(&e))], false),
            Ok(Err(e)) => {
                *slot = None;
                (vec![Err(unreachable(&e))], true)
            }
            // A slow server is no reason to close the connection (that would end the hold).
            Err(_) => (
                vec![Err(Outcome::Unreachable("no reply in time".into()))],
                false,
            ),
        }
    }

    fn lease(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn named(&self, outcomes: Vec<Outcome>) -> Vec<(String, Outcome)> {
        named_all(&self.clients, outcomes)
    }

    fn is_lost(&self) -> bool {
        let lease = self.lease();
        let lost = lease.loss.is_some() || Instant::now() >= lease.valid_until;
        drop(lease);
        if lost {
            self.lost.send_replace(true);
        }
        lost
    }

    fn lose(&self, loss: LockError) -> LockError {
        let mut lease = self.lease();
        if lease.loss.is_none() {
            lease.loss = Some(loss.clone());
        }
        drop(lease);
        self.lost.send_replace(true);
        loss
    }

    /// LOCK.EXTEND on every server: Ok with the new validity when a quorum confirmed it;
    /// `NotOwner` (lost) when too many servers say the owner holds nothing; `Expired` (lost)
    /// when validity ran out first; `Unreachable` otherwise (not conclusive).
    async fn extend(&self) -> Result<Duration, LockError> {
        let started = Instant::now();
        {
            let lease = self.lease();
            if let Some(loss) = &lease.loss {
                return Err(loss.clone());
            }
            if started >= lease.valid_until {
                drop(lease);
                return Err(self.lose(LockError::Expired { causes: Vec::new() }));
            }
        }
        let (results, disconnected) = self.run(extend_cmd(&self.key, &self.owner, self.ttl)).await;
        let outcomes: Vec<Outcome> = results
            .into_iter()
            .map(|r| match r {
                Ok(Value::Int(_)) => Outcome::Granted(0),
                Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
                Err(o) => o,
            })
            .collect();
        let elapsed = started.elapsed();
        let ok = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Granted(_)))
            .count();
        let gone = outcomes.iter().filter(|o| o.is_refusal()).count();
        let n = outcomes.len();
        let causes = self.named(outcomes);
        let mut lease = self.lease();
        if let Some(loss) = &lease.loss {
            return Err(loss.clone());
        }
        let now = Instant::now();
        if ok >= self.quorum {
            if now >= lease.valid_until {
                // Confirmed too late: the lock may have been free in between. It stays lost.
                drop(lease);
                return Err(self.lose(LockError::Expired { causes }));
            }
            if let Some(v) = self.ttl.checked_sub(elapsed + drift(self.ttl)) {
                lease.valid_until = lease.valid_until.max(started + elapsed + v);
                return Ok(lease.valid_until.saturating_duration_since(now));
            }
        }
        drop(lease);
        if disconnected {
            return Err(self.lose(LockError::Disconnected { causes }));
        }
        if n - gone < self.quorum {
            return Err(self.lose(LockError::NotOwner { causes }));
        }
        Err(LockError::Unreachable { causes })
    }

    async fn release(&self) -> Result<(), LockError> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let cmd = if self.release_all {
            release_cmd(&self.key, &self.owner)
        } else {
            release_one_cmd(&self.key, &self.owner)
        };
        if let Some(bound) = &self.bound {
            // Released first (so no lock-delay starts), then the connection closes; a closed
            // connection already ended the hold.
            let (results, closed) = self.run(cmd).await;
            let conn = bound.lock().await.take();
            drop(conn);
            if closed {
                return Ok(());
            }
            return match results.into_iter().next() {
                // Unanswered: the close just sent ends the hold once the server reads it.
                Some(Err(o @ Outcome::Unreachable(_))) => Err(LockError::Unreachable {
                    causes: self.named(vec![o]),
                }),
                _ => Ok(()),
            };
        }
        let outcomes: Vec<Outcome> = on_all(&self.clients, vec![Some(cmd); self.clients.len()])
            .await
            .into_iter()
            .map(|r| match r {
                // NOTOWNER (or any answer) counts as done: the hold is gone either way.
                Err(o @ Outcome::Unreachable(_)) => o,
                _ => Outcome::Granted(0),
            })
            .collect();
        if outcomes.iter().all(|o| matches!(o, Outcome::Granted(_))) {
            Ok(())
        } else {
            Err(LockError::Unreachable {
                causes: self.named(outcomes),
            })
        }
    }
}

/// A held lock or semaphore permit of an [`AsyncLockClient`] (or a lock of an
/// [`AsyncRedlock`]). Released by [`AsyncLockGuard::release`], or on drop by a task spawned on
/// the runtime it was acquired on (the drop itself never blocks). A [`Watchdog`] of the request
/// runs as a task until then.
#[must_use = "dropping the guard releases the lock at once"]
pub struct AsyncLockGuard {
    state: Arc<GuardState>,
    watchdog: Option<tokio::task::JoinHandle<()>>,
    runtime: Option<tokio::runtime::Handle>,
    lost: watch::Receiver<bool>,
}

impl AsyncLockGuard {
    #[allow(clippy::too_many_arguments)]
    fn new(
        clients: Arc<[AsyncLockClient]>,
        quorum: usize,
        key: &str,
        owner: String,
        request: Acquire,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
        bound: Option<Conn>,
    ) -> Self {
        let (tx, rx) = watch::channel(false);
        let state = Arc::new(GuardState {
            clients,
            quorum,
            key: key.to_string(),
            owner,
            mode: request.mode,
            ttl: request.ttl,
            release_all: request.release_all(),
            tokens,
            lease: Mutex::new(Lease {
                valid_until,
                loss: None,
            }),
            released: AtomicBool::new(false),
            lost: tx,
            bound: bound.map(|c| tokio::sync::Mutex::new(Some(c))),
        });
        let runtime = tokio::runtime::Handle::try_current().ok();
        let watchdog = match (&runtime, request.watchdog) {
            (Some(rt), Some(w)) => Some(rt.spawn(run_watchdog(Arc::clone(&state), w))),
            _ => None,
        };
        AsyncLockGuard {
            state,
            watchdog,
            runtime,
            lost: rx,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The owner this guard holds under (random, or the request's or client's owner).
    pub fn owner(&self) -> &str {
        &self.state.owner
    }

    /// Write, read, or a permit of a semaphore.
    pub fn mode(&self) -> Mode {
        self.state.mode
    }

    /// Whether the hold is bound to this guard's own connection ([`Acquire::bind`]).
    pub fn is_bound(&self) -> bool {
        self.state.bound.is_some()
    }

    /// The grant's fencing token, for a lock (or permit) on one server; `None` for a Redlock,
    /// whose servers' tokens are not comparable (see [`AsyncLockGuard::tokens`]).
    pub fn fencing_token(&self) -> Option<u64> {
        fencing_token(&self.state)
    }

    /// (server, token) for every server that granted the lock.
    pub fn tokens(&self) -> Vec<(String, u64)> {
        self.state
            .tokens
            .iter()
            .filter_map(|(i, t)| {
                self.state
                    .clients
                    .get(*i)
                    .map(|c| (c.inner.name.clone(), *t))
            })
            .collect()
    }

    /// How much longer the lock is certainly held (zero once expired or lost).
    pub fn validity(&self) -> Duration {
        if self.state.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .lease()
            .valid_until
            .saturating_duration_since(Instant::now())
    }

    /// True once the lock may no longer be held: its validity ran out without a confirmed
    /// extend, or the servers said the owner no longer holds it. Stays true.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// A signal that fires once the lock is lost (see [`LostSignal`]).
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            state: Arc::clone(&self.state),
            rx: self.lost.clone(),
        }
    }

    /// How many holds this guard's owner has of the key (`LOCK.INFO` on the first server that
    /// granted): 1 for a random owner, more when guards of one explicit owner re-entered it, 0
    /// once the hold is gone.
    pub async fn hold_count(&self) -> Result<u64, LockError> {
        let i = self.state.tokens.first().map_or(0, |(i, _)| *i);
        let Some(client) = self.state.clients.get(i) else {
            return Ok(0);
        };
        Ok(client
            .info(&self.state.key)
            .await?
            .map_or(0, |info| info.hold_count(&self.state.owner)))
    }

    /// Renews the lease for another ttl; returns the new validity. [`LockError::NotOwner`]
    /// (the guard is then lost) when the servers say the owner holds nothing; `Unreachable`
    /// is not conclusive; `Expired` when validity had run out first.
    pub async fn extend(&self) -> Result<Duration, LockError> {
        self.state.extend().await
    }

    /// Stops the watchdog and releases the hold (one hold for an explicit owner), waiting for
    /// the servers' answers. A hold that is already gone counts as released.
    pub async fn release(mut self) -> Result<(), LockError> {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        self.state.release().await
    }
}

fn fencing_token(state: &GuardState) -> Option<u64> {
    match (&state.tokens[..], state.clients.len()) {
        ([(_, t)], 1) => Some(*t),
        _ => None,
    }
}

impl Drop for AsyncLockGuard {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        if self.state.released.load(Ordering::SeqCst) {
            return;
        }
        let state = Arc::clone(&self.state);
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        if let Some(rt) = runtime {
            rt.spawn(async move {
                let _ = state.release().await;
            });
        }
    }
}

impl std::fmt::Debug for AsyncLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLockGuard")
            .field("key", &self.state.key)
            .field("owner", &self.state.owner)
            .field("mode", &self.state.mode)
            .field("tokens", &self.state.tokens)
            .finish()
    }
}

/// Fires once the lock of a guard is lost: the watchdog found the owner no longer holds it (the
/// key was deleted, the hold expired or was taken over), or its validity ran out without a
/// confirmed extend. Cheap to clone; every clone sees the same signal.
#[derive(Clone)]
pub struct LostSignal {
    state: Arc<GuardState>,
    rx: watch::Receiver<bool>,
}

impl LostSignal {
    /// Whether the lock is lost now.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// The key of the lock.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The fencing token of the grant (one server; `None` for a Redlock).
    pub fn fencing_token(&self) -> Option<u64> {
        fencing_token(&self.state)
    }

    /// Completes once the lock is lost (at once if it already is). Never completes while the
    /// lock is held: `select!` on it next to the work.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        loop {
            if self.state.is_lost() {
                return;
            }
            let until = self.state.lease().valid_until;
            let deadline = tokio::time::Instant::from_std(until);
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The guard is gone: nothing will extend the lease any more.
                        tokio::time::sleep_until(deadline).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// The watchdog task: extends every `fraction` of the ttl; after an inconclusive (unreachable)
/// extend, tries again sooner; reports a loss once and ends.
async fn run_watchdog(state: Arc<GuardState>, watchdog: Watchdog) {
    let period = state
        .ttl
        .mul_f64(watchdog.fraction)
        .max(Duration::from_millis(1));
    let mut next = period;
    loop {
        let until = state.lease().valid_until;
        let left = until.saturating_duration_since(Instant::now());
        tokio::time::sleep(next.min(left)).await;
        if state.released.load(Ordering::SeqCst) {
            return;
        }
        let result = state.extend().await;
        if state.released.load(Ordering::SeqCst) {
            return;
        }
        match result {
            Ok(_) => next = period,
            Err(e) if state.is_lost() => {
                watchdog.report(LostLock {
                    key: state.key.clone(),
                    causes: e.causes().to_vec(),
                });
                return;
            }
            Err(_) => next = (period / 4).max(Duration::from_millis(1)),
        }
    }
}

/// Redlock on tokio: one lock over N independent servers (N/2+1 must grant), each reached
/// through an [`AsyncLockClient`] of its own (one shared connection, dedicated ones for
/// waits). Cheap to clone. Waits as its [`WaitStrategy`] says: by default queued on one
/// server with the module's `WAIT` (see [`WaitStrategy::Queue`]). Locks only: it refuses
/// semaphore permits, explicit owners, [`Acquire::bind`] and [`Acquire::min_replicas`] with
/// [`LockError::InvalidRequest`], as the sync [`crate::Redlock`] does.
#[derive(Clone)]
pub struct AsyncRedlock {
    clients: Arc<[AsyncLockClient]>,
    quorum: usize,
    retry_delay: (Duration, Duration),
    strategy: WaitStrategy,
    prefix: String,
}

impl AsyncRedlock {
    /// One server per URL; `per_instance_timeout` bounds connecting to and each reply from
    /// one server (the servers are asked at the same time).
    pub fn new<S: AsRef<str>>(
        urls: &[S],
        per_instance_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let clients = urls
            .iter()
            .map(|u| AsyncLockClient::new(u.as_ref(), per_instance_timeout))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Self::of(clients))
    }

    /// The same over existing `redis::Client`s, one per server.
    pub fn from_clients(clients: Vec<redis::Client>, per_instance_timeout: Duration) -> Self {
        Self::of(
            clients
                .into_iter()
                .map(|c| AsyncLockClient::from_client(c, per_instance_timeout))
                .collect(),
        )
    }

    fn of(clients: Vec<AsyncLockClient>) -> Self {
        let quorum = clients.len() / 2 + 1;
        AsyncRedlock {
            clients: clients.into(),
            quorum,
            retry_delay: (Duration::from_millis(1), Duration::from_millis(20)),
            strategy: WaitStrategy::Queue,
            prefix: String::new(),
        }
    }

    /// How an acquire with `wait` waits ([`WaitStrategy::Queue`] by default).
    pub fn wait_strategy(mut self, strategy: WaitStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The random delay between polling attempts, in `[min, max)` (default 1 to 20 ms).
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.retry_delay = (min, max.max(min + Duration::from_micros(1)));
        self
    }

    /// Owners of this Redlock's guards start with `prefix` (then 32 random hex digits).
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Result<Self, LockError> {
        let prefix = prefix.into();
        OwnerIdentity::Prefix(prefix.clone()).check()?;
        self.prefix = prefix;
        Ok(self)
    }

    /// How many servers must grant a lock.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// `LOCK.INFO key` on every server, in order: (server, what it said).
    pub async fn info(&self, key: &str) -> Vec<(String, Result<Option<LockInfo>, LockError>)> {
        let mut out = Vec::with_capacity(self.clients.len());
        for c in self.clients.iter() {
            out.push((c.inner.name.clone(), c.info(key).await));
        }
        out
    }

    fn jitter(&self) -> Duration {
        let (min, max) = self.retry_delay;
        rand::thread_rng().gen_range(min..max)
    }

    /// Acquires the lock on a majority. Without `wait`, one attempt; with it, attempts repeat
    /// until the wait is over, waiting in between as the [`WaitStrategy`] says. A failed
    /// attempt is released everywhere; a refusal ends the attempts at once.
    pub async fn acquire(&self, key: &str, request: Acquire) -> Result<AsyncLockGuard, LockError> {
        request.check()?;
        let invalid = |reason: &str| {
            Err(LockError::InvalidRequest {
                reason: format!("AsyncRedlock does not take {reason}"),
            })
        };
        if matches!(request.mode, Mode::Permit { .. }) {
            return invalid("semaphore permits (see Redlock)");
        }
        if request.owner.is_some() {
            return invalid("an explicit owner (see Redlock)");
        }
        if request.bind {
            return invalid("bind()");
        }
        if request.min_replicas.is_some() {
            return invalid("min_replicas");
        }
        let owner = format!("{}{}", self.prefix, crate::info::random_hex());
        if self.clients.is_empty() {
            return Err(LockError::Unreachable { causes: Vec::new() });
        }
        // If this future is dropped midway, whatever the servers granted is released.
        let everywhere = self
            .clients
            .iter()
            .map(|c| (Behind::Shared(c.clone()), c.inner.timeout))
            .collect();
        let cancel = ReleaseOnCancel::new(everywhere, key, &owner);
        let result = self.attempts(key, &owner, &request).await;
        cancel.disarm();
        result
    }

    /// The attempts of [`AsyncRedlock::acquire`], until a guard, a refusal or the end of the
    /// wait.
    async fn attempts(
        &self,
        key: &str,
        owner: &str,
        request: &Acquire,
    ) -> Result<AsyncLockGuard, LockError> {
        let give_up = crate::give_up_after(request.wait);
        let mut backoff = Duration::ZERO;
        let n = self.clients.len();
        loop {
            let started = Instant::now();
            let cmd = request.command(key, owner, None);
            let outcomes: Vec<Outcome> = on_all(&self.clients, vec![Some(cmd); n])
                .await
                .into_iter()
                .map(acquire_outcome)
                .collect();
            let tokens: Vec<(usize, u64)> = outcomes
                .iter()
                .enumerate()
                .filter_map(|(i, o)| match o {
                    Outcome::Granted(t) => Some((i, *t)),
                    _ => None,
                })
                .collect();
            let elapsed = started.elapsed();
            let validity = request
                .ttl
                .checked_sub(elapsed + drift(request.ttl))
                .filter(|v| !v.is_zero());
            if tokens.len() >= self.quorum {
                if let Some(validity) = validity {
                    return Ok(self.guard(
                        key,
                        owner,
                        request,
                        tokens,
                        started + elapsed + validity,
                    ));
                }
            }
            if !tokens.is_empty()
                || outcomes
                    .iter()
                    .any(|o| matches!(o, Outcome::Unreachable(_)))
            {
                self.release(key, owner).await;
            }
            let answered: Vec<bool> = outcomes
                .iter()
                .map(|o| !matches!(o, Outcome::Unreachable(_)))
                .collect();
            let causes = named_all(&self.clients, outcomes);
            let error = if tokens.len() >= self.quorum {
                LockError::Expired { causes }
            } else {
                classify(&causes, self.quorum)
            };
            let now = Instant::now();
            if now >= give_up || error.is_refusal() {
                return Err(error);
            }
            if self.strategy == WaitStrategy::Queue {
                match self
                    .queue_once(key, owner, request, give_up, &answered, &mut backoff)
                    .await
                {
                    Some(done) => return done,
                    None => continue,
                }
            }
            tokio::time::sleep(self.jitter().min(give_up - now)).await;
        }
    }

    fn guard(
        &self,
        key: &str,
        owner: &str,
        request: &Acquire,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
    ) -> AsyncLockGuard {
        AsyncLockGuard::new(
            Arc::clone(&self.clients),
            self.quorum,
            key,
            owner.to_string(),
            request.clone(),
            tokens,
            valid_until,
            None,
        )
    }

    /// `LOCK.RELEASE key owner ALL` everywhere (best effort).
    async fn release(&self, key: &str, owner: &str) {
        let n = self.clients.len();
        on_all(&self.clients, vec![Some(release_cmd(key, owner)); n]).await;
    }

    /// One queued round, as the sync [`crate::Redlock`] does it: wait on the key's designated
    /// server for at most a slice; when it grants, ask the others. `Some` ends the acquire.
    async fn queue_once(
        &self,
        key: &str,
        owner: &str,
        request: &Acquire,
        give_up: Instant,
        answered: &[bool],
        backoff: &mut Duration,
    ) -> Option<Result<AsyncLockGuard, LockError>> {
        let n = self.clients.len();
        let designated = crate::designated_server(key, answered, n);
        let slice = give_up
            .saturating_duration_since(Instant::now())
            .min(crate::QUEUE_SLICE)
            .min(request.ttl / 4);
        if slice < Duration::from_millis(1) {
            return None;
        }
        let client = self.clients.get(designated)?;
        // The grant may come at any moment of the slice, and the lease starts then: the
        // validity is counted from the slice's start, the earliest moment it can have started.
        let sent_at = Instant::now();
        let first = match client.inner.dedicated().await {
            Ok((conn, id)) => {
                let bound = slice.saturating_add(client.inner.timeout + WAIT_REPLY_MARGIN);
                let cmd = request.command(key, owner, Some(slice));
                // Cancelled during the wait: released behind it, on its connection.
                let behind = Behind::Waiting {
                    conn: conn.clone(),
                    id,
                    client: client.clone(),
                    route: Arc::default(),
                };
                let cancel = ReleaseOnCancel::new(vec![(behind, bound)], key, owner);
                let (conn, reply) = on_dedicated(conn, &cmd, bound).await;
                cancel.disarm();
                if let Some(conn) = conn {
                    client.inner.put_back(conn, id);
                }
                acquire_outcome(reply)
            }
            Err(o) => o,
        };
        let give_up_left = || give_up.saturating_duration_since(Instant::now());
        match first {
            Outcome::Granted(token) => {
                let mut tokens = vec![(designated, token)];
                let mut outcomes: Vec<Outcome> = Vec::new();
                // The previous holder's releases may still be on their way: a few quick tries.
                for pause in [0u64, 1, 2, 4, 8] {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    let cmds: Vec<Option<Cmd>> = (0..n)
                        .map(|j| {
                            (!tokens.iter().any(|(i, _)| *i == j))
                                .then(|| request.command(key, owner, None))
                        })
                        .collect();
                    outcomes = on_all(&self.clients, cmds.clone())
                        .await
                        .into_iter()
                        .map(acquire_outcome)
                        .collect();
                    for (j, o) in outcomes.iter().enumerate() {
                        if let (Outcome::Granted(t), Some(_)) = (o, &cmds[j]) {
                            tokens.push((j, *t));
                        }
                    }
                    if tokens.len() >= self.quorum
                        || outcomes.iter().any(|o| o.is_refusal())
                        || Instant::now() >= give_up
                    {
                        break;
                    }
                }
                let validity = request
                    .ttl
                    .checked_sub(sent_at.elapsed() + drift(request.ttl))
                    .filter(|v| !v.is_zero());
                if tokens.len() >= self.quorum {
                    if let Some(validity) = validity {
                        tokens.sort_unstable();
                        return Some(Ok(self.guard(
                            key,
                            owner,
                            request,
                            tokens,
                            Instant::now() + validity,
                        )));
                    }
                }
                self.release(key, owner).await;
                let error = classify(&named_all(&self.clients, outcomes), self.quorum);
                if error.is_refusal() {
                    return Some(Err(error));
                }
                let (min, _) = self.retry_delay;
                *backoff =
                    (*backoff * 2).clamp(min.max(Duration::from_millis(20)), crate::QUEUE_SLICE);
                let delay = rand::thread_rng().gen_range(*backoff / 2..=*backoff);
                tokio::time::sleep(delay.min(give_up_left())).await;
                None
            }
            Outcome::Held => None,
            Outcome::MaxWaiters(_) => {
                *backoff = (*backoff * 2).clamp(Duration::from_millis(20), crate::QUEUE_SLICE);
                let delay = rand::thread_rng().gen_range(*backoff / 2..=*backoff);
                tokio::time::sleep(delay.min(give_up_left())).await;
                None
            }
            Outcome::Unreachable(_) => {
                tokio::time::sleep(self.jitter().min(give_up_left())).await;
                None
            }
            refused => {
                let outcomes = (0..n)
                    .map(|i| {
                        if i == designated {
                            refused.clone()
                        } else {
                            Outcome::Unreachable("not asked".into())
                        }
                    })
                    .collect();
                Some(Err(classify(&named_all(&self.clients, outcomes), 1)))
            }
        }
    }

    /// As [`AsyncLockClient::using`], over the quorum lock.
    pub async fn using<T, F, Fut>(
        &self,
        key: &str,
        request: Acquire,
        work: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(key, crate::with_watchdog(request)).await?;
        let out = work(guard.lost_signal()).await;
        let _ = guard.release().await;
        Ok(out)
    }
}
