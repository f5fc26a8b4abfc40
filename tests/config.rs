//! Module configuration: load-line arguments set the defaults, `lock.*` config-file lines and
//! `CONFIG SET` override them, and what `CONFIG REWRITE` saved is what a restart reads.

use redis_lock_testkit::*;

fn config_get(c: &mut Connection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(c)
        .unwrap_or_else(|e| panic!("CONFIG GET {name}: {e}"));
    assert_eq!(pair.len(), 2, "CONFIG GET {name}: {pair:?}");
    pair[1].clone()
}

/// A server started from a config file whose `loadmodule` line carries `load_args`, followed
/// by the lines `extra`.
fn server_from_file(load_args: &str, extra: &str) -> Result<Server, String> {
    let text = format!(
        "loadmodule {} {load_args}\n{extra}\n",
        module_path().display()
    );
    ServerBuilder::new().config_text(text).start()
}

#[test]
fn a_config_file_line_beats_the_load_line_argument() {
    let server = server_from_file("max-waiters 5000", "lock.max-waiters 10000").unwrap();
    let mut c = server.client();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "10000");
    // The other one, not in the file, keeps its own default.
    assert_eq!(config_get(&mut c, "lock.max-total-waiters"), "1000000");
}

#[test]
fn a_load_line_argument_alone_sets_the_value() {
    let server = server_from_file(
        "max-waiters 5000 max-total-waiters 70000 refuse-when-evictable yes",
        "",
    )
    .unwrap();
    let mut c = server.client();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "5000");
    assert_eq!(config_get(&mut c, "lock.max-total-waiters"), "70000");
    assert_eq!(config_get(&mut c, "lock.refuse-when-evictable"), "yes");
}

#[test]
fn a_value_saved_by_config_rewrite_survives_a_restart() {
    let mut server = server_from_file("max-waiters 5000", "").unwrap();
    let mut c = server.client();
    query(&mut c, &["CONFIG", "SET", "lock.max-waiters", "7000"]).unwrap();
    query(&mut c, &["CONFIG", "REWRITE"]).unwrap();
    let file = std::fs::read_to_string(server.dir.join("redis.conf")).unwrap();
    assert!(file.contains("lock.max-waiters 7000"), "{file}");
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "7000");

    // Set back to the load line's value: REWRITE keeps the line that is already in the file
    // and writes the value into it (Redis does so for every setting whose line the file has;
    // docs/commands.md said before version 4 that the line was removed), and the restart reads
    // that value.
    query(&mut c, &["CONFIG", "SET", "lock.max-waiters", "5000"]).unwrap();
    query(&mut c, &["CONFIG", "REWRITE"]).unwrap();
    let file = std::fs::read_to_string(server.dir.join("redis.conf")).unwrap();
    assert!(file.contains("lock.max-waiters 5000"), "{file}");
    assert!(!file.contains("lock.max-waiters 7000"), "{file}");
    server.crash_and_restart();
    let mut c = server.client();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "5000");
}

#[test]
fn bad_load_line_arguments_fail_the_start_with_the_reason_in_the_log() {
    for (index, (args, reason)) in [
        ("MAX-WAITERS 5", "names are lowercase: max-waiters"),
        ("max-waiters 0", "must be an integer from 1 to"),
        ("max-waiters 5 max-waiters 6", "given twice"),
        ("max-waiters", "name value pairs"),
        ("refuse-when-evictable on", "must be yes or no"),
        ("no-such-thing 1", "unknown module argument"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = std::env::temp_dir().join(format!(
            "redis-lock-badargs-{}-{}",
            std::process::id(),
            index
        ));
        let _ = std::fs::create_dir_all(&dir);
        let log = dir.join("server.log");
        let _ = std::fs::remove_file(&log);
        let started = server_from_file(args, &format!("logfile {}", log.display()));
        assert!(started.is_err(), "{args:?} was accepted");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(text.contains(reason), "{args:?}: log says {text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
