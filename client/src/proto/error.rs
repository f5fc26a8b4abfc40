//! The one error type of the crate, what a lost lock says about its loss, and how the servers'
//! answers to a request name a failure.

use std::time::SystemTime;

use super::reply::Outcome;

/// Why a lock (or permit) was not acquired, or a guard's extend or release failed. Every
/// variant but `InvalidRequest` lists what each instance answered.
///
/// When enough instances answered but some refused the request with an error, the variant is
/// the most specific refusal any of them gave: `ModuleMissing`, `Deadlock`, `WrongKind`,
/// `CapacityMismatch`, `MaxWaiters`, `NotOwner`, then `Refused` for any other error (such as
/// `WRONGTYPE`). None of these is retried by [`crate::Redlock`]: the request itself is at fault.
///
/// The sync and the async clients give the same variant (and the same cause texts) for the
/// same situation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// Enough instances answered, but the lock is held by someone else (on too many of them):
    /// for a semaphore, every permit is taken (or others queue first). Also the answer to a
    /// wait that ran out.
    Held {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// Too few instances answered to reach a quorum.
    Unreachable {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// An instance refused the request with an error not named by a variant of its own (for
    /// example `WRONGTYPE`: the key holds another Redis type).
    Refused {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The server refused the request because it would deadlock (`-DEADLOCK`): its owner holds
    /// the lock shared and asked for it exclusively (an upgrade: release the read hold first),
    /// or, with a wait, queueing would close a cycle of owners waiting for one another across
    /// keys of that server. Nothing changed; the request did not queue. Only requests with an
    /// explicit owner ([`Acquire::owner`](crate::Acquire::owner)) can get it: a random owner holds nothing when it asks.
    Deadlock {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The key is the other kind (`-WRONGKIND`): a semaphore permit was asked of a lock key, or
    /// a lock of a semaphore key. Nothing changed.
    WrongKind {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The semaphore key exists with another capacity than the one asked for (a key keeps its
    /// capacity while it has holders or waiters; `LOCK.INFO` shows it). Nothing changed.
    CapacityMismatch {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The lock's validity ran out while acquiring it (the instances were too slow), or before
    /// an extend of it was confirmed.
    Expired {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The server refused to queue the waiting request (`-MAXWAITERS`): the key's wait queue
    /// (`lock.max-waiters`) or the server's waiter limit is full. Retry later.
    MaxWaiters {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The owner does not hold the lock (`-NOTOWNER`), outside of a guard. A guard whose hold
    /// is gone reports [`LockError::Lost`] instead, which says how it was lost.
    NotOwner {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// The lock was granted but fewer replicas than asked ([`Acquire::min_replicas`](crate::Acquire::min_replicas))
    /// acknowledged it within the timeout: the grant was released again.
    ReplicasNotAcknowledged {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged the grant in time.
        acknowledged: u32,
        /// The server.
        causes: Vec<(String, Outcome)>,
    },
    /// The request was refused before anything was sent (for example a lock-delay on a read
    /// lock, or a ttl of zero).
    InvalidRequest {
        /// What is wrong with the request.
        reason: String,
    },
    /// The guard's lock was lost before this operation (or is found lost by it): its release,
    /// extend or `using` did not happen under the lock. Says how and when it was lost.
    Lost(LostLock),
    /// A server does not have the lock module loaded (it answered `unknown command` to a
    /// `LOCK.*` command): load it with `loadmodule /path/to/libredis_lock.so`.
    ModuleMissing {
        /// What each server answered (server name, answer).
        causes: Vec<(String, Outcome)>,
    },
    /// A client could not be built: a malformed URL, or settings the client cannot use.
    Config {
        /// What is wrong.
        reason: String,
    },
    /// The client's cap on connections for waiting acquires was reached and none came free
    /// before the request's wait ran out (see `max_wait_connections`).
    WaitLimit {
        /// The cap.
        limit: usize,
    },
}

/// How a held lock ended without its guard's release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossCause {
    /// The lease's validity ran out without a confirmed extend (the servers could not be
    /// reached in time, or nobody extended it).
    Expired,
    /// The key is gone: deleted (`DEL`, `UNLINK`, `FLUSHALL`), evicted, or removed by the
    /// server when its last hold expired.
    Deleted,
    /// The key now holds another type of value (overwritten, for example by `SET`).
    Overwritten,
    /// Another owner holds the lock now.
    Taken,
    /// The server ended this owner's hold (its ttl passed there, or it was released by
    /// someone using the same owner) and nobody else holds the lock yet.
    Ended,
    /// A bound hold's connection closed, which ended the hold ([`crate::Acquire::bind`]).
    ConnectionClosed,
}

impl LossCause {
    /// A few words for messages.
    pub fn describe(self) -> &'static str {
        match self {
            LossCause::Expired => "its validity ran out without a confirmed extend",
            LossCause::Deleted => "its key was deleted (DEL, FLUSHALL, eviction or expiry)",
            LossCause::Overwritten => "its key was overwritten with another type",
            LossCause::Taken => "another owner holds it now",
            LossCause::Ended => "the server ended the hold",
            LossCause::ConnectionClosed => "its bound connection closed",
        }
    }
}

/// A lost lock: which key, how it was lost, and when the client noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLock {
    /// The key of the lost lock.
    pub key: String,
    /// How it was lost.
    pub cause: LossCause,
    /// When this client noticed the loss (wall clock).
    pub noticed_at: SystemTime,
    /// What each server answered to the request that found the loss (empty when the
    /// validity ran out before any request failed).
    pub causes: Vec<(String, Outcome)>,
}

impl std::fmt::Display for LostLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ago = self.noticed_at.elapsed().unwrap_or_default();
        write!(
            f,
            "lock {:?} lost: {} (noticed {} ms ago)",
            self.key,
            self.cause.describe(),
            ago.as_millis()
        )?;
        for (name, outcome) in &self.causes {
            write!(f, " [{name}: {outcome:?}]")?;
        }
        Ok(())
    }
}

impl LockError {
    /// What each instance answered.
    pub fn causes(&self) -> &[(String, Outcome)] {
        match self {
            LockError::Held { causes }
            | LockError::Unreachable { causes }
            | LockError::Refused { causes }
            | LockError::Deadlock { causes }
            | LockError::WrongKind { causes }
            | LockError::CapacityMismatch { causes }
            | LockError::Expired { causes }
            | LockError::MaxWaiters { causes }
            | LockError::NotOwner { causes }
            | LockError::ModuleMissing { causes }
            | LockError::ReplicasNotAcknowledged { causes, .. } => causes,
            LockError::Lost(lost) => &lost.causes,
            LockError::InvalidRequest { .. }
            | LockError::Config { .. }
            | LockError::WaitLimit { .. } => &[],
        }
    }

    /// The request itself was refused (by a server, or before anything was sent): trying it
    /// again unchanged gets the same answer (`MaxWaiters` may pass later, once the queue
    /// shrinks).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            LockError::Refused { .. }
                | LockError::Deadlock { .. }
                | LockError::WrongKind { .. }
                | LockError::CapacityMismatch { .. }
                | LockError::MaxWaiters { .. }
                | LockError::NotOwner { .. }
                | LockError::InvalidRequest { .. }
                | LockError::ModuleMissing { .. }
                | LockError::Config { .. }
        )
    }

    /// The loss, when this error reports a lost lock.
    pub fn lost(&self) -> Option<&LostLock> {
        match self {
            LockError::Lost(lost) => Some(lost),
            _ => None,
        }
    }
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            LockError::Held { .. } => "lock (or every permit) held by someone else",
            LockError::Unreachable { .. } => "too few lock instances reachable",
            LockError::Refused { .. } => "lock request refused",
            LockError::Deadlock { .. } => "lock request refused: it would deadlock",
            LockError::WrongKind { .. } => {
                "lock request refused: the key is a lock and a permit was asked, or the reverse"
            }
            LockError::CapacityMismatch { .. } => {
                "permit request refused: the semaphore has another capacity"
            }
            LockError::Expired { .. } => "lock validity ran out",
            LockError::MaxWaiters { .. } => "lock request refused: the wait queue is full",
            LockError::NotOwner { .. } => "the owner does not hold the lock",
            LockError::ReplicasNotAcknowledged {
                wanted,
                acknowledged,
                ..
            } => {
                write!(
                    f,
                    "lock granted but only {acknowledged} of {wanted} replicas acknowledged it \
                     in time (released):"
                )?;
                for (name, outcome) in self.causes() {
                    write!(f, " [{name}: {outcome:?}]")?;
                }
                return Ok(());
            }
            LockError::InvalidRequest { reason } => {
                return write!(f, "invalid lock request: {reason}");
            }
            LockError::Config { reason } => {
                return write!(f, "invalid lock client configuration: {reason}");
            }
            LockError::WaitLimit { limit } => {
                return write!(
                    f,
                    "all {limit} connections for waiting acquires were in use until the wait \
                     ran out (raise max_wait_connections, or wait longer)"
                );
            }
            LockError::Lost(lost) => return write!(f, "{lost}"),
            LockError::ModuleMissing { .. } => {
                "the server does not have the lock module loaded (load it with \
                 `loadmodule /path/to/libredis_lock.so` or MODULE LOAD)"
            }
        };
        write!(f, "{what}")?;
        if self.causes().is_empty() {
            return Ok(());
        }
        write!(f, ":")?;
        for (name, outcome) in self.causes() {
            write!(f, " [{name}: {outcome:?}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for LockError {}
/// What an error reply of a server means to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    // In order of precedence, most specific first.
    ModuleMissing,
    Deadlock,
    WrongKind,
    CapacityMismatch,
    MaxWaiters,
    NotOwner,
    Other,
}
/// The kind of an error answer (typed, or read from the text of an untyped `Refused`).
fn refusal(outcome: &Outcome) -> Option<Refusal> {
    Some(match outcome {
        Outcome::Deadlock(_) => Refusal::Deadlock,
        Outcome::WrongKind(_) => Refusal::WrongKind,
        Outcome::CapacityMismatch(_) => Refusal::CapacityMismatch,
        Outcome::MaxWaiters(_) => Refusal::MaxWaiters,
        Outcome::NotOwner(_) => Refusal::NotOwner,
        Outcome::Refused(text) if is_module_missing(text) => Refusal::ModuleMissing,
        Outcome::Refused(text) => match Outcome::from_error_text(text.as_str()) {
            Outcome::Refused(_) => Refusal::Other,
            typed => return refusal(&typed),
        },
        Outcome::Granted(_) | Outcome::Held | Outcome::Unreachable(_) => return None,
    })
}
/// Names the failure from what the instances answered, given the quorum needed.
pub(crate) fn classify(causes: &[(String, Outcome)], quorum: usize) -> LockError {
    let reachable = causes
        .iter()
        .filter(|(_, o)| !matches!(o, Outcome::Unreachable(_)))
        .count();
    let refused = causes.iter().filter_map(|(_, o)| refusal(o)).min();
    let causes = causes.to_vec();
    if reachable < quorum {
        return LockError::Unreachable { causes };
    }
    match refused {
        Some(Refusal::ModuleMissing) => LockError::ModuleMissing { causes },
        Some(Refusal::Deadlock) => LockError::Deadlock { causes },
        Some(Refusal::WrongKind) => LockError::WrongKind { causes },
        Some(Refusal::CapacityMismatch) => LockError::CapacityMismatch { causes },
        Some(Refusal::MaxWaiters) => LockError::MaxWaiters { causes },
        Some(Refusal::NotOwner) => LockError::NotOwner { causes },
        Some(Refusal::Other) => LockError::Refused { causes },
        None => LockError::Held { causes },
    }
}

/// `ERR unknown command 'LOCK.ACQUIRE', with args beginning with: ...` (Redis and Valkey).
fn is_module_missing(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("unknown command") && lower.contains("lock.")
}
