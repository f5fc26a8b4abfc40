//! Issue 35 item 5: the client checks its own holds with `LOCK.INFO key OWNER owner` (one
//! entry, O(1) on the server whatever the number of holders), never with the plain
//! `LOCK.INFO key` (O(holders)): the watcher's re-reads after an invalidation (one per owner
//! among a key's guards), `hold_count()`, and the look at a server after a refused extend.
//! `MONITOR` on the server shows what the client sent.
//!
//! A server with an older module (0.3.0) answers the owner form with "wrong number of
//! arguments": the client then uses the plain form for that server, remembers it, and its
//! checks keep working. Those tests load the old build from `REDIS_LOCK_OLD_MODULE`
//! (default `/tmp/base-module/libredis_lock.so`) and are skipped, saying so, when there is
//! none.
#![cfg(feature = "tokio")]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockClient, LossCause};
use redis_lock_testkit::{query, wait_until, Server, ServerBuilder};

const TTL: Duration = Duration::from_secs(30);

/// The commands a server runs, as `MONITOR` prints them, collected by a thread.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn on(server: &Server) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        reader.read_line(&mut first).expect("MONITOR reply");
        assert!(first.starts_with("+OK"), "MONITOR answered {first:?}");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                sink.lock().unwrap().push(line.trim_end().to_string());
                line.clear();
            }
        });
        Monitor { lines }
    }

    /// The `LOCK.INFO` commands seen so far, each as its quoted arguments
    /// (`"LOCK.INFO" "k" "OWNER" "o"`).
    fn infos(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| {
                let args = &l[l.find("] ")? + 2..];
                args.to_ascii_lowercase()
                    .starts_with("\"lock.info\"")
                    .then(|| args.to_string())
            })
            .collect()
    }

    fn owner_reads(&self, key: &str, owner: &str) -> usize {
        let want = format!("\"LOCK.INFO\" \"{key}\" \"OWNER\" \"{owner}\"");
        self.infos().iter().filter(|l| **l == want).count()
    }

    fn plain_reads(&self, key: &str) -> usize {
        let want = format!("\"LOCK.INFO\" \"{key}\"");
        self.infos().iter().filter(|l| **l == want).count()
    }

    /// Waits for a command the client sends after everything it sent before (a `PING` of a
    /// raw connection would not order against the client's connections): here a marker
    /// `LOCK.INFO` of a key nobody uses, sent by the test itself.
    fn settle(&self, server: &Server, marker: &str) {
        let mut c = raw_conn(server.port);
        query(&mut c, &["LOCK.INFO", marker]).expect("LOCK.INFO");
        wait_until("MONITOR shows the marker", || self.plain_reads(marker) >= 1);
    }
}

fn raw_conn(port: u16) -> redis_lock_testkit::Connection {
    redis_lock_testkit::connect(port).expect("a raw connection")
}

/// How many `LOCK.INFO` the server refused before running them (an older module's arity
/// error for the owner form): `rejected_calls` of `INFO commandstats`.
fn refused_info_calls(server: &Server) -> usize {
    let mut c = raw_conn(server.port);
    let stats = redis_lock_testkit::text_reply(query(&mut c, &["INFO", "commandstats"]))
        .expect("INFO commandstats");
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_lock.info:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("rejected_calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn old_module() -> Option<PathBuf> {
    let set = std::env::var_os("REDIS_LOCK_OLD_MODULE").map(PathBuf::from);
    // Named but missing is a broken set-up (`make test` builds it), not a reason to skip.
    if let Some(path) = &set {
        assert!(
            path.exists(),
            "REDIS_LOCK_OLD_MODULE={} does not exist (make old-module builds it)",
            path.display()
        );
    }
    let path = set.unwrap_or_else(|| PathBuf::from("/tmp/base-module/libredis_lock.so"));
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipped: no module 0.3.0 build at {} (set REDIS_LOCK_OLD_MODULE)",
            path.display()
        );
        None
    }
}

fn old_server(module: PathBuf) -> Server {
    ServerBuilder::new()
        .module(module)
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn sync_checks_read_the_owners_own_entry() {
    let server = Server::start();
    let monitor = Monitor::on(&server);
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut raw = raw_conn(server.port);

    // Two reader guards of the client (two random owners) and a reader of someone else's.
    let a = client.acquire("k", Acquire::read(TTL)).unwrap();
    let b = client.acquire("k", Acquire::read(TTL)).unwrap();
    query(&mut raw, &["LOCK.RWREAD", "k", "other", "30000"]).expect("RWREAD");
    assert_eq!(a.hold_count().unwrap(), 1);
    assert_eq!(b.hold_count().unwrap(), 1);
    wait_until("the watcher re-read each owner's hold", || {
        monitor.owner_reads("k", a.owner()) >= 2 && monitor.owner_reads("k", b.owner()) >= 2
    });
    assert!(!a.is_lost() && !b.is_lost(), "others' reads take nothing");

    // Gone: the watcher's re-reads find both guards' holds gone.
    query(&mut raw, &["DEL", "k"]).expect("DEL");
    wait_until("both guards lost", || a.is_lost() && b.is_lost());
    assert_eq!(a.loss().unwrap().cause, LossCause::Deleted);

    // Taken by another owner in one step: the owner's entry is gone, `holders_count` says
    // someone else holds the key.
    let c = client
        .acquire("t", Acquire::write(TTL).owner("mine"))
        .unwrap();
    query(&mut raw, &["MULTI"]).unwrap();
    query(&mut raw, &["LOCK.RELEASE", "t", "mine", "ALL"]).unwrap();
    query(&mut raw, &["LOCK.ACQUIRE", "t", "theirs", "30000"]).unwrap();
    query(&mut raw, &["EXEC"]).expect("EXEC");
    wait_until("the guard lost", || c.is_lost());
    assert_eq!(c.loss().unwrap().cause, LossCause::Taken);

    // A refused extend looks at the server: with the owner form too.
    let d = client.lock("e", TTL, Duration::ZERO).unwrap();
    query(&mut raw, &["DEL", "e"]).expect("DEL");
    assert!(d.extend().is_err());

    monitor.settle(&server, "marker");
    assert!(monitor.owner_reads("t", "mine") >= 1);
    assert!(monitor.owner_reads("e", d.owner()) >= 1);
    let plain: Vec<String> = monitor
        .infos()
        .into_iter()
        .filter(|l| !l.contains("\"OWNER\"") && !l.contains("\"marker\""))
        .collect();
    assert!(plain.is_empty(), "plain LOCK.INFO sent: {plain:?}");
}

#[test]
fn async_checks_read_the_owners_own_entry() {
    let server = Server::start();
    let monitor = Monitor::on(&server);
    let rt = multi_thread_runtime();
    rt.block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let mut raw = raw_conn(server.port);
        let a = client.acquire("k", Acquire::read(TTL)).await.unwrap();
        let b = client.acquire("k", Acquire::read(TTL)).await.unwrap();
        query(&mut raw, &["LOCK.RWREAD", "k", "other", "30000"]).expect("RWREAD");
        assert_eq!(a.hold_count().await.unwrap(), 1);
        assert_eq!(b.hold_count().await.unwrap(), 1);
        let (oa, ob) = (a.owner().to_string(), b.owner().to_string());
        wait_until("the watcher re-read each owner's hold", || {
            monitor.owner_reads("k", &oa) >= 2 && monitor.owner_reads("k", &ob) >= 2
        });
        assert!(!a.is_lost() && !b.is_lost());
        query(&mut raw, &["DEL", "k"]).expect("DEL");
        wait_until("both guards lost", || a.is_lost() && b.is_lost());
        assert_eq!(a.loss().unwrap().cause, LossCause::Deleted);

        let c = client
            .acquire("t", Acquire::write(TTL).owner("mine"))
            .await
            .unwrap();
        query(&mut raw, &["MULTI"]).unwrap();
        query(&mut raw, &["LOCK.RELEASE", "t", "mine", "ALL"]).unwrap();
        query(&mut raw, &["LOCK.ACQUIRE", "t", "theirs", "30000"]).unwrap();
        query(&mut raw, &["EXEC"]).expect("EXEC");
        wait_until("the guard lost", || c.is_lost());
        assert_eq!(c.loss().unwrap().cause, LossCause::Taken);

        let d = client.lock("e", TTL, Duration::ZERO).await.unwrap();
        query(&mut raw, &["DEL", "e"]).expect("DEL");
        assert!(d.extend().await.is_err());
        monitor.settle(&server, "marker");
        assert!(monitor.owner_reads("t", "mine") >= 1);
        assert!(monitor.owner_reads("e", d.owner()) >= 1);
    });
    let plain: Vec<String> = monitor
        .infos()
        .into_iter()
        .filter(|l| !l.contains("\"OWNER\"") && !l.contains("\"marker\""))
        .collect();
    assert!(plain.is_empty(), "plain LOCK.INFO sent: {plain:?}");
}

#[test]
fn redlock_checks_read_the_owners_own_entry() {
    let servers = three();
    let monitors: Vec<Monitor> = servers.iter().map(Monitor::on).collect();
    let redlock = redlock(&servers);
    let g = redlock.acquire("r", Acquire::write(TTL)).unwrap();
    assert_eq!(g.hold_count().unwrap(), 1);
    for s in &servers {
        let mut raw = raw_conn(s.port);
        query(&mut raw, &["DEL", "r"]).expect("DEL");
    }
    wait_until("the guard lost", || g.is_lost());
    for (s, m) in servers.iter().zip(&monitors) {
        m.settle(s, "marker");
        let plain: Vec<String> = m
            .infos()
            .into_iter()
            .filter(|l| !l.contains("\"OWNER\"") && !l.contains("\"marker\""))
            .collect();
        assert!(plain.is_empty(), "plain LOCK.INFO sent: {plain:?}");
    }
    assert!(
        monitors[0].owner_reads("r", g.owner()) >= 2,
        "hold_count, re-read"
    );
}

#[test]
fn sync_checks_work_on_an_older_module() {
    let Some(module) = old_module() else {
        return;
    };
    let server = old_server(module);
    let monitor = Monitor::on(&server);
    let client = LockClient::new(&url(&server), TIMEOUT).unwrap();
    let mut raw = raw_conn(server.port);
    let a = client.acquire("k", Acquire::read(TTL)).unwrap();
    let b = client.acquire("k", Acquire::read(TTL)).unwrap();
    assert_eq!(a.hold_count().unwrap(), 1);
    assert_eq!(b.hold_count().unwrap(), 1);
    query(&mut raw, &["LOCK.RWREAD", "k", "other", "30000"]).expect("RWREAD");
    query(&mut raw, &["DEL", "k"]).expect("DEL");
    wait_until("both guards lost", || a.is_lost() && b.is_lost());
    assert_eq!(a.loss().unwrap().cause, LossCause::Deleted);

    let c = client
        .acquire("t", Acquire::write(TTL).owner("mine"))
        .unwrap();
    assert_eq!(c.hold_count().unwrap(), 1);
    query(&mut raw, &["MULTI"]).unwrap();
    query(&mut raw, &["LOCK.RELEASE", "t", "mine", "ALL"]).unwrap();
    query(&mut raw, &["LOCK.ACQUIRE", "t", "theirs", "30000"]).unwrap();
    query(&mut raw, &["EXEC"]).expect("EXEC");
    wait_until("the guard lost", || c.is_lost());
    assert_eq!(c.loss().unwrap().cause, LossCause::Taken);
    assert_eq!(c.hold_count().unwrap(), 0);

    monitor.settle(&server, "marker");
    // The owner form was tried (and refused) before the client settled on the plain one: by
    // the first check, the watcher's first re-read, and re-reads already on their way (how many
    // of those depends on timing); never after. (`MONITOR` does not show a command refused for
    // its arity: the server's command stats count it.)
    let tried = refused_info_calls(&server);
    assert!((1..=4).contains(&tried), "owner form tried {tried} times");
    assert!(monitor.plain_reads("t") >= 2, "{:?}", monitor.infos());
    // Learnt for good: more checks and a loss on another key send no owner form.
    let d = client
        .acquire("u", Acquire::write(TTL).owner("again"))
        .unwrap();
    for _ in 0..20 {
        assert_eq!(d.hold_count().unwrap(), 1);
    }
    query(&mut raw, &["DEL", "u"]).expect("DEL");
    wait_until("the guard lost", || d.is_lost());
    monitor.settle(&server, "marker2");
    assert_eq!(
        refused_info_calls(&server),
        tried,
        "the owner form was sent again"
    );
}

#[test]
fn async_checks_work_on_an_older_module() {
    let Some(module) = old_module() else {
        return;
    };
    let server = old_server(module);
    let monitor = Monitor::on(&server);
    let rt = multi_thread_runtime();
    rt.block_on(async {
        let client = AsyncLockClient::new(&url(&server), TIMEOUT).unwrap();
        let mut raw = raw_conn(server.port);
        let a = client.acquire("k", Acquire::read(TTL)).await.unwrap();
        let b = client.acquire("k", Acquire::read(TTL)).await.unwrap();
        assert_eq!(a.hold_count().await.unwrap(), 1);
        assert_eq!(b.hold_count().await.unwrap(), 1);
        query(&mut raw, &["LOCK.RWREAD", "k", "other", "30000"]).expect("RWREAD");
        query(&mut raw, &["DEL", "k"]).expect("DEL");
        wait_until("both guards lost", || a.is_lost() && b.is_lost());
        assert_eq!(a.loss().unwrap().cause, LossCause::Deleted);

        let c = client
            .acquire("t", Acquire::write(TTL).owner("mine"))
            .await
            .unwrap();
        assert_eq!(c.hold_count().await.unwrap(), 1);
        query(&mut raw, &["MULTI"]).unwrap();
        query(&mut raw, &["LOCK.RELEASE", "t", "mine", "ALL"]).unwrap();
        query(&mut raw, &["LOCK.ACQUIRE", "t", "theirs", "30000"]).unwrap();
        query(&mut raw, &["EXEC"]).expect("EXEC");
        wait_until("the guard lost", || c.is_lost());
        assert_eq!(c.loss().unwrap().cause, LossCause::Taken);
        assert_eq!(c.hold_count().await.unwrap(), 0);
        monitor.settle(&server, "marker");
        // As in the sync test: tried before the client learnt the plain form (a number that
        // depends on timing), never after.
        let tried = refused_info_calls(&server);
        assert!((1..=4).contains(&tried), "owner form tried {tried} times");
        assert!(monitor.plain_reads("t") >= 2, "{:?}", monitor.infos());
        let d = client
            .acquire("u", Acquire::write(TTL).owner("again"))
            .await
            .unwrap();
        for _ in 0..20 {
            assert_eq!(d.hold_count().await.unwrap(), 1);
        }
        query(&mut raw, &["DEL", "u"]).expect("DEL");
        wait_until("the guard lost", || d.is_lost());
        monitor.settle(&server, "marker2");
        assert_eq!(
            refused_info_calls(&server),
            tried,
            "the owner form was sent again"
        );
    });
}
