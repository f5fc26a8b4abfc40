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
