//! A redis-server with the module, on a free loopback port, killed when the handle drops.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redis::Connection;

use crate::PATIENCE;

/// The workspace root: this crate lives in `<workspace>/testkit`.
fn workspace_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// The module the tests load: `REDIS_LOCK_MODULE`, or the workspace's debug build.
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("REDIS_LOCK_MODULE") {
        return PathBuf::from(p);
    }
    workspace_dir().join("target/debug/libredis_lock.so")
}

/// The server binary the harness starts: `REDIS_LOCK_SERVER` (a name on PATH or a path, e.g.
/// `valkey-server`), `redis-server` by default. `.ci/run` runs the suite once per server.
pub fn server_binary() -> String {
    std::env::var("REDIS_LOCK_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// Where valgrind logs go when REDIS_LOCK_VALGRIND is set.
fn valgrind_log_dir() -> PathBuf {
    workspace_dir().join("target/valgrind")
}

/// Is `taskset` there to pin the server to a CPU?
pub fn taskset_available() -> bool {
    Command::new("taskset")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh, empty temporary directory named `<prefix>-<pid>-<sequence>`.
pub(crate) fn fresh_temp_dir(prefix: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A free port for a cluster node: at most 55535, since the node also listens on its port plus
/// 10000 (the cluster bus), and that one free too. Free ports come from the kernel's ephemeral
/// range, which reaches 60999, so about one in five would not do.
pub(crate) fn free_cluster_port() -> Result<u16, String> {
    for _ in 0..200 {
        let port = free_port()?;
        if port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port at or under 55535 with a free cluster bus port".into())
}

pub(crate) fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// How a server is started. The defaults are the test suite's: the binary from
/// `REDIS_LOCK_SERVER`, the module from `REDIS_LOCK_MODULE` (or the debug build), valgrind when
/// `REDIS_LOCK_VALGRIND` is set, no persistence, loopback only.
#[derive(Clone, Debug)]
pub struct ServerBuilder {
    binary: String,
    module: PathBuf,
    cpu: Option<usize>,
    args: Vec<String>,
    valgrind: bool,
    dir_prefix: String,
    config_text: Option<String>,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// Why one start attempt failed: worth another port, or not.
enum SpawnError {
    Retry(String),
    Fatal(String),
}

impl ServerBuilder {
    pub fn new() -> Self {
        ServerBuilder {
            binary: server_binary(),
            module: module_path(),
            cpu: None,
            args: Vec::new(),
            valgrind: std::env::var_os("REDIS_LOCK_VALGRIND").is_some(),
            dir_prefix: "redis-lock-test".to_string(),
            config_text: None,
        }
    }

    /// The server binary (a name on PATH or a path).
    pub fn binary(mut self, binary: impl Into<String>) -> Self {
        self.binary = binary.into();
        self
    }

    /// The module to load (give an absolute path: the server changes into its `--dir` first).
    pub fn module(mut self, module: impl Into<PathBuf>) -> Self {
        self.module = module.into();
        self
    }

    /// Pins the server to `cpu` with `taskset` when given and `taskset` is available.
    pub fn cpu(mut self, cpu: Option<usize>) -> Self {
        self.cpu = cpu;
        self
    }

    /// Extra `--name value` arguments, after the defaults (so they override them).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.args
            .extend(args.into_iter().map(|s| s.as_ref().to_string()));
        self
    }

    /// Runs the server under valgrind memcheck (logs in `<workspace>/target/valgrind/`).
    pub fn valgrind(mut self, on: bool) -> Self {
        self.valgrind = on;
        self
    }

    /// The start of the name of the server's temporary directory.
    pub fn dir_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dir_prefix = prefix.into();
        self
    }

    /// Starts the server from a config file with this text (written to `redis.conf` in the
    /// server's directory at the first start, and kept as the server rewrites it, so a restart
    /// reads what `CONFIG REWRITE` left). The text loads the module itself (`loadmodule` line):
    /// the command line then has no `--loadmodule`.
    pub fn config_text(mut self, text: impl Into<String>) -> Self {
        self.config_text = Some(text.into());
        self
    }

    /// Starts the server in a fresh temporary directory and waits until it answers PING
    /// (loading done), trying up to 5 free ports.
    pub fn start(self) -> Result<Server, String> {
        let dir = std::env::temp_dir().join(format!(
            "{}-{}-{}",
            self.dir_prefix,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir {}: {e}", dir.display()))?;
        let mut last = String::new();
        for _attempt in 0..5 {
            let cluster = self.args.iter().any(|a| a == "--cluster-enabled");
            let port = match if cluster {
                free_cluster_port()
            } else {
                free_port()
            } {
                Ok(port) => port,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            };
            match self.spawn(port, &dir) {
                Ok(child) => {
                    return Ok(Server {
                        child,
                        port,
                        dir,
                        config: self,
                    })
                }
                Err(SpawnError::Retry(why)) => last = why,
                Err(SpawnError::Fatal(why)) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(why);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(format!("{} did not start ({last})", self.binary))
    }

    /// Starts the server on `port` in `dir` and waits until it answers PING.
    fn spawn(&self, port: u16, dir: &Path) -> Result<Child, SpawnError> {
        if !self.module.exists() {
            return Err(SpawnError::Fatal(format!(
                "module not built at {} (run `make test`, or `cargo build --features test-hooks`)",
                self.module.display()
            )));
        }
        // The command line: [taskset -c CPU] [valgrind OPTIONS] SERVER.
        let mut program: Vec<OsString> = Vec::new();
        if let Some(cpu) = self.cpu.filter(|_| taskset_available()) {
            program.extend(["taskset".into(), "-c".into(), cpu.to_string().into()]);
        }
        // REDIS_LOCK_VALGRIND=1: run the server under valgrind memcheck, logs in
        // target/valgrind/ (see docs/robustness.md).
        if self.valgrind {
            let logs = valgrind_log_dir();
            let _ = std::fs::create_dir_all(&logs);
            program.extend([
                "valgrind".into(),
                "--leak-check=full".into(),
                "--show-leak-kinds=definite".into(),
                "--errors-for-leak-kinds=definite".into(),
                format!("--log-file={}/redis-%p.log", logs.display()).into(),
            ]);
        }
        program.push(self.binary.clone().into());
        if let Some(text) = &self.config_text {
            let file = dir.join("redis.conf");
            if !file.exists() {
                std::fs::write(&file, text).map_err(|e| {
                    SpawnError::Fatal(format!("config file {}: {e}", file.display()))
                })?;
            }
            program.push(file.into());
        }
        let mut cmd = Command::new(&program[0]);
        cmd.args(&program[1..])
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir);
        if self.config_text.is_none() {
            cmd.arg("--loadmodule").arg(&self.module);
        }
        cmd.args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            SpawnError::Fatal(format!(
                "cannot start {} ({e}; is it installed? `make test` installs redis-server, \
                 `make test-valkey` valkey-server)",
                program[0].to_string_lossy()
            ))
        })?;
        let patience = if self.valgrind {
            PATIENCE * 6
        } else {
            PATIENCE
        };
        await_ping(child, port, patience).map_err(SpawnError::Retry)
    }
}

pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    config: ServerBuilder,
}

impl Server {
    /// Starts a server with the module and no persistence.
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--name value` arguments (they override the defaults:
    /// no persistence, loopback only).
    pub fn start_with(extra: &[&str]) -> Server {
        ServerBuilder::new()
            .args(extra)
            .start()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Kills the server with SIGKILL (no shutdown save) and starts it again on the same port
    /// and directory with the same arguments: what survives is what was on disk.
    pub fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.config.spawn(self.port, &self.dir) {
                Ok(child) => {
                    self.child = child;
                    return;
                }
                Err(SpawnError::Fatal(why)) => panic!("{why}"),
                Err(SpawnError::Retry(_)) => {}
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

    /// A connection with a 30 s read timeout.
    pub fn client(&self) -> Connection {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).expect("client");
        let c = client.get_connection().expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        c
    }

    /// The AOF file that receives new writes (the multi-part AOF of Redis 7 and Valkey 8).
    pub fn incr_aof(&self) -> PathBuf {
        let dir = self.dir.join("appendonlydir");
        std::fs::read_dir(&dir)
            .expect("appendonlydir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
            .expect("an incr AOF file")
    }

    /// Is the process still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.config.valgrind {
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

/// Waits until the process started on `port` answers PING (loading done), for up to
/// `patience`; kills it and says why when it exits first or never answers.
pub(crate) fn await_ping(mut child: Child, port: u16, patience: Duration) -> Result<Child, String> {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited: {status}"));
        }
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) {
            if let Ok(mut c) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(child);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("no PING reply within {patience:?}"))
}
