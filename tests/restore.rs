//! Stored values are checked when they are loaded: `RESTORE` of a lock value that breaks an
//! invariant (counts, expiries, tokens, capacities, holder and queue rules) is refused with an
//! error, and every value that is accepted works with every lock command. Payloads are real
//! `DUMP`s of each shape of lock, mutated field by field and resealed with a valid checksum
//! (testkit's `ModuleDump`), so the server's own checks pass and the module's are what is
//! tested. The same decoder reads RDB files and full resynchronisations.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_lock_testkit::*;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP").arg(key).query(c).expect("DUMP")
}

fn restore(c: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("RESTORE").arg(key).arg(0).arg(payload).query(c)
}

/// A server whose log the test can read, with DEBUG allowed. `hz 500`: a blocked request's
/// 1 ms timeout is noticed within 2 ms rather than at the next 100 ms tick.
fn logged_server() -> Server {
    Server::start_with(&[
        "--logfile",
        "lock.log",
        "--enable-debug-command",
        "yes",
        "--hz",
        "500",
    ])
}

fn log_text(server: &Server) -> String {
    std::fs::read_to_string(server.dir.join("lock.log")).unwrap_or_default()
}

/// `DUMP`s of every shape a lock value takes: a compact single holder, a full value with
/// several readers (one re-entered), a semaphore, a pending lock-delay, bound holds, an
/// exclusive hold with a lock-delay, a long owner.
fn shapes(c: &mut Connection) -> Vec<(&'static str, Vec<u8>)> {
    int(c, &["LOCK.ACQUIRE", "s:compact", "owner", "600000"]);
    for (owner, ttl) in [("r1", "600000"), ("r2", "500000"), ("r3", "400000")] {
        int(c, &["LOCK.RWREAD", "s:readers", owner, ttl]);
    }
    int(c, &["LOCK.RWREAD", "s:readers", "r1", "600000"]);
    int(c, &["LOCK.SEMACQUIRE", "s:sem", "p1", "5", "600000"]);
    int(c, &["LOCK.SEMACQUIRE", "s:sem", "p2", "5", "600000"]);
    int(c, &["LOCK.SEMACQUIRE", "s:sem", "p2", "5", "600000"]);
    int(
        c,
        &["LOCK.ACQUIRE", "s:delay", "d", "30", "LOCKDELAY", "600000"],
    );
    int(c, &["LOCK.ACQUIRE", "s:bound", "b", "600000", "BIND"]);
    int(
        c,
        &["LOCK.RWREAD", "s:bound-readers", "b1", "600000", "BIND"],
    );
    int(c, &["LOCK.RWREAD", "s:bound-readers", "b2", "600000"]);
    int(
        c,
        &[
            "LOCK.ACQUIRE",
            "s:held-delay",
            "h",
            "600000",
            "LOCKDELAY",
            "1000",
        ],
    );
    let long = "o".repeat(100);
    int(c, &["LOCK.ACQUIRE", "s:long", &long, "600000"]);
    // The delayed key's hold expires; its lock-delay is then pending.
    wait_until("the lock-delay is pending", || {
        info(c, "s:delay")
            .and_then(|m| m.get("mode").cloned())
            .is_some_and(|m| value_text(&m) == "free")
    });
    [
        "s:compact",
        "s:readers",
        "s:sem",
        "s:delay",
        "s:bound",
        "s:bound-readers",
        "s:held-delay",
        "s:long",
    ]
    .into_iter()
    .map(|k| (k, dump(c, k)))
    .collect()
}

/// Values at the edges of every range the decoder checks.
fn interesting(rng: &mut Rng, now: u64, current: u64) -> u64 {
    let table = [
        0,
        1,
        2,
        3,
        5,
        (1 << 31) - 1,
        1 << 31,
        1 << 32,
        (1 << 47) + 1,
        1 << 48,
        1 << 49,
        (1 << 49) + 1,
        (1 << 53) - 1,
        1 << 53,
        (1 << 63) - 1,
        1 << 63,
        u64::MAX,
        now,
        now - 1000,
        now + 1000,
        now + 600_000,
        current.wrapping_add(1),
        current.wrapping_sub(1),
        current.wrapping_mul(2),
        rng.next_u64(),
        rng.next_u64() >> 32,
    ];
    table[rng.index(table.len())]
}

fn mutate(rng: &mut Rng, original: &ModuleDump, now: u64) -> Vec<u8> {
    let mut d = original.clone();
    let rounds = 1 + rng.index(3);
    for _ in 0..rounds {
        let n = d.fields.len();
        match rng.index(10) {
            0..=4 if n > 0 => {
                let i = rng.index(n);
                d.fields[i] = match &d.fields[i] {
                    Field::Unsigned(v) => Field::Unsigned(interesting(rng, now, *v)),
                    Field::Bytes(b) => match rng.index(5) {
                        0 => Field::Bytes(Vec::new()),
                        1 => Field::Bytes(vec![b'x'; 1025]),
                        2 => Field::Bytes(vec![b'y'; 1024]),
                        3 => {
                            // Another owner of the same value: a duplicate.
                            let others: Vec<Vec<u8>> = d
                                .fields
                                .iter()
                                .filter_map(|f| match f {
                                    Field::Bytes(o) if o != b => Some(o.clone()),
                                    _ => None,
                                })
                                .collect();
                            Field::Bytes(
                                others
                                    .get(rng.index(others.len()))
                                    .cloned()
                                    .unwrap_or_default(),
                            )
                        }
                        _ => Field::Unsigned(b.len() as u64),
                    },
                };
            }
            5 if n > 0 => {
                d.fields.remove(rng.index(n));
            }
            6 if n > 0 => {
                let i = rng.index(n);
                let f = d.fields[i].clone();
                d.fields.insert(rng.index(n + 1), f);
            }
            7 if n > 1 => {
                let (i, j) = (rng.index(n), rng.index(n));
                d.fields.swap(i, j);
            }
            8 => {
                let at = rng.index(n + 1);
                d.fields
                    .insert(at, Field::Unsigned(interesting(rng, now, 0)));
            }
            _ => {
                // Another encoding version (0 to 3).
                d.module_id = (d.module_id & !0x3ff) | rng.index(4) as u64;
            }
        }
    }
    let mut payload = d.payload();
    // Now and then a raw byte changes too (the checksum is recomputed, so the server's own
    // format checks and the module's see it).
    if rng.index(8) == 0 {
        let body = payload.len() - 10;
        let at = rng.index(body);
        payload[at] ^= 1 << rng.index(8);
        payload = reseal(payload);
    }
    payload
}

/// Runs every lock command (and the data type's methods: DUMP, DIGEST, MEMORY USAGE, COPY) on
/// `key`, and returns the error replies that mention an internal error.
fn exercise(c: &mut Connection, key: &str, owner: &str) -> Vec<String> {
    let copy = format!("{key}:copy");
    let commands: Vec<Vec<&str>> = vec![
        vec!["LOCK.INFO", key],
        // Queued behind the value's holders: the value needs a timer for their expiry.
        vec!["LOCK.ACQUIRE", key, "w", "1000", "WAIT", "1"],
        vec!["LOCK.ACQUIRE", key, "x", "1000"],
        vec!["LOCK.RWREAD", key, "y", "1000"],
        vec!["LOCK.SEMACQUIRE", key, "z", "3", "1000"],
        vec!["LOCK.EXTEND", key, owner, "1000"],
        vec!["LOCK.ACQUIRE", key, owner, "1000"],
        vec!["LOCK.RWREAD", key, owner, "1000"],
        vec!["LOCK.SEMACQUIRE", key, owner, "5", "1000"],
        vec!["LOCK.RELEASE", key, owner],
        vec!["LOCK.ACQUIRE", key, "w", "1000", "WAIT", "1"],
        vec!["LOCK.RELEASE", key, owner, "ALL"],
        vec!["LOCK.INFO", key],
        vec!["LOCK.QUEUES"],
        vec!["DEBUG", "DIGEST-VALUE", key],
        vec!["MEMORY", "USAGE", key],
        vec!["COPY", key, &copy, "REPLACE"],
        vec!["DUMP", key],
    ];
    let mut bad = Vec::new();
    for words in commands {
        let r = query(c, &words);
        if let Err(e) = r {
            let text = format!("{e:?}");
            if text.to_lowercase().contains("internal error") {
                bad.push(format!("{words:?}: {text}"));
            }
        }
    }
    bad
}

#[test]
fn mutated_dumps_of_every_shape_are_refused_or_work_with_every_command() {
    let started = Instant::now();
    let server = logged_server();
    let mut c = server.client();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let shapes = shapes(&mut c);
    let parsed: Vec<(&str, ModuleDump)> = shapes
        .iter()
        .map(|(name, p)| {
            let d = ModuleDump::parse(p);
            (
                *name,
                d.unwrap_or_else(|| panic!("{name}: not a module value payload: {p:?}")),
            )
        })
        .collect();
    for (name, d) in &parsed {
        assert_eq!(d.encoding_version(), 3, "{name}");
        assert_eq!(ModuleDump::parse(&d.payload()).as_ref(), Some(d), "{name}");
        restore(&mut c, &format!("{name}:again"), &d.payload())
            .unwrap_or_else(|e| panic!("{name} rebuilt: {e:?}"));
    }

    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let now = now_ms();
    let (mut accepted, mut refused) = (0, 0);
    let mut internal = Vec::new();
    const PAYLOADS: usize = 5000;
    for i in 0..PAYLOADS {
        let (shape, original) = &parsed[i % parsed.len()];
        let payload = mutate(&mut rng, original, now);
        let key = format!("m:{i}");
        match restore(&mut c, &key, &payload) {
            Ok(()) => {
                accepted += 1;
                let owner = ModuleDump::parse(&payload)
                    .and_then(|d| {
                        d.fields.into_iter().find_map(|f| match f {
                            Field::Bytes(b) => Some(String::from_utf8_lossy(&b).to_string()),
                            _ => None,
                        })
                    })
                    .filter(|o| !o.is_empty())
                    .unwrap_or_else(|| "nobody".into());
                for e in exercise(&mut c, &key, &owner) {
                    internal.push(format!("{shape} #{i}: {e}"));
                }
            }
            Err(e) => {
                refused += 1;
                let text = format!("{e:?}");
                assert!(
                    text.contains("Bad data format") || text.contains("payload version"),
                    "{shape} #{i}: unexpected refusal {text}"
                );
                assert_eq!(int(&mut c, &["EXISTS", &key]), 0, "nothing half-restored");
            }
        }
        if i % 500 == 0 {
            assert_eq!(
                query(&mut c, &["PING"]).expect("PING within 5 s"),
                Value::SimpleString("PONG".into())
            );
        }
    }
    // Timers of the accepted values fire (settle, expiries): the server still answers, and
    // nothing logged an internal error.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        query(&mut c, &["PING"]).expect("PING within 5 s"),
        Value::SimpleString("PONG".into())
    );
    let log = log_text(&server);
    let logged: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("internal error"))
        .collect();
    eprintln!(
        "{PAYLOADS} mutated payloads: {accepted} accepted, {refused} refused, in {:?}",
        started.elapsed()
    );
    assert!(internal.is_empty(), "internal errors: {internal:#?}");
    assert!(logged.is_empty(), "internal errors in the log: {logged:#?}");
    assert!(accepted > 100 && refused > 100, "{accepted} / {refused}");
}

/// The compact value's holder with its expiry (the fourth field: fence, count, owner, mode,
/// count, expiry) replaced.
fn with_expiry(original: &[u8], expires_at: u64) -> Vec<u8> {
    let mut d = ModuleDump::parse(original).expect("a module value payload");
    assert!(matches!(d.fields[5], Field::Unsigned(_)), "{:?}", d.fields);
    d.fields[5] = Field::Unsigned(expires_at);
    d.payload()
}

/// A holder expiry of 2^63 ms made RESTORE's key spin the main thread (the expiry timer's
/// deadline overflowed into the past: it fired, found nothing due and re-armed, forever); one
/// of 2^64 - 1 made every later command on the key fail with an internal error. Both are
/// refused now, and the server answers throughout.
#[test]
fn holder_expiries_of_2_63_and_2_64_minus_1_are_refused() {
    let server = logged_server();
    let mut c = server.client();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // An exclusive hold with a lock-delay: its key outlives the hold, so the value has a timer
    // for the hold's own expiry (as it would with waiters or several readers).
    int(
        &mut c,
        &["LOCK.ACQUIRE", "src", "o", "600000", "LOCKDELAY", "1000"],
    );
    let good = dump(&mut c, "src");
    restore(&mut c, "fine", &with_expiry(&good, now_ms() + 600_000)).expect("a valid expiry");
    // 2^63 last: on a build without the checks it leaves the server spinning.
    for (name, at) in [
        ("2^64-1", u64::MAX),
        ("2^49+1", (1 << 49) + 1),
        ("2^63", 1u64 << 63),
    ] {
        let key = format!("bad:{name}");
        let restored = restore(&mut c, &key, &with_expiry(&good, at));
        // What a build that accepted it would do next: commands on the key, timers firing.
        let internal = exercise(&mut c, &key, "o");
        std::thread::sleep(Duration::from_millis(200));
        let ping = query(&mut c, &["PING"]);
        assert!(
            matches!(&restored, Err(e) if format!("{e:?}").contains("Bad data format"))
                && internal.is_empty()
                && ping == Ok(Value::SimpleString("PONG".into())),
            "expiry {name}: RESTORE {restored:?}, internal errors {internal:?}, PING {ping:?}"
        );
        int(&mut c, &["DEL", &key]);
    }
    // The largest accepted expiry (2^49 ms) works with every command, timers included.
    restore(&mut c, "far", &with_expiry(&good, 1 << 49)).expect("2^49 is in range");
    let far = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "far", "w2", "1000", "WAIT", "60000"],
        1,
    );
    // Among them LOCK.RELEASE ALL of the holder, which serves the waiter.
    assert!(exercise(&mut c, "far", "o").is_empty());
    far.join()
        .expect("the waiter behind a far expiry is served");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        query(&mut c, &["PING"]).expect("PING within 5 s"),
        Value::SimpleString("PONG".into())
    );
    assert!(
        log_text(&server).contains("expiry out of range"),
        "the refusal is logged"
    );
}

/// The AOF carries LOCK.SYNC states: one that breaks an invariant (here a holder whose expiry
/// is 2^63 - 1 ms, the text form of earlier versions, beside a reader a writer joins) is
/// refused and changes nothing; the rest of the file loads, and the server answers.
#[test]
fn an_aof_with_lock_sync_states_that_break_invariants_loads_without_them() {
    let mut server = Server::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--logfile",
        "lock.log",
    ]);
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "current", "me", "600000"]);
    server.signal("KILL");
    wait_until("the server is dead", || !server.alive());
    let incr = server.incr_aof();
    let soon = now_ms() + 600_000;
    let far = format!("1 write {} 7 7 9", i64::MAX);
    let reader = format!("1 read {soon} 8 8 9");
    let writer = format!("1 write {soon} 9 9 9");
    let token_above_fence = format!("1 read {soon} 9 8 9");
    let mut aof = std::fs::OpenOptions::new()
        .append(true)
        .open(&incr)
        .expect("open aof");
    use std::io::Write;
    aof.write_all(&resp(&["SELECT", "0"])).expect("write");
    for (key, owner, state) in [
        ("far", "o", far.as_str()),
        ("rw", "r", reader.as_str()),
        ("rw", "w", writer.as_str()),
        ("above", "o", token_above_fence.as_str()),
    ] {
        aof.write_all(&resp(&["LOCK.SYNC", key, owner, state]))
            .expect("write");
    }
    drop(aof);
    server.crash_and_restart();
    let mut c = server.client();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        query(&mut c, &["PING"]).expect("PING within 5 s"),
        Value::SimpleString("PONG".into())
    );
    assert_eq!(
        int(&mut c, &["EXISTS", "far"]),
        0,
        "the far expiry was refused"
    );
    assert_eq!(
        int(&mut c, &["EXISTS", "above"]),
        0,
        "the token above the fence was refused"
    );
    assert_eq!(
        holders(&mut c, "rw"),
        vec![("r".to_string(), 1)],
        "no writer beside a reader"
    );
    assert_eq!(holders(&mut c, "current"), vec![("me".to_string(), 1)]);
    assert!(exercise(&mut c, "rw", "r").is_empty());
}

/// An RDB file holding a lock value that breaks an invariant (a holder expiry of 2^63 ms,
/// written over a saved one, the file's checksum recomputed) makes the load fail: the server
/// logs why and exits, as with any corrupt RDB, instead of starting with the value (on a build
/// without the checks it started and then spun on the value's timer).
#[test]
fn an_rdb_with_a_value_that_breaks_an_invariant_fails_the_load() {
    let server = Server::start_with(&["--dbfilename", "dump.rdb"]);
    let mut c = server.client();
    int(
        &mut c,
        &["LOCK.ACQUIRE", "held", "o", "600000", "LOCKDELAY", "1000"],
    );
    int(&mut c, &["LOCK.ACQUIRE", "other", "o", "600000"]);
    let payload = dump(&mut c, "held");
    assert_eq!(query(&mut c, &["SAVE"]).unwrap(), Value::Okay);
    let rdb_path = server.dir.join("dump.rdb");
    let mut rdb = std::fs::read(&rdb_path).expect("dump.rdb");
    // The value's bytes are the DUMP payload without its type byte and trailer.
    let value = &payload[1..payload.len() - 10];
    let forged_payload = with_expiry(&payload, 1 << 63);
    let forged = &forged_payload[1..forged_payload.len() - 10];
    assert_eq!(value.len(), forged.len(), "the same field widths");
    let at = rdb
        .windows(value.len())
        .position(|w| w == value)
        .expect("the value in the RDB file");
    rdb[at..at + value.len()].copy_from_slice(forged);
    let body = rdb.len() - 8;
    let crc = crc64(&rdb[..body]);
    rdb[body..].copy_from_slice(&crc.to_le_bytes());

    // A second server, on the forged file, in a directory of its own (the first server's goes
    // with it).
    let dir = std::env::temp_dir().join(format!(
        "redis-lock-forged-rdb-{}-{}",
        std::process::id(),
        server.port
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dump.rdb"), &rdb).unwrap();
    drop(c);
    let port = server.port;
    drop(server);
    let mut child = std::process::Command::new(server_binary())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--dbfilename",
            "dump.rdb",
        ])
        .arg("--dir")
        .arg(&dir)
        .args(["--logfile", "lock.log", "--loadmodule"])
        .arg(module_path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the server");
    let status = poll_within(PATIENCE, || matches!(child.try_wait(), Ok(Some(_))));
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("lock.log")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.is_ok(),
        "the server started from the forged RDB instead of failing the load; its log:\n{log}"
    );
    assert!(
        log.contains("bad lock value in RDB: expiry out of range"),
        "the reason is logged:\n{log}"
    );
}
