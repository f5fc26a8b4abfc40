//! Several keys held together ([`LockClient::acquire_all`](super::LockClient::acquire_all),
//! [`Redlock::acquire_all`](super::Redlock::acquire_all)).

use std::time::{Duration, Instant};

use super::guard::LockGuard;
use crate::proto::multi::{ordered, release_result, with_wait_left};
use crate::{Acquire, LockError, LostLock};

/// Guards over several keys, taken in the global key order and released together (on
/// [`MultiGuard::release`] or drop, in the reverse order).
#[must_use = "dropping the guard releases every key at once"]
#[derive(Debug)]
pub struct MultiGuard {
    /// In key order.
    guards: Vec<LockGuard>,
}

/// Takes every key of `items` in the global order with `acquire`; on a failure, releases what
/// was taken (by dropping it) and returns that failure.
pub(crate) fn acquire_all<K: AsRef<str>>(
    items: &[(K, Acquire)],
    acquire: impl Fn(&str, Acquire) -> Result<LockGuard, LockError>,
) -> Result<MultiGuard, LockError> {
    let started = Instant::now();
    let mut guards = Vec::with_capacity(items.len());
    for (key, request) in ordered(items)? {
        let request = with_wait_left(&request, started, Instant::now());
        guards.push(acquire(&key, request)?);
    }
    Ok(MultiGuard { guards })
}

impl MultiGuard {
    /// The guards, in key order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The guard of `key`.
    pub fn get(&self, key: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|g| g.key() == key)
    }

    /// True once any of the keys is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// The first loss among the keys, if any.
    pub fn loss(&self) -> Option<LostLock> {
        self.guards.iter().find_map(LockGuard::loss)
    }

    /// How much longer every key is certainly held (the least validity).
    pub fn validity(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::validity)
            .min()
            .unwrap_or_default()
    }

    /// Extends every key; the least new validity, or the first failure.
    pub fn extend(&self) -> Result<Duration, LockError> {
        let mut least = Duration::MAX;
        for g in &self.guards {
            least = least.min(g.extend()?);
        }
        Ok(least)
    }

    /// Releases every key (in reverse key order). Succeeds only if every key was held until
    /// its release; otherwise the first loss ([`LockError::Lost`]), or the first other
    /// failure.
    pub fn release(self) -> Result<(), LockError> {
        let results = self
            .guards
            .into_iter()
            .rev()
            .map(LockGuard::release)
            .collect();
        release_result(results)
    }
}
