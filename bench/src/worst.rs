//! Worst case per command: the server time of each lock command in the states that cost the
//! most (SPEC.md, "Bounded cost": every lock command at or under 1 ms of server time at default
//! settings).
//!
//! # The state
//!
//! One server holds, all at once:
//! - `wc:readers`: 100,000 readers and a writer (`wc-writer`) queued behind them;
//! - a chain of 10,000 locks: `wc-link-i` holds `wc:chain:i` and waits for `wc:chain:{i+1}`;
//!   `wc-end` holds the last and waits for `wc:own`;
//! - `wc:own`, held by the requester `wc-requester`, which `wc-writer` and `wc-end` wait for;
//! - `wc:sem`, a semaphore of 100,000 permits, all held (one per owner), one request queued.
//!
//! So the requester's exclusive request for `wc:readers` closes a cycle (it waits for
//! `wc-writer`, who waits for it); searched forwards from the request's blockers, as before
//! version 3, it first lists all 100,000 readers. Its request for `wc:chain:0` closes a cycle
//! too, 10,000 links away: forwards that walks the chain to its end; backwards (version 3) it
//! walks the chain from the end, until `lock.deadlock-budget` runs out, and then waits (the
//! row says what the reply was). LOCK.QUEUES sees about 10,000 queues.
//!
//! # What is timed
//!
//! Each request is sent alone and its server time read from the SLOWLOG (threshold 0): the
//! command's own time as Redis measures it around the handler, the figure INFO commandstats
//! adds up. A request that blocks is taken out of the queue with `CLIENT UNBLOCK id ERROR` (as
//! section 8; there commandstats would count it twice on Redis 7.0, the SLOWLOG once). The
//! table gives the mean and the largest sample; for requests that do not block, also INFO
//! commandstats' `usec_per_call` over the same samples.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::detect::{
    acquire_words, config_set, ok_int, queue_waiters, take_probe_durations,
    wait_for_module_waiters, words, Probe, PROBE_NAME,
};
use crate::measure::{flush, reset_stats, RawClients, LONG_TTL};
use crate::server::{command_usec, Server};

pub const READERS: usize = 100_000;
pub const CHAIN: usize = 10_000;
const PERMITS: usize = 100_000;
const REQUESTER: &str = "wc-requester";

/// One timed row.
pub struct Row {
    pub what: String,
    pub reply: String,
    pub mean_us: f64,
    pub max_us: f64,
    /// INFO commandstats usec_per_call (requests that do not block only).
    pub commandstats_us: Option<f64>,
}

/// How a request is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// The reply comes at once.
    Immediate,
    /// The request blocks; CLIENT UNBLOCK ... ERROR takes it out again.
    Blocking,
}

fn pipeline(c: &mut Connection, n: usize, mut cmd: impl FnMut(usize) -> Vec<String>) {
    for start in (0..n).step_by(5_000) {
        let mut p = redis::pipe();
        for i in start..(start + 5_000).min(n) {
            let w = cmd(i);
            let mut one = redis::cmd(&w[0]);
            for a in &w[1..] {
                one.arg(a);
            }
            p.add_command(one).ignore();
        }
        let _: () = p.query(c).expect("set-up pipeline");
    }
}

/// Builds the state (see the module documentation); returns the connections of the queued
/// requests, which must stay open.
fn set_up(server: &Server, c: &mut Connection) -> Vec<RawClients> {
    let ttl = LONG_TTL.to_string();
    let mut raw = Vec::new();
    flush(c);
    wait_for_module_waiters(c, 0);
    ok_int(c, &["LOCK.ACQUIRE", "wc:own", REQUESTER, &ttl]);
    pipeline(c, READERS, |i| {
        words(&["LOCK.RWREAD", "wc:readers", &format!("wc-reader-{i}"), &ttl])
    });
    pipeline(c, CHAIN + 1, |i| {
        let owner = if i == CHAIN {
            "wc-end".to_string()
        } else {
            format!("wc-link-{i}")
        };
        words(&["LOCK.ACQUIRE", &format!("wc:chain:{i}"), &owner, &ttl])
    });
    let cap = PERMITS.to_string();
    pipeline(c, PERMITS, |i| {
        words(&[
            "LOCK.SEMACQUIRE",
            "wc:sem",
            &format!("wc-permit-{i}"),
            &cap,
            &ttl,
        ])
    });
    // The writer behind the readers, and the same owner waiting for the requester's key.
    raw.extend(queue_waiters(server, c, 1, |_| {
        acquire_words("wc:readers", "wc-writer")
    }));
    raw.extend(queue_waiters(server, c, 1, |_| {
        acquire_words("wc:own", "wc-writer")
    }));
    raw.extend(queue_waiters(server, c, 1, |_| {
        words(&[
            "LOCK.SEMACQUIRE",
            "wc:sem",
            "wc-permit-waiter",
            &cap,
            &ttl,
            "WAIT",
            "0",
        ])
    }));
    // The chain, link by link in order, then its end waits for the requester's key.
    raw.extend(queue_waiters(server, c, CHAIN, |i| {
        acquire_words(&format!("wc:chain:{}", i + 1), &format!("wc-link-{i}"))
    }));
    raw.extend(queue_waiters(server, c, 1, |_| {
        acquire_words("wc:own", "wc-end")
    }));
    raw
}

/// Sends a request that may block or may be answered at once (refused, granted): returns its
/// reply, after taking it out of the queue with `CLIENT UNBLOCK id ERROR` if it blocked.
fn maybe_blocking(c: &mut Connection, probe: &mut Probe, request: &[String]) -> String {
    probe.send(request);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pause = Duration::from_micros(20);
    loop {
        let mut byte = [0u8; 1];
        probe.stream.set_nonblocking(true).expect("nonblocking");
        let answered = matches!(probe.stream.peek(&mut byte), Ok(n) if n > 0);
        probe.stream.set_nonblocking(false).expect("blocking");
        if answered {
            return probe.read_line();
        }
        let n: i64 = redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(probe.id)
            .arg("ERROR")
            .query(c)
            .expect("CLIENT UNBLOCK");
        if n == 1 {
            return probe.read_line();
        }
        assert!(Instant::now() < deadline, "no reply and never blocked");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// The kind of a reply as `time` describes it: its first word (`integer`, `nil`, `-DEADLOCK`).
fn kind(reply: &str) -> &str {
    reply.split_whitespace().next().unwrap_or("")
}

/// Times `samples` of `request` (after one untimed warm-up).
fn time(
    c: &mut Connection,
    server: &Server,
    what: &str,
    command: &'static str,
    request: &[String],
    sending: Sending,
    samples: usize,
) -> Row {
    let mut probe_raw = Probe::open(server);
    let mut probe = server.connect();
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(PROBE_NAME)
        .query(&mut probe)
        .expect("SETNAME");
    let mut send = |c: &mut Connection| -> String {
        match sending {
            Sending::Blocking => maybe_blocking(c, &mut probe_raw, request),
            Sending::Immediate => {
                let mut cmd = redis::cmd(&request[0]);
                for a in &request[1..] {
                    cmd.arg(a);
                }
                match cmd.query::<Value>(&mut probe) {
                    Ok(Value::Int(n)) => format!("integer {n}"),
                    Ok(Value::Nil) => "nil".into(),
                    Ok(Value::Array(v)) => format!("array of {}", v.len()),
                    Ok(Value::Map(v)) => format!("map of {}", v.len()),
                    Ok(_) => "reply".into(),
                    Err(e) => format!("-{}", e.code().unwrap_or("ERR")),
                }
            }
        }
    };
    let reply = send(c);
    config_set(c, "slowlog-max-len", "100000");
    config_set(c, "slowlog-log-slower-than", "0");
    take_probe_durations(c, command);
    reset_stats(c);
    let mut durations = Vec::with_capacity(samples);
    for _ in 0..samples {
        let r = send(c);
        if kind(&r) != kind(&reply) {
            panic!("{what}: reply changed from {reply} to {r}");
        }
        durations.extend(take_probe_durations(c, command));
    }
    config_set(c, "slowlog-log-slower-than", "10000");
    config_set(c, "slowlog-max-len", "128");
    let (usec, calls) = command_usec(c, &[command]);
    let mean_us = durations.iter().sum::<f64>() / durations.len().max(1) as f64;
    let max_us = durations.iter().copied().fold(0.0, f64::max);
    Row {
        what: what.to_string(),
        reply: if reply.starts_with("-UNBLOCKED") {
            "waited".into()
        } else {
            kind(&reply).to_string()
        },
        mean_us,
        max_us,
        commandstats_us: (sending == Sending::Immediate).then(|| usec / calls.max(1.0)),
    }
}

/// The tenant user for the filtered LOCK.QUEUES row (may read `tenantA:*` only, none of the
/// queues here); `None` when the server refused to create it.
fn tenant_probe(server: &Server, c: &mut Connection) -> Option<Connection> {
    let ok: redis::RedisResult<()> = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "wc-tenant",
            "on",
            ">wc-pass",
            "~tenantA:*",
            "+@all",
        ])
        .query(c);
    ok.ok()?;
    let mut t = server.connect();
    let _: () = redis::cmd("AUTH")
        .arg("wc-tenant")
        .arg("wc-pass")
        .query(&mut t)
        .ok()?;
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(PROBE_NAME)
        .query(&mut t)
        .ok()?;
    Some(t)
}

/// Every row, on `server` (whatever module it loaded). `quick`: fewer samples.
pub fn measure(server: &Server, quick: bool, step: &dyn Fn(&str)) -> Vec<Row> {
    let mut c = server.connect();
    let ttl = LONG_TTL.to_string();
    step("worst case: setting up 100,000 readers, a 10,000-lock chain, 100,000 permits");
    let began = Instant::now();
    let raw = set_up(server, &mut c);
    step(&format!(
        "worst case: set up in {:.1} s",
        began.elapsed().as_secs_f64()
    ));
    let slow = if quick { 5 } else { 20 };
    let fast = if quick { 50 } else { 200 };
    let mut rows = Vec::new();
    let immediate = Sending::Immediate;
    let mut add = |c: &mut Connection,
                   what: &str,
                   command: &'static str,
                   request: Vec<String>,
                   sending: Sending,
                   samples: usize| {
        step(&format!("worst case: {what}"));
        rows.push(time(c, server, what, command, &request, sending, samples));
    };
    add(
        &mut c,
        "LOCK.ACQUIRE WAIT on the key of 100,000 readers + a queued writer (closes a cycle)",
        "lock.acquire",
        acquire_words("wc:readers", REQUESTER),
        immediate,
        slow,
    );
    add(
        &mut c,
        "LOCK.ACQUIRE WAIT on the first of a chain of 10,000 locks (closes a cycle at its end)",
        "lock.acquire",
        acquire_words("wc:chain:0", REQUESTER),
        // Refused where the whole chain is walked; waits where the budget runs out first.
        Sending::Blocking,
        slow,
    );
    add(
        &mut c,
        "LOCK.ACQUIRE without WAIT on the key of 100,000 readers",
        "lock.acquire",
        words(&["LOCK.ACQUIRE", "wc:readers", REQUESTER, &ttl]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.RWREAD WAIT on the key of 100,000 readers (behind the writer: closes a cycle)",
        "lock.rwread",
        words(&["LOCK.RWREAD", "wc:readers", REQUESTER, &ttl, "WAIT", "0"]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.RWREAD re-entry of one of the 100,000 readers",
        "lock.rwread",
        words(&["LOCK.RWREAD", "wc:readers", "wc-reader-50000", &ttl]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.RELEASE of one hold of one of the 100,000 readers",
        "lock.release",
        words(&["LOCK.RELEASE", "wc:readers", "wc-reader-50000"]),
        immediate,
        // One fewer than the re-entries above added (with their warm-up): the reader keeps
        // its first hold.
        fast,
    );
    add(
        &mut c,
        "LOCK.EXTEND of one of the 100,000 readers",
        "lock.extend",
        words(&["LOCK.EXTEND", "wc:readers", "wc-reader-50000", &ttl]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.SEMACQUIRE without WAIT on a semaphore of 100,000 permits, all held, one queued",
        "lock.semacquire",
        words(&[
            "LOCK.SEMACQUIRE",
            "wc:sem",
            REQUESTER,
            &PERMITS.to_string(),
            &ttl,
        ]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.SEMACQUIRE WAIT on that semaphore (queues; not part of detection)",
        "lock.semacquire",
        words(&[
            "LOCK.SEMACQUIRE",
            "wc:sem",
            REQUESTER,
            &PERMITS.to_string(),
            &ttl,
            "WAIT",
            "0",
        ]),
        Sending::Blocking,
        fast,
    );
    add(
        &mut c,
        "LOCK.INFO of a chain key (one holder, one waiter)",
        "lock.info",
        words(&["LOCK.INFO", "wc:chain:5000"]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.INFO of the key of 100,000 readers (the reply lists every holder)",
        "lock.info",
        words(&["LOCK.INFO", "wc:readers"]),
        immediate,
        slow,
    );
    add(
        &mut c,
        "LOCK.INFO OWNER of one of the 100,000 readers (a client checking its own hold)",
        "lock.info",
        words(&["LOCK.INFO", "wc:readers", "OWNER", "wc-reader-50000"]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.INFO COUNT 10 of the key of 100,000 readers",
        "lock.info",
        words(&["LOCK.INFO", "wc:readers", "COUNT", "10"]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.INFO OWNER of one of the 100,000 permit holders",
        "lock.info",
        words(&["LOCK.INFO", "wc:sem", "OWNER", "wc-permit-50000"]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.QUEUES (about 10,000 queues; default BY AGE COUNT 10)",
        "lock.queues",
        words(&["LOCK.QUEUES"]),
        immediate,
        fast,
    );
    add(
        &mut c,
        "LOCK.QUEUES BY LENGTH COUNT 1000 (about 10,000 queues)",
        "lock.queues",
        words(&["LOCK.QUEUES", "BY", "LENGTH", "COUNT", "1000"]),
        immediate,
        fast,
    );
    // The chain request's cost as the budget grows (where the build has one): the check is
    // cut at each, so this is the cost of a given number of visits.
    let budget_default: Option<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.deadlock-budget")
        .query::<Vec<String>>(&mut c)
        .ok()
        .and_then(|v| v.get(1).cloned());
    if let Some(default) = budget_default {
        for budget in ["1000", "10000", "100000"] {
            config_set(&mut c, "lock.deadlock-budget", budget);
            add(
                &mut c,
                &format!("(budget {budget}) LOCK.ACQUIRE WAIT on the first of the chain"),
                "lock.acquire",
                acquire_words("wc:chain:0", REQUESTER),
                Sending::Blocking,
                slow,
            );
        }
        config_set(&mut c, "lock.deadlock-budget", &default);
    }
    // The same LOCK.QUEUES from a user that may read none of the queues.
    if let Some(mut tenant) = tenant_probe(server, &mut c) {
        step("worst case: LOCK.QUEUES by a tenant who may read none of them");
        config_set(&mut c, "slowlog-max-len", "100000");
        config_set(&mut c, "slowlog-log-slower-than", "0");
        take_probe_durations(&mut c, "lock.queues");
        reset_stats(&mut c);
        let mut durations = Vec::new();
        let mut reply = String::new();
        for _ in 0..fast {
            let v: Value = redis::cmd("LOCK.QUEUES")
                .query(&mut tenant)
                .unwrap_or(Value::Nil);
            reply = match v {
                Value::Array(v) => format!("array of {}", v.len()),
                _ => "reply".into(),
            };
            durations.extend(take_probe_durations(&mut c, "lock.queues"));
        }
        config_set(&mut c, "slowlog-log-slower-than", "10000");
        config_set(&mut c, "slowlog-max-len", "128");
        let (usec, calls) = command_usec(&mut c, &["lock.queues"]);
        rows.push(Row {
            what: "LOCK.QUEUES by a user that may read `tenantA:*` only (none of them)".into(),
            reply,
            mean_us: durations.iter().sum::<f64>() / durations.len().max(1) as f64,
            max_us: durations.iter().copied().fold(0.0, f64::max),
            commandstats_us: Some(usec / calls.max(1.0)),
        });
    }
    drop(raw);
    let deadline = Instant::now() + Duration::from_secs(120);
    while crate::detect::lock_waiters(&mut c) != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    flush(&mut c);
    rows
}

/// The rows as a markdown table: one column pair per build measured.
pub fn table(md: &mut String, builds: &[(&str, &[Row])]) {
    let _ = write!(md, "| request |");
    for (name, _) in builds {
        let _ = write!(
            md,
            " {name}: reply | mean µs | max µs | commandstats µs/call |"
        );
    }
    let _ = writeln!(md);
    let _ = write!(md, "|---|");
    for _ in builds {
        let _ = write!(md, "---|---:|---:|---:|");
    }
    let _ = writeln!(md);
    // Every row of every build, in the order of the build with the most (a row only one
    // build can run, such as a setting the other lacks, shows "-" for the other).
    let Some((_, most)) = builds.iter().max_by_key(|(_, rows)| rows.len()) else {
        return;
    };
    for row in most.iter() {
        let _ = write!(md, "| {} |", row.what);
        for (_, rows) in builds {
            match rows.iter().find(|r| r.what == row.what) {
                Some(r) => {
                    let cs = r
                        .commandstats_us
                        .map_or("-".to_string(), |u| format!("{u:.1}"));
                    let _ = write!(
                        md,
                        " {} | {:.1} | {:.1} | {cs} |",
                        r.reply, r.mean_us, r.max_us
                    );
                }
                None => {
                    let _ = write!(md, " - | - | - | - |");
                }
            }
        }
        let _ = writeln!(md);
    }
}
