//! Several keys held together ([`AsyncLockClient::acquire_all`](super::AsyncLockClient::acquire_all),
//! [`AsyncRedlock::acquire_all`](super::AsyncRedlock::acquire_all)).

use std::future::Future;
use std::time::{Duration, Instant};

use super::guard::AsyncLockGuard;
use crate::proto::multi::{ordered, release_result, with_wait_left};
use crate::{Acquire, LockError, LostLock};

/// Guards over several keys, taken in the global key order and released together (on
/// [`AsyncMultiGuard::release`], or on drop as each [`AsyncLockGuard`] is).
#[must_use = "dropping the guard releases every key at once"]
#[derive(Debug)]
pub struct AsyncMultiGuard {
    /// In key order.
    guards: Vec<AsyncLockGuard>,
}

/// Takes every key of `items` in the global order with `acquire`; on a failure, releases what
/// was taken (by dropping it) and returns that failure.
pub(crate) async fn acquire_all<K, F, Fut>(
    items: &[(K, Acquire)],
    acquire: F,
) -> Result<AsyncMultiGuard, LockError>
where
    K: AsRef<str>,
    F: Fn(String, Acquire) -> Fut,
    Fut: Future<Output = Result<AsyncLockGuard, LockError>>,
{
    let started = Instant::now();
    let mut guards = Vec::with_capacity(items.len());
    for (key, request) in ordered(items)? {
        let request = with_wait_left(&request, started, Instant::now());
        guards.push(acquire(key, request).await?);
    }
    Ok(AsyncMultiGuard { guards })
}

impl AsyncMultiGuard {
    /// The guards, in key order.
    pub fn guards(&self) -> &[AsyncLockGuard] {
        &self.guards
    }

    /// The guard of `key`.
    pub fn get(&self, key: &str) -> Option<&AsyncLockGuard> {
        self.guards.iter().find(|g| g.key() == key)
    }

    /// True once any of the keys is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(AsyncLockGuard::is_lost)
    }

    /// The first loss among the keys, if any.
    pub fn loss(&self) -> Option<LostLock> {
        self.guards.iter().find_map(AsyncLockGuard::loss)
    }

    /// How much longer every key is certainly held (the least validity).
    pub fn validity(&self) -> Duration {
        self.guards
            .iter()
            .map(AsyncLockGuard::validity)
            .min()
            .unwrap_or_default()
    }

    /// Releases every key (in reverse key order). Succeeds only if every key was held until
    /// its release; otherwise the first loss ([`LockError::Lost`]), or the first other
    /// failure.
    pub async fn release(self) -> Result<(), LockError> {
        let mut results = Vec::with_capacity(self.guards.len());
        for g in self.guards.into_iter().rev() {
            results.push(g.release().await);
        }
        release_result(results)
    }
}
