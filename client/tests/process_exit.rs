//! Issue 24, "nothing held past its process": a child process (this test binary run again,
//! for one `#[ignore]`d child test, with the server and key in its environment) takes a lock
//! with a 30 s ttl, says so on stdout, and ends; the parent then polls `LOCK.INFO` until the
//! key has no holder. The bound is 100 ms from the child's exit: no query sent 100 ms
//! or more after the exit may see the key held (a bound on when a query is sent, so that a
//! loaded machine delaying the answers cannot fail it; see `freed_after_exit`).
//!
//! - async: a guard alive at the end of `#[tokio::main]`-shaped code (the runtime is built as
//!   the macro builds it, the guard is dropped as `main`'s future completes, then the runtime
//!   is dropped); a guard that outlives the runtime; a guard owned by a task still running
//!   when the runtime shuts down;
//! - sync: a guard alive when the child's `main` returns;
//! - `bind()` holders (sync and async) whose process is SIGKILLed: freed at once by the
//!   server.
//!
//! The child tests do nothing unless `CHILD_URL` is set, so a run with `--include-ignored`
//! leaves them harmless.
#![cfg(feature = "tokio")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockClient, Watchdog};
use redis_lock_testkit::{holders, Server};

const CHILD_URL: &str = "REDIS_LOCK_TEST_CHILD_URL";
const CHILD_KEY: &str = "REDIS_LOCK_TEST_CHILD_KEY";
const TTL: Duration = Duration::from_secs(30);
/// The bound from the child's exit to a free key.
const FREE_BOUND: Duration = Duration::from_millis(100);
/// How long the parent keeps looking (longer than the ttl, so that a failure says how long
/// the lock really stayed).
const LOOK_FOR: Duration = Duration::from_secs(35);

/// The server and key, when this process is a child started by a parent test.
fn child_setup() -> Option<(String, String)> {
    Some((
        std::env::var(CHILD_URL).ok()?,
        std::env::var(CHILD_KEY).ok()?,
    ))
}

/// Tells the parent the lock is held (it waits for this line).
fn say_held(owner: &str) {
    let mut out = std::io::stdout();
    writeln!(out, "HELD {owner}").unwrap();
    out.flush().unwrap();
}

/// Starts this test binary again, running only the child test `name`.
fn spawn_child(name: &str, server: &Server, key: &str) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--include-ignored"])
        .env(CHILD_URL, url(server))
        .env(CHILD_KEY, key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let owner = loop {
        line.clear();
        let n = lines.read_line(&mut line).expect("child stdout");
        assert!(n > 0, "the child ended before taking the lock");
        if let Some(owner) = line.trim().strip_prefix("HELD ") {
            break owner.to_string();
        }
    };
    // Keep draining its stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut rest = String::new();
        while lines.read_line(&mut rest).map(|n| n > 0).unwrap_or(false) {
            rest.clear();
        }
    });
    (child, owner)
}

/// After the child ended (at `exited`): the key must have no holder for any `LOCK.INFO` sent
/// `FREE_BOUND` or more after the exit. The bound is on when a query was *sent*, not on when
/// its answer came: the server handles the child's release (sent before it exited) or its
/// closed socket (closed by the kernel before `wait` returned) ahead of any later command, so
/// a query sent after the bound sees a free key however long a loaded machine keeps the server
/// (or this thread) waiting for a CPU; a lock held until its ttl (30 s) fails it. The time to
/// the first answer that saw the key free is printed.
fn freed_after_exit(server: &Server, key: &str, exited: Instant, what: &str) {
    let mut c = server.client();
    let mut held_past_bound = None;
    let took = poll_1ms(LOOK_FOR, || {
        let sent = exited.elapsed();
        let free = holders(&mut c, key).is_empty();
        if !free && sent >= FREE_BOUND && held_past_bound.is_none() {
            held_past_bound = Some(sent);
        }
        free
    })
    .map(|_| exited.elapsed());
    match took {
        Some(d) => {
            eprintln!(
                "{what}: free {:.1} ms after the child's exit",
                d.as_secs_f64() * 1e3
            );
            if let Some(sent) = held_past_bound {
                panic!(
                    "{what}: still held for a query sent {sent:?} after the exit (bound \
                     {FREE_BOUND:?}); free {d:?} after it"
                );
            }
        }
        None => panic!(
            "{what}: still held {LOOK_FOR:?} after the child's exit: {:?}",
            holders(&mut c, key)
        ),
    }
}

/// Runs child test `name` to its end, then checks the lock is free within the bound.
fn child_exits_then_free(name: &str, what: &str) {
    let server = Server::start();
    let key = "exit";
    let (mut child, owner) = spawn_child(name, &server, key);
    let status = child.wait().expect("wait for the child");
    let exited = Instant::now();
    assert!(status.success(), "{what}: child {status}");
    let _ = owner;
    freed_after_exit(&server, key, exited, what);
}

/// Starts child test `name`, SIGKILLs it while it holds the lock, and checks the lock is free
/// within the bound.
fn child_killed_then_free(name: &str, what: &str) {
    let server = Server::start();
    let key = "killed";
    let (mut child, owner) = spawn_child(name, &server, key);
    assert_eq!(holders(&mut server.client(), key), vec![(owner, 1)]);
    child.kill().expect("SIGKILL the child");
    child.wait().expect("wait for the child");
    freed_after_exit(&server, key, Instant::now(), what);
}

#[test]
fn an_async_guard_alive_at_the_end_of_tokio_main_is_free_once_the_process_exits() {
    child_exits_then_free(
        "child_tokio_main",
        "guard alive at the end of #[tokio::main]",
    );
}

#[test]
fn an_async_guard_that_outlives_its_runtime_is_free_once_the_process_exits() {
    child_exits_then_free(
        "child_guard_outlives_runtime",
        "async guard (with a watchdog) dropped after its runtime",
    );
}

#[test]
fn an_async_guard_owned_by_a_task_at_runtime_shutdown_is_free_once_the_process_exits() {
    child_exits_then_free(
        "child_guard_in_task_at_shutdown",
        "async guard owned by a task still running at runtime shutdown",
    );
}

#[test]
fn a_sync_guard_alive_when_main_returns_is_free_once_the_process_exits() {
    child_exits_then_free("child_sync_main", "sync guard alive when main returns");
}

#[test]
fn a_sigkilled_sync_bind_holder_frees_the_lock_at_once() {
    child_killed_then_free("child_sync_bound_holder", "SIGKILLed sync bind() holder");
}

#[test]
fn a_sigkilled_async_bind_holder_frees_the_lock_at_once() {
    child_killed_then_free("child_async_bound_holder", "SIGKILLed async bind() holder");
}

// The children. Each does nothing unless started by a parent test above.

/// `#[tokio::main] async fn main() { let guard = ...; ... }`, written out as the macro
/// expands it: the guard is dropped as the future completes, inside `block_on`; then the
/// runtime is dropped and the process exits.
#[test]
#[ignore = "child process of an_async_guard_alive_at_the_end_of_tokio_main_..."]
fn child_tokio_main() {
    let Some((url, key)) = child_setup() else {
        return;
    };
    multi_thread_runtime().block_on(async {
        let client = AsyncLockClient::new(&url, TIMEOUT).unwrap();
        let _guard = client.try_lock(&key, TTL).await.unwrap();
        say_held(_guard.owner());
    });
}

#[test]
#[ignore = "child process of an_async_guard_that_outlives_its_runtime_..."]
fn child_guard_outlives_runtime() {
    let Some((url, key)) = child_setup() else {
        return;
    };
    let rt = multi_thread_runtime();
    let guard = rt.block_on(async {
        let client = AsyncLockClient::new(&url, TIMEOUT).unwrap();
        client
            .acquire(&key, Acquire::write(TTL).watchdog(Watchdog::new()))
            .await
            .unwrap()
    });
    say_held(guard.owner());
    drop(rt);
    drop(guard);
}

#[test]
#[ignore = "child process of an_async_guard_owned_by_a_task_at_runtime_shutdown_..."]
fn child_guard_in_task_at_shutdown() {
    let Some((url, key)) = child_setup() else {
        return;
    };
    multi_thread_runtime().block_on(async {
        let client = AsyncLockClient::new(&url, TIMEOUT).unwrap();
        let guard = client.try_lock(&key, TTL).await.unwrap();
        say_held(guard.owner());
        tokio::spawn(async move {
            let _guard = guard;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
    });
}

#[test]
#[ignore = "child process of a_sync_guard_alive_when_main_returns_..."]
fn child_sync_main() {
    let Some((url, key)) = child_setup() else {
        return;
    };
    let client = LockClient::new(&url, TIMEOUT).unwrap();
    let guard = client.try_lock(&key, TTL).unwrap();
    say_held(guard.owner());
}

#[test]
#[ignore = "child process of a_sigkilled_sync_bind_holder_..."]
fn child_sync_bound_holder() {
    let Some((url, key)) = child_setup() else {
        return;
    };
    let client = LockClient::new(&url, TIMEOUT).unwrap();
    let guard = client.acquire(&key, Acquire::write(TTL).bind()).unwrap();
    say_held(guard.owner());
    std::thread::sleep(Duration::from_secs(60)); // killed long before
}

#[test]
#[ignore = "child process of a_sigkilled_async_bind_holder_..."]
fn child_async_bound_holder() {
    let Some((url, key)) = child_setup() else {
        return;
    };
    multi_thread_runtime().block_on(async {
        let client = AsyncLockClient::new(&url, TIMEOUT).unwrap();
        let guard = client
            .acquire(&key, Acquire::write(TTL).bind())
            .await
            .unwrap();
        say_held(guard.owner());
        tokio::time::sleep(Duration::from_secs(60)).await; // killed long before
    });
}
