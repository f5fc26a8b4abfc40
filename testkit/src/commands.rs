//! Commands given as words, and `LOCK.INFO` read into maps.

use std::collections::HashMap;

use redis::{Connection, Value};

/// Runs a command given as words.
pub fn cmd(words: &[&str]) -> redis::Cmd {
    let mut c = redis::cmd(words[0]);
    for w in &words[1..] {
        c.arg(*w);
    }
    c
}

pub fn query(c: &mut Connection, words: &[&str]) -> redis::RedisResult<Value> {
    cmd(words).query(c)
}

/// The reply as an integer token, panicking with the reply otherwise.
pub fn int(c: &mut Connection, words: &[&str]) -> i64 {
    match query(c, words) {
        Ok(Value::Int(i)) => i,
        other => panic!("{words:?}: expected an integer, got {other:?}"),
    }
}

pub fn is_nil(c: &mut Connection, words: &[&str]) -> bool {
    matches!(query(c, words), Ok(Value::Nil))
}

/// The error text of a reply, panicking if it was not an error.
pub fn err(c: &mut Connection, words: &[&str]) -> String {
    match query(c, words) {
        Err(e) => format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
            .trim()
            .to_string(),
        Ok(v) => panic!("{words:?}: expected an error, got {v:?}"),
    }
}

/// LOCK.INFO as a map from field name to value (RESP2 flat array), or None for nil.
pub fn info(c: &mut Connection, key: &str) -> Option<HashMap<String, Value>> {
    info_with(c, key, &[])
}

/// `LOCK.INFO key [options]` (e.g. `["OWNER", "o"]`, `["COUNT", "5"]`) as a map, or None for nil.
pub fn info_with(
    c: &mut Connection,
    key: &str,
    options: &[&str],
) -> Option<HashMap<String, Value>> {
    let mut words = vec!["LOCK.INFO", key];
    words.extend_from_slice(options);
    match query(c, &words).expect("LOCK.INFO") {
        Value::Nil => None,
        Value::Array(items) => {
            let mut map = HashMap::new();
            for pair in items.chunks(2) {
                let name = match &pair[0] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
                    Value::SimpleString(s) => s.clone(),
                    other => panic!("field name {other:?}"),
                };
                map.insert(name, pair[1].clone());
            }
            Some(map)
        }
        Value::Map(items) => Some(
            items
                .into_iter()
                .map(|(k, v)| match k {
                    Value::BulkString(b) => (String::from_utf8_lossy(&b).to_string(), v),
                    Value::SimpleString(s) => (s, v),
                    other => panic!("field name {other:?}"),
                })
                .collect(),
        ),
        other => panic!("LOCK.INFO reply {other:?}"),
    }
}

pub fn info_int(c: &mut Connection, key: &str, field: &str) -> i64 {
    match info(c, key).and_then(|m| m.get(field).cloned()) {
        Some(Value::Int(i)) => i,
        other => panic!("{field}: {other:?}"),
    }
}

/// The owners holding `key`, with their counts, sorted by owner.
pub fn holders(c: &mut Connection, key: &str) -> Vec<(String, i64)> {
    let Some(map) = info(c, key) else {
        return Vec::new();
    };
    let Some(Value::Array(hs)) = map.get("holders").cloned() else {
        panic!("holders field missing");
    };
    hs.into_iter()
        .map(|h| match h {
            Value::Array(parts) => match (&parts[0], &parts[1]) {
                (Value::BulkString(o), Value::Int(n)) => {
                    (String::from_utf8_lossy(o).to_string(), *n)
                }
                other => panic!("holder {other:?}"),
            },
            other => panic!("holder {other:?}"),
        })
        .collect()
}

/// Waiters queued on `key` (0 when the key does not exist).
pub fn waiting(c: &mut Connection, key: &str) -> i64 {
    match info(c, key) {
        None => 0,
        Some(m) => match m.get("waiting") {
            Some(Value::Int(i)) => *i,
            other => panic!("waiting: {other:?}"),
        },
    }
}

/// The client id of a connection.
pub fn client_id(c: &mut Connection) -> i64 {
    int(c, &["CLIENT", "ID"])
}

/// Grants `n` fresh locks `{prefix}:{i}` (owner `owner`, 10 minutes) and one read lock
/// `{prefix}:shared`, and returns the largest token replied.
pub fn grant_many(c: &mut Connection, prefix: &str, n: usize) -> i64 {
    let mut max = 0;
    for i in 0..n {
        let key = format!("{prefix}:{i}");
        max = max.max(int(c, &["LOCK.ACQUIRE", &key, "owner", "600000"]));
    }
    let shared = format!("{prefix}:shared");
    max = max.max(int(c, &["LOCK.RWREAD", &shared, "reader", "600000"]));
    max
}

/// A bulk or simple string reply as text, panicking with the reply otherwise.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// An array (or set) of strings as texts, panicking with the reply otherwise.
pub fn value_texts(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().map(value_text).collect(),
        other => panic!("expected an array, got {other:?}"),
    }
}

/// The next `n` keyspace events from `pubsub` (subscribed to `__keyevent@<db>__:...` channels):
/// (event name, key), in arrival order. Waits up to the pubsub's read timeout for each.
pub fn next_events(pubsub: &mut redis::PubSub<'_>, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|_| {
            let msg = pubsub.get_message().expect("keyspace event");
            let key: String = msg.get_payload().expect("event payload");
            let channel = msg.get_channel_name();
            let name = channel.rsplit(':').next().unwrap_or(channel).to_string();
            (name, key)
        })
        .collect()
}

/// `LOCK.QUEUES [args]` rows as (key, db, waiting, oldest wait ms).
pub fn lock_queues(c: &mut Connection, args: &[&str]) -> Vec<(String, i64, i64, i64)> {
    queue_rows(c, args)
        .into_iter()
        .map(|r| (r.key, r.db, r.waiting, r.oldest_ms))
        .collect()
}

/// One LOCK.QUEUES row in full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueRow {
    pub key: String,
    pub db: i64,
    pub waiting: i64,
    pub oldest_ms: i64,
    /// How many holders the key has.
    pub holding: i64,
    /// Up to 10 of them as (owner, ms held, -1 when unknown), sorted by owner.
    pub holders: Vec<(String, i64)>,
}

/// `LOCK.QUEUES [args]` rows, each checked for its shape: [key, db, waiting, oldest, holding,
/// [[owner, held], ...]].
pub fn queue_rows(c: &mut Connection, args: &[&str]) -> Vec<QueueRow> {
    let mut words = vec!["LOCK.QUEUES"];
    words.extend_from_slice(args);
    match query(c, &words).expect("LOCK.QUEUES") {
        Value::Array(rows) => rows
            .iter()
            .map(|r| match r {
                Value::Array(p) => match &p[..] {
                    [k, Value::Int(db), Value::Int(n), Value::Int(age), Value::Int(holding), Value::Array(hs)] => {
                        QueueRow {
                            key: value_text(k),
                            db: *db,
                            waiting: *n,
                            oldest_ms: *age,
                            holding: *holding,
                            holders: hs
                                .iter()
                                .map(|h| match h {
                                    Value::Array(pair) => match &pair[..] {
                                        [o, Value::Int(held)] => (value_text(o), *held),
                                        other => panic!("holder {other:?}"),
                                    },
                                    other => panic!("holder {other:?}"),
                                })
                                .collect(),
                        }
                    }
                    other => panic!("row {other:?}"),
                },
                other => panic!("row {other:?}"),
            })
            .collect(),
        other => panic!("LOCK.QUEUES reply {other:?}"),
    }
}

/// Each holder of `key` as (owner, count, ttl ms, held ms or -1), from LOCK.INFO, sorted by owner.
pub fn holder_entries(c: &mut Connection, key: &str) -> Vec<(String, i64, i64, i64)> {
    let Some(map) = info(c, key) else {
        return Vec::new();
    };
    let Some(Value::Array(hs)) = map.get("holders").cloned() else {
        panic!("holders field missing");
    };
    hs.iter()
        .map(|h| match h {
            Value::Array(parts) => match &parts[..] {
                [o, Value::Int(n), Value::Int(ttl), Value::Int(held), ..] => {
                    (value_text(o), *n, *ttl, *held)
                }
                other => panic!("holder entry {other:?}"),
            },
            other => panic!("holder entry {other:?}"),
        })
        .collect()
}
