//! Several keys at once: the one global order they are taken in (so two requests over
//! overlapping keys can never wait for each other in a cycle), the wait left for each key, and
//! what the release of them all reports.

use std::time::{Duration, Instant};

use super::error::LockError;
use super::request::Acquire;

/// The most keys one multi-key acquire takes.
pub const MAX_KEYS: usize = 1024;

/// The requests checked and put in the global order: by key bytes. Every multi-key acquire of
/// every client takes its keys in this order, so one that holds key `a` and waits for `b`
/// (`a < b`) is never waited for by one that holds `b`, whatever order the caller named them.
pub(crate) fn ordered<K: AsRef<str>>(
    items: &[(K, Acquire)],
) -> Result<Vec<(String, Acquire)>, LockError> {
    let invalid = |reason: String| Err(LockError::InvalidRequest { reason });
    if items.is_empty() {
        return invalid("no keys to acquire".into());
    }
    if items.len() > MAX_KEYS {
        return invalid(format!(
            "{} keys in one acquire (at most {MAX_KEYS})",
            items.len()
        ));
    }
    let mut out: Vec<(String, Acquire)> = Vec::with_capacity(items.len());
    for (key, request) in items {
        request.check()?;
        if request.owner.is_some() {
            return invalid(
                "a multi-key acquire takes no explicit owner: each key is held under an owner \
                 of its own guard, so that releasing one never takes another's hold"
                    .into(),
            );
        }
        if request.min_replicas.is_some() {
            return invalid("a multi-key acquire takes no min_replicas".into());
        }
        out.push((key.as_ref().to_string(), request.clone()));
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return invalid(format!("the key {:?} is named twice", w[0].0));
    }
    Ok(out)
}

/// The wait left for one key's request, `started` being when the whole acquire began: its own
/// wait less what the keys before it took. `None` once that wait is spent (the key is then
/// tried once, without waiting).
pub(crate) fn wait_left(request: &Acquire, started: Instant, now: Instant) -> Option<Duration> {
    let wait = request.wait?;
    let left = wait.checked_sub(now.saturating_duration_since(started))?;
    (!left.is_zero()).then_some(left)
}

/// The request for one key at `now`: the same, with the wait that is left.
pub(crate) fn with_wait_left(request: &Acquire, started: Instant, now: Instant) -> Acquire {
    let mut r = request.clone();
    r.wait = wait_left(request, started, now);
    r
}

/// What releasing every key reports: the first loss if any key was lost (a lost lock is never
/// a success), else the first other failure, else success.
pub(crate) fn release_result(results: Vec<Result<(), LockError>>) -> Result<(), LockError> {
    let mut first_error = None;
    for r in results {
        match r {
            Err(e @ LockError::Lost(_)) => return Err(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
            Ok(()) => {}
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_in_byte_order_whatever_order_they_are_named_in() {
        let ttl = Duration::from_secs(1);
        let a = ordered(&[("b", Acquire::write(ttl)), ("a", Acquire::read(ttl))]).unwrap();
        let b = ordered(&[("a", Acquire::read(ttl)), ("b", Acquire::write(ttl))]).unwrap();
        let keys =
            |v: &Vec<(String, Acquire)>| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&a), vec!["a", "b"]);
        assert_eq!(keys(&a), keys(&b));
    }

    #[test]
    fn bad_sets_are_refused_before_anything_is_sent() {
        let ttl = Duration::from_secs(1);
        let none: [(&str, Acquire); 0] = [];
        for bad in [
            ordered(&none),
            ordered(&[("a", Acquire::write(ttl)), ("a", Acquire::read(ttl))]),
            ordered(&[("a", Acquire::write(ttl).owner("o"))]),
            ordered(&[("a", Acquire::write(Duration::ZERO))]),
        ] {
            assert!(
                matches!(bad, Err(LockError::InvalidRequest { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn each_key_waits_only_what_is_left_of_its_wait() {
        let now = Instant::now();
        let r = Acquire::write(Duration::from_secs(1)).wait(Duration::from_secs(2));
        assert_eq!(wait_left(&r, now, now), Some(Duration::from_secs(2)));
        let later = now + Duration::from_millis(1500);
        assert_eq!(wait_left(&r, now, later), Some(Duration::from_millis(500)));
        assert_eq!(wait_left(&r, now, now + Duration::from_secs(3)), None);
        assert_eq!(
            wait_left(&Acquire::write(Duration::from_secs(1)), now, now),
            None
        );
    }
}
