//! Both clients over TLS (cargo feature `tls`, rustls) against a real TLS listener: a throwaway
//! CA and server certificate are made with the `openssl` command-line tool.
#![cfg(all(feature = "tls", feature = "tokio"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod common;
/// redis 1.x counts the TLS handshake (and its loading of the system's root certificates) in
/// the connect timeout; unoptimised ring in a test build on a busy machine needs well over the
/// kit's 200 ms for it.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

use redis::TlsCertificates;
use redis_lock_client::aio::AsyncLockClient;
use redis_lock_client::{Acquire, LockClient, LockError};
use redis_lock_testkit::{holders, wait_until, waiting, Server};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command-line tool");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it, in a fresh directory.
fn certificates() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "redis-lock-client-tls-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=redis-lock test CA",
        ],
    );
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server with the module and a TLS listener (clients need no certificate); also its plain
/// port, for the test's own checks. Returns the server, the TLS port and the CA in PEM.
fn tls_server() -> (Server, u16, Vec<u8>) {
    let dir = certificates();
    let port = free_port();
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let (cert, key, ca) = (path("server.crt"), path("server.key"), path("ca.crt"));
    let port_arg = port.to_string();
    let server = Server::start_with(&[
        "--tls-port",
        &port_arg,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    let pem = std::fs::read(dir.join("ca.crt")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (server, port, pem)
}

fn tls_client(port: u16, ca: &[u8]) -> redis::Client {
    redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}/"),
        TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.to_vec()),
        },
    )
    .unwrap()
}

#[test]
fn the_sync_client_locks_and_waits_over_tls() {
    let (server, port, ca) = tls_server();
    let client = LockClient::from_client(&tls_client(port, &ca), TIMEOUT).unwrap();
    let ttl = Duration::from_secs(10);
    let g = client.try_lock("t", ttl).unwrap();
    let mut plain = server.client();
    assert_eq!(holders(&mut plain, "t"), vec![(g.owner().to_string(), 1)]);
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .lock("t", ttl, Duration::from_secs(8))
                .map(|g| g.fencing_token())
        })
    };
    wait_until("waiter queued", || waiting(&mut plain, "t") == 1);
    let first = g.fencing_token().unwrap();
    g.release().unwrap();
    assert!(waiter.join().unwrap().unwrap().unwrap() > first);

    // Without the CA the server's certificate is not trusted: nothing is sent.
    let untrusted = LockClient::new(&format!("rediss://127.0.0.1:{port}/"), TIMEOUT).unwrap();
    let e = untrusted.try_lock("t", ttl).unwrap_err();
    assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
    // A bound hold has connections of its own that do not speak TLS: refused, not sent in
    // clear.
    let e = client.acquire("t", Acquire::write(ttl).bind()).unwrap_err();
    assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("do not support"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_locks_and_waits_over_tls() {
    let (server, port, ca) = tls_server();
    let client = AsyncLockClient::from_client(tls_client(port, &ca), TIMEOUT);
    let ttl = Duration::from_secs(10);
    let g = client.try_lock("t", ttl).await.unwrap();
    let info = client.info("t").await.unwrap().unwrap();
    assert_eq!(info.hold_count(g.owner()), 1);
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("t", ttl, Duration::from_secs(8))
                .await
                .map(|g| g.fencing_token())
        })
    };
    let mut plain = server.client();
    wait_until("waiter queued", || waiting(&mut plain, "t") == 1);
    let first = g.fencing_token().unwrap();
    g.release().await.unwrap();
    assert!(waiter.await.unwrap().unwrap() > Some(first));

    let untrusted = AsyncLockClient::new(&format!("rediss://127.0.0.1:{port}/"), TIMEOUT).unwrap();
    let e = untrusted.try_lock("t", ttl).await.unwrap_err();
    assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
}
