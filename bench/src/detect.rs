//! The cost of deadlock detection: the server time of one blocking LOCK.ACQUIRE that cannot
//! be granted, runs the wait-for check and queues, with a given set of owners already waiting.
//!
//! # What is timed, and how
//!
//! A lock request with WAIT that cannot be granted at once is checked for a cycle before it
//! queues (SPEC.md, "Deadlock detection"): the check visits every owner reachable from the
//! request's blockers and reads the keys they wait on. The timed request is always the same:
//! owner `dl-requester`, which holds a key of its own (`dl:own`, so a cycle could close on it)
//! that another owner, `dl-bystander`, waits for (so the module's shortcut for requesters that
//! hold no key anyone waits for does not skip the walk; the bystander is not reachable from
//! the request, so no cycle closes), asks with `WAIT 0` for a key it cannot have. With
//! `contended_own` false there is no bystander, and the figure is that of the shortcut. What differs is who is already waiting ([`Waiting`]). The request queues (its
//! reply is checked: it must be `CLIENT UNBLOCK ... ERROR`'s, not a grant or `-DEADLOCK`);
//! then `CLIENT UNBLOCK id ERROR` takes it out again, and the next sample starts from the same
//! state.
//!
//! The figure is the command's own processing time as Redis measures it around the command
//! handler (`c->duration`: the first try, the check, the queueing, blocking the client), read
//! from the SLOWLOG (threshold 0, one entry per request), not from INFO commandstats. Redis
//! 7.0.15's `call()` adds a command's time to commandstats even when the command blocked, and
//! every `updateStatsOnUnblock` adds `c->duration` again: once for `CLIENT UNBLOCK id ERROR`
//! (in CLIENT UNBLOCK itself) or a WAIT timeout (`moduleBlockedClientTimedOut`), twice for a
//! plain `CLIENT UNBLOCK id` (both). So commandstats shows 2x the work here (the table shows it
//! beside the figure; measured: exactly 2x). 7.2 skips blocked clients in `call()` and counts
//! once, at the unblock. The SLOWLOG skips blocked clients in `call()` in both and gets one
//! entry of `c->duration` per request unblocked with `ERROR` (7.0: in CLIENT UNBLOCK, with no
//! arguments; 7.2: `unblockClientOnError`); the run asserts one entry per request. The work done
//! when the client leaves the queue again (the module's disconnect callback) is in neither.
//!
//! After the samples, the setup is checked to be walked: an owner at the far end of what the
//! request waits for queues a request on `dl:own`, and the same request must now be refused
//! with `-DEADLOCK` (for the chain, the check can only see that cycle by walking every link).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::measure::{flush, reset_stats, RawClients, LONG_TTL};
use crate::server::{command_usec, info_field, Server};

const REQUESTER: &str = "dl-requester";
const OWN_KEY: &str = "dl:own";
pub(crate) const PROBE_NAME: &str = "dl-probe";

/// Who is waiting when the timed request arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// Nobody: the requested key is held by one owner that waits for nothing, so the check
    /// visits that one owner.
    Nobody,
    /// `n` owners queued on the requested key, as readers behind its writer holder, so the
    /// request (a writer) waits for all `n` and the check visits each. (Readers, because `n`
    /// writers queueing one after another would each run a check over every writer ahead of
    /// it: a setup quadratic in `n`.)
    Queue(usize),
    /// `n` owners in a chain, each holding a key and waiting for the next one's: owner `i`
    /// holds `dl:chain:{i}` and waits for `dl:chain:{i+1}`; the last key is held by an owner
    /// that waits for nothing. The request asks for `dl:chain:0`, so the check walks the chain
    /// link by link, reading one key per owner.
    Chain(usize),
    /// No lock at all: a semaphore request with WAIT on a full semaphore of capacity 1 with `n`
    /// permit requests queued, which queues the same way but is not part of detection (no
    /// check runs): what a blocking request costs without the check.
    Semaphore(usize),
}

/// One measurement: server µs per blocking request (mean and median of the SLOWLOG entries),
/// what INFO commandstats shows per call for the same requests, and how many samples.
pub struct CheckCost {
    pub mean_us: f64,
    pub p50_us: f64,
    pub commandstats_us: f64,
    pub samples: usize,
}

/// A plain connection that sends a command and reads one single-line reply when told.
pub(crate) struct Probe {
    pub(crate) stream: TcpStream,
    pub(crate) id: i64,
}

fn resp(words: &[String]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    out
}

impl Probe {
    pub(crate) fn open(server: &Server) -> Probe {
        let stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        let mut p = Probe { stream, id: 0 };
        p.send(&["CLIENT".into(), "SETNAME".into(), PROBE_NAME.into()]);
        assert_eq!(p.read_line(), "+OK");
        p.send(&["CLIENT".into(), "ID".into()]);
        let line = p.read_line();
        p.id = line
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .expect("CLIENT ID");
        p
    }

    pub(crate) fn send(&mut self, words: &[String]) {
        self.stream.write_all(&resp(words)).expect("write");
    }

    /// One reply line without its CRLF (a simple string, error or integer reply).
    pub(crate) fn read_line(&mut self) -> String {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            self.stream.read_exact(&mut byte).expect("reply");
            line.push(byte[0]);
        }
        line.truncate(line.len() - 2);
        String::from_utf8_lossy(&line).into_owned()
    }
}

pub(crate) fn words(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn acquire_words(key: &str, owner: &str) -> Vec<String> {
    words(&[
        "LOCK.ACQUIRE",
        key,
        owner,
        &LONG_TTL.to_string(),
        "WAIT",
        "0",
    ])
}

pub(crate) fn lock_waiters(c: &mut Connection) -> i64 {
    info_field(c, "lock", "lock_waiters").unwrap_or(0.0) as i64
}

pub(crate) fn wait_for_module_waiters(c: &mut Connection, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while lock_waiters(c) != n as i64 {
        assert!(
            Instant::now() < deadline,
            "waiters: {} (expected {n})",
            lock_waiters(c)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Queues `n` waiters (after those already waiting), `cmd(i)` each, in batches of 1000: each batch is
/// queued before the next is sent, so the requests arrive about in order (for the chain: a
/// link queues before the links it waits for, and its own check stays short).
pub(crate) fn queue_waiters(
    server: &Server,
    c: &mut Connection,
    n: usize,
    cmd: impl Fn(usize) -> Vec<String>,
) -> Vec<RawClients> {
    let mut out = Vec::new();
    let base = usize::try_from(lock_waiters(c)).unwrap_or(0);
    for start in (0..n).step_by(1000) {
        let len = (n - start).min(1000);
        let mut raw = RawClients::open(server, len);
        raw.send_each(|j| cmd(start + j));
        wait_for_module_waiters(c, base + start + len);
        out.push(raw);
    }
    out
}

pub(crate) fn ok_int(c: &mut Connection, parts: &[&str]) {
    let mut cmd = redis::cmd(parts[0]);
    for p in &parts[1..] {
        cmd.arg(*p);
    }
    let r: redis::RedisResult<i64> = cmd.query(c);
    assert!(r.is_ok(), "{parts:?}: {r:?}");
}

/// Builds `waiting`; returns the timed request, the command name it counts under, the
/// waiters' connections, and the owner at the far end of what the request waits for.
fn set_up(
    server: &Server,
    c: &mut Connection,
    waiting: Waiting,
) -> (Vec<String>, &'static str, Vec<RawClients>, String) {
    let ttl = LONG_TTL.to_string();
    match waiting {
        Waiting::Nobody => {
            ok_int(c, &["LOCK.ACQUIRE", "dl:key", "dl-holder", &ttl]);
            let request = acquire_words("dl:key", REQUESTER);
            (request, "lock.acquire", Vec::new(), "dl-holder".into())
        }
        Waiting::Queue(n) => {
            ok_int(c, &["LOCK.ACQUIRE", "dl:queue", "dl-holder", &ttl]);
            let raw = queue_waiters(server, c, n, |i| {
                words(&[
                    "LOCK.RWREAD",
                    "dl:queue",
                    &format!("dl-reader-{i}"),
                    &ttl,
                    "WAIT",
                    "0",
                ])
            });
            let request = acquire_words("dl:queue", REQUESTER);
            let far = format!("dl-reader-{}", n.saturating_sub(1));
            (request, "lock.acquire", raw, far)
        }
        Waiting::Chain(n) => {
            for start in (0..=n).step_by(1000) {
                let mut p = redis::pipe();
                for i in start..(start + 1000).min(n + 1) {
                    let owner = if i == n {
                        "dl-end".to_string()
                    } else {
                        format!("dl-link-{i}")
                    };
                    p.cmd("LOCK.ACQUIRE")
                        .arg(format!("dl:chain:{i}"))
                        .arg(owner)
                        .arg(LONG_TTL)
                        .ignore();
                }
                let _: () = p.query(c).expect("chain holders");
            }
            let raw = queue_waiters(server, c, n, |i| {
                acquire_words(&format!("dl:chain:{}", i + 1), &format!("dl-link-{i}"))
            });
            let request = acquire_words("dl:chain:0", REQUESTER);
            (request, "lock.acquire", raw, "dl-end".into())
        }
        Waiting::Semaphore(n) => {
            ok_int(c, &["LOCK.SEMACQUIRE", "dl:sem", "dl-holder", "1", &ttl]);
            let raw = queue_waiters(server, c, n, |i| {
                words(&[
                    "LOCK.SEMACQUIRE",
                    "dl:sem",
                    &format!("dl-permit-{i}"),
                    "1",
                    &ttl,
                    "WAIT",
                    "0",
                ])
            });
            let request = words(&[
                "LOCK.SEMACQUIRE",
                "dl:sem",
                REQUESTER,
                "1",
                &ttl,
                "WAIT",
                "0",
            ]);
            (request, "lock.semacquire", raw, String::new())
        }
    }
}

/// Sends the request, takes it out of the queue once it is there, and returns its reply.
pub(crate) fn one_request(c: &mut Connection, probe: &mut Probe, request: &[String]) -> String {
    probe.send(request);
    // CLIENT UNBLOCK answers 0 until the request has been processed and is blocked; ask again
    // with a growing pause, so a slow request is not answered by a stream of retries.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pause = Duration::from_micros(20);
    loop {
        let n: i64 = redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(probe.id)
            .arg("ERROR")
            .query(c)
            .expect("CLIENT UNBLOCK");
        if n == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the request never blocked");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    probe.read_line()
}

pub(crate) fn config_set(c: &mut Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
        .expect("CONFIG SET");
}

/// The durations (µs) of the SLOWLOG entries of `command` sent by the probe, and a reset of
/// the log (in one round trip).
pub(crate) fn take_probe_durations(c: &mut Connection, command: &str) -> Vec<f64> {
    let (entries, ()): (Vec<Value>, ()) = redis::pipe()
        .cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .cmd("SLOWLOG")
        .arg("RESET")
        .query(c)
        .expect("SLOWLOG GET");
    let mut out = Vec::new();
    for e in entries {
        let Value::Array(fields) = e else { continue };
        let (Some(Value::Int(us)), Some(Value::Array(args)), Some(Value::BulkString(name))) =
            (fields.get(2), fields.get(3), fields.get(5))
        else {
            continue;
        };
        // Redis 7.0 logs the entry of a command unblocked by CLIENT UNBLOCK with no arguments
        // (the client's argv is gone by then); 7.2 keeps them.
        let is_command = match args.first() {
            None => true,
            Some(Value::BulkString(a)) => a.eq_ignore_ascii_case(command.as_bytes()),
            Some(_) => false,
        };
        if is_command && name == PROBE_NAME.as_bytes() {
            out.push(*us as f64);
        }
    }
    out
}

/// Server time of one blocking request with `waiting` already waiting, over `samples`
/// requests (see the module documentation).
pub fn blocking_request(
    server: &Server,
    waiting: Waiting,
    samples: usize,
    contended_own: bool,
) -> CheckCost {
    let mut c = server.connect();
    flush(&mut c);
    wait_for_module_waiters(&mut c, 0);
    ok_int(
        &mut c,
        &["LOCK.ACQUIRE", OWN_KEY, REQUESTER, &LONG_TTL.to_string()],
    );
    let mut bystander = None;
    if contended_own {
        let mut b = RawClients::open(server, 1);
        b.send_each(|_| acquire_words(OWN_KEY, "dl-bystander"));
        wait_for_module_waiters(&mut c, 1);
        bystander = Some(b);
    }
    let (request, command, raw, far) = set_up(server, &mut c, waiting);
    let waiters_before = lock_waiters(&mut c);
    let mut probe = Probe::open(server);
    let unblocked = |reply: &str| {
        assert!(
            reply.starts_with("-UNBLOCKED"),
            "{waiting:?}: the timed request did not wait: {reply}"
        );
    };
    // Warm-up, not timed.
    for _ in 0..3 {
        unblocked(&one_request(&mut c, &mut probe, &request));
    }
    // Every command is logged now (CLIENT UNBLOCK's too): the log is read and emptied after
    // each request, and long enough for the retries of one.
    config_set(&mut c, "slowlog-max-len", "100000");
    config_set(&mut c, "slowlog-log-slower-than", "0");
    take_probe_durations(&mut c, command);
    reset_stats(&mut c);
    let mut durations = Vec::with_capacity(samples);
    for _ in 0..samples {
        unblocked(&one_request(&mut c, &mut probe, &request));
        let d = take_probe_durations(&mut c, command);
        assert_eq!(d.len(), 1, "{waiting:?}: one SLOWLOG entry per request");
        durations.extend(d);
    }
    config_set(&mut c, "slowlog-log-slower-than", "10000");
    config_set(&mut c, "slowlog-max-len", "128");
    let (usec, calls) = command_usec(&mut c, &[command]);
    assert_eq!(
        lock_waiters(&mut c),
        waiters_before,
        "{waiting:?}: each timed request left the queue"
    );
    // The walk reaches the far end: an owner there now waits for a key the requester holds,
    // so the same request closes a cycle and is refused.
    if !matches!(waiting, Waiting::Semaphore(_)) {
        // Version 3 bounds a check (`lock.deadlock-budget`) and searches backwards from the
        // requester, so the chain's far end is as far as it was for the forward walk: give this
        // one check room for it (a build without the setting refuses the CONFIG SET: fine).
        let budget: Option<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("lock.deadlock-budget")
            .query::<Vec<String>>(&mut c)
            .ok()
            .and_then(|v| v.get(1).cloned());
        if budget.is_some() {
            config_set(&mut c, "lock.deadlock-budget", "1000000000");
        }
        let mut closer = RawClients::open(server, 1);
        closer.send_each(|_| acquire_words(OWN_KEY, &far));
        wait_for_module_waiters(&mut c, waiters_before as usize + 1);
        probe.send(&request);
        let reply = probe.read_line();
        assert!(
            reply.starts_with("-DEADLOCK"),
            "{waiting:?}: with the cycle closed the request got {reply}"
        );
        if let Some(budget) = budget {
            config_set(&mut c, "lock.deadlock-budget", &budget);
        }
        drop(closer);
    }
    drop(probe);
    drop(raw);
    drop(bystander);
    durations.sort_by(|a, b| a.total_cmp(b));
    let mean_us = durations.iter().sum::<f64>() / durations.len().max(1) as f64;
    let p50_us = durations
        .get(durations.len() / 2)
        .copied()
        .unwrap_or(f64::NAN);
    // Leave nobody waiting for the next measurement.
    wait_for_module_waiters(&mut c, 0);
    CheckCost {
        mean_us,
        p50_us,
        commandstats_us: usec / calls.max(1.0),
        samples: durations.len(),
    }
}
