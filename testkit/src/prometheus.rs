//! A real Prometheus server (Debian package `prometheus`) started on a free loopback port with a
//! given configuration and its storage in a temporary directory, queried over its HTTP API; and
//! `promtool`, which comes with it. Replies are JSON, read with the small parser below (the
//! API's replies are all this kit needs to read).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::daemon::Daemon;
use crate::server::fresh_temp_dir;
use crate::PATIENCE;

/// The Prometheus binary: `PROMETHEUS` if set, else `prometheus` on PATH; `None` when there is
/// none (the caller skips).
pub fn binary() -> Option<String> {
    let name = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".to_string());
    let found = Command::new(&name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    found.then_some(name)
}

/// Runs `promtool` (beside the Prometheus binary, or on PATH) with `args` in directory `dir`:
/// its output (standard output and error), or `Err` with it when it exits non-zero.
pub fn promtool(dir: &Path, args: &[&str]) -> Result<String, String> {
    let bin = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".to_string());
    let out = Command::new(&bin)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("{bin}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{bin} {args:?}: {}: {text}", out.status))
    }
}

/// A running Prometheus, killed when dropped (its directory removed then).
pub struct Prometheus {
    daemon: Daemon,
    pub port: u16,
    /// Holds the configuration files, the storage (`data/`) and the log (`prometheus.log`).
    pub dir: PathBuf,
}

/// One sample of an instant vector: its labels (the name in `__name__`) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Prometheus {
    /// Writes `files` (name, text) into a fresh temporary directory, starts `binary` with
    /// `--config.file` set to the one named `config`, and waits until it is ready (trying a few
    /// free ports).
    pub fn start(binary: &str, config: &str, files: &[(&str, &str)]) -> Prometheus {
        let dir = fresh_temp_dir("prometheus").unwrap_or_else(|e| panic!("{e}"));
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let config = dir.join(config);
        let data = dir.join("data");
        let daemon = Daemon::start(
            binary,
            dir.clone(),
            "prometheus.log",
            2 * PATIENCE,
            "/-/ready",
            |port| {
                let mut command = Command::new(binary);
                command
                    .arg(format!("--config.file={}", config.display()))
                    .arg(format!("--storage.tsdb.path={}", data.display()))
                    .arg(format!("--web.listen-address=127.0.0.1:{port}"));
                command
            },
        );
        Prometheus {
            port: daemon.port,
            daemon,
            dir,
        }
    }

    /// What Prometheus has logged so far.
    pub fn log(&self) -> String {
        self.daemon.log()
    }

    /// GET `path` (with its query string already encoded) and the reply's `data`, or why not
    /// (an HTTP error, or a `status` other than `success`).
    pub fn api(&self, path: &str) -> Result<Json, String> {
        let body = self.daemon.get(path)?;
        let reply = Json::parse(&body)?;
        match reply.get("status").and_then(Json::as_str) {
            Some("success") => reply
                .get("data")
                .cloned()
                .ok_or_else(|| format!("no data in {body}")),
            _ => Err(format!("{path}: {body}")),
        }
    }

    /// An instant query (`/api/v1/query`) whose result is a vector (or a scalar, as one sample
    /// without labels).
    pub fn query(&self, promql: &str) -> Result<Vec<Sample>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)))?;
        let value = |v: &Json| -> Result<f64, String> {
            let text = v
                .as_array()
                .and_then(|pair| pair.get(1))
                .and_then(Json::as_str)
                .ok_or_else(|| format!("{promql}: sample value in {v:?}"))?;
            parse_float(text).ok_or_else(|| format!("{promql}: value {text:?}"))
        };
        let result = data
            .get("result")
            .ok_or_else(|| format!("{promql}: no result"))?;
        if data.get("resultType").and_then(Json::as_str) == Some("scalar") {
            return Ok(vec![Sample {
                labels: BTreeMap::new(),
                value: value(result)?,
            }]);
        }
        let samples = result
            .as_array()
            .ok_or_else(|| format!("{promql}: result is not a vector: {result:?}"))?;
        samples
            .iter()
            .map(|s| {
                let labels = match s.get("metric") {
                    Some(Json::Object(m)) => m
                        .iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect(),
                    _ => BTreeMap::new(),
                };
                Ok(Sample {
                    labels,
                    value: value(s.get("value").unwrap_or(&Json::Null))?,
                })
            })
            .collect()
    }

    /// The value of a query that returns exactly one sample, or why not.
    pub fn query_one(&self, promql: &str) -> Result<f64, String> {
        match self.query(promql)?.as_slice() {
            [one] => Ok(one.value),
            other => Err(format!("{promql}: {} samples: {other:?}", other.len())),
        }
    }
}

/// A Prometheus float as the API writes it (`"1.5"`, `"NaN"`, `"+Inf"`, `"-Inf"`).
pub fn parse_float(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

/// Percent-encodes `text` for a URL's query string (everything but unreserved characters).
pub fn url_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A JSON value. Objects keep their members in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses one JSON text (RFC 8259), or says where it is not JSON.
    pub fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            bytes: text.as_bytes(),
            at: 0,
        };
        let value = p.value(0)?;
        p.space();
        if p.at != p.bytes.len() {
            return Err(p.error("text after the value"));
        }
        Ok(value)
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Number(n) => Some(*n),
            _ => None,
        }
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        let end = (self.at + 40).min(self.bytes.len());
        let near = String::from_utf8_lossy(&self.bytes[self.at.min(end)..end]);
        format!("JSON: {what} at byte {} (near {near:?})", self.at)
    }

    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    fn eat(&mut self, word: &str) -> bool {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > 64 {
            return Err(self.error("nesting deeper than 64"));
        }
        self.space();
        match self.bytes.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                let mut members = Vec::new();
                self.space();
                if self.eat("}") {
                    return Ok(Json::Object(members));
                }
                loop {
                    self.space();
                    let key = self.string()?;
                    self.space();
                    if !self.eat(":") {
                        return Err(self.error("expected ':'"));
                    }
                    members.push((key, self.value(depth + 1)?));
                    self.space();
                    if self.eat("}") {
                        return Ok(Json::Object(members));
                    }
                    if !self.eat(",") {
                        return Err(self.error("expected ',' or '}'"));
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.space();
                if self.eat("]") {
                    return Ok(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.space();
                    if self.eat("]") {
                        return Ok(Json::Array(items));
                    }
                    if !self.eat(",") {
                        return Err(self.error("expected ',' or ']'"));
                    }
                }
            }
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b't') if self.eat("true") => Ok(Json::Bool(true)),
            Some(b'f') if self.eat("false") => Ok(Json::Bool(false)),
            Some(b'n') if self.eat("null") => Ok(Json::Null),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.at;
                while let Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') =
                    self.bytes.get(self.at)
                {
                    self.at += 1;
                }
                let text = std::str::from_utf8(&self.bytes[start..self.at]).unwrap_or("");
                text.parse()
                    .map(Json::Number)
                    .map_err(|_| self.error("bad number"))
            }
            _ => Err(self.error("expected a value")),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .bytes
            .get(self.at..self.at + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.error("bad \\u escape"))?;
        self.at += 4;
        Ok(digits)
    }

    fn string(&mut self) -> Result<String, String> {
        if !self.eat("\"") {
            return Err(self.error("expected a string"));
        }
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(self.error("unterminated string"));
            };
            self.at += 1;
            match b {
                b'"' => {
                    return String::from_utf8(out).map_err(|_| self.error("invalid UTF-8"));
                }
                b'\\' => {
                    let Some(&e) = self.bytes.get(self.at) else {
                        return Err(self.error("unterminated escape"));
                    };
                    self.at += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code) && self.eat("\\u") {
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(self.error("bad surrogate pair"));
                                }
                                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                            }
                            char::from_u32(code).ok_or_else(|| self.error("bad \\u escape"))?
                        }
                        _ => return Err(self.error("bad escape")),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(b),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_prometheus_api_sends() {
        let text = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"up","le":"+Inf"},"value":[1795699180.13,"0.5"]}],
            "x":[true,false,null,-1.5e3,"a\"\\\/\u00e9\ud83d\ude00\n"], "e":{}, "a":[]}}"#;
        let j = Json::parse(text).unwrap();
        let data = j.get("data").unwrap();
        assert_eq!(
            data.get("resultType").and_then(Json::as_str),
            Some("vector")
        );
        let sample = &data.get("result").unwrap().as_array().unwrap()[0];
        assert_eq!(
            sample
                .get("metric")
                .unwrap()
                .get("le")
                .and_then(Json::as_str),
            Some("+Inf")
        );
        let x = data.get("x").unwrap().as_array().unwrap();
        assert_eq!(
            x,
            &[
                Json::Bool(true),
                Json::Bool(false),
                Json::Null,
                Json::Number(-1500.0),
                Json::String("a\"\\/é😀\n".to_string())
            ]
        );
        assert_eq!(data.get("e"), Some(&Json::Object(vec![])));
        assert_eq!(data.get("a"), Some(&Json::Array(vec![])));
    }

    #[test]
    fn refuses_what_is_not_json() {
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\" 1}",
            "\"abc",
            "tru",
            "1 2",
            "\"\\x\"",
            "{1:2}",
        ] {
            assert!(Json::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn floats_and_urls() {
        assert!(parse_float("NaN").unwrap().is_nan());
        assert_eq!(parse_float("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_float("0.25"), Some(0.25));
        assert_eq!(
            url_encode("rate(a{le=\"+Inf\"}[1m]) > 0"),
            "rate%28a%7Ble%3D%22%2BInf%22%7D%5B1m%5D%29%20%3E%200"
        );
    }
}
