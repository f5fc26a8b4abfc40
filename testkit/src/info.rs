//! `INFO` read into maps: one parser for every section (and for `CLUSTER INFO`, which has the
//! same `name:value` lines), typed helpers, and the server flavour.

use std::collections::HashMap;

use redis::Connection;

/// Parses `INFO`-style text (`name:value` lines, `# Section` headers, CRLF or LF) into a map
/// from field name to its value, trimmed. If a name appears twice the first one counts.
pub fn parse_info(text: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = line.split_once(':') {
            map.entry(name.to_string())
                .or_insert_with(|| value.trim().to_string());
        }
    }
    map
}

/// The raw text of `INFO <section>`, panicking if the command fails.
pub fn info_text(c: &mut Connection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(c)
        .unwrap_or_else(|e| panic!("INFO {section}: {e:?}"))
}

/// `INFO <section>` as a map from field name to value.
pub fn info_section(c: &mut Connection, section: &str) -> HashMap<String, String> {
    parse_info(&info_text(c, section))
}

/// A numeric field of `INFO <section>`, panicking when it is missing or not a number.
pub fn info_u64(c: &mut Connection, section: &str, field: &str) -> u64 {
    let text = info_text(c, section);
    parse_info(&text)
        .get(field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field}: in INFO {section}:\n{text}"))
}

/// An `INFO lock` field (Redis prefixes module fields with the module name: `lock_<field>`).
pub fn info_field(c: &mut Connection, field: &str) -> u64 {
    info_u64(c, "lock", &format!("lock_{field}"))
}

/// Calls of the module's commands on this server so far: every `cmdstat_lock.*` of INFO
/// commandstats.
pub fn lock_calls(c: &mut Connection) -> u64 {
    parse_info(&info_text(c, "commandstats"))
        .iter()
        .filter(|(k, _)| k.starts_with("cmdstat_lock."))
        .filter_map(|(_, v)| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// The server's `used_memory` (INFO memory), in bytes.
pub fn used_memory(c: &mut Connection) -> i64 {
    info_u64(c, "memory", "used_memory") as i64
}

/// No AOF rewrite running or scheduled (both read from one `INFO persistence`).
pub fn aof_rewrite_finished(c: &mut Connection) -> bool {
    let p = info_section(c, "persistence");
    p.get("aof_rewrite_in_progress").map(String::as_str) == Some("0")
        && p.get("aof_rewrite_scheduled").map(String::as_str) == Some("0")
}

/// Which server the tests run against, read from `INFO server`, for the few behaviours that
/// differ between servers (ACL categories for module commands, memory per blocked client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Redis, with its version as (major, minor).
    Redis(u32, u32),
    /// Valkey, with its own version as (major, minor).
    Valkey(u32, u32),
}

impl Flavor {
    /// Redis 7.2+ and every Valkey let modules put commands in ACL categories.
    pub fn has_module_acl_categories(self) -> bool {
        match self {
            Flavor::Redis(major, minor) => (major, minor) >= (7, 2),
            Flavor::Valkey(..) => true,
        }
    }

    /// Redis 7.4+ and Valkey 8+ let modules add categories of their own (`@lock`).
    pub fn has_module_own_category(self) -> bool {
        match self {
            Flavor::Redis(major, minor) => (major, minor) >= (7, 4),
            Flavor::Valkey(major, _) => major >= 8,
        }
    }
}

/// The server flavour and version of a connection's server.
pub fn flavor(c: &mut Connection) -> Flavor {
    let server = info_section(c, "server");
    let major_minor = |v: &str| {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    };
    match server.get("valkey_version") {
        Some(v) => {
            let (major, minor) = major_minor(v);
            Flavor::Valkey(major, minor)
        }
        None => {
            let (major, minor) = major_minor(server.get("redis_version").expect("redis_version"));
            Flavor::Redis(major, minor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_info;

    #[test]
    fn parses_fields_skips_headers_and_keeps_the_first_duplicate() {
        let text = "# Memory\r\nused_memory:1234\r\nexecutable:/usr/bin/redis-server\r\n\r\n\
                    # Lock\r\nlock_locks_held:2\r\nused_memory:9\r\n";
        let m = parse_info(text);
        assert_eq!(m["used_memory"], "1234");
        assert_eq!(m["executable"], "/usr/bin/redis-server");
        assert_eq!(m["lock_locks_held"], "2");
        assert_eq!(m.len(), 3);
    }
}
