//! Prometheus's redis_exporter (Debian package `prometheus-redis-exporter`), started on a free
//! loopback port against a test server, and scraped over plain HTTP.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::free_port;
use crate::PATIENCE;

/// A running redis_exporter, killed when dropped.
pub struct Exporter {
    child: Child,
    pub port: u16,
}

/// The exporter's binary: `REDIS_EXPORTER` if set, else Debian's name, else upstream's.
fn binary() -> String {
    if let Ok(b) = std::env::var("REDIS_EXPORTER") {
        return b;
    }
    for name in ["prometheus-redis-exporter", "redis_exporter"] {
        let found = Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if found {
            return name.to_string();
        }
    }
    panic!("redis_exporter not found (make test installs prometheus-redis-exporter)")
}

impl Exporter {
    /// Starts the exporter for the server on `redis_port`, with the collect script `script`,
    /// and waits until it serves `/metrics` (trying a few free ports).
    pub fn start(redis_port: u16, script: &Path) -> Exporter {
        let bin = binary();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port().unwrap_or_else(|e| panic!("{e}"));
            let mut child = Command::new(&bin)
                .arg("-redis.addr")
                .arg(format!("redis://127.0.0.1:{redis_port}"))
                .arg("-web.listen-address")
                .arg(format!("127.0.0.1:{port}"))
                .arg("-script")
                .arg(script)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{bin}: {e}"));
            let deadline = Instant::now() + PATIENCE;
            while Instant::now() < deadline {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("exited with {status}");
                    break;
                }
                if get(port, "/metrics").is_ok() {
                    return Exporter { child, port };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{bin} did not start: {last}")
    }

    /// The body of `/metrics`.
    pub fn scrape(&self) -> String {
        get(self.port, "/metrics").unwrap_or_else(|e| panic!("scrape: {e}"))
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.0 GET on loopback: the body, or why not.
fn get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end in {response:?}"))?;
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!("HTTP status: {head}"));
    }
    Ok(body.to_string())
}

/// The samples of metric `name` in a Prometheus text exposition, by their `key` label (the
/// label redis_exporter gives a collect script's values).
pub fn script_values(text: &str, name: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix("{key=\"")?;
            let (key, rest) = rest.split_once("\"}")?;
            Some((key.to_string(), rest.trim().parse().ok()?))
        })
        .collect()
}
