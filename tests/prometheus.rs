//! The Prometheus set-up of docs/operations.md ("Metrics and Prometheus", "Dashboards and
//! alerts worth having"), run for real: the module's server, Debian's redis_exporter logged in
//! as the ACL user the docs define, with the shipped collect script, and Debian's Prometheus
//! with the documented scrape configuration and alert rules (the files in contrib/prometheus/,
//! which the docs show byte for byte). Checked through Prometheus's HTTP API after a scripted
//! workload: every `INFO lock` figure as a relabelled series, counters, histogram quantiles,
//! the dashboard queries and the alert rules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_testkit::prometheus::{self, Json, Prometheus};
use redis_lock_testkit::*;

const LONG: &str = "60000";

fn repo_path(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_path(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of the fenced blocks tagged `lang` in `text`, one string per block.
fn fenced_blocks(text: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end();
        match current.as_mut() {
            None if bare == format!("```{lang}") => current = Some(String::new()),
            Some(_) if bare == "```" => blocks.extend(current.take()),
            Some(block) => block.push_str(line),
            None => {}
        }
    }
    blocks
}

/// The exporter's `ACL SETUSER` line in docs/operations.md, as words.
fn exporter_acl() -> Vec<String> {
    let docs = read("docs/operations.md");
    let lines: Vec<&str> = docs
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER lock-exporter "))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "docs/operations.md: the exporter's ACL line"
    );
    lines[0].split_whitespace().map(str::to_string).collect()
}

/// `text` with `from` (which must occur exactly once) replaced by `to`.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} once in the config");
    text.replacen(from, to, 1)
}

/// The names of the alert rules in a rule file.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

fn skip_without_prometheus() -> Option<String> {
    let bin = prometheus::binary();
    if bin.is_none() {
        println!(
            "SKIPPED: no `prometheus` binary (scripts/ensure-deps.sh installs Debian's package `prometheus`)"
        );
    }
    bin
}

/// The two files the docs show are the shipped ones, byte for byte (so the live test below,
/// which runs the shipped files, runs what the docs say).
#[test]
fn the_docs_show_the_shipped_prometheus_files_byte_for_byte() {
    let docs = read("docs/operations.md");
    let blocks = fenced_blocks(&docs, "yaml");
    for file in [
        "contrib/prometheus/prometheus.yml",
        "contrib/prometheus/lock-alerts.yml",
    ] {
        let text = read(file);
        assert!(
            blocks.contains(&text),
            "docs/operations.md has no ```yaml block equal to {file}"
        );
    }
    let acl = exporter_acl();
    assert_eq!(acl[..3], ["ACL", "SETUSER", "lock-exporter"]);
}

/// promtool accepts the shipped configuration and rules, and the rules' unit tests pass (each
/// alert driven to firing by made-up series, including the ones the live test cannot wait for).
#[test]
fn promtool_checks_the_shipped_configuration_and_alert_tests() {
    if skip_without_prometheus().is_none() {
        return;
    }
    let dir = repo_path("contrib/prometheus");
    for args in [
        &["check", "config", "prometheus.yml"][..],
        &["check", "rules", "lock-alerts.yml"],
        &["test", "rules", "lock-alerts.test.yml"],
    ] {
        let out = prometheus::promtool(&dir, args).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.contains("SUCCESS"), "promtool {args:?}: {out}");
    }
}

/// Polls `check` every 200 ms until it returns Ok, for up to `bound`; panics with its last
/// error and the end of Prometheus's log.
fn eventually<T>(
    prom: &Prometheus,
    what: &str,
    bound: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + bound;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                let log = prom.log();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                panic!("{what}: {e}\nPrometheus log (last lines, newest first):\n{tail:#?}");
            }
            Err(_) => thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// `histogram_quantile` as Prometheus 2.42 computes it, from (upper bound, cumulative count)
/// pairs that end with +Inf: linear inside the bucket where the rank falls, the first bucket
/// starting at 0, and the highest finite bound when the rank falls in the +Inf bucket.
fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let mut b: Vec<(f64, f64)> = buckets.to_vec();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    assert!(b.len() >= 2 && b[b.len() - 1].0 == f64::INFINITY);
    let total = b[b.len() - 1].1;
    if total == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * total;
    let i = b[..b.len() - 1]
        .iter()
        .position(|x| x.1 >= rank)
        .unwrap_or(b.len() - 1);
    if i == b.len() - 1 {
        return b[b.len() - 2].0;
    }
    let (mut start, end, mut count) = (0.0, b[i].0, b[i].1);
    if i > 0 {
        start = b[i - 1].0;
        count -= b[i - 1].1;
        rank -= b[i - 1].1;
    }
    start + (end - start) * (rank / count)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The scripted workload; returns the client it leaves waiting (on key `s`, held by `h`).
fn workload(server: &Server, c: &mut Connection) -> Waiter {
    // Three holds of at least 0.3 s; the second and third granted by hand-over after waits of
    // at least 0.3 s and 0.6 s.
    int(c, &["LOCK.ACQUIRE", "q", "a", LONG]);
    let b = spawn_waiter(server, c, &["LOCK.ACQUIRE", "q", "b", LONG, "WAIT", "0"], 1);
    let cc = spawn_waiter(server, c, &["LOCK.ACQUIRE", "q", "c", LONG, "WAIT", "0"], 2);
    thread::sleep(Duration::from_millis(300));
    int(c, &["LOCK.RELEASE", "q", "a"]);
    b.token();
    thread::sleep(Duration::from_millis(300));
    int(c, &["LOCK.RELEASE", "q", "b"]);
    cc.token();
    thread::sleep(Duration::from_millis(300));
    int(c, &["LOCK.RELEASE", "q", "c"]);
    // Three short holds and a re-entry.
    for key in ["quick:1", "quick:2", "quick:3"] {
        int(c, &["LOCK.ACQUIRE", key, "o", LONG]);
        int(c, &["LOCK.RELEASE", key, "o"]);
    }
    int(c, &["LOCK.ACQUIRE", "quick:1", "o", LONG]);
    int(c, &["LOCK.ACQUIRE", "quick:1", "o", LONG]);
    int(c, &["LOCK.RELEASE", "quick:1", "o", "ALL"]);
    // A 0.2 s lease that runs out.
    int(c, &["LOCK.ACQUIRE", "e", "x", "200"]);
    wait_until("the lease to run out", || {
        info_field(c, "expirations_total") == 1
    });
    // A waiter that gives up after 0.1 s.
    int(c, &["LOCK.ACQUIRE", "t", "h", LONG]);
    let gives_up = spawn_waiter(
        server,
        c,
        &["LOCK.ACQUIRE", "t", "w", LONG, "WAIT", "100"],
        1,
    );
    assert_eq!(gives_up.join().unwrap(), Value::Nil);
    int(c, &["LOCK.RELEASE", "t", "h"]);
    // A MAXWAITERS refusal: one waiter allowed on a key.
    query(c, &["CONFIG", "SET", "lock.max-waiters", "1"]).unwrap();
    int(c, &["LOCK.ACQUIRE", "m", "h", LONG]);
    let m = spawn_waiter(server, c, &["LOCK.ACQUIRE", "m", "w", LONG, "WAIT", "0"], 1);
    let e = err(c, &["LOCK.ACQUIRE", "m", "x", LONG, "WAIT", "0"]);
    assert!(e.starts_with("MAXWAITERS"), "{e}");
    query(c, &["CONFIG", "SET", "lock.max-waiters", "100000"]).unwrap();
    int(c, &["LOCK.RELEASE", "m", "h"]);
    m.token();
    int(c, &["LOCK.RELEASE", "m", "w"]);
    // A deadlock refusal: A holds d1 and waits for d2; B holds d2 and asks for d1.
    int(c, &["LOCK.ACQUIRE", "d1", "A", LONG]);
    int(c, &["LOCK.ACQUIRE", "d2", "B", LONG]);
    let a = spawn_waiter(
        server,
        c,
        &["LOCK.ACQUIRE", "d2", "A", LONG, "WAIT", "0"],
        1,
    );
    let e = err(c, &["LOCK.ACQUIRE", "d1", "B", LONG, "WAIT", "0"]);
    assert!(e.starts_with("DEADLOCK"), "{e}");
    int(c, &["LOCK.RELEASE", "d2", "B"]);
    a.token();
    int(c, &["LOCK.RELEASE", "d1", "A"]);
    int(c, &["LOCK.RELEASE", "d2", "A"]);
    // A client left waiting.
    int(c, &["LOCK.ACQUIRE", "s", "h", LONG]);
    spawn_waiter(server, c, &["LOCK.ACQUIRE", "s", "w", LONG, "WAIT", "0"], 1)
}

/// The states the workload leads each documented alert to (a rule missing here fails the test,
/// so a new rule needs its expected state).
const ALERT_STATES: [(&str, &str); 8] = [
    // The client left waiting is served before the rules are checked.
    ("LockWaiterStuck", "inactive"),
    ("LockMetricsMissing", "inactive"),
    // maxmemory-policy allkeys-lru; `for: 10m`.
    ("LockEvictable", "pending"),
    ("LockEvicted", "inactive"),
    // Not a cluster: no slot changes hands.
    ("LockSlotLost", "inactive"),
    ("LockWaitersRefused", "firing"),
    ("LockDeadlocksRefused", "firing"),
    // 1 expiry of about a dozen holds ended; `for: 15m`.
    ("LockLeasesRunningOut", "pending"),
];

#[test]
fn prometheus_with_the_documented_configuration_graphs_and_alerts_on_the_lock_metrics() {
    let Some(bin) = skip_without_prometheus() else {
        return;
    };
    let started = Instant::now();
    let server = Server::start();
    let mut c = server.client();

    // The exporter's user, exactly as docs/operations.md grants it.
    let acl = exporter_acl();
    let password = acl
        .iter()
        .find_map(|w| w.strip_prefix('>'))
        .expect("a >password in the ACL line")
        .to_string();
    let words: Vec<&str> = acl.iter().map(String::as_str).collect();
    query(&mut c, &words).unwrap();
    query(&mut c, &["ACL", "LOG", "RESET"]).unwrap();
    // Lock keys can be evicted (LockEvictable); 1 GB is far more than the test uses.
    query(&mut c, &["CONFIG", "SET", "maxmemory", "1gb"]).unwrap();
    query(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    )
    .unwrap();

    let exporter = Exporter::start_as(
        server.port,
        &repo_path("contrib/redis_exporter/lock-metrics.lua"),
        Some((words[2], &password)),
    );

    // The documented files; only the target and the two intervals differ.
    let config = read("contrib/prometheus/prometheus.yml");
    let config = replace_once(
        &config,
        "'localhost:9121'",
        &format!("'127.0.0.1:{}'", exporter.port),
    );
    let config = replace_once(&config, "scrape_interval: 15s", "scrape_interval: 1s");
    let config = replace_once(
        &config,
        "evaluation_interval: 15s",
        "evaluation_interval: 1s",
    );
    let alerts = read("contrib/prometheus/lock-alerts.yml");
    let prom = Prometheus::start(
        &bin,
        "prometheus.yml",
        &[("prometheus.yml", &config), ("lock-alerts.yml", &alerts)],
    );
    prometheus::promtool(&prom.dir, &["check", "config", "prometheus.yml"])
        .unwrap_or_else(|e| panic!("{e}"));
    let bound = 4 * PATIENCE;

    // Prometheus has the state before the workload (every counter 0), so rates and increases
    // cover all of it.
    eventually(&prom, "a first scrape", bound, || {
        let up = prom.query_one("redis_up")?;
        if up == 1.0 {
            Ok(())
        } else {
            Err(format!("redis_up {up}"))
        }
    });
    let scraped = Instant::now();

    let stuck = workload(&server, &mut c);

    // Wait until Prometheus has what INFO lock says now (nothing moves but the waiter's age).
    let info = info_section(&mut c, "lock");
    let expected: BTreeMap<(String, String), f64> = lock_series(&info)
        .into_iter()
        .map(|(name, le, v)| ((name, le.unwrap_or_default()), v))
        .collect();
    let series = eventually(&prom, "every INFO lock figure in Prometheus", bound, || {
        let samples = prom.query("{__name__=~\"lock_.+\"}")?;
        let mut got = BTreeMap::new();
        for s in &samples {
            let extra: Vec<&String> = s
                .labels
                .keys()
                .filter(|k| !["__name__", "instance", "job", "le"].contains(&k.as_str()))
                .collect();
            if !extra.is_empty() {
                return Err(format!("labels {extra:?} on {:?}", s.labels));
            }
            let name = s.labels["__name__"].clone();
            let le = s.labels.get("le").cloned().unwrap_or_default();
            if got.insert((name, le), s.value).is_some() {
                return Err(format!("two series for {:?}", s.labels));
            }
        }
        for (key, want) in &expected {
            match got.get(key) {
                None => return Err(format!("no series {key:?}")),
                Some(_) if key.0 == "lock_oldest_wait_seconds" => {}
                Some(v) if v != want => {
                    return Err(format!("{key:?} is {v}, INFO lock says {want}"))
                }
                Some(_) => {}
            }
        }
        let unknown: Vec<_> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
        if !unknown.is_empty() {
            return Err(format!("series not in INFO lock: {unknown:?}"));
        }
        Ok(got)
    });
    let value = |name: &str| series[&(name.to_string(), String::new())];

    // The workload's known figures.
    assert_eq!(
        value("lock_grants_total"),
        info_u64(&mut c, "lock", "lock_grants_total") as f64
    );
    for (name, want) in [
        ("lock_handoffs_total", 4.0),
        ("lock_timeouts_total", 1.0),
        ("lock_expirations_total", 1.0),
        ("lock_maxwaiters_total", 1.0),
        ("lock_deadlocks_total", 1.0),
        ("lock_reentries_total", 1.0),
        ("lock_waiters", 1.0),
        ("lock_longest_queue", 1.0),
        ("lock_evictable", 1.0),
        ("lock_wait_seconds_count", 4.0),
    ] {
        assert_eq!(value(name), want, "{name}");
    }
    assert!(value("lock_oldest_wait_seconds") > 0.0);
    assert!(
        value("lock_wait_seconds_sum") >= 0.9,
        "waits of 0.3 s and 0.6 s at least"
    );
    assert!(
        value("lock_hold_seconds_sum") >= 1.2,
        "holds of 3 x 0.3, 0.2 and 0.1 s at least"
    );

    // Counters: increase() over a window that holds the whole run, and the exact difference.
    for name in [
        "lock_grants_total",
        "lock_handoffs_total",
        "lock_hold_seconds_count",
    ] {
        let total = value(name);
        let exact = prom
            .query_one(&format!(
                "max_over_time({name}[5m]) - min_over_time({name}[5m])"
            ))
            .unwrap();
        assert_eq!(exact, total, "{name}");
        // increase() extrapolates to the end of the window, by at most 1.1 times the average
        // interval between its n samples, but not before its first sample, which was 0 (a
        // counter is not extrapolated below 0): from total to total * (1 + 1.1 / (n - 1)).
        let inc = prom.query_one(&format!("increase({name}[5m])")).unwrap();
        let n = prom
            .query_one(&format!("count_over_time({name}[5m])"))
            .unwrap();
        let most = total * (1.0 + 1.1 / (n - 1.0)) * (1.0 + 1e-9);
        assert!(
            inc >= total && inc <= most,
            "increase({name}) {inc}, INFO {total}, {n} samples"
        );
    }

    // Histograms: quantiles over the raw series equal those computed from INFO lock's buckets;
    // over rate(...[5m]) the same (every bucket started at 0 in the same scrape); and they agree
    // with the known waits and holds.
    for hist in ["lock_wait_seconds", "lock_hold_seconds"] {
        let buckets: Vec<(f64, f64)> = series
            .iter()
            .filter(|((n, _), _)| *n == format!("{hist}_bucket"))
            .map(|((_, le), v)| (prometheus::parse_float(le).unwrap(), *v))
            .collect();
        for q in [0.5, 0.99] {
            let want = bucket_quantile(q, &buckets);
            let raw = prom
                .query_one(&format!("histogram_quantile({q}, {hist}_bucket)"))
                .unwrap();
            let rated = prom
                .query_one(&format!("histogram_quantile({q}, rate({hist}_bucket[5m]))"))
                .unwrap();
            assert!(
                want.is_finite() && want > 0.0,
                "{hist} p{q}: {want} from {buckets:?}"
            );
            assert!(
                close(raw, want),
                "{hist} p{q}: Prometheus {raw}, INFO lock {want}"
            );
            assert!(
                close(rated, want),
                "{hist} p{q} of rates: {rated}, INFO lock {want}"
            );
        }
        let p99 = prom
            .query_one(&format!(
                "histogram_quantile(0.99, rate({hist}_bucket[5m]))"
            ))
            .unwrap();
        // The longest wait took at least 0.6 s (bucket 0.5 to 1 or above); the longest holds
        // at least 0.3 s (bucket 0.1 to 0.5 or above).
        let floor = if hist == "lock_wait_seconds" {
            0.5
        } else {
            0.1
        };
        assert!(p99 >= floor, "{hist} p99 {p99} below {floor}");
    }

    // Every dashboard query of the docs answers, with a finite value.
    let docs = read("docs/operations.md");
    let graphs = fenced_blocks(&docs, "promql");
    assert_eq!(graphs.len(), 1, "docs/operations.md: one promql block");
    for q in graphs[0].lines().filter(|l| !l.trim().is_empty()) {
        let v = prom
            .query_one(q)
            .unwrap_or_else(|e| panic!("dashboard query: {e}"));
        assert!(v.is_finite(), "{q}: {v}");
    }

    // The waiter is served (so LockWaiterStuck stays inactive however slow the machine).
    int(&mut c, &["LOCK.RELEASE", "s", "h"]);
    stuck.token();

    // Every alert rule evaluates without error; the provoked ones are pending or firing.
    let names = alert_names(&alerts);
    let want: BTreeMap<&str, &str> = ALERT_STATES.into_iter().collect();
    assert_eq!(
        names.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        want.keys().copied().collect::<BTreeSet<_>>(),
        "the rules in lock-alerts.yml and the states this test expects"
    );
    eventually(&prom, "the alerts' states", bound, || {
        let data = prom.api("/api/v1/rules")?;
        let mut seen = BTreeMap::new();
        for group in data.get("groups").and_then(Json::as_array).unwrap_or(&[]) {
            for rule in group.get("rules").and_then(Json::as_array).unwrap_or(&[]) {
                let field = |k: &str| rule.get(k).and_then(Json::as_str).unwrap_or("");
                if field("health") != "ok" {
                    return Err(format!(
                        "rule {}: health {:?}: {:?}",
                        field("name"),
                        field("health"),
                        field("lastError")
                    ));
                }
                seen.insert(field("name").to_string(), field("state").to_string());
            }
        }
        let seen: BTreeMap<&str, &str> =
            seen.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if seen == want {
            Ok(())
        } else {
            Err(format!("rule states {seen:?}, expected {want:?}"))
        }
    });

    // What Prometheus records as the type: nothing for the relabelled series, gauge for the
    // exporter's family (docs/operations.md, "Types").
    let meta = prom
        .api("/api/v1/metadata?metric=lock_grants_total")
        .unwrap();
    assert_eq!(meta, Json::Object(vec![]), "metadata of lock_grants_total");
    let meta = prom
        .api("/api/v1/metadata?metric=redis_script_values")
        .unwrap();
    let kind = meta
        .get("redis_script_values")
        .and_then(Json::as_array)
        .and_then(|m| m.first())
        .and_then(|m| m.get("type"))
        .and_then(Json::as_str);
    assert_eq!(kind, Some("gauge"), "metadata: {meta:?}");

    // The exporter's user was refused nothing.
    assert_eq!(
        prom.query_one("redis_exporter_last_scrape_error").unwrap(),
        0.0
    );
    match query(&mut c, &["ACL", "LOG"]).unwrap() {
        Value::Array(entries) if entries.is_empty() => {}
        other => panic!("ACL LOG: {other:?}"),
    }
    let log = exporter.log();
    assert!(!log.contains("level=error"), "exporter log:\n{log}");

    println!(
        "prometheus test: {:.1} s in all, {:.1} s from the first scrape",
        started.elapsed().as_secs_f64(),
        scraped.elapsed().as_secs_f64()
    );
}
