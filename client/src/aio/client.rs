//! The async face's client for one server or a Redis Cluster: [`AsyncLockClient`].

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use super::conn::{
    is_io, on_dedicated, route_of, unreachable, Behind, Conn, Inner, ReleaseOnCancel, Route,
    Target, MAX_KEY_MOVES,
};
use super::guard::{AsyncLockGuard, LostSignal};
use super::multi::{acquire_all, AsyncMultiGuard};
use crate::proto::error::classify;
use crate::proto::lease::single_server_valid_until;
use crate::proto::reply::{acquire_outcome, error_outcome, info_cmd, millis, WAIT_REPLY_MARGIN};
use crate::{Acquire, LockError, LockInfo, Outcome, OwnerIdentity, DEFAULT_WAIT_CONNECTIONS};

/// An async lock client for one Redis server with the module, or (feature `cluster`) a Redis
/// Cluster whose masters all load it. Clone it freely: clones share connections. See the
/// [module documentation](crate::aio).
#[derive(Clone)]
pub struct AsyncLockClient {
    pub(crate) inner: Arc<Inner>,
    owner: OwnerIdentity,
}

impl AsyncLockClient {
    /// A client for `url` (`redis://[user:password@]host:port/db`, or `rediss://` with the
    /// `tls` feature). `timeout` bounds connecting and each reply (a waiting acquire's reply
    /// may also take its wait and a one-second margin). Fails only on a malformed URL: the
    /// server is contacted on first use.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, LockError> {
        let client = redis::Client::open(url).map_err(|e| LockError::Config {
            reason: format!("{url:?} is not a Redis URL: {e}"),
        })?;
        Ok(Self::from_client(client, timeout))
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
    pub fn cluster<S: AsRef<str>>(nodes: &[S], timeout: Duration) -> Result<Self, LockError> {
        let config = |e: redis::RedisError| LockError::Config {
            reason: e.to_string(),
        };
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let shared = redis::cluster::ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()
            .map_err(config)?;
        // No retries of its own: a wait whose key moved comes back with TRYAGAIN, ASK or
        // MOVED, and `acquire` sends it again where the key is with what is left of the wait
        // (the crate would send the same WAIT again, after a backoff of a second or more).
        let waits = redis::cluster::ClusterClient::builder(nodes.clone())
            .connection_timeout(timeout)
            .retries(0)
            .build()
            .map_err(config)?;
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
                timeout: crate::proto::reply::usable_timeout(timeout),
                shared: tokio::sync::Mutex::new(None),
                idle: Mutex::new(Vec::new()),
                wait_slots: Arc::new(tokio::sync::Semaphore::new(DEFAULT_WAIT_CONNECTIONS)),
                wait_limit: DEFAULT_WAIT_CONNECTIONS,
                watcher: Default::default(),
                info_form: Default::default(),
            }),
            owner: OwnerIdentity::Random,
        }
    }

    /// At most `limit` connections for waiting acquires (default
    /// [`crate::DEFAULT_WAIT_CONNECTIONS`]): a waiting acquire holds one while its request is out
    /// (also a Redlock's queued wait on its designated server). When all are in use, further
    /// waits queue in the client, in FIFO order, for what is left of their wait; one that
    /// gets no connection in time fails with [`LockError::WaitLimit`]. Acquires without a wait
    /// go over the shared connection and are not limited; a bound hold has a connection of its
    /// own, not counted here. Set it on a new client, before its first acquire (clones made
    /// before share the old limit).
    pub fn max_wait_connections(mut self, limit: usize) -> Self {
        let limit = limit.max(1);
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.wait_slots = Arc::new(tokio::sync::Semaphore::new(limit));
            inner.wait_limit = limit;
        }
        self
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
        match self.inner.short(&info_cmd(key)).await {
            Ok(v) => LockInfo::from_reply(&v).map_err(|e| LockError::Refused {
                causes: self.named(Outcome::Refused(e)),
            }),
            Err(o) => Err(classify(&self.named(o), 1)),
        }
    }

    /// What the server says of `owner`'s hold of `key`: `LOCK.INFO key OWNER owner`, or the
    /// plain form on a server whose module predates the option (learnt once per client).
    pub(crate) async fn own_info(
        &self,
        key: &str,
        owner: &str,
    ) -> Result<Option<LockInfo>, LockError> {
        let form = &self.inner.info_form;
        if form.plain_only() {
            return self.info(key).await;
        }
        let reply = self.inner.short(&form.cmd(key, owner)).await;
        if form.refused(&reply) {
            return self.info(key).await;
        }
        match reply {
            Ok(v) => LockInfo::from_reply(&v).map_err(|e| LockError::Refused {
                causes: self.named(Outcome::Refused(e)),
            }),
            Err(o) => Err(classify(&self.named(o), 1)),
        }
    }

    /// Acquires a lock, or a semaphore permit, as `request` says. Waiting is done by the server
    /// (FIFO queue) on a dedicated connection. With [`Acquire::bind`] the acquire opens a
    /// connection of the guard's own, which carries its extends and release and closes with
    /// it; a closing by the server is noticed at once and reported as a loss
    /// ([`LockError::Lost`] with [`crate::LossCause::ConnectionClosed`]).
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
        let dedicated = request.wait.is_some() || request.min_replicas.is_some();
        // A wait connection of the client's capped number, taken (FIFO) before the request
        // goes out; the time spent here comes off the server-side wait.
        let _slot = match (request.wait, request.bind) {
            (Some(wait), false) => {
                let slot = self.inner.wait_slot(wait).await?;
                if !wait.is_zero() {
                    let left = wait.saturating_sub(started.elapsed());
                    request.wait = Some(left.max(Duration::from_millis(1)));
                }
                Some(slot)
            }
            _ => None,
        };
        let cmd = request.command(key, &owner, request.wait);
        // The watcher's push count before the request: a push in between is re-read for the
        // guard.
        let since = vec![self.inner.pushes()];
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
        let deadline =
            single_server_valid_until(started, request.wait.is_some(), request.ttl, Instant::now());
        let min_replicas = request.min_replicas;
        let guard = AsyncLockGuard::new(
            Arc::new([self.clone()]),
            key,
            owner,
            request,
            vec![(0, token)],
            deadline,
            bound,
            since,
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
                Err(_) => {
                    return (
                        None,
                        Err(Outcome::Unreachable(crate::proto::reply::NO_REPLY.into())),
                    )
                }
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

    /// Acquires as `request` says (with a [`crate::Watchdog`] added when it has none), runs
    /// `work` with a [`LostSignal`] of the hold, then releases it and returns what `work`
    /// returned, **only if the lock was held until the release**: if it was lost meanwhile,
    /// the result is [`LockError::Lost`] and `work`'s value is dropped. The signal fires as
    /// soon as the loss is noticed (its key deleted, its lease ended, taken): `work` should
    /// `select!` on [`LostSignal::lost`] next to what it does and stop early. If `work` panics
    /// or is cancelled, the guard's drop releases the hold.
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
        let acquired = self
            .acquire(key, crate::proto::watchdog::with_watchdog(request))
            .await;
        super::run_using(acquired, work).await
    }

    /// Acquires every key of `items` (each with its own request), in one global order (by key
    /// bytes) whatever order they are named in, so two multi-key acquires over overlapping keys
    /// never deadlock; each key waits at most what is left of its own wait. If one key cannot
    /// be had, the keys already taken are released and the error is that key's. See
    /// [`AsyncMultiGuard`].
    pub async fn acquire_all<K: AsRef<str>>(
        &self,
        items: &[(K, Acquire)],
    ) -> Result<AsyncMultiGuard, LockError> {
        acquire_all(items, |key, request| async move {
            self.acquire(&key, request).await
        })
        .await
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
