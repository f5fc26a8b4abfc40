//! A redis-server with the module, started and owned by the benchmark (with the test kit's
//! launcher).

use std::ops::Deref;
use std::path::Path;
use std::time::Duration;

use redis::Connection;
use redis_lock_testkit::{parse_info, ServerBuilder};

pub use redis_lock_testkit::taskset_available;

/// The kit's server (its `port`, kill on drop) with the benchmark's connections.
pub struct Server(redis_lock_testkit::Server);

impl Deref for Server {
    type Target = redis_lock_testkit::Server;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Server {
    /// Starts redis-server with the module on a free loopback port, pinned to `cpu` with
    /// taskset when given (and available).
    pub fn start(module: &Path, cpu: Option<usize>) -> Result<Server, String> {
        Self::start_binary(module, cpu, "redis-server")
    }

    /// [`Server::start`] with another server binary (`valkey-server`).
    pub fn start_binary(module: &Path, cpu: Option<usize>, binary: &str) -> Result<Server, String> {
        // Absolute: redis-server changes into --dir before it loads modules.
        let module = module.canonicalize().map_err(|e| {
            format!(
                "module {}: {e} (build it with `cargo build --release`)",
                module.display()
            )
        })?;
        ServerBuilder::new()
            .binary(binary)
            .module(module)
            .cpu(cpu)
            .valgrind(false)
            .dir_prefix("redis-lock-bench")
            .args(["--maxclients", "20000", "--loglevel", "warning"])
            .start()
            .map(Server)
    }

    fn try_connect(&self) -> redis::RedisResult<Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    pub fn connect(&self) -> Connection {
        let c = self.try_connect().expect("connect to the benchmark server");
        c.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        c
    }

    pub fn version(&self) -> String {
        let mut c = self.connect();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut c)
            .unwrap_or_default();
        // Valkey reports the Redis version it is compatible with too; its own comes first.
        let mut fields = parse_info(&info);
        fields
            .remove("valkey_version")
            .or_else(|| fields.remove("redis_version"))
            .unwrap_or_else(|| "?".to_string())
    }
}

/// Reads `INFO` fields.
pub fn info_field(c: &mut Connection, section: &str, field: &str) -> Option<f64> {
    let text: String = redis::cmd("INFO").arg(section).query(c).ok()?;
    parse_info(&text).get(field).and_then(|v| v.parse().ok())
}

/// Total microseconds spent in `commands` (INFO commandstats) and their call count.
pub fn command_usec(c: &mut Connection, commands: &[&str]) -> (f64, f64) {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(c)
        .unwrap_or_default();
    let stats = parse_info(&text);
    let mut usec = 0.0;
    let mut calls = 0.0;
    for name in commands {
        if let Some(rest) = stats.get(&format!("cmdstat_{name}")) {
            for field in rest.split(',') {
                if let Some(v) = field.strip_prefix("usec=") {
                    usec += v.parse::<f64>().unwrap_or(0.0);
                }
                if let Some(v) = field.strip_prefix("calls=") {
                    calls += v.parse::<f64>().unwrap_or(0.0);
                }
            }
        }
    }
    (usec, calls)
}

pub fn used_memory(c: &mut Connection) -> f64 {
    info_field(c, "memory", "used_memory").unwrap_or(0.0)
}
