//! Prometheus's redis_exporter (Debian package `prometheus-redis-exporter`), started on a free
//! loopback port against a test server, and scraped over plain HTTP.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::daemon::Daemon;
use crate::server::fresh_temp_dir;
use crate::PATIENCE;

/// A running redis_exporter, killed when dropped (its temporary directory, which holds its log,
/// is removed then).
pub struct Exporter {
    daemon: Daemon,
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
        Exporter::start_as(redis_port, script, None)
    }

    /// [`Exporter::start`], logging in to the server as ACL user `user` (name, password) when
    /// given. The credentials go in the exporter's environment (`REDIS_USER`,
    /// `REDIS_PASSWORD`), not on its command line.
    pub fn start_as(redis_port: u16, script: &Path, user: Option<(&str, &str)>) -> Exporter {
        let bin = binary();
        let dir = fresh_temp_dir("redis-exporter").unwrap_or_else(|e| panic!("{e}"));
        let daemon = Daemon::start(&bin, dir, "exporter.log", PATIENCE, "/metrics", |port| {
            let mut command = Command::new(&bin);
            command
                .arg("-redis.addr")
                .arg(format!("redis://127.0.0.1:{redis_port}"))
                .arg("-web.listen-address")
                .arg(format!("127.0.0.1:{port}"))
                .arg("-script")
                .arg(script)
                .env_remove("REDIS_USER")
                .env_remove("REDIS_PASSWORD");
            if let Some((name, password)) = user {
                command
                    .env("REDIS_USER", name)
                    .env("REDIS_PASSWORD", password);
            }
            command
        });
        Exporter {
            port: daemon.port,
            daemon,
        }
    }

    /// What the exporter has logged so far (its standard error).
    pub fn log(&self) -> String {
        self.daemon.log()
    }

    /// The body of `/metrics`.
    pub fn scrape(&self) -> String {
        self.daemon
            .get("/metrics")
            .unwrap_or_else(|e| panic!("scrape: {e}"))
    }
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

/// What the shipped collect script (`contrib/redis_exporter/lock-metrics.lua`) makes of the
/// fields of an `INFO lock` section, as docs/operations.md describes it: (series name, `le`
/// label of a histogram bucket, value). A field keeps its name unless it is in ms:
/// `lock_x_ms` becomes `lock_x_seconds`; `lock_x_ms_le_<b>` the bucket `le` = b/1000 of
/// `lock_x_seconds_bucket`; `lock_x_ms_count` both `lock_x_seconds_count` and the `+Inf`
/// bucket; `lock_x_ms_sum` `lock_x_seconds_sum`. Times become seconds.
pub fn lock_series(info: &HashMap<String, String>) -> Vec<(String, Option<String>, f64)> {
    let mut out = Vec::new();
    for (field, text) in info.iter().filter(|(k, _)| k.starts_with("lock_")) {
        // The script reads integer fields only: a field of another kind fails here, so that
        // the script is taught it.
        let value: i64 = text
            .parse()
            .unwrap_or_else(|_| panic!("INFO lock {field}:{text} is not an integer"));
        let ms = value as f64 / 1000.0;
        if let Some((base, le)) = field.split_once("_ms_le_") {
            let le: u64 = le.parse().unwrap_or_else(|_| panic!("bucket {field}"));
            out.push((
                format!("{base}_seconds_bucket"),
                Some(seconds_text(le)),
                value as f64,
            ));
        } else if let Some(base) = field.strip_suffix("_ms_count") {
            out.push((format!("{base}_seconds_count"), None, value as f64));
            let inf = Some("+Inf".to_string());
            out.push((format!("{base}_seconds_bucket"), inf, value as f64));
        } else if let Some(base) = field.strip_suffix("_ms_sum") {
            out.push((format!("{base}_seconds_sum"), None, ms));
        } else if let Some(base) = field.strip_suffix("_ms") {
            out.push((format!("{base}_seconds"), None, ms));
        } else {
            out.push((field.clone(), None, value as f64));
        }
    }
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

/// `ms` milliseconds as seconds in the shortest decimal: 100 -> "0.1", 60000 -> "60".
pub fn seconds_text(ms: u64) -> String {
    let text = format!("{}.{:03}", ms / 1000, ms % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
