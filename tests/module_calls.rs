//! Lock commands called by another module through `RedisModule_Call`: that call runs on a
//! temporary client with no user of its own, which the module must not ask for its user's
//! name (the server dereferences the missing user and dies). Such a call is unrestricted, as
//! `RedisModule_Call` itself is. Also: LOCK.QUEUES is refused inside scripts (`deny-script`).

use std::path::PathBuf;
use std::process::Command;

use redis_lock_testkit::*;

/// Where the redis-module crate's copy of `redismodule.h` is (cargo fetched it to build the
/// module, so it is there wherever the module was built).
fn redismodule_header_dir() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let registry = home.join("registry/src");
    for index in std::fs::read_dir(&registry).expect("cargo registry sources") {
        let dir = index
            .expect("entry")
            .path()
            .join("redis-module-2.0.8/src/include");
        if dir.join("redismodule.h").exists() {
            return dir;
        }
    }
    panic!(
        "redismodule.h of redis-module 2.0.8 not found under {}",
        registry.display()
    );
}

/// Builds tests/support/call_module.c into a shared library once per test binary.
fn call_module() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("call_module.so");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/call_module.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg("-I")
        .arg(redismodule_header_dir())
        .arg(&source)
        .status()
        .expect("cc");
    assert!(status.success(), "building {}", source.display());
    out
}

fn server_with_call_module() -> Server {
    let helper = call_module();
    ServerBuilder::new()
        .args(["--loadmodule".to_string(), helper.display().to_string()])
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn lock_queues_called_by_another_module_answers_and_the_server_lives() {
    let server = server_with_call_module();
    let mut c = server.client();
    int(&mut c, &["LOCK.ACQUIRE", "qk", "holder", "60000"]);
    let w = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "qk", "w", "60000", "WAIT", "5000"],
        1,
    );
    let reply = query(&mut c, &["CALLHELPER.CALL", "LOCK.QUEUES"]);
    let Ok(Value::Array(rows)) = reply else {
        panic!("CALLHELPER.CALL LOCK.QUEUES: {reply:?}");
    };
    // Unrestricted, as RedisModule_Call is: the one queue is listed.
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        query(&mut c, &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
    int(&mut c, &["LOCK.RELEASE", "qk", "holder"]);
    assert!(matches!(w.join(), Ok(Value::Int(_))));
}

#[test]
fn lock_commands_called_by_another_module_work() {
    let server = server_with_call_module();
    let mut c = server.client();
    // A call from a module cannot block: WAIT acts as without WAIT, as in a script.
    int(&mut c, &["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let reply = query(
        &mut c,
        &[
            "CALLHELPER.CALL",
            "LOCK.ACQUIRE",
            "k",
            "m",
            "60000",
            "WAIT",
            "1000",
        ],
    );
    assert_eq!(reply, Ok(Value::Nil));
    let token = query(
        &mut c,
        &["CALLHELPER.CALL", "LOCK.ACQUIRE", "k2", "m", "60000"],
    );
    assert!(matches!(token, Ok(Value::Int(t)) if t > 0), "{token:?}");
    assert_eq!(
        query(&mut c, &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
}

#[test]
fn lock_queues_is_refused_inside_scripts() {
    let server = Server::start();
    let mut c = server.client();
    let e = err(&mut c, &["EVAL", "return redis.call('LOCK.QUEUES')", "0"]);
    assert!(e.to_lowercase().contains("not allowed from script"), "{e}");
}
