//! Issue 24, "one error type": a server without the module gives `LockError::ModuleMissing`,
//! whose message says how to load it, from the sync and the async client; the same situation
//! (nothing listening, a paused server, a malformed URL) gives the same error, variant and
//! text, sync and async.
#![cfg(feature = "tokio")]

use std::time::Duration;

mod common;
use common::*;

use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{LockClient, LockError};
use redis_lock_testkit::Server;

const TTL: Duration = Duration::from_secs(10);

fn assert_module_missing<T>(what: &str, result: Result<T, LockError>) {
    match result {
        Err(e @ LockError::ModuleMissing { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("loadmodule"),
                "{what}: says how to load it: {text}"
            );
        }
        Err(e) => panic!("{what}: expected ModuleMissing, got {e:?} ({e})"),
        Ok(_) => panic!("{what}: expected ModuleMissing, got a guard"),
    }
}

#[test]
fn a_server_without_the_module_gives_module_missing_sync_and_async() {
    let plain = server_without_module();
    let client = LockClient::new(&url(&plain), TIMEOUT).unwrap();
    assert_module_missing("sync try_lock", client.try_lock("m", TTL));
    assert_module_missing("sync lock", client.lock("m", TTL, Duration::from_secs(1)));
    multi_thread_runtime().block_on(async {
        let aio = AsyncLockClient::new(&url(&plain), TIMEOUT).unwrap();
        assert_module_missing("async try_lock", aio.try_lock("m", TTL).await);
        assert_module_missing(
            "async lock",
            aio.lock("m", TTL, Duration::from_secs(1)).await,
        );
    });
}

/// The sync and the async client's errors for one acquire against `url`.
fn both_errors(url: &str) -> (LockError, LockError) {
    let sync = match LockClient::new(url, TIMEOUT).and_then(|c| c.try_lock("s", TTL)) {
        Err(e) => e,
        Ok(_) => panic!("sync: a guard"),
    };
    let not_sync = multi_thread_runtime().block_on(async {
        match AsyncLockClient::new(url, TIMEOUT) {
            Ok(c) => match c.try_lock("s", TTL).await {
                Err(e) => e,
                Ok(_) => panic!("async: a guard"),
            },
            Err(e) => e,
        }
    });
    (sync, not_sync)
}

fn assert_same(what: &str, (sync, not_sync): (LockError, LockError)) {
    eprintln!("{what}: sync {sync} / async {not_sync}");
    assert_eq!(
        std::mem::discriminant(&sync),
        std::mem::discriminant(&not_sync),
        "{what}: sync {sync:?} / async {not_sync:?}"
    );
    // The server's own text quotes the request's arguments, the random owner among them.
    assert_eq!(
        without_owners(&sync.to_string()),
        without_owners(&not_sync.to_string()),
        "{what}"
    );
}

/// `text` with every run of 32 hex digits (a random owner) replaced by `<owner>`.
fn without_owners(text: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    for c in text.chars() {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        out.push_str(if run.len() == 32 { "<owner>" } else { &run });
        run.clear();
        out.push(c);
    }
    out.push_str(if run.len() == 32 { "<owner>" } else { &run });
    out
}

#[test]
fn the_same_situation_gives_the_same_error_sync_and_async() {
    // Nothing listening: a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = both_errors(&format!("redis://127.0.0.1:{port}/"));
    assert!(
        matches!(refused.0, LockError::Unreachable { .. }),
        "{:?}",
        refused.0
    );
    assert_same("connection refused", refused);

    // A paused server (accepts, never answers).
    let server = Server::start();
    server.signal("STOP");
    let paused = both_errors(&url(&server));
    server.signal("CONT");
    assert!(
        matches!(paused.0, LockError::Unreachable { .. }),
        "{:?}",
        paused.0
    );
    assert_same("paused server", paused);

    // A malformed URL: the constructors' error.
    let malformed = both_errors("not a url");
    assert!(
        matches!(malformed.0, LockError::Config { .. }),
        "{:?}",
        malformed.0
    );
    assert_same("malformed URL", malformed);

    // No module.
    let plain = server_without_module();
    assert_same("no module", both_errors(&url(&plain)));
}
