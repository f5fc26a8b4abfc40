//! A helper process the tests talk to over HTTP on loopback (redis_exporter, Prometheus):
//! started on a free port with its standard error in a log file of its own temporary directory,
//! waited for until it answers, and killed (the directory removed) when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::free_port;
use crate::PATIENCE;

/// A running helper process, killed when dropped (its directory removed then).
pub struct Daemon {
    child: Child,
    pub port: u16,
    /// The process's temporary directory: its log and whatever the caller put there.
    pub dir: PathBuf,
    log_name: &'static str,
}

impl Daemon {
    /// Starts `command(port)` on a free loopback port, its standard error going to `log_name`
    /// in `dir`, and waits up to `patience` until `GET ready_path` answers 200; a process that
    /// exits or does not answer is killed and a few other ports are tried. Panics with the log
    /// when none starts.
    pub fn start(
        what: &str,
        dir: PathBuf,
        log_name: &'static str,
        patience: Duration,
        ready_path: &str,
        mut command: impl FnMut(u16) -> Command,
    ) -> Daemon {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port().unwrap_or_else(|e| panic!("{e}"));
            let log = std::fs::File::create(dir.join(log_name))
                .unwrap_or_else(|e| panic!("{what} log: {e}"));
            let mut child = command(port)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let deadline = Instant::now() + patience;
            while Instant::now() < deadline {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("exited with {status}");
                    break;
                }
                if get(port, ready_path).is_ok() {
                    return Daemon {
                        child,
                        port,
                        dir,
                        log_name,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let log = std::fs::read_to_string(dir.join(log_name)).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        panic!("{what} did not start: {last}\n{log}")
    }

    /// What the process has logged so far (its standard error).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(self.log_name)).unwrap_or_default()
    }

    /// `GET path` on the process's port.
    pub fn get(&self, path: &str) -> Result<String, String> {
        get(self.port, path)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An HTTP/1.0 GET on loopback: the body, or why not (with the body of an error reply).
pub fn get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end in {response:?}"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.") || !status.contains(" 200 ") {
        return Err(format!("HTTP status: {status}: {body}"));
    }
    Ok(body.to_string())
}
