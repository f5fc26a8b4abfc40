//! What the module tells the server about itself: COMMAND DOCS (summary, complexity, since,
//! arguments), COMMAND INFO flags, the module version in MODULE LIST, and ACL categories, which
//! exist for module commands only on some servers (checked per server flavour).

use std::collections::HashMap;

use redis_lock_testkit::*;

/// A flat RESP2 array of name/value pairs (or a RESP3 map) as a map keyed by name.
fn pairs(v: &Value) -> HashMap<String, Value> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("name {other:?}"),
    };
    match v {
        Value::Array(items) => items
            .chunks(2)
            .map(|p| (text(&p[0]), p[1].clone()))
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        other => panic!("expected pairs, got {other:?}"),
    }
}

/// COMMAND DOCS for one command: its doc map.
fn docs(c: &mut Connection, command: &str) -> HashMap<String, Value> {
    let reply = query(c, &["COMMAND", "DOCS", command]).expect("COMMAND DOCS");
    let all = pairs(&reply);
    let doc = all
        .get(command)
        .unwrap_or_else(|| panic!("COMMAND DOCS {command}: nothing for it in {all:?}"));
    pairs(doc)
}

/// The arguments COMMAND DOCS lists, as (name, type, token, optional).
fn doc_args(doc: &HashMap<String, Value>) -> Vec<(String, String, Option<String>, bool)> {
    let Some(Value::Array(args)) = doc.get("arguments") else {
        panic!("no arguments in {doc:?}");
    };
    args.iter()
        .map(|a| {
            let a = pairs(a);
            let optional = a
                .get("flags")
                .map(|f| value_texts(f).iter().any(|s| s == "optional"))
                .unwrap_or(false);
            (
                value_text(&a["name"]),
                value_text(&a["type"]),
                a.get("token").map(value_text),
                optional,
            )
        })
        .collect()
}

#[test]
fn command_docs_show_summary_complexity_since_and_arguments() {
    let server = Server::start();
    let mut c = server.client();
    // Every command came with the first version.
    let since = "0.1.0";
    for command in [
        "lock.acquire",
        "lock.rwread",
        "lock.semacquire",
        "lock.release",
        "lock.extend",
        "lock.info",
        "lock.sync",
    ] {
        let doc = docs(&mut c, command);
        for field in ["summary", "complexity", "since", "arguments"] {
            assert!(doc.contains_key(field), "{command}: no {field} in {doc:?}");
        }
        assert!(
            value_text(&doc["summary"]).len() > 20,
            "{command} summary: {doc:?}"
        );
        assert!(
            value_text(&doc["complexity"]).starts_with("O("),
            "{command}"
        );
        assert_eq!(value_text(&doc["since"]), since, "{command}");
        assert_eq!(value_text(&doc["module"]), "lock", "{command}");
        let args = doc_args(&doc);
        assert_eq!(args[0].0, "key", "{command}");
        assert_eq!(args[0].1, "key", "{command}");
    }
    let with_wait: Vec<(String, String, Option<String>, bool)> = vec![
        ("key".into(), "key".into(), None, false),
        ("owner".into(), "string".into(), None, false),
        ("ttl".into(), "integer".into(), None, false),
        (
            "timeout".into(),
            "integer".into(),
            Some("WAIT".into()),
            true,
        ),
    ];
    let bind = (
        "bind".to_string(),
        "pure-token".to_string(),
        Some("BIND".to_string()),
        true,
    );
    let lock_delay = (
        "ms".to_string(),
        "integer".to_string(),
        Some("LOCKDELAY".to_string()),
        true,
    );
    let mut rwread = with_wait.clone();
    rwread.push(bind.clone());
    let mut acquire = rwread.clone();
    acquire.push(lock_delay);
    assert_eq!(doc_args(&docs(&mut c, "lock.acquire")), acquire);
    assert_eq!(doc_args(&docs(&mut c, "lock.rwread")), rwread);
    let release = doc_args(&docs(&mut c, "lock.release"));
    assert_eq!(
        release.last(),
        Some(&(
            "all".to_string(),
            "pure-token".to_string(),
            Some("ALL".to_string()),
            true
        ))
    );
}

#[test]
fn waiting_commands_carry_the_blocking_flag_and_the_module_version_follows_the_crate() {
    let server = Server::start();
    let mut c = server.client();
    for (command, blocking) in [
        ("lock.acquire", true),
        ("lock.rwread", true),
        ("lock.semacquire", true),
        ("lock.release", false),
        ("lock.extend", false),
        ("lock.info", false),
    ] {
        let reply = query(&mut c, &["COMMAND", "INFO", command]).expect("COMMAND INFO");
        let Value::Array(outer) = reply else {
            panic!("{reply:?}")
        };
        let Some(Value::Array(info)) = outer.first() else {
            panic!("{outer:?}")
        };
        let flags = value_texts(&info[2]);
        assert_eq!(
            flags.iter().any(|f| f == "blocking"),
            blocking,
            "{command}: {flags:?}"
        );
        // The key is declared: cluster routing and ACL key patterns see it.
        let words: &[&str] = match command {
            "lock.info" => &["COMMAND", "GETKEYS", command, "k1"],
            "lock.semacquire" => &["COMMAND", "GETKEYS", command, "k1", "o", "2", "1000"],
            _ => &["COMMAND", "GETKEYS", command, "k1", "o", "1000"],
        };
        let keys = query(&mut c, words).expect("GETKEYS");
        assert_eq!(value_texts(&keys), vec!["k1".to_string()], "{command}");
    }

    let expected: i64 = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse::<i64>().expect("numeric version"))
        .fold(0, |acc, p| acc * 100 + p);
    let Value::Array(modules) = query(&mut c, &["MODULE", "LIST"]).expect("MODULE LIST") else {
        panic!("MODULE LIST")
    };
    let lock = modules
        .iter()
        .map(pairs)
        .find(|m| value_text(&m["name"]) == "lock")
        .expect("module lock listed");
    assert_eq!(lock["ver"], Value::Int(expected));
    // This release's number, and INFO says the same with the encoding it writes.
    assert_eq!(expected, 400);
    assert_eq!(info_field(&mut c, "module_version"), 400);
    assert_eq!(info_field(&mut c, "encoding_version"), 3);
    let modules = info_section(&mut c, "modules");
    let line = modules
        .get("module")
        .expect("INFO modules lists the module");
    assert!(line.starts_with("name=lock,ver=400,"), "{line}");
}

/// A connection authenticated as a fresh user with the given ACL rules.
fn user_connection(
    server: &Server,
    admin: &mut Connection,
    name: &str,
    rules: &[&str],
) -> Connection {
    let mut setuser = vec!["ACL", "SETUSER", name, "reset", "on", "nopass", "~*"];
    setuser.extend_from_slice(rules);
    assert_eq!(
        query(admin, &setuser).expect("ACL SETUSER"),
        Value::Okay,
        "{setuser:?}"
    );
    let mut c = server.client();
    assert_eq!(
        query(&mut c, &["AUTH", name, "any"]).expect("AUTH"),
        Value::Okay
    );
    c
}

/// Whether the user may run the command: a NOPERM reply means no; any other reply (even an
/// error from the command itself) means the ACL let it through.
fn allowed(c: &mut Connection, words: &[&str]) -> bool {
    match query(c, words) {
        Err(e) => e.code() != Some("NOPERM"),
        Ok(_) => true,
    }
}

#[test]
fn acl_categories_where_the_server_has_them_and_names_everywhere() {
    let server = Server::start();
    let mut admin = server.client();
    let flavor = flavor(&mut admin);
    let acquire = ["LOCK.ACQUIRE", "k", "o", "1000"];
    let rwread = ["LOCK.RWREAD", "r", "o", "1000"];
    let semacquire = ["LOCK.SEMACQUIRE", "s", "o", "2", "1000"];
    let release = ["LOCK.RELEASE", "k", "nobody"];
    let extend = ["LOCK.EXTEND", "k", "nobody", "1000"];
    let info = ["LOCK.INFO", "k"];
    let sync = ["LOCK.SYNC", "k", "o", "x"];

    // Granting by name works on every server.
    let mut named = user_connection(
        &server,
        &mut admin,
        "named",
        &[
            "+lock.acquire",
            "+lock.rwread",
            "+lock.semacquire",
            "+lock.release",
            "+lock.extend",
            "+lock.info",
        ],
    );
    for words in [&acquire[..], &rwread, &semacquire, &release, &extend, &info] {
        assert!(allowed(&mut named, words), "{words:?} by name");
    }
    assert!(!allowed(&mut named, &sync));

    let mut writer = user_connection(&server, &mut admin, "writer", &["+@write"]);
    let mut reader = user_connection(&server, &mut admin, "reader", &["+@read"]);
    if flavor.has_module_acl_categories() {
        for words in [&acquire[..], &rwread, &semacquire, &release, &extend] {
            assert!(
                allowed(&mut writer, words),
                "{flavor:?}: {words:?} in @write"
            );
        }
        assert!(
            allowed(&mut reader, &info),
            "{flavor:?}: LOCK.INFO in @read"
        );
        assert!(!allowed(&mut reader, &acquire));
        // The internal command is @admin @dangerous, not @write.
        assert!(
            !allowed(&mut writer, &sync),
            "{flavor:?}: LOCK.SYNC in @write"
        );
        let mut blocking = user_connection(&server, &mut admin, "blocking", &["+@blocking"]);
        assert!(allowed(&mut blocking, &acquire));
        assert!(allowed(&mut blocking, &rwread));
        assert!(allowed(&mut blocking, &semacquire));
        assert!(!allowed(&mut blocking, &release));
    } else {
        // Redis 7.0: module commands belong to no category.
        assert!(!allowed(&mut writer, &acquire), "{flavor:?}");
        assert!(!allowed(&mut reader, &info), "{flavor:?}");
    }

    let own = query(
        &mut admin,
        &[
            "ACL", "SETUSER", "own", "reset", "on", "nopass", "~*", "+@lock",
        ],
    );
    if flavor.has_module_own_category() {
        assert_eq!(own, Ok(Value::Okay), "{flavor:?}");
        let mut own = user_connection(&server, &mut admin, "own", &["+@lock"]);
        for words in [&acquire[..], &rwread, &semacquire, &release, &extend, &info] {
            assert!(allowed(&mut own, words), "{flavor:?}: {words:?} in @lock");
        }
        assert!(!allowed(&mut own, &sync), "LOCK.SYNC is not in @lock");
        assert!(!allowed(&mut own, &["SET", "k2", "v"]));
    } else {
        assert!(own.is_err(), "{flavor:?}: @lock should not exist: {own:?}");
    }
}
