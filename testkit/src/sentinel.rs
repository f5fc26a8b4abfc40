//! A Redis Sentinel (`<server binary> <config> --sentinel`, without the module) on a free
//! loopback port, killed when the handle drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::Connection;

use crate::server::{await_ping, free_port, fresh_temp_dir};
use crate::{server_binary, PATIENCE};

/// A sentinel process: the same binary as the servers ([`server_binary`], so `valkey-server`
/// when `REDIS_LOCK_SERVER` says so) started in sentinel mode with its own writable config
/// file in its own temporary directory. Sentinels never load the module. Killed (SIGKILL) and
/// its directory removed when the handle drops.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Sentinel {
    /// Starts a sentinel watching the master `name` at `127.0.0.1:<master_port>` with the
    /// given quorum, a 1 s `down-after-milliseconds` and the given `failover-timeout`.
    pub fn monitor(
        name: &str,
        master_port: u16,
        quorum: u32,
        failover_timeout_ms: u64,
    ) -> Sentinel {
        let lines = [
            format!("sentinel monitor {name} 127.0.0.1 {master_port} {quorum}"),
            format!("sentinel down-after-milliseconds {name} 1000"),
            format!("sentinel failover-timeout {name} {failover_timeout_ms}"),
            format!("sentinel parallel-syncs {name} 1"),
        ];
        Sentinel::start_with(&lines)
    }

    /// Starts a sentinel whose config file holds `port`, `bind 127.0.0.1`, `dir`, a log file
    /// in its directory (`sentinel.log`, see [`Sentinel::log`]) and then `lines` (the
    /// `sentinel monitor ...` and other directives), trying up to 5 free ports; waits until
    /// it answers PING.
    pub fn start_with<S: AsRef<str>>(lines: &[S]) -> Sentinel {
        let dir = fresh_temp_dir("redis-lock-sentinel").unwrap_or_else(|e| panic!("{e}"));
        let mut last = String::new();
        for _attempt in 0..5 {
            let port = free_port().unwrap_or_else(|e| panic!("{e}"));
            match spawn(port, &dir, lines) {
                Ok(child) => return Sentinel { child, port, dir },
                Err(why) => last = why,
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("sentinel did not start ({last})");
    }

    /// A connection with a 30 s read timeout.
    pub fn client(&self) -> Connection {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).expect("client");
        let c = client.get_connection().expect("connect to sentinel");
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        c
    }

    /// The sentinel's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default()
    }
}

fn spawn<S: AsRef<str>>(port: u16, dir: &Path, lines: &[S]) -> Result<Child, String> {
    let conf = dir.join("sentinel.conf");
    let mut text = format!(
        "port {port}\nbind 127.0.0.1\ndir \"{}\"\nlogfile \"{}\"\n",
        dir.display(),
        dir.join("sentinel.log").display()
    );
    for line in lines {
        text.push_str(line.as_ref());
        text.push('\n');
    }
    std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
    let binary = server_binary();
    let child = Command::new(&binary)
        .arg(&conf)
        .arg("--sentinel")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {binary} --sentinel: {e}"))?;
    await_ping(child, port, PATIENCE)
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
