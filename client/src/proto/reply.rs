//! Commands the client sends besides the acquires ([`super::request`]), and what a server's
//! replies mean: one typed [`Outcome`] per server and request.

use std::time::Duration;

use redis::{Cmd, Value};

/// Added to a blocking request's wait (and the timeout) before its reply is given up on: the
/// server's own wait timeout fires on its timer, a little late on a busy server.
pub(crate) const WAIT_REPLY_MARGIN: Duration = Duration::from_secs(1);

/// What one server answered to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Granted (or done), with this server's fencing token where there is one (0 otherwise).
    Granted(u64),
    /// Held by someone else (the command replied nil).
    Held,
    /// `-NOTOWNER`: the owner does not hold the lock there (never did, released, expired, or
    /// the key was deleted). The error text follows.
    NotOwner(String),
    /// `-DEADLOCK`: the request would deadlock (an upgrade of a read hold, or a wait closing a
    /// cycle of waiting owners).
    Deadlock(String),
    /// `-MAXWAITERS`: the wait queue of the key (or the server's waiter limit) is full.
    MaxWaiters(String),
    /// `-WRONGKIND`: a permit asked of a lock key, or a lock of a semaphore key.
    WrongKind(String),
    /// The semaphore key has another capacity than the one asked.
    CapacityMismatch(String),
    /// The server answered with another error (WRONGTYPE, ERR, ...), or an unexpected reply.
    Refused(String),
    /// No answer: connection refused, reset or timed out.
    Unreachable(String),
}

impl Outcome {
    /// The typed answer for an error reply's text: `CODE detail` (or `-CODE detail`, or the
    /// `CODE: detail` that the `redis` crate prints).
    pub fn from_error_text(text: impl Into<String>) -> Outcome {
        let text = text.into();
        let trimmed = text.trim_start().trim_start_matches('-');
        let code = trimmed.split([' ', ':']).next().unwrap_or_default();
        match code {
            "NOTOWNER" => Outcome::NotOwner(text),
            "DEADLOCK" => Outcome::Deadlock(text),
            "MAXWAITERS" => Outcome::MaxWaiters(text),
            "WRONGKIND" => Outcome::WrongKind(text),
            "ERR" if trimmed.contains("the semaphore has another capacity") => {
                Outcome::CapacityMismatch(text)
            }
            _ => Outcome::Refused(text),
        }
    }

    /// The server answered with an error of any kind (every variant but `Granted`, `Held` and
    /// `Unreachable`).
    pub fn is_refusal(&self) -> bool {
        self.error_text().is_some() && !matches!(self, Outcome::Unreachable(_))
    }

    /// The text of an error reply, or of the failure to reach the server.
    pub fn error_text(&self) -> Option<&str> {
        match self {
            Outcome::Granted(_) | Outcome::Held => None,
            Outcome::NotOwner(t)
            | Outcome::Deadlock(t)
            | Outcome::MaxWaiters(t)
            | Outcome::WrongKind(t)
            | Outcome::CapacityMismatch(t)
            | Outcome::Refused(t)
            | Outcome::Unreachable(t) => Some(t),
        }
    }
}

/// The longest per-request timeout a client takes (a longer one is cut to it): timeouts are
/// added to clock readings, which a `Duration::MAX` would overflow.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A client's timeout as it is used: at least 1 ms, at most [`MAX_TIMEOUT`].
pub(crate) fn usable_timeout(timeout: Duration) -> Duration {
    timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT)
}

/// What a request that got no reply reads as, in both faces.
pub(crate) const NO_REPLY: &str = "no reply in time";

/// A failure to reach a server, worded the same by both faces (a timed-out read is
/// [`NO_REPLY`] whether the socket said "timed out" or "resource temporarily unavailable").
pub(crate) fn unreachable(e: &redis::RedisError) -> Outcome {
    if e.is_timeout() {
        return Outcome::Unreachable(NO_REPLY.into());
    }
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    if io.is_some_and(|io| {
        matches!(
            io.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    }) {
        return Outcome::Unreachable(NO_REPLY.into());
    }
    Outcome::Unreachable(e.to_string())
}

/// The typed answer for an error reply as the `redis` crate returns it: read from its code and
/// detail as the server sent them (`ERR the semaphore has another capacity ...`), since its
/// `Display` puts a description first (`An error was signalled by the server - ResponseError:
/// ...`), which hides the `ERR` code.
pub(crate) fn error_outcome(e: &redis::RedisError) -> Outcome {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => Outcome::from_error_text(format!("{code} {detail}")),
        (Some(code), None) => Outcome::from_error_text(code),
        (None, _) => Outcome::from_error_text(e.to_string()),
    }
}

pub(crate) fn acquire_outcome(r: Result<Value, Outcome>) -> Outcome {
    match r {
        Ok(Value::Int(t)) => Outcome::Granted(u64::try_from(t).unwrap_or(0)),
        Ok(Value::Nil) => Outcome::Held,
        Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
        Err(o) => o,
    }
}

pub(crate) fn extend_cmd(key: &str, owner: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("LOCK.EXTEND");
    cmd.arg(key).arg(owner).arg(millis(ttl));
    cmd
}

pub(crate) fn extend_outcome(r: Result<Value, Outcome>) -> Outcome {
    match r {
        Ok(Value::Int(_)) => Outcome::Granted(0),
        Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
        Err(o) => o,
    }
}

pub(crate) fn release_cmd(key: &str, owner: &str) -> Cmd {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner).arg("ALL");
    cmd
}

/// LOCK.RELEASE without ALL: one hold of an owner that may hold the key through other guards.
pub(crate) fn release_one_cmd(key: &str, owner: &str) -> Cmd {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
    cmd
}

/// `Granted(remaining holds)` when the owner held the key; `NotOwner` when it did not (the
/// hold was already gone: whether that is a loss is the lease's call, see
/// [`super::lease::Lease::released`]).
pub(crate) fn release_outcome(r: Result<Value, Outcome>) -> Outcome {
    match r {
        Ok(Value::Int(n)) => Outcome::Granted(u64::try_from(n).unwrap_or(0)),
        Ok(other) => Outcome::Refused(format!("unexpected reply {other:?}")),
        Err(o) => o,
    }
}

/// `LOCK.INFO key`.
pub(crate) fn info_cmd(key: &str) -> Cmd {
    let mut cmd = redis::cmd("LOCK.INFO");
    cmd.arg(key);
    cmd
}

/// How a client reads one server's `LOCK.INFO` for its own hold: `LOCK.INFO key OWNER owner`
/// (module 0.4.0 and later: only that owner's entry, O(1) whatever the number of holders), or
/// the plain `LOCK.INFO key` (O(holders)) for a server with an older module, which answers
/// the owner form with a wrong-number-of-arguments error. Learnt from the first such error
/// and kept for the server (one per server connection pool), so the owner form is not tried
/// again on every check.
#[derive(Debug, Default)]
pub(crate) struct InfoForm {
    plain_only: std::sync::atomic::AtomicBool,
}

impl InfoForm {
    /// The command that reads `owner`'s hold of `key` on this server.
    pub(crate) fn cmd(&self, key: &str, owner: &str) -> Cmd {
        if self.plain_only() {
            return info_cmd(key);
        }
        let mut cmd = info_cmd(key);
        cmd.arg("OWNER").arg(owner);
        cmd
    }

    /// Whether this server only takes the plain form.
    pub(crate) fn plain_only(&self) -> bool {
        self.plain_only.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `reply` (to the owner form) is an older module's refusal of it; if so the
    /// server gets the plain form from now on, and the caller sends that.
    pub(crate) fn refused(&self, reply: &Result<Value, Outcome>) -> bool {
        let Err(outcome) = reply else {
            return false;
        };
        if !outcome.is_refusal() || !outcome.error_text().is_some_and(owner_form_refused) {
            return false;
        }
        self.plain_only
            .store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }
}

/// Whether an error reply to `LOCK.INFO key OWNER owner` means the server's module predates
/// the option (0.3.0 and earlier: "ERR wrong number of arguments for 'lock.info' command").
pub(crate) fn owner_form_refused(error_text: &str) -> bool {
    error_text
        .to_ascii_lowercase()
        .contains("wrong number of arguments")
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
