//! What one guard holds, shared by the sync and the async guard: key, owner, mode, tokens,
//! the [`Lease`], and the commands its extends and release send. A face's guard keeps a
//! [`Hold`] and adds its own way of sending and of waking whoever waits for a loss.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::Cmd;

use super::error::{LockError, LossCause};
use super::info::LockInfo;
use super::lease::Lease;
use super::reply::{extend_cmd, release_cmd, release_one_cmd, Outcome};
use super::request::{Acquire, Mode};

/// What a guard holds.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) mode: Mode,
    /// Release all of the owner's holds (`ALL`): the owner is this guard's alone (random).
    /// Otherwise (an explicit owner) one hold.
    pub(crate) release_all: bool,
    /// (server index, token) for every server that granted.
    pub(crate) tokens: Vec<(usize, u64)>,
    /// The servers' names, in order.
    pub(crate) names: Vec<String>,
    lease: Mutex<Lease>,
    /// Servers on which a watcher found the hold gone (a quorum lock is lost once too many
    /// are).
    gone: Mutex<Vec<bool>>,
}

impl Hold {
    pub(crate) fn new(
        key: &str,
        owner: String,
        request: &Acquire,
        tokens: Vec<(usize, u64)>,
        names: Vec<String>,
        valid_until: Instant,
    ) -> Self {
        let quorum = names.len() / 2 + 1;
        Hold {
            key: key.to_string(),
            mode: request.mode,
            release_all: request.release_all(),
            lease: Mutex::new(Lease::new(
                key,
                request.ttl,
                quorum,
                request.release_all(),
                valid_until,
                names.clone(),
            )),
            gone: Mutex::new(vec![false; names.len()]),
            owner,
            tokens,
            names,
        }
    }

    pub(crate) fn lease(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn quorum(&self) -> usize {
        self.names.len() / 2 + 1
    }

    /// The grant's token on one server; `None` for a quorum lock, whose servers' tokens are
    /// not comparable.
    pub(crate) fn fencing_token(&self) -> Option<u64> {
        match (&self.tokens[..], self.names.len()) {
            ([(_, t)], 1) => Some(*t),
            _ => None,
        }
    }

    /// (server name, token) for every server that granted.
    pub(crate) fn named_tokens(&self) -> Vec<(String, u64)> {
        self.tokens
            .iter()
            .filter_map(|(i, t)| self.names.get(*i).map(|n| (n.clone(), *t)))
            .collect()
    }

    /// The server whose `LOCK.INFO` speaks for the hold (the first that granted).
    pub(crate) fn first_server(&self) -> usize {
        self.tokens.first().map_or(0, |(i, _)| *i)
    }

    pub(crate) fn is_lost(&self, now: Instant) -> bool {
        self.lease().is_lost(now)
    }

    pub(crate) fn validity(&self, now: Instant) -> Duration {
        self.lease().validity(now)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.lease().valid_until()
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.lease().ttl()
    }

    pub(crate) fn extend_cmd(&self, ttl: Duration) -> Cmd {
        extend_cmd(&self.key, &self.owner, ttl)
    }

    pub(crate) fn release_cmd(&self) -> Cmd {
        if self.release_all {
            release_cmd(&self.key, &self.owner)
        } else {
            release_one_cmd(&self.key, &self.owner)
        }
    }

    /// Records a loss found outside the guard's own requests (a watcher's re-read, a closed
    /// bound connection); true the first time, so it is reported once.
    pub(crate) fn lose(&self, cause: LossCause, causes: Vec<(String, Outcome)>) -> bool {
        self.lease().lose(cause, causes)
    }

    /// Whether `info` (a re-read of the key on server `i`) shows the lock lost: gone there,
    /// and on too many servers for a quorum. Records the loss and returns its cause the first
    /// time.
    pub(crate) fn check_info(&self, i: usize, info: &Option<LockInfo>) -> Option<LossCause> {
        let cause = self.loss_in_info(i, info)?;
        let causes = self.info_causes(i, cause);
        self.lose(cause, causes).then_some(cause)
    }

    /// What [`Hold::check_info`] finds, without recording it: the cause, if `info` shows the
    /// lock lost.
    pub(crate) fn loss_in_info(&self, i: usize, info: &Option<LockInfo>) -> Option<LossCause> {
        let cause = super::lease::cause_from_info(info, &self.owner)?;
        // The servers that still hold it: those that granted and were not found gone since.
        let holding = {
            let mut gone = self.gone.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(g) = gone.get_mut(i) {
                *g = true;
            }
            self.tokens
                .iter()
                .filter(|(j, _)| !gone.get(*j).copied().unwrap_or(true))
                .count()
        };
        if holding >= self.quorum() {
            return None;
        }
        Some(cause)
    }

    /// The causes list of a loss a re-read of server `i` found.
    pub(crate) fn info_causes(&self, i: usize, cause: LossCause) -> Vec<(String, Outcome)> {
        self.names
            .get(i)
            .map(|n| {
                vec![(
                    n.clone(),
                    Outcome::NotOwner(format!("LOCK.INFO: {}", cause.describe())),
                )]
            })
            .unwrap_or_default()
    }
}

impl Hold {
    /// After a face read `LOCK.INFO` for a [`Verdict::Diagnose`] (`None`: it could not).
    pub(crate) fn diagnosed<T>(
        &self,
        info: Option<Option<LockInfo>>,
        outcomes: &[Outcome],
    ) -> Result<T, LockError> {
        self.lease().diagnosed(info, &self.owner, outcomes)
    }
}
