//! Test harness: a real redis-server with the module loaded, on a free loopback port, killed
//! when the handle drops. No mocks.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use redis::{Connection, Value};

/// Generous bound for "eventually" conditions on a shared 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("REDIS_LOCK_MODULE") {
        return PathBuf::from(p);
    }
    // The workspace's target directory: this package's, or its parent's for member crates.
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        here.join("target/debug/libredis_lock.so"),
        here.join("../target/debug/libredis_lock.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| candidates[0].clone())
}

/// The server binary the harness starts: `REDIS_LOCK_SERVER` (a name on PATH or a path, e.g.
/// `valkey-server`), `redis-server` by default. `.ci/run` runs the suite once per server.
pub fn server_binary() -> String {
    std::env::var("REDIS_LOCK_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// Which server the tests run against, read from `INFO server`, for the few behaviours that
/// differ between servers (ACL categories for module commands, memory per blocked client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Redis, with its version as (major, minor).
    Redis(u32, u32),
    /// Valkey, with its own version as (major, minor).
    Valkey(u32, u32),
}

impl Flavor {
    /// Redis 7.2+ and every Valkey let modules put commands in ACL categories.
    pub fn has_module_acl_categories(self) -> bool {
        match self {
            Flavor::Redis(major, minor) => (major, minor) >= (7, 2),
            Flavor::Valkey(..) => true,
        }
    }

    /// Redis 7.4+ and Valkey 8+ let modules add categories of their own (`@lock`).
    pub fn has_module_own_category(self) -> bool {
        match self {
            Flavor::Redis(major, minor) => (major, minor) >= (7, 4),
            Flavor::Valkey(major, _) => major >= 8,
        }
    }
}

/// The server flavour and version of a connection's server.
pub fn flavor(c: &mut Connection) -> Flavor {
    let text: String = redis::cmd("INFO")
        .arg("server")
        .query(c)
        .expect("INFO server");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
    };
    let major_minor = |v: String| {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    };
    match field("valkey_version") {
        Some(v) => {
            let (major, minor) = major_minor(v);
            Flavor::Valkey(major, minor)
        }
        None => {
            let (major, minor) = major_minor(field("redis_version").expect("redis_version"));
            Flavor::Redis(major, minor)
        }
    }
}

pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

impl Server {
    /// Starts a server with the module and no persistence.
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--name value` arguments (they override the defaults:
    /// no persistence, loopback only).
    pub fn start_with(extra: &[&str]) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "redis-lock-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _attempt in 0..5 {
            let port = free_port();
            if let Some(child) = spawn(port, &dir, &extra) {
                return Server {
                    child,
                    port,
                    dir,
                    extra,
                };
            }
        }
        panic!("{} did not start", server_binary());
    }

    /// Kills the server with SIGKILL (no shutdown save) and starts it again on the same port
    /// and directory with the same arguments: what survives is what was on disk.
    pub fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(child) = spawn(self.port, &self.dir, &self.extra) {
                self.child = child;
                return;
            }
            assert!(Instant::now() < deadline, "server did not restart");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends a signal (STOP, CONT) to the server process.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub fn client(&self) -> Connection {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).expect("client");
        let c = client.get_connection().expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        c
    }

    /// Is the process still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// Starts redis-server and waits until it answers PING (loading done); None if it exits.
fn spawn(port: u16, dir: &std::path::Path, extra: &[String]) -> Option<Child> {
    let module = module_path();
    assert!(
        module.exists(),
        "module not built at {} (run `make test`, or `cargo build --features test-hooks`)",
        module.display()
    );
    // REDIS_LOCK_VALGRIND=1: run the server under valgrind memcheck, logs in target/valgrind/
    // (see docs/robustness.md).
    let mut cmd = match valgrind_log_dir() {
        Some(dir) => {
            let _ = std::fs::create_dir_all(&dir);
            let mut cmd = Command::new("valgrind");
            cmd.args([
                "--leak-check=full",
                "--show-leak-kinds=definite",
                "--errors-for-leak-kinds=definite",
            ])
            .arg(format!("--log-file={}/redis-%p.log", dir.display()))
            .arg(server_binary());
            cmd
        }
        None => Command::new(server_binary()),
    };
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--loadmodule")
        .arg(&module)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {} ({e}; is it installed? `make test` installs redis-server, \
                 `make test-valkey` valkey-server)",
            server_binary()
        )
    });
    let patience = if valgrind_log_dir().is_some() {
        PATIENCE * 6
    } else {
        PATIENCE
    };
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) {
            if let Ok(mut c) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Some(child);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Where valgrind logs go when REDIS_LOCK_VALGRIND is set.
fn valgrind_log_dir() -> Option<PathBuf> {
    std::env::var_os("REDIS_LOCK_VALGRIND")?;
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    Some(here.join("target/valgrind"))
}

impl Drop for Server {
    fn drop(&mut self) {
        if valgrind_log_dir().is_some() {
            // A clean shutdown, so valgrind reports leaks (it cannot after SIGKILL).
            if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)) {
                if let Ok(mut c) = client.get_connection() {
                    let _: redis::RedisResult<()> =
                        redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut c);
                }
            }
            let deadline = Instant::now() + PATIENCE * 6;
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a command given as words.
pub fn cmd(words: &[&str]) -> redis::Cmd {
    let mut c = redis::cmd(words[0]);
    for w in &words[1..] {
        c.arg(*w);
    }
    c
}

pub fn query(c: &mut Connection, words: &[&str]) -> redis::RedisResult<Value> {
    cmd(words).query(c)
}

/// The reply as an integer token, panicking with the reply otherwise.
pub fn int(c: &mut Connection, words: &[&str]) -> i64 {
    match query(c, words) {
        Ok(Value::Int(i)) => i,
        other => panic!("{words:?}: expected an integer, got {other:?}"),
    }
}

pub fn is_nil(c: &mut Connection, words: &[&str]) -> bool {
    matches!(query(c, words), Ok(Value::Nil))
}

/// The error text of a reply, panicking if it was not an error.
pub fn err(c: &mut Connection, words: &[&str]) -> String {
    match query(c, words) {
        Err(e) => format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
            .trim()
            .to_string(),
        Ok(v) => panic!("{words:?}: expected an error, got {v:?}"),
    }
}

/// LOCK.INFO as a map from field name to value (RESP2 flat array), or None for nil.
pub fn info(c: &mut Connection, key: &str) -> Option<std::collections::HashMap<String, Value>> {
    match query(c, &["LOCK.INFO", key]).expect("LOCK.INFO") {
        Value::Nil => None,
        Value::Array(items) => {
            let mut map = std::collections::HashMap::new();
            for pair in items.chunks(2) {
                let name = match &pair[0] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
                    Value::SimpleString(s) => s.clone(),
                    other => panic!("field name {other:?}"),
                };
                map.insert(name, pair[1].clone());
            }
            Some(map)
        }
        Value::Map(items) => Some(
            items
                .into_iter()
                .map(|(k, v)| match k {
                    Value::BulkString(b) => (String::from_utf8_lossy(&b).to_string(), v),
                    Value::SimpleString(s) => (s, v),
                    other => panic!("field name {other:?}"),
                })
                .collect(),
        ),
        other => panic!("LOCK.INFO reply {other:?}"),
    }
}

pub fn info_int(c: &mut Connection, key: &str, field: &str) -> i64 {
    match info(c, key).and_then(|m| m.get(field).cloned()) {
        Some(Value::Int(i)) => i,
        other => panic!("{field}: {other:?}"),
    }
}

/// The owners holding `key`, with their counts, sorted by owner.
pub fn holders(c: &mut Connection, key: &str) -> Vec<(String, i64)> {
    let Some(map) = info(c, key) else {
        return Vec::new();
    };
    let Some(Value::Array(hs)) = map.get("holders").cloned() else {
        panic!("holders field missing");
    };
    hs.into_iter()
        .map(|h| match h {
            Value::Array(parts) => match (&parts[0], &parts[1]) {
                (Value::BulkString(o), Value::Int(n)) => {
                    (String::from_utf8_lossy(o).to_string(), *n)
                }
                other => panic!("holder {other:?}"),
            },
            other => panic!("holder {other:?}"),
        })
        .collect()
}

/// Waiters queued on `key` (0 when the key does not exist).
pub fn waiting(c: &mut Connection, key: &str) -> i64 {
    match info(c, key) {
        None => 0,
        Some(m) => match m.get("waiting") {
            Some(Value::Int(i)) => *i,
            other => panic!("waiting: {other:?}"),
        },
    }
}

/// Polls `cond` until it holds, failing after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for: {what}");
}

/// An `INFO lock` field (Redis prefixes module fields with the module name: `lock_<field>`).
pub fn info_field(c: &mut Connection, field: &str) -> u64 {
    let text: String = redis::cmd("INFO").arg("lock").query(c).expect("INFO");
    let wanted = format!("lock_{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {wanted} in INFO lock:\n{text}"))
}

/// The client id of a connection.
pub fn client_id(c: &mut Connection) -> i64 {
    int(c, &["CLIENT", "ID"])
}
