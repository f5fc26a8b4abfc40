//! What the client's test files share: server URLs, the per-server timeout, five servers and a
//! Redlock over them, and the server's view of the client's bound connections.

// Each test file uses a part of this.
#![allow(dead_code)]

use std::time::Duration;

use redis_lock_client::{Redlock, BOUND_CLIENT_NAME};
use redis_lock_testkit::{query, text_reply, Connection, Server};

/// Per-server timeout of the clients under test.
pub const TIMEOUT: Duration = Duration::from_millis(200);

pub fn url(s: &Server) -> String {
    format!("redis://127.0.0.1:{}/", s.port)
}

pub fn five() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

pub fn redlock(servers: &[Server]) -> Redlock {
    let urls: Vec<String> = servers.iter().map(url).collect();
    Redlock::new(&urls, TIMEOUT).unwrap()
}

/// The `CLIENT LIST` ids and lines of the server's bound connections (named
/// [`BOUND_CLIENT_NAME`] by the client).
pub fn bound_clients(c: &mut Connection) -> Vec<(i64, String)> {
    let list = text_reply(query(c, &["CLIENT", "LIST"])).expect("CLIENT LIST");
    let name = format!("name={BOUND_CLIENT_NAME} ");
    list.lines()
        .filter(|l| l.contains(&name))
        .map(|l| {
            let id = l
                .split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|v| v.parse().ok())
                .expect("id field");
            (id, l.to_string())
        })
        .collect()
}

pub fn three() -> Vec<Server> {
    (0..3).map(|_| Server::start()).collect()
}

/// An async Redlock over `servers` with the per-server [`TIMEOUT`].
#[cfg(feature = "tokio")]
pub fn async_redlock(servers: &[Server]) -> redis_lock_client::aio::AsyncRedlock {
    let urls: Vec<String> = servers.iter().map(url).collect();
    redis_lock_client::aio::AsyncRedlock::new(&urls, TIMEOUT).unwrap()
}

/// A multi-thread runtime built the way `#[tokio::main]` builds one.
#[cfg(feature = "tokio")]
pub fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A redis-server (or valkey-server) WITHOUT the lock module: an empty config file, so the
/// harness adds no `--loadmodule`.
pub fn server_without_module() -> Server {
    redis_lock_testkit::ServerBuilder::new()
        .config_text("")
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Polls `cond` every millisecond for up to `bound`; how long it took to hold, or `None`.
/// (Finer than `poll_within`, for latency figures.)
pub fn poll_1ms(bound: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = std::time::Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Does `key` exist on the server (raw `EXISTS`)?
pub fn exists(c: &mut Connection, key: &str) -> bool {
    redis_lock_testkit::int(c, &["EXISTS", key]) == 1
}

/// Median and maximum of some durations (sorted in place), in milliseconds.
pub fn p50_max_ms(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    match samples.len() {
        0 => (f64::NAN, f64::NAN),
        n => (ms(samples[(n - 1) / 2]), ms(samples[n - 1])),
    }
}

/// The server's `connected_clients` (INFO clients).
pub fn connected_clients(c: &mut Connection) -> u64 {
    redis_lock_testkit::info_u64(c, "clients", "connected_clients")
}

/// After a Redlock release: `key` is gone from every server within a few seconds (a Redlock
/// release answers once a quorum confirmed; the others' replies may still be on their way).
/// The bound (2 s, times `REDIS_LOCK_TEST_TIME_FACTOR`; normally it takes a millisecond or two)
/// stays below the callers' ttls (5 s and 10 s), so a server the release never reached, whose
/// key would last until its ttl, still fails.
pub fn gone_from_every_server(servers: &[Server], key: &str) {
    let bound = redis_lock_testkit::scaled(Duration::from_secs(2));
    for (i, s) in servers.iter().enumerate() {
        let mut c = s.client();
        assert!(
            poll_1ms(bound, || !exists(&mut c, key)).is_some(),
            "`{key}` still on server {i} {bound:?} after the release"
        );
    }
}
