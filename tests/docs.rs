//! The documentation against the server: docs/commands.md names exactly the commands, options,
//! INFO fields, errors, settings and keyspace events the module has, and module.conf.example
//! names every setting and event. Each check reads the doc generically (tables, synopses,
//! backticked replies), so adding a field or an option to the module means adding it to the
//! doc, nothing here. Also: every relative link and anchor in README.md and docs/*.md resolves,
//! and every `ACL SETUSER` line of docs/operations.md grants what it says on this server.
//!
//! `REDIS_LOCK_DOCS_ROOT` points the tests at another copy of the repository's README.md,
//! docs/ and module.conf.example (to show that they fail when a name is deleted).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::Connection;
use redis_lock_testkit::*;

const LONG: &str = "600000";

/// Commands that only test builds have (`--features test-hooks`): never documented.
fn is_test_hook(name: &str) -> bool {
    name.starts_with("lock.debug-")
}

fn root() -> PathBuf {
    match std::env::var_os("REDIS_LOCK_DOCS_ROOT") {
        Some(r) => PathBuf::from(r),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn commands_md() -> String {
    read("docs/commands.md")
}

// ---------------------------------------------------------------------------------------------
// Reading markdown

/// A heading and the lines under it, up to the next heading of any level.
struct Section {
    level: usize,
    title: String,
    body: Vec<String>,
}

/// The document cut at its headings (lines inside code fences are never headings).
fn sections(doc: &str) -> Vec<Section> {
    let mut out = vec![Section {
        level: 0,
        title: String::new(),
        body: Vec::new(),
    }];
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !fenced && hashes > 0 && line[hashes..].starts_with(' ') {
            out.push(Section {
                level: hashes,
                title: line[hashes..].trim().to_string(),
                body: Vec::new(),
            });
        } else if let Some(s) = out.last_mut() {
            s.body.push(line.to_string());
        }
    }
    out
}

/// The body of the section whose title starts with `title`, with its subsections.
fn section_text(doc: &str, title: &str) -> String {
    let all = sections(doc);
    let Some(i) = all.iter().position(|s| s.title.starts_with(title)) else {
        panic!("docs/commands.md has no section \"{title}\"")
    };
    let mut text = all[i].body.join("\n");
    for s in &all[i + 1..] {
        if s.level <= all[i].level {
            break;
        }
        text.push('\n');
        text.push_str(&s.body.join("\n"));
    }
    text
}

/// The rows of the markdown tables in `text`, as cells (header and separator rows left out).
fn table_rows(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let t = line.trim();
        if !t.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells: Vec<String> = t
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect();
        if !in_table {
            in_table = true; // the header row
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        rows.push(cells);
    }
    rows
}

/// The backticked spans of `text`, with runs of white space (line breaks) made one space.
fn code_spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut prose = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let mut parts = prose.split('`');
    parts.next();
    while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
        out.push(inside.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    out
}

/// Every `LOCK.NAME` the text mentions, lowercased.
fn lock_command_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(i) = text[at..].find("LOCK.") {
        let start = at + i;
        let mut end = start + 5;
        while end < bytes.len() && (bytes[end].is_ascii_uppercase() || bytes[end] == b'-') {
            end += 1;
        }
        let name = text[start..end].trim_end_matches('-');
        if name.len() > 5 && (start == 0 || !bytes[start - 1].is_ascii_alphanumeric()) {
            out.insert(name.to_ascii_lowercase());
        }
        at = end;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Talking to the server

/// The reply, or the error as "CODE detail".
fn reply(c: &mut Connection, words: &[&str]) -> Result<Value, String> {
    query(c, words).map_err(|e| {
        format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
            .trim()
            .to_string()
    })
}

fn strings_of(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().map(value_text).collect(),
        other => panic!("expected an array, got {other:?}"),
    }
}

/// The server's LOCK.* commands (COMMAND LIST FILTERBY PATTERN), test hooks left out.
fn server_commands(c: &mut Connection) -> BTreeSet<String> {
    let v = query(c, &["COMMAND", "LIST", "FILTERBY", "PATTERN", "lock.*"]).unwrap();
    strings_of(&v)
        .into_iter()
        .map(|n| n.to_ascii_lowercase())
        .filter(|n| !is_test_hook(n))
        .collect()
}

/// Every `token` COMMAND DOCS gives for a command's arguments (nested blocks included).
fn doc_tokens(v: &Value, out: &mut BTreeSet<String>) {
    let items = match v {
        Value::Array(items) => items.clone(),
        Value::Map(pairs) => pairs
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect(),
        _ => return,
    };
    for pair in items.windows(2) {
        if let (Some(k), Some(v)) = (text_of(&pair[0]), text_of(&pair[1])) {
            if k == "token" {
                out.insert(v.to_ascii_uppercase());
            }
        }
    }
    for item in &items {
        doc_tokens(item, out);
    }
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn value_is_nonempty(v: &Value) -> bool {
    match v {
        Value::Array(items) => !items.is_empty() && items.iter().any(value_is_nonempty),
        Value::Map(pairs) => !pairs.is_empty(),
        Value::Nil => false,
        _ => true,
    }
}

// ---------------------------------------------------------------------------------------------
// (1) commands

#[test]
fn every_documented_command_exists_and_every_command_is_documented() {
    let doc = commands_md();
    let server = Server::start();
    let mut c = server.client();
    let documented = lock_command_names(&doc);
    let served = server_commands(&mut c);
    assert!(served.len() >= 7, "the server lists {served:?}");
    let missing: Vec<_> = served.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "commands the server has that docs/commands.md never names: {missing:?}"
    );
    let unknown: Vec<_> = documented.difference(&served).collect();
    assert!(
        unknown.is_empty(),
        "docs/commands.md names commands the server does not have: {unknown:?}"
    );
    // The summary table at the top lists each one.
    let summary: BTreeSet<String> = table_rows(&sections(&doc)[1].body.join("\n"))
        .iter()
        .filter_map(|row| row.first())
        .flat_map(|cell| lock_command_names(cell))
        .collect();
    assert_eq!(summary, served, "the summary table of docs/commands.md");
    // Each has its own section with a synopsis, and the server describes it.
    for name in &served {
        assert!(
            synopsis(&doc, name).is_some(),
            "docs/commands.md has no \"## {}\" section with a synopsis",
            name.to_ascii_uppercase()
        );
        let docs = query(&mut c, &["COMMAND", "DOCS", name]).unwrap();
        assert!(value_is_nonempty(&docs), "COMMAND DOCS {name}: {docs:?}");
        let info = query(&mut c, &["COMMAND", "INFO", name]).unwrap();
        assert!(value_is_nonempty(&info), "COMMAND INFO {name}: {info:?}");
    }
    // The test hooks, when this build has them, are the only commands left out on purpose.
    let all = strings_of(
        &query(
            &mut c,
            &["COMMAND", "LIST", "FILTERBY", "PATTERN", "lock.*"],
        )
        .unwrap(),
    );
    for hook in all.iter().filter(|n| is_test_hook(n)) {
        assert!(
            !doc.to_ascii_lowercase().contains(hook.as_str()),
            "test hook {hook} is in the user's reference"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (2) options

/// One option of a synopsis: `[WAIT timeout]` is ("WAIT", ["timeout"]), `[BIND]` ("BIND", []),
/// `[BY AGE|LENGTH]` ("BY", ["AGE|LENGTH"]).
#[derive(Clone, Debug)]
struct Opt {
    keyword: String,
    values: Vec<String>,
}

#[derive(Debug)]
struct Synopsis {
    positional: Vec<String>,
    options: Vec<Opt>,
}

/// The synopsis line of `name` (the first line starting with the command's name inside a code
/// fence of its own `## LOCK.NAME` section), parsed.
fn synopsis(doc: &str, name: &str) -> Option<Synopsis> {
    let upper = name.to_ascii_uppercase();
    let section = sections(doc)
        .into_iter()
        .find(|s| s.level == 2 && s.title.split_whitespace().next() == Some(upper.as_str()))?;
    let mut fenced = false;
    let line = section.body.iter().find_map(|l| {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        let t = l.trim();
        (fenced && t.split_whitespace().next() == Some(upper.as_str())).then(|| t.to_string())
    })?;
    let rest = line[upper.len()..].trim();
    let (plain, bracketed) = match rest.find('[') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let positional = plain.split_whitespace().map(str::to_string).collect();
    let mut options = Vec::new();
    for group in bracketed.split('[').skip(1) {
        let inner = group.split(']').next().unwrap_or("");
        let mut words = inner.split_whitespace();
        let keyword = words.next().unwrap_or("").to_string();
        assert!(
            !keyword.is_empty() && keyword.chars().all(|c| c.is_ascii_uppercase()),
            "{upper}: option [{inner}] does not start with its KEYWORD"
        );
        options.push(Opt {
            keyword,
            values: words.map(str::to_string).collect(),
        });
    }
    Some(Synopsis {
        positional,
        options,
    })
}

/// A valid value for a synopsis placeholder (a new placeholder in the doc needs one here).
fn sample(placeholder: &str, key: &str) -> String {
    match placeholder {
        "key" => key.to_string(),
        "owner" => "doc-owner".into(),
        "ttl" => LONG.into(),
        "capacity" => "3".into(),
        "timeout" => "50".into(),
        "ms" => "10".into(),
        "n" => "5".into(),
        "p" => "doc:".into(),
        other if other.contains('|') || other.chars().all(|c| c.is_ascii_uppercase()) => {
            other.split('|').next().unwrap_or(other).to_string()
        }
        other => panic!("no sample value for the synopsis placeholder `{other}`"),
    }
}

/// The words of one option with its values; `choice` picks among `A|B` alternatives.
fn option_words(opt: &Opt, key: &str, choice: usize) -> Vec<String> {
    let mut words = vec![opt.keyword.clone()];
    for v in &opt.values {
        if v.contains('|') {
            let alts: Vec<&str> = v.split('|').collect();
            words.push(alts[choice % alts.len()].to_string());
        } else {
            words.push(sample(v, key));
        }
    }
    words
}

/// Did the server take the arguments? Argument errors are all `ERR`; a reply or an error of
/// another kind (`NOTOWNER` for a release of a lock nobody holds) means they were accepted,
/// since every argument is checked before the key is looked at.
fn accepted(r: &Result<Value, String>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) => !e.starts_with("ERR"),
    }
}

fn words_ref(words: &[String]) -> Vec<&str> {
    words.iter().map(String::as_str).collect()
}

#[test]
fn every_documented_option_is_accepted_and_every_accepted_option_is_documented() {
    let doc = commands_md();
    let server = Server::start();
    let mut c = server.client();
    // Words to try as options: every upper-case word of the doc, and every token the server's
    // COMMAND DOCS lists for any lock command, and one nobody would use.
    let mut candidates: BTreeSet<String> = doc
        .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'))
        .filter(|w| w.len() >= 2 && w.chars().all(|c| c.is_ascii_uppercase() || c == '-'))
        .map(str::to_string)
        .collect();
    candidates.insert("NOSUCHOPTION".into());
    let served = server_commands(&mut c);
    let mut tokens_of = BTreeMap::new();
    for name in &served {
        let docs = query(&mut c, &["COMMAND", "DOCS", name]).unwrap();
        let mut tokens = BTreeSet::new();
        doc_tokens(&docs, &mut tokens);
        candidates.extend(tokens.iter().cloned());
        tokens_of.insert(name.clone(), tokens);
    }
    for name in &served {
        let tokens = &tokens_of[name];
        if name == "lock.sync" {
            // Internal: refused from clients whatever the arguments (checked with the errors).
            continue;
        }
        let syn = synopsis(&doc, name).expect("synopsis");
        let documented: BTreeSet<String> = syn.options.iter().map(|o| o.keyword.clone()).collect();
        let mut n = 0;
        let mut run = |c: &mut Connection, extra: &[String]| {
            n += 1;
            let key = format!("docs:opt:{name}:{n}");
            let mut words = vec![name.clone()];
            words.extend(syn.positional.iter().map(|p| sample(p, &key)));
            let base_len = words.len();
            for w in extra {
                // A placeholder that stands for the key in an option (none today) follows it.
                words.push(if w == "key" { key.clone() } else { w.clone() });
            }
            let r = reply(c, &words_ref(&words));
            (words[base_len..].to_vec(), words, r)
        };
        // The bare command, each option alone (each alternative of its value), and all of them
        // together in reverse order.
        let (_, words, r) = run(&mut c, &[]);
        assert!(accepted(&r), "{words:?} -> {r:?}");
        for opt in &syn.options {
            let choices = opt
                .values
                .iter()
                .map(|v| v.split('|').count())
                .max()
                .unwrap_or(1);
            for choice in 0..choices {
                let (_, words, r) = run(&mut c, &option_words(opt, "", choice));
                assert!(
                    accepted(&r),
                    "documented option refused: {words:?} -> {r:?}"
                );
            }
        }
        if syn.options.len() > 1 {
            // Options documented as excluding each other: the second of a pair is left out.
            const EXCLUSIVE: &[(&str, &str, &str)] = &[("LOCK.QUEUES", "PREFIX", "BY")];
            let mut taken: Vec<&str> = Vec::new();
            let mut all: Vec<String> = Vec::new();
            for o in syn.options.iter().rev() {
                let excluded = EXCLUSIVE.iter().any(|(cmd, a, b)| {
                    cmd.eq_ignore_ascii_case(name)
                        && ((o.keyword == *b && taken.contains(a))
                            || (o.keyword == *a && taken.contains(b)))
                });
                if !excluded {
                    taken.push(o.keyword.as_str());
                    all.extend(option_words(o, "", 0));
                }
            }
            let (_, words, r) = run(&mut c, &all);
            assert!(
                accepted(&r),
                "all options in another order: {words:?} -> {r:?}"
            );
        }
        // Commands of a fixed shape take no options at all.
        let arity = match query(&mut c, &["COMMAND", "INFO", name]).unwrap() {
            Value::Array(rows) => match rows.first() {
                Some(Value::Array(fields)) => match fields.get(1) {
                    Some(Value::Int(a)) => *a,
                    other => panic!("arity {other:?}"),
                },
                other => panic!("COMMAND INFO {other:?}"),
            },
            other => panic!("COMMAND INFO {other:?}"),
        };
        assert_eq!(
            arity < 0,
            !syn.options.is_empty(),
            "{name}: arity {arity} vs the documented options"
        );
        // No other word works as an option, alone or with a value.
        for word in &candidates {
            if documented.contains(word) {
                continue;
            }
            for extra in [vec![word.clone()], vec![word.clone(), "5".to_string()]] {
                let (_, words, r) = run(&mut c, &extra);
                assert!(
                    !accepted(&r),
                    "{name} accepts an option docs/commands.md does not list: {words:?} -> {r:?}"
                );
            }
        }
        // And COMMAND DOCS and the doc name the same option keywords.
        assert_eq!(
            tokens, &documented,
            "{name}: COMMAND DOCS tokens vs the options in docs/commands.md's synopsis"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (3) INFO fields

/// The field names of the INFO section's table, `<b>` expanded from the row's "b = 1, 5, ...".
fn documented_info_fields(doc: &str) -> BTreeSet<String> {
    let text = section_text(doc, "The INFO lock section");
    let mut out = BTreeSet::new();
    for row in table_rows(&text) {
        let Some(first) = row.first() else { continue };
        let meaning = row.get(1).cloned().unwrap_or_default();
        for name in code_spans(first) {
            if !name.starts_with("lock_") {
                continue;
            }
            if name.contains("<b>") {
                let after = meaning
                    .split("b = ")
                    .nth(1)
                    .unwrap_or_else(|| panic!("{name}: the row does not list b = ..."));
                let bounds: Vec<&str> = after
                    .split(", ")
                    .map(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit()))
                    .take_while(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                    .collect();
                assert!(!bounds.is_empty(), "{name}: no bounds in {meaning:?}");
                for b in bounds {
                    out.insert(name.replace("<b>", b));
                }
            } else {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn info_lock_fields_are_the_documented_ones() {
    let doc = commands_md();
    let documented = documented_info_fields(&doc);
    let server = Server::start();
    let mut c = server.client();
    let shown: BTreeSet<String> = info_section(&mut c, "lock").into_keys().collect();
    let undocumented: Vec<_> = shown.difference(&documented).collect();
    let absent: Vec<_> = documented.difference(&shown).collect();
    assert!(
        undocumented.is_empty() && absent.is_empty(),
        "INFO lock fields not in docs/commands.md's table: {undocumented:?}; \
         in the table but not in INFO lock: {absent:?}"
    );
    // The example output names only real fields.
    let section = section_text(&doc, "The INFO lock section");
    for line in section.lines() {
        if let Some((name, _)) = line.trim().split_once(':') {
            if name.starts_with("lock_") && !name.contains(' ') {
                assert!(shown.contains(name), "the INFO example shows {name}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// (4) errors

/// One documented error reply: its pieces between the doc's `...` elisions, code first.
#[derive(Debug)]
struct ErrorPattern {
    shown: String,
    pieces: Vec<String>,
}

impl ErrorPattern {
    fn parse(span: &str) -> Option<ErrorPattern> {
        let text = span.strip_prefix('-')?;
        let code: String = text
            .chars()
            .take_while(|c| c.is_ascii_uppercase())
            .collect();
        if code.len() < 2 || !text[code.len()..].starts_with(' ') {
            return None;
        }
        let pieces = text
            .split("...")
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        Some(ErrorPattern {
            shown: span.to_string(),
            pieces,
        })
    }

    /// `text` starts with the first piece and has the others after it, in order.
    fn matches(&self, text: &str) -> bool {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut at = 0;
        for (i, p) in self.pieces.iter().enumerate() {
            match text[at..].find(p.as_str()) {
                Some(0) => at += p.len(),
                Some(j) if i > 0 => at += j + p.len(),
                _ => return false,
            }
        }
        true
    }
}

/// The replies of the errors table (first column; `a` / `b` alternatives are separate).
fn documented_errors(doc: &str) -> Vec<ErrorPattern> {
    let text = section_text(doc, "Errors");
    let mut out = Vec::new();
    for row in table_rows(&text) {
        let first = row.first().cloned().unwrap_or_default();
        let parsed: Vec<ErrorPattern> = code_spans(&first)
            .iter()
            .filter_map(|s| ErrorPattern::parse(s))
            .collect();
        assert!(
            !parsed.is_empty(),
            "errors table row without a reply: {row:?}"
        );
        out.extend(parsed);
    }
    out
}

/// Documented errors this test does not provoke, and why: for these the text must be in the
/// module's source of replies instead.
const NOT_PROVOKED: &[(&str, &str)] = &[
    (
        "ERR the fencing-token counter is",
        "needs the counter at its end, which would refuse every later grant here; tests/fencing.rs provokes both texts",
    ),
    (
        "ERR LOCK.SYNC state carries a fencing token",
        "LOCK.SYNC is refused from clients; tests/fencing.rs loads an AOF that carries one",
    ),
    (
        "ERR LOCK.SYNC state conflicts",
        "LOCK.SYNC is refused from clients; a master or an AOF must send it",
    ),
    (
        "ERR the lock key vanished",
        "an internal consistency check that no command sequence reaches",
    ),
    (
        "ERR could not create the lock key",
        "an internal consistency check that no command sequence reaches",
    ),
    (
        "TRYAGAIN the key's hash slot",
        "needs a cluster whose slot changes hands: tests/slots.rs produces it",
    ),
];

/// The replies' texts in the module's source (src/errors.rs, the parser's messages).
fn source_reply_texts() -> Vec<String> {
    let mut out = Vec::new();
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["src/errors.rs", "core/src/parse.rs"] {
        let text = std::fs::read_to_string(here.join(file)).expect("source");
        for (i, literal) in text.split('"').enumerate() {
            if i % 2 == 1 {
                let code: String = literal
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase())
                    .collect();
                if code.len() >= 2 && literal[code.len()..].starts_with(' ') {
                    out.push(literal.to_string());
                }
            }
        }
    }
    out
}

fn server_has_test_hooks(c: &mut Connection) -> bool {
    let v = query(c, &["COMMAND", "LIST", "FILTERBY", "PATTERN", "lock.*"]).unwrap();
    strings_of(&v).iter().any(|n| is_test_hook(n))
}

/// Sends everything that should fail and returns every error text it got.
fn provoke_errors(server: &Server, c: &mut Connection) -> Vec<String> {
    let mut got = Vec::new();
    let long_owner = "o".repeat(1025);
    let simple: Vec<Vec<&str>> = vec![
        vec!["LOCK.ACQUIRE", "e:k", "o"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "abc"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "0"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "WAIT", "x"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "WAIT", "-1"],
        vec!["LOCK.ACQUIRE", "e:k", "", "1000"],
        vec!["LOCK.ACQUIRE", "e:k", &long_owner, "1000"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "FOO"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "BIND", "BIND"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "WAIT"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "LOCKDELAY", "x"],
        vec!["LOCK.ACQUIRE", "e:k", "o", "1000", "LOCKDELAY", "-1"],
        vec!["LOCK.RWREAD", "e:k", "o", "1000", "LOCKDELAY", "5"],
        vec!["LOCK.SEMACQUIRE", "e:s", "o", "x", "1000"],
        vec!["LOCK.SEMACQUIRE", "e:s", "o", "0", "1000"],
        vec!["LOCK.RELEASE", "e:k", "o", "ALL", "more"],
        vec!["LOCK.RELEASE", "e:nobody", "o"],
        vec!["LOCK.SYNC", "e:k", "o", "1 write 1 1 1 1"],
        vec!["LOCK.QUEUES", "BY", "SIZE"],
        vec!["LOCK.QUEUES", "COUNT", "0"],
        vec!["LOCK.QUEUES", "COUNT", "x"],
        vec!["LOCK.QUEUES", "PREFIX", "a", "BY", "AGE"],
        vec![
            "EVAL",
            "return redis.call('LOCK.ACQUIRE', KEYS[1], 'o', 1000, 'BIND')",
            "1",
            "e:k",
        ],
    ];
    for words in &simple {
        if let Err(e) = reply(c, words) {
            got.push(e);
        }
    }
    let mut push = |r: Result<Value, String>| {
        if let Err(e) = r {
            got.push(e);
        }
    };
    // Kinds, types and capacities.
    int(c, &["LOCK.SEMACQUIRE", "e:sem", "o", "2", LONG]);
    push(reply(c, &["LOCK.SEMACQUIRE", "e:sem", "o", "3", LONG]));
    push(reply(c, &["LOCK.ACQUIRE", "e:sem", "o", LONG]));
    int(c, &["LOCK.ACQUIRE", "e:lock", "o", LONG]);
    push(reply(c, &["LOCK.SEMACQUIRE", "e:lock", "o", "2", LONG]));
    query(c, &["SET", "e:string", "v"]).unwrap();
    push(reply(c, &["LOCK.ACQUIRE", "e:string", "o", LONG]));
    // The upgrade deadlock, and a cycle between two owners.
    int(c, &["LOCK.RWREAD", "e:read", "r", LONG]);
    push(reply(c, &["LOCK.ACQUIRE", "e:read", "r", LONG]));
    int(c, &["LOCK.ACQUIRE", "e:a", "t1", LONG]);
    int(c, &["LOCK.ACQUIRE", "e:b", "t2", LONG]);
    let w = spawn_waiter(
        server,
        c,
        &["LOCK.ACQUIRE", "e:b", "t1", LONG, "WAIT", "0"],
        1,
    );
    push(reply(c, &["LOCK.ACQUIRE", "e:a", "t2", LONG, "WAIT", "0"]));
    int(c, &["LOCK.RELEASE", "e:b", "t2"]);
    w.token();
    // A waiter whose key becomes a semaphore while it waits.
    let w = spawn_waiter(
        server,
        c,
        &["LOCK.ACQUIRE", "e:lock", "w", LONG, "WAIT", "0"],
        1,
    );
    query(c, &["RENAME", "e:sem", "e:lock"]).unwrap();
    push(
        w.join()
            .map_err(|e| format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))),
    );
    // The three waiter limits.
    int(c, &["LOCK.ACQUIRE", "e:full", "h", LONG]);
    for (setting, waiters) in [
        ("lock.max-waiters", 1),
        ("lock.max-total-waiters", 1),
        ("lock.max-waiters-per-user", 1),
    ] {
        query(c, &["CONFIG", "SET", setting, "1"]).unwrap();
        let w = spawn_waiter(
            server,
            c,
            &["LOCK.ACQUIRE", "e:full", "w", LONG, "WAIT", "0"],
            waiters,
        );
        push(reply(
            c,
            &["LOCK.ACQUIRE", "e:full", "x", LONG, "WAIT", "0"],
        ));
        query(c, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]).unwrap();
        let _ = w.join();
        wait_until("the waiter left", || waiting(c, "e:full") == 0);
        let default = match setting {
            "lock.max-waiters" => "100000",
            "lock.max-total-waiters" => "1000000",
            _ => "0",
        };
        query(c, &["CONFIG", "SET", setting, default]).unwrap();
    }
    // Refused while the server can evict keys.
    query(c, &["CONFIG", "SET", "maxmemory", "1gb"]).unwrap();
    query(c, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]).unwrap();
    query(c, &["CONFIG", "SET", "lock.refuse-when-evictable", "yes"]).unwrap();
    push(reply(c, &["LOCK.ACQUIRE", "e:evict", "o", LONG]));
    query(c, &["CONFIG", "SET", "lock.refuse-when-evictable", "no"]).unwrap();
    query(c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    query(c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();
    // A RESTORE payload that is not a valid lock value (its last field cut off).
    let payload: Vec<u8> = redis::cmd("DUMP").arg("e:lock").query(c).unwrap();
    let mut dump = ModuleDump::parse(&payload).expect("a module value");
    dump.fields.pop();
    push(
        redis::cmd("RESTORE")
            .arg("e:bad")
            .arg(0)
            .arg(dump.payload())
            .query::<Value>(c)
            .map_err(|e| format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))),
    );
    // A re-entry past the largest count a stored value may carry (2^63 - 1): a value with that
    // count, then one more re-entry.
    for _ in 0..7 {
        int(c, &["LOCK.ACQUIRE", "e:count", "o", LONG]);
    }
    let payload: Vec<u8> = redis::cmd("DUMP").arg("e:count").query(c).unwrap();
    let mut dump = ModuleDump::parse(&payload).expect("a module value");
    let counts = dump
        .fields
        .iter_mut()
        .filter(|f| matches!(f, Field::Unsigned(7)))
        .map(|f| *f = Field::Unsigned(i64::MAX as u64))
        .count();
    assert_eq!(counts, 1, "the count in {:?}", dump.fields);
    redis::cmd("RESTORE")
        .arg("e:count-max")
        .arg(0)
        .arg(dump.payload())
        .query::<Value>(c)
        .expect("a value with the largest count");
    push(reply(c, &["LOCK.ACQUIRE", "e:count-max", "o", LONG]));
    // The panic guard (test builds only).
    if query(c, &["LOCK.DEBUG-PANIC", "LOCK.ACQUIRE"]).is_ok() {
        push(reply(c, &["LOCK.ACQUIRE", "e:panic", "o", LONG]));
    }
    // A waiter whose key MIGRATE moved to another server.
    let target = Server::start();
    int(c, &["LOCK.ACQUIRE", "e:moved", "h", LONG]);
    let w = spawn_waiter(
        server,
        c,
        &["LOCK.ACQUIRE", "e:moved", "w", LONG, "WAIT", "0"],
        1,
    );
    let port = target.port.to_string();
    query(c, &["MIGRATE", "127.0.0.1", &port, "e:moved", "0", "5000"]).unwrap();
    push(
        w.join()
            .map_err(|e| format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))),
    );
    got
}

#[test]
fn every_documented_error_is_produced_and_every_reply_text_is_documented() {
    let doc = commands_md();
    let documented = documented_errors(&doc);
    assert!(documented.len() >= 20, "errors table: {documented:?}");
    let server = Server::start();
    let mut c = server.client();
    let has_hooks = server_has_test_hooks(&mut c);
    let produced = provoke_errors(&server, &mut c);
    let source = source_reply_texts();
    let mut only_in_source = Vec::new();
    for pattern in &documented {
        if produced.iter().any(|p| pattern.matches(p)) {
            continue;
        }
        let excused = NOT_PROVOKED
            .iter()
            .any(|(prefix, _)| pattern.pieces[0].starts_with(prefix));
        // The panic guard's reply needs the test hooks (`--features test-hooks`).
        if !has_hooks && pattern.pieces[0].starts_with("ERR internal error in") {
            eprintln!("not a test-hooks build: {} not checked", pattern.shown);
            continue;
        }
        assert!(
            excused,
            "documented error {} was not produced; got: {produced:#?}",
            pattern.shown
        );
        assert!(
            source.iter().any(|s| pattern.matches(s)),
            "documented error {} is not a reply text of the module",
            pattern.shown
        );
        only_in_source.push(pattern.shown.clone());
    }
    eprintln!("documented errors found in the source only, not produced: {only_in_source:#?}");
    // Every error the module can reply (its texts, and what this test produced) is in the
    // errors table.
    for text in source.iter().chain(produced.iter()) {
        assert!(
            documented.iter().any(|p| p.matches(text)),
            "reply not in docs/commands.md's errors table: {text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (5) configuration

/// An integer bound as the doc writes it: `100000`, `2^31`, `2^31 (2147483648)`.
fn bound(text: &str) -> i64 {
    let t = text
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_matches('`');
    match t.split_once('^') {
        Some((base, exp)) => {
            let base: i64 = base.parse().expect("base");
            let exp: u32 = exp.parse().expect("exponent");
            base.pow(exp)
        }
        None => t
            .parse()
            .unwrap_or_else(|_| panic!("not a bound: {text:?}")),
    }
}

/// (name, default, range) of each row of the configuration table.
fn documented_configs(doc: &str) -> Vec<(String, String, String)> {
    let text = section_text(doc, "Configuration");
    table_rows(&text)
        .into_iter()
        .filter_map(|row| {
            let name = code_spans(row.first()?).into_iter().next()?;
            name.starts_with("lock.").then(|| {
                let default = row.get(1).cloned().unwrap_or_default();
                let default = default
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_matches('`')
                    .to_string();
                (name, default, row.get(2).cloned().unwrap_or_default())
            })
        })
        .collect()
}

fn config_get_all(c: &mut Connection) -> BTreeMap<String, String> {
    let v = query(c, &["CONFIG", "GET", "lock.*"]).unwrap();
    let flat: Vec<String> = match v {
        Value::Map(pairs) => pairs
            .iter()
            .flat_map(|(k, v)| [value_text(k), value_text(v)])
            .collect(),
        other => strings_of(&other),
    };
    flat.chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

#[test]
fn every_setting_is_documented_with_its_default_and_range() {
    let doc = commands_md();
    let documented = documented_configs(&doc);
    let server = Server::start();
    let mut c = server.client();
    let actual = config_get_all(&mut c);
    let names: BTreeSet<String> = documented.iter().map(|d| d.0.clone()).collect();
    let served: BTreeSet<String> = actual.keys().cloned().collect();
    assert_eq!(
        served, names,
        "CONFIG GET lock.* vs docs/commands.md's table"
    );
    for (name, default, range) in &documented {
        assert_eq!(&actual[name], default, "{name}: default");
        if let Some((lo, hi)) = range.split_once(" to ") {
            let (lo, hi) = (bound(lo), bound(hi));
            for (value, ok) in [(lo, true), (hi, true), (lo - 1, false), (hi + 1, false)] {
                let r = reply(&mut c, &["CONFIG", "SET", name, &value.to_string()]);
                assert_eq!(
                    r.is_ok(),
                    ok,
                    "CONFIG SET {name} {value}: {r:?} (range {range})"
                );
            }
        } else {
            for (value, ok) in [("yes", true), ("no", true), ("maybe", false)] {
                assert!(range.contains(value) || !ok, "{name}: range {range:?}");
                let r = reply(&mut c, &["CONFIG", "SET", name, value]);
                assert_eq!(r.is_ok(), ok, "CONFIG SET {name} {value}: {r:?}");
            }
        }
        query(&mut c, &["CONFIG", "SET", name, default]).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// (6) and (7) keyspace events, and module.conf.example

fn documented_events(doc: &str) -> BTreeSet<String> {
    let text = section_text(doc, "Keyspace notifications");
    table_rows(&text)
        .into_iter()
        .filter_map(|row| code_spans(row.first()?).into_iter().next())
        .filter(|n| n.starts_with("lock."))
        .collect()
}

#[test]
fn module_conf_example_names_every_setting_and_event() {
    let doc = commands_md();
    let example = read("module.conf.example");
    let server = Server::start();
    let mut c = server.client();
    let mut missing = Vec::new();
    for name in config_get_all(&mut c).keys() {
        if !example.contains(name.as_str()) {
            missing.push(name.clone());
        }
    }
    let events = documented_events(&doc);
    assert!(events.len() >= 10, "events in docs/commands.md: {events:?}");
    for e in &events {
        if !example.contains(e.as_str()) {
            missing.push(e.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "module.conf.example does not name: {missing:?}"
    );
}

#[test]
fn the_documented_keyspace_events_are_the_ones_the_module_sends() {
    let doc = commands_md();
    let documented = documented_events(&doc);
    let server = Server::start();
    let mut c = server.client();
    query(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "Ed"]).unwrap();
    let sub_client =
        redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).expect("client");
    let mut sub = sub_client.get_connection().expect("connect");
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:lock.*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();

    // acquire, extend, release; queued, timeout; cancel.
    int(&mut c, &["LOCK.ACQUIRE", "ev", "h", LONG]);
    int(&mut c, &["LOCK.EXTEND", "ev", "h", LONG]);
    let w = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "ev", "t", LONG, "WAIT", "50"],
        1,
    );
    let _ = w.join();
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    send_raw(&mut raw, &["LOCK.ACQUIRE", "ev", "gone", LONG, "WAIT", "0"]).unwrap();
    wait_until("the raw waiter is queued", || waiting(&mut c, "ev") == 1);
    drop(raw);
    wait_until("the closed waiter left", || waiting(&mut c, "ev") == 0);
    int(&mut c, &["LOCK.RELEASE", "ev", "h"]);
    // disconnect: a bound hold whose connection closes.
    let mut bound = server.client();
    int(&mut bound, &["LOCK.ACQUIRE", "ev:bind", "b", LONG, "BIND"]);
    drop(bound);
    wait_until("the bound hold ended", || info(&mut c, "ev:bind").is_none());
    // expire and delay: a hold with a lock-delay that runs out its lease.
    int(
        &mut c,
        &["LOCK.ACQUIRE", "ev:delay", "d", "1500", "LOCKDELAY", "50"],
    );
    // A waiter keeps a timer on the key, so the module itself expires the hold.
    let w = spawn_waiter(
        &server,
        &mut c,
        &["LOCK.ACQUIRE", "ev:delay", "x", LONG, "WAIT", "0"],
        1,
    );
    w.token();
    // evicted: a volatile policy and a maxmemory below what the server uses.
    int(&mut c, &["LOCK.ACQUIRE", "ev:evict", "e", LONG]);
    query(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-random"],
    )
    .unwrap();
    query(&mut c, &["SET", "filler", &"x".repeat(1 << 20)]).unwrap();
    // Half of what it uses: the lock keys go, and the filler keeps it above the limit.
    let used = used_memory(&mut c);
    let _ = query(
        &mut c,
        &["CONFIG", "SET", "maxmemory", &(used / 2).to_string()],
    );
    wait_until("the lock key was evicted", || {
        let _ = query(&mut c, &["SET", "probe", "1"]);
        info_field(&mut c, "evicted_total") >= 1
    });
    query(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    query(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).unwrap();

    // Every event was sent by now; read until the documented ones have come (or PATIENCE),
    // then whatever else is left.
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match pubsub.get_message() {
            Ok(msg) => {
                let channel = msg.get_channel_name().to_string();
                seen.insert(channel.rsplit(':').next().unwrap_or("").to_string());
            }
            Err(_) if seen.is_superset(&documented) || std::time::Instant::now() > deadline => {
                break
            }
            Err(_) => {}
        }
    }
    assert_eq!(
        seen, documented,
        "events the module sent vs docs/commands.md's table"
    );
}

// ---------------------------------------------------------------------------------------------
// Links

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens.
fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for s in sections(markdown).into_iter().skip(1) {
        let base = slug(&s.title.replace('`', ""));
        let n = count.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of inline links `[text](target)` outside code.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code, which may hold brackets.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, p)| p)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let base = root();
    let mut files = vec![PathBuf::from("README.md")];
    for entry in std::fs::read_dir(base.join("docs")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "md") {
            files.push(p.strip_prefix(&base).unwrap().to_path_buf());
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(base.join(file)).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                base.join(file)
            } else {
                base.join(file.parent().unwrap_or(Path::new(""))).join(path)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let dest_text = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&dest_text).contains(anchor) {
                    broken.push(format!("{}: {target} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// ACL grant lines of docs/operations.md

/// Every `ACL SETUSER` line in the code blocks of docs/operations.md's "ACL" and "Multi-tenant"
/// sections grants the user commands (all LOCK.* but LOCK.SYNC and test hooks) on its key
/// pattern, and not LOCK.SYNC. A line granting the module's own category `@lock` is refused
/// where modules cannot add categories (Redis before 7.4), as the section says.
#[test]
fn the_acl_grant_lines_of_operations_md_work() {
    let ops = read("docs/operations.md");
    let mut lines = Vec::new();
    for title in ["ACL", "Multi-tenant"] {
        let text = section_text(&ops, title);
        let mut fenced = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if fenced && line.trim_start().starts_with("ACL SETUSER") {
                lines.push(line.trim().to_string());
            }
        }
    }
    assert!(lines.len() >= 3, "ACL SETUSER lines found: {lines:?}");
    let server = Server::start();
    let mut c = server.client();
    let own_category = flavor(&mut c).has_module_own_category();
    let user_commands: Vec<String> = server_commands(&mut c)
        .into_iter()
        .filter(|n| n != "lock.sync")
        .collect();
    assert_eq!(user_commands.len(), 7, "{user_commands:?}");
    for (i, line) in lines.iter().enumerate() {
        let mut words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let user = format!("docs-acl-{i}");
        words[2] = user.clone();
        let key = words
            .iter()
            .find_map(|w| w.strip_prefix('~'))
            .unwrap_or_else(|| panic!("no key pattern in {line}"))
            .replace('*', "x");
        let r = reply(&mut c, &words_ref(&words));
        if line.contains("@lock") && !own_category {
            assert!(r.is_err(), "{line}: expected a refusal here, got {r:?}");
            continue;
        }
        assert!(r.is_ok(), "{line}: {r:?}");
        for name in user_commands
            .iter()
            .map(String::as_str)
            .chain(["lock.sync"])
        {
            let mut dry = vec!["ACL", "DRYRUN", &user, name];
            let args: &[&str] = match name {
                "lock.queues" => &[],
                "lock.info" => &[&key],
                "lock.release" => &[&key, "o"],
                "lock.semacquire" => &[&key, "o", "2", "1000"],
                "lock.sync" => &[&key, "o", "state"],
                _ => &[&key, "o", "1000"],
            };
            dry.extend_from_slice(args);
            let allowed = matches!(reply(&mut c, &dry), Ok(Value::Okay));
            assert_eq!(
                allowed,
                name != "lock.sync",
                "{line}: ACL DRYRUN {user} {name} {args:?}"
            );
        }
    }
}
