//! The async face's connections: one shared multiplexed connection per client, dedicated
//! ones for waits (pooled), cluster routing, and the release sent behind a cancelled request.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, Value};

use super::client::AsyncLockClient;
use super::watch::{read_pushes, Watcher};
use crate::proto::reply::{error_outcome, release_cmd, InfoForm, NO_REPLY, WAIT_REPLY_MARGIN};
use crate::{LockError, Outcome};

/// Idle dedicated connections kept for waits.
const MAX_IDLE: usize = 8;

/// A connection of either kind; both are multiplexed and cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    pub(crate) async fn query(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// A pipeline, on one server's connection (the watcher's registrations).
    pub(crate) async fn pipeline(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => Ok(Vec::new()),
        }
    }

    /// `cmd` where `route` says: by the key's slot, or to the node a redirect named (after
    /// `ASKING` for an `ASK`). One server ignores the route.
    pub(crate) async fn query_routed(
        &mut self,
        cmd: &Cmd,
        route: &Route,
    ) -> redis::RedisResult<Value> {
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
pub(crate) enum Route {
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
    pub(crate) fn after(e: &redis::RedisError) -> Option<Route> {
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
pub(crate) const MAX_KEY_MOVES: usize = 5;

/// Reads a route shared between a wait and the release that may be sent behind it.
pub(crate) fn route_of(route: &Mutex<Route>) -> Route {
    route.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Where the client connects.
// One per client, behind its Arc: a redis 1.x `Client` (240 bytes) inline costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Target {
    Single(redis::Client),
    #[cfg(feature = "cluster")]
    Cluster {
        /// With a response timeout: for the shared connection.
        shared: Box<redis::cluster::ClusterClient>,
        /// Without one (waits are bounded by the client): for dedicated connections.
        waits: Box<redis::cluster::ClusterClient>,
    },
}

pub(crate) struct Inner {
    pub(crate) target: Target,
    /// `host:port` (the first node for a cluster), as errors name the server.
    pub(crate) name: String,
    pub(crate) timeout: Duration,
    pub(crate) shared: tokio::sync::Mutex<Option<Conn>>,
    /// Idle dedicated connections, each with its server-side client id where known.
    pub(crate) idle: Mutex<Vec<(Conn, Option<i64>)>>,
    /// One permit per connection a wait may use (`max_wait_connections`): a wait holds one
    /// while its request is out. Waits take idle connections first and open one only when
    /// none is idle, so at most this many wait connections are ever open.
    pub(crate) wait_slots: Arc<tokio::sync::Semaphore>,
    pub(crate) wait_limit: usize,
    /// The loss watcher, over the shared connection (see [`super::watch`]).
    pub(crate) watcher: Watcher,
    /// Whether the server takes `LOCK.INFO key OWNER owner` (the client's checks of its own
    /// holds; learnt from an older module's refusal, see [`InfoForm`]).
    pub(crate) info_form: InfoForm,
}

impl Inner {
    fn idle(&self) -> MutexGuard<'_, Vec<(Conn, Option<i64>)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a connection: `dedicated` ones have no response timeout of their own (the caller
    /// bounds each request), the shared one has the client's timeout.
    pub(crate) async fn open(&self, dedicated: bool) -> redis::RedisResult<Conn> {
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

    /// The shared connection, opened when there is none. Boxed: opening it starts the
    /// watcher's task, which may reopen it, and the compiler cannot see through that cycle.
    pub(crate) fn shared(
        self: &Arc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Conn, Outcome>> + Send + '_>>
    {
        Box::pin(self.open_shared())
    }

    async fn open_shared(self: &Arc<Self>) -> Result<Conn, Outcome> {
        let mut slot = self.shared.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let mut conn = match &self.target {
            Target::Single(client) => self.open_watched(client).await,
            #[cfg(feature = "cluster")]
            Target::Cluster { .. } => self.open(false).await,
        }
        .map_err(|e| unreachable(&e))?;
        self.connected(&mut conn).await;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// The shared connection of one server: RESP3, with its pushes (tracking invalidations,
    /// the library's notice of a closed connection) read by the watcher's task.
    async fn open_watched(self: &Arc<Self>, client: &redis::Client) -> redis::RedisResult<Conn> {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(tx);
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let conn = match tokio::time::timeout(self.timeout * 4, connect).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "connect timed out",
                )))
            }
        };
        tokio::spawn(read_pushes(Arc::downgrade(self), rx));
        Ok(Conn::Single(conn))
    }

    /// A short command over the shared connection, bounded by the timeout. After an I/O
    /// failure the shared connection is reopened by the next request.
    pub(crate) async fn short(self: &Arc<Self>, cmd: &Cmd) -> Result<Value, Outcome> {
        let mut conn = self.shared().await?;
        let reply = tokio::time::timeout(self.timeout, conn.query(cmd)).await;
        match reply {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if !is_io(&e) => Err(error_outcome(&e)),
            Ok(Err(e)) => {
                *self.shared.lock().await = None;
                self.reopen_soon();
                Err(unreachable(&e))
            }
            Err(_) => {
                *self.shared.lock().await = None;
                self.reopen_soon();
                Err(Outcome::Unreachable(NO_REPLY.into()))
            }
        }
    }

    /// Commands in one pipeline over the shared connection (the watcher's registrations):
    /// `Err(true)` when the server refused one, `Err(false)` when the answer did not come.
    pub(crate) async fn pipeline(self: &Arc<Self>, cmds: &[Cmd]) -> Result<(), bool> {
        let mut conn = self.shared().await.map_err(|_| false)?;
        let mut pipe = redis::pipe();
        for c in cmds {
            pipe.add_command(c.clone());
        }
        match tokio::time::timeout(self.timeout, conn.pipeline(&pipe)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if !is_io(&e) => {
                let refused = crate::proto::watch::tracking_refused(&e.to_string());
                if refused {
                    Err(true)
                } else {
                    Ok(())
                }
            }
            _ => Err(false),
        }
    }

    /// A dedicated connection (from the idle ones, or opened), with its client id.
    pub(crate) async fn dedicated(&self) -> Result<(Conn, Option<i64>), Outcome> {
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
    pub(crate) async fn with_id(&self, conn: Conn) -> (Conn, Option<i64>) {
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

    pub(crate) fn put_back(&self, conn: Conn, id: Option<i64>) {
        let mut idle = self.idle();
        if idle.len() < MAX_IDLE {
            idle.push((conn, id));
        }
    }

    /// A permit for one wait connection, waiting (in FIFO order with the other waits) at most
    /// `wait` for one to come free: [`LockError::WaitLimit`] when none did.
    pub(crate) async fn wait_slot(
        &self,
        wait: Duration,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, LockError> {
        let slots = Arc::clone(&self.wait_slots);
        let limit = LockError::WaitLimit {
            limit: self.wait_limit,
        };
        match tokio::time::timeout(wait, slots.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(limit),
        }
    }

    /// `cmd` (a release) over a blocking connection of its own, bounded by the timeout: for a
    /// guard dropped where no runtime will run its release (see `AsyncLockGuard`'s drop).
    pub(crate) fn release_blocking(&self, cmd: &Cmd) {
        match &self.target {
            Target::Single(client) => {
                if let Ok(mut conn) = client.get_connection_with_timeout(self.timeout) {
                    let _ = conn.set_read_timeout(Some(self.timeout));
                    let _ = conn.set_write_timeout(Some(self.timeout));
                    let _: redis::RedisResult<Value> = cmd.query(&mut conn);
                }
            }
            #[cfg(feature = "cluster")]
            Target::Cluster { shared, .. } => {
                if let Ok(mut conn) = shared.get_connection() {
                    let _ = conn.set_read_timeout(Some(self.timeout));
                    let _ = conn.set_write_timeout(Some(self.timeout));
                    let _: redis::RedisResult<Value> = cmd.query(&mut conn);
                }
            }
        }
    }
}

pub(crate) fn is_io(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

pub(crate) use crate::proto::reply::unreachable;

/// A command on a dedicated connection, with its reply bounded by `bound`. `Ok(conn)` with the
/// result when the connection can carry another request.
pub(crate) async fn on_dedicated(
    mut conn: Conn,
    cmd: &Cmd,
    bound: Duration,
) -> (Option<Conn>, Result<Value, Outcome>) {
    match tokio::time::timeout(bound, conn.query(cmd)).await {
        Ok(Ok(v)) => (Some(conn), Ok(v)),
        Ok(Err(e)) if !is_io(&e) => (Some(conn), Err(error_outcome(&e))),
        Ok(Err(e)) => (None, Err(unreachable(&e))),
        Err(_) => (None, Err(Outcome::Unreachable(NO_REPLY.into()))),
    }
}

/// Where a cancelled request's release goes: behind the request on its own dedicated
/// connection, or over a client's shared connection (where the request went too).
pub(crate) enum Behind {
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
pub(crate) struct ReleaseOnCancel {
    pending: Option<(Vec<(Behind, Duration)>, Cmd)>,
}

impl ReleaseOnCancel {
    pub(crate) fn new(via: Vec<(Behind, Duration)>, key: &str, owner: &str) -> Self {
        ReleaseOnCancel {
            pending: Some((via, release_cmd(key, owner))),
        }
    }

    /// Not armed: for an owner that may hold the key through other guards.
    pub(crate) fn none() -> Self {
        ReleaseOnCancel { pending: None }
    }

    /// The request's reply was read: nothing to undo here any more.
    pub(crate) fn disarm(mut self) {
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

/// The same command to every server at once (each over its shared connection); one result
/// per server, in order. `cmds[i] == None` skips server `i` (its result is "not sent"). With
/// `enough`, the results come once that many servers replied (any reply); the others are
/// left to finish in the background and read "no answer awaited".
pub(crate) async fn on_all(
    clients: &[AsyncLockClient],
    cmds: Vec<Option<Cmd>>,
    enough: Option<usize>,
) -> Vec<Result<Value, Outcome>> {
    if let ([client], [Some(cmd)]) = (clients, cmds.as_slice()) {
        return vec![client.inner.short(cmd).await];
    }
    let mut set = tokio::task::JoinSet::new();
    let mut pending = vec![false; clients.len()];
    for (i, (client, cmd)) in clients.iter().zip(cmds).enumerate() {
        if let Some(cmd) = cmd {
            let client = client.clone();
            pending[i] = true;
            set.spawn(async move { (i, client.inner.short(&cmd).await) });
        }
    }
    let mut results: Vec<Result<Value, Outcome>> = (0..clients.len())
        .map(|_| Err(Outcome::Unreachable("not sent".into())))
        .collect();
    let mut replied = 0;
    while let Some(done) = set.join_next().await {
        if let Ok((i, r)) = done {
            if r.is_ok() {
                replied += 1;
            }
            if let Some(slot) = results.get_mut(i) {
                *slot = r;
            }
            if let Some(p) = pending.get_mut(i) {
                *p = false;
            }
        }
        if enough.is_some_and(|n| replied >= n) {
            for (r, p) in results.iter_mut().zip(&pending) {
                if *p {
                    *r = Err(Outcome::Unreachable("no answer awaited".into()));
                }
            }
            set.detach_all();
            break;
        }
    }
    results
}
