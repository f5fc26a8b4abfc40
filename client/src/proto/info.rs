//! `LOCK.INFO` read into a struct, and the client-wide owner identity.

use std::time::Duration;

use rand::Rng;
use redis::Value;

use super::error::LockError;
use super::request::{Acquire, MAX_OWNER_LEN};

/// One holder of a key, as `LOCK.INFO` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The owner string the hold was acquired under.
    pub owner: String,
    /// How many holds the owner has (re-entries of a lock, or permits of a semaphore).
    pub count: u64,
    /// How much longer the owner's holds last, unless extended.
    pub ttl: Duration,
    /// How long the owner has held the key, from its first grant (module 0.3.0+); `None` when
    /// the server does not say or does not know (a hold restored from older files).
    pub held: Option<Duration>,
}

/// One queued client of a key, as `LOCK.INFO` lists it (servers with the `waiters` field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The owner it asks under.
    pub owner: String,
    /// `write`, `read` or `permit`.
    pub mode: String,
    /// How long it has been queued.
    pub waited: Duration,
    /// Its connection's id (as `CLIENT LIST` and `CLIENT KILL ID` name it).
    pub client_id: u64,
}

/// What `LOCK.INFO key` says about a lock or semaphore key.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LockInfo {
    /// The last fencing token granted on this key.
    pub fence: u64,
    /// The live holders, sorted by owner bytes.
    pub holders: Vec<Holder>,
    /// `write`, `read`, `semaphore` or `free`.
    pub mode: String,
    /// The mode each queued waiter asks for, head first (`write`, `read` or `permit`).
    pub queue: Vec<String>,
    /// How many clients wait in the queue.
    pub waiting: u64,
    /// What is left of a running lock-delay (zero when none).
    pub delay: Duration,
    /// A semaphore's capacity (`None` for a lock key).
    pub capacity: Option<u64>,
    /// The queued clients, head first (empty on a replica, or from a module version without
    /// the field).
    pub waiters: Vec<Waiter>,
    /// How many owners hold the key, whether `holders` lists them or not (module 0.4.0 and
    /// later; `None` from an older module, whose `holders` lists every one). A read of one
    /// owner's hold (`LOCK.INFO key OWNER owner`, how the client checks its own holds) lists
    /// that owner alone: this tells whether others hold the key.
    pub holders_count: Option<u64>,
}

impl LockInfo {
    /// The hold count of `owner` (0 when it holds nothing).
    pub fn hold_count(&self, owner: &str) -> u64 {
        self.holders
            .iter()
            .find(|h| h.owner == owner)
            .map_or(0, |h| h.count)
    }

    /// How many owners hold the key: `holders_count` when the server says it, otherwise the
    /// number listed (an older module lists every holder).
    pub fn live_holders(&self) -> u64 {
        self.holders_count
            .unwrap_or_else(|| u64::try_from(self.holders.len()).unwrap_or(u64::MAX))
    }

    /// Reads a `LOCK.INFO` reply: nil is `None`; the RESP2 field-value array and the RESP3 map
    /// are both understood, unknown fields are skipped.
    pub fn from_reply(reply: &Value) -> Result<Option<LockInfo>, String> {
        let pairs: Vec<(&Value, &Value)> = match reply {
            Value::Nil => return Ok(None),
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|c| match c {
                    [k, v] => Some((k, v)),
                    _ => None,
                })
                .collect(),
            Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
            other => return Err(format!("unexpected LOCK.INFO reply {other:?}")),
        };
        let mut info = LockInfo::default();
        for (k, v) in pairs {
            match text(k).as_deref() {
                Some("fence") => info.fence = int(v)?,
                Some("mode") => info.mode = text(v).unwrap_or_default(),
                Some("waiting") => info.waiting = int(v)?,
                Some("delay") => info.delay = Duration::from_millis(int(v)?),
                Some("capacity") => info.capacity = Some(int(v)?),
                Some("holders_count") => info.holders_count = Some(int(v)?),
                Some("queue") => {
                    info.queue = match v {
                        Value::Array(q) => q.iter().filter_map(text).collect(),
                        _ => Vec::new(),
                    }
                }
                Some("waiters") => {
                    let Value::Array(list) = v else {
                        return Err(format!("unexpected waiters {v:?}"));
                    };
                    for w in list {
                        match w {
                            Value::Array(f) if f.len() >= 4 => info.waiters.push(Waiter {
                                owner: text(&f[0]).unwrap_or_default(),
                                mode: text(&f[1]).unwrap_or_default(),
                                waited: Duration::from_millis(int(&f[2])?),
                                client_id: int(&f[3])?,
                            }),
                            other => return Err(format!("unexpected waiter {other:?}")),
                        }
                    }
                }
                Some("holders") => {
                    let Value::Array(list) = v else {
                        return Err(format!("unexpected holders {v:?}"));
                    };
                    for h in list {
                        match h {
                            Value::Array(f) if f.len() >= 3 => info.holders.push(Holder {
                                owner: text(&f[0]).unwrap_or_default(),
                                count: int(&f[1])?,
                                ttl: Duration::from_millis(int(&f[2])?),
                                // -1 (unknown) and servers before 0.3.0 (no element): None.
                                held: match f.get(3) {
                                    Some(Value::Int(ms)) => {
                                        u64::try_from(*ms).ok().map(Duration::from_millis)
                                    }
                                    _ => None,
                                },
                            }),
                            other => return Err(format!("unexpected holder {other:?}")),
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Some(info))
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Result<u64, String> {
    match v {
        Value::Int(i) => Ok(u64::try_from(*i).unwrap_or(0)),
        other => Err(format!("expected an integer in LOCK.INFO, got {other:?}")),
    }
}

/// How a client names the owners of its guards when a request names none
/// ([`crate::Acquire::owner`] always wins).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum OwnerIdentity {
    /// A fresh random owner per guard (the default): every guard is its own owner.
    #[default]
    Random,
    /// A fresh random owner per guard, after this prefix (`prefix` + 32 hex digits), so that
    /// `LOCK.INFO` and `CLIENT LIST` show whose holds they are.
    Prefix(String),
    /// The same owner for every guard of the client: guards of one client re-enter each
    /// other's locks, a write request on a key the client reads fails with
    /// [`LockError::Deadlock`], and waits that would close a cycle across keys are refused.
    /// Each guard's release drops one hold.
    Fixed(String),
}

impl OwnerIdentity {
    /// Refuses what the server would refuse (an owner is 1 to 1024 bytes).
    pub(crate) fn check(&self) -> Result<(), LockError> {
        let invalid = |reason: String| Err(LockError::InvalidRequest { reason });
        match self {
            OwnerIdentity::Random => Ok(()),
            OwnerIdentity::Prefix(p) if p.len() + 32 > MAX_OWNER_LEN => invalid(format!(
                "an owner prefix is at most {} bytes, not {}",
                MAX_OWNER_LEN - 32,
                p.len()
            )),
            OwnerIdentity::Fixed(o) if o.is_empty() || o.len() > MAX_OWNER_LEN => invalid(format!(
                "an owner is 1 to {MAX_OWNER_LEN} bytes, not {}",
                o.len()
            )),
            _ => Ok(()),
        }
    }

    /// The request with this identity applied: a fixed owner becomes the request's explicit
    /// owner unless it has one; returns the owner to use when the request has none.
    pub(crate) fn apply(&self, request: &mut Acquire) -> String {
        if let (OwnerIdentity::Fixed(o), None) = (self, &request.owner) {
            request.owner = Some(o.clone());
        }
        match (&request.owner, self) {
            (Some(o), _) => o.clone(),
            (None, OwnerIdentity::Prefix(p)) => format!("{p}{}", random_hex()),
            (None, _) => random_hex(),
        }
    }
}

/// 32 random hex digits.
pub(crate) fn random_hex() -> String {
    format!("{:032x}", rand::thread_rng().gen::<u128>())
}
