//! A redis-server with the module, started and owned by the benchmark.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Connection;

pub struct Server {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Server {
    /// Starts redis-server with the module on a free loopback port, pinned to `cpu` with
    /// taskset when given (and available).
    pub fn start(module: &Path, cpu: Option<usize>) -> Result<Server, String> {
        // Absolute: redis-server changes into --dir before it loads modules.
        let module = module.canonicalize().map_err(|e| {
            format!(
                "module {}: {e} (build it with `cargo build --release`)",
                module.display()
            )
        })?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| e.to_string())?;
        let dir =
            std::env::temp_dir().join(format!("redis-lock-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut cmd = match cpu {
            Some(c) if taskset_available() => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", &c.to_string(), "redis-server"]);
                cmd
            }
            _ => Command::new("redis-server"),
        };
        cmd.arg("--port")
            .arg(port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxclients",
                "20000",
            ])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(&dir)
            .arg("--loadmodule")
            .arg(&module)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let mut server = Server { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut c) = server.try_connect() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(server);
                }
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("redis-server exited: {status}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not start".into())
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
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn taskset_available() -> bool {
    Command::new("taskset")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Reads `INFO` fields.
pub fn info_field(c: &mut Connection, section: &str, field: &str) -> Option<f64> {
    let text: String = redis::cmd("INFO").arg(section).query(c).ok()?;
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Total microseconds spent in `commands` (INFO commandstats) and their call count.
pub fn command_usec(c: &mut Connection, commands: &[&str]) -> (f64, f64) {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(c)
        .unwrap_or_default();
    let mut usec = 0.0;
    let mut calls = 0.0;
    for name in commands {
        let prefix = format!("cmdstat_{name}:");
        if let Some(rest) = text.lines().find_map(|l| l.strip_prefix(&prefix)) {
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
