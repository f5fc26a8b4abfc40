//! What the client's test files share: server URLs, the per-server timeout, five servers and a
//! Redlock over them.

use std::time::Duration;

use redis_lock_client::Redlock;
use redis_lock_testkit::Server;

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
