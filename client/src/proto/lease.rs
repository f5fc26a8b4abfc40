//! What a guard knows about its hold, and what each answer to its extends and release means:
//! the one place that decides whether a lock is still held, lost (how, noticed when), or
//! released. Both faces keep a [`Lease`] behind a mutex and feed it the servers' answers; time
//! comes in as an argument.

use std::time::{Duration, Instant, SystemTime};

use super::error::{classify, LockError, LossCause, LostLock};
use super::info::LockInfo;
use super::reply::Outcome;

/// Clock drift allowance for a lease of `ttl`: 1% of it plus 2 ms (as Redlock specifies).
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// With one server there is no cross-server drift, but the client's and the server's clocks
/// still run separately: a margin kept off every single-server lease.
pub(crate) const SINGLE_SERVER_MARGIN: Duration = Duration::from_millis(2);
/// Allowance for the transit of a waited grant's reply.
pub(crate) const WAITED_GRANT_MARGIN: Duration = Duration::from_millis(5);

/// The end of a single-server lease granted to a request sent at `sent` and answered at `now`.
/// Without a server-side wait the server granted after `sent`, so `sent + ttl` is a safe lower
/// bound of the expiry. A waited grant is replied the moment it happens, so it started at the
/// reply's arrival less the reply's transit, allowed for by a margin.
pub(crate) fn single_server_valid_until(
    sent: Instant,
    waited: bool,
    ttl: Duration,
    now: Instant,
) -> Instant {
    let end = if waited {
        now + ttl.saturating_sub(WAITED_GRANT_MARGIN)
    } else {
        sent + ttl
    };
    end.checked_sub(SINGLE_SERVER_MARGIN).unwrap_or(now)
}

/// The end of a quorum lease whose request was sent at `sent`, if it is still of use at `now`.
pub(crate) fn quorum_valid_until(sent: Instant, ttl: Duration, now: Instant) -> Option<Instant> {
    let elapsed = now.saturating_duration_since(sent);
    let validity = ttl.checked_sub(elapsed + drift(ttl))?;
    (!validity.is_zero()).then(|| now + validity)
}

/// How a loss reads from `LOCK.INFO` of the key on a server, for `owner`: `None` while the
/// owner still holds it there.
pub(crate) fn cause_from_info(info: &Option<LockInfo>, owner: &str) -> Option<LossCause> {
    let Some(info) = info else {
        return Some(LossCause::Deleted);
    };
    if info.hold_count(owner) > 0 {
        return None;
    }
    // A read of this owner's hold alone lists nobody else: `holders_count` says whether others
    // hold the key.
    if info.live_holders() == 0 {
        Some(LossCause::Ended)
    } else {
        Some(LossCause::Taken)
    }
}

/// What a `using` returns once its work ran and its guard was released: the work's value only
/// if the lock was held until the release. A release that could not be confirmed (servers
/// unreachable) while the lease was still valid leaves the work's value standing: the lock was
/// certainly held while it ran, and the hold ends at its ttl.
pub(crate) fn using_result<T>(released: Result<(), LockError>, out: T) -> Result<T, LockError> {
    match released {
        Err(lost @ LockError::Lost(_)) => Err(lost),
        _ => Ok(out),
    }
}

/// The cause a refusal of an extend or release points at, before any closer look.
fn cause_of(outcome: &Outcome) -> LossCause {
    match outcome {
        Outcome::Refused(text) if text.contains("WRONGTYPE") => LossCause::Overwritten,
        _ => LossCause::Ended,
    }
}

/// What the servers answered to an extend or a release, counted.
struct Tally {
    /// Servers that did it (still held it).
    ok: usize,
    /// Servers that may still hold it: all but those that refused.
    holding: usize,
    /// The first refusal: its server and the cause it points at.
    first_refusal: Option<(usize, LossCause)>,
}

impl Tally {
    fn of(outcomes: &[Outcome]) -> Self {
        Tally {
            ok: outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Granted(_)))
                .count(),
            holding: outcomes.iter().filter(|o| !o.is_refusal()).count(),
            first_refusal: outcomes
                .iter()
                .enumerate()
                .find(|(_, o)| o.is_refusal())
                .map(|(i, o)| (i, cause_of(o))),
        }
    }
}

/// The answer to an extend or a release, once the lease has read the servers' replies.
#[derive(Debug)]
pub(crate) enum Verdict<T> {
    /// Final.
    Done(Result<T, LockError>),
    /// Too many servers say the owner holds nothing: read `LOCK.INFO` of the key on this
    /// server (or `None` when it could not be read) and pass it to [`Lease::diagnosed`], which
    /// names the loss.
    Diagnose(usize),
}

/// The state of one guard's hold. `valid_until` only moves forward, and only while it has
/// not passed; a loss, once recorded, is never cleared.
#[derive(Debug)]
pub(crate) struct Lease {
    key: String,
    /// The lease asked for by each grant and extend (an extend may set a new one).
    ttl: Duration,
    quorum: usize,
    /// The owner is this guard's alone (random): a successful release then proves that the
    /// owner held the key without a break since the grant (nobody else can have been granted
    /// under that owner), so it is a success even after the local validity ran out.
    own_owner: bool,
    valid_until: Instant,
    loss: Option<LostLock>,
    released: bool,
    /// Names of the servers, in order (for causes).
    names: Vec<String>,
}

impl Lease {
    pub(crate) fn new(
        key: &str,
        ttl: Duration,
        quorum: usize,
        own_owner: bool,
        valid_until: Instant,
        names: Vec<String>,
    ) -> Self {
        Lease {
            key: key.to_string(),
            ttl,
            quorum,
            own_owner,
            valid_until,
            loss: None,
            released: false,
            names,
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until
    }

    fn named(&self, outcomes: &[Outcome]) -> Vec<(String, Outcome)> {
        self.names
            .iter()
            .cloned()
            .zip(outcomes.iter().cloned())
            .collect()
    }

    /// The loss, if the lock is lost at `now` (recording an expiry when validity has run out).
    pub(crate) fn loss(&mut self, now: Instant) -> Option<&LostLock> {
        if self.loss.is_none() && !self.released && now >= self.valid_until {
            self.record(LossCause::Expired, Vec::new());
        }
        self.loss.as_ref()
    }

    pub(crate) fn is_lost(&mut self, now: Instant) -> bool {
        self.loss(now).is_some()
    }

    /// How much longer the lock is certainly held (zero once lost).
    pub(crate) fn validity(&mut self, now: Instant) -> Duration {
        if self.is_lost(now) {
            return Duration::ZERO;
        }
        self.valid_until.saturating_duration_since(now)
    }

    fn record(&mut self, cause: LossCause, causes: Vec<(String, Outcome)>) -> LockError {
        if self.loss.is_none() {
            self.loss = Some(LostLock {
                key: self.key.clone(),
                cause,
                noticed_at: SystemTime::now(),
                causes,
            });
        }
        self.lost_error()
    }

    fn lost_error(&self) -> LockError {
        match &self.loss {
            Some(lost) => LockError::Lost(lost.clone()),
            None => LockError::Lost(LostLock {
                key: self.key.clone(),
                cause: LossCause::Expired,
                noticed_at: SystemTime::now(),
                causes: Vec::new(),
            }),
        }
    }

    /// Records a loss found by a watcher (a re-read of the key, a closed bound connection).
    /// True when this is the first loss recorded (so it is reported once).
    pub(crate) fn lose(&mut self, cause: LossCause, causes: Vec<(String, Outcome)>) -> bool {
        if self.loss.is_some() || self.released {
            return false;
        }
        self.record(cause, causes);
        true
    }

    /// Before an extend is sent: `Err` when the lock is already lost (or released).
    pub(crate) fn before_extend(&mut self, now: Instant) -> Result<(), LockError> {
        if self.released {
            return Err(LockError::InvalidRequest {
                reason: "the guard was released".into(),
            });
        }
        match self.loss(now) {
            Some(_) => Err(self.lost_error()),
            None => Ok(()),
        }
    }

    /// The servers' answers to `LOCK.EXTEND ... ttl` sent at `sent` (`closed`: a bound
    /// connection was found closed): the new validity when a quorum confirmed it in time. A
    /// confirmation after validity ran out does not revive the guard (the lock may have been
    /// free in between).
    pub(crate) fn extended(
        &mut self,
        outcomes: &[Outcome],
        closed: bool,
        sent: Instant,
        ttl: Duration,
        now: Instant,
    ) -> Verdict<Duration> {
        let tally = Tally::of(outcomes);
        let causes = self.named(outcomes);
        if self.loss.is_some() {
            return Verdict::Done(Err(self.lost_error()));
        }
        if tally.ok >= self.quorum {
            if now >= self.valid_until {
                return Verdict::Done(Err(self.record(LossCause::Expired, causes)));
            }
            if let Some(v) = ttl.checked_sub(now.saturating_duration_since(sent) + drift(ttl)) {
                // The server set the expiry to its now + ttl: with the same ttl a later reply
                // only moves the lease forward, but a new ttl replaces it (a shorter one
                // shortens the lease: the old validity no longer holds).
                self.valid_until = if ttl == self.ttl {
                    self.valid_until.max(now + v)
                } else {
                    now + v
                };
                self.ttl = ttl;
                return Verdict::Done(Ok(self.valid_until.saturating_duration_since(now)));
            }
        }
        if closed {
            return Verdict::Done(Err(self.record(LossCause::ConnectionClosed, causes)));
        }
        if let Some(verdict) = self.too_few_hold(&tally, causes.clone()) {
            return verdict;
        }
        if now >= self.valid_until {
            return Verdict::Done(Err(self.record(LossCause::Expired, causes)));
        }
        Verdict::Done(Err(classify(&causes, self.quorum)))
    }

    /// When fewer than a quorum of servers may still hold the lock (the others refused): the
    /// loss, named by the first refusal, or a closer look at it.
    fn too_few_hold<T>(
        &mut self,
        tally: &Tally,
        causes: Vec<(String, Outcome)>,
    ) -> Option<Verdict<T>> {
        if tally.holding >= self.quorum {
            return None;
        }
        Some(match tally.first_refusal {
            Some((i, LossCause::Ended)) => Verdict::Diagnose(i),
            Some((_, cause)) => Verdict::Done(Err(self.record(cause, causes))),
            None => Verdict::Done(Err(self.record(LossCause::Ended, causes))),
        })
    }

    /// After [`Verdict::Diagnose`]: `info` is what the server's `LOCK.INFO` said (`None`
    /// when it could not be read), `outcomes` the answers that led here.
    pub(crate) fn diagnosed<T>(
        &mut self,
        info: Option<Option<LockInfo>>,
        owner: &str,
        outcomes: &[Outcome],
    ) -> Result<T, LockError> {
        let cause = info
            .and_then(|i| cause_from_info(&i, owner))
            .unwrap_or(LossCause::Ended);
        let causes = self.named(outcomes);
        Err(self.record(cause, causes))
    }

    /// The servers' answers to the guard's `LOCK.RELEASE` (`closed`: a bound connection was
    /// found closed before the release reached the server). A release is a success only when
    /// the lock was held until it: a quorum released a hold of the owner, and either the
    /// owner is the guard's own or the validity had not run out.
    pub(crate) fn released(
        &mut self,
        outcomes: &[Outcome],
        closed: bool,
        now: Instant,
    ) -> Verdict<()> {
        self.released = true;
        let tally = Tally::of(outcomes);
        let causes = self.named(outcomes);
        if tally.ok >= self.quorum && (self.own_owner || now < self.valid_until) {
            // Held without a break until the release, whatever was believed meanwhile.
            self.loss = None;
            return Verdict::Done(Ok(()));
        }
        if self.loss.is_some() {
            return Verdict::Done(Err(self.lost_error()));
        }
        if closed {
            return Verdict::Done(Err(self.record(LossCause::ConnectionClosed, causes)));
        }
        if tally.ok >= self.quorum {
            return Verdict::Done(Err(self.record(LossCause::Expired, causes)));
        }
        if let Some(verdict) = self.too_few_hold(&tally, causes.clone()) {
            return verdict;
        }
        // Not confirmed, and the validity is over: the lock may have ended meanwhile.
        if now >= self.valid_until {
            return Verdict::Done(Err(self.record(LossCause::Expired, causes)));
        }
        Verdict::Done(Err(LockError::Unreachable { causes }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(quorum: usize, own: bool, valid_for: Duration, now: Instant) -> Lease {
        let names = (0..quorum * 2 - 1).map(|i| format!("s{i}")).collect();
        Lease::new(
            "k",
            Duration::from_secs(3),
            quorum,
            own,
            now + valid_for,
            names,
        )
    }

    fn notowner() -> Outcome {
        Outcome::NotOwner("NOTOWNER the owner does not hold this lock".into())
    }

    #[test]
    fn a_release_the_servers_confirm_is_a_success_even_after_local_validity_for_own_owners() {
        let now = Instant::now();
        let mut l = lease(1, true, Duration::from_millis(10), now);
        let later = now + Duration::from_secs(1);
        assert!(l.is_lost(later));
        let v = l.released(&[Outcome::Granted(0)], false, later);
        assert!(matches!(v, Verdict::Done(Ok(()))), "{v:?}");
        // An explicit owner cannot prove it held the key without a break.
        let mut l = lease(1, false, Duration::from_millis(10), now);
        let v = l.released(&[Outcome::Granted(0)], false, later);
        match v {
            Verdict::Done(Err(LockError::Lost(lost))) => assert_eq!(lost.cause, LossCause::Expired),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_release_the_servers_refuse_is_a_loss_named_by_a_closer_look() {
        let now = Instant::now();
        let mut l = lease(1, true, Duration::from_secs(3), now);
        let v = l.released(&[notowner()], false, now);
        assert!(matches!(v, Verdict::Diagnose(0)), "{v:?}");
        let info = LockInfo {
            mode: "write".into(),
            holders: vec![crate::Holder {
                owner: "other".into(),
                count: 1,
                ttl: Duration::from_secs(1),
                held: None,
            }],
            ..Default::default()
        };
        let r: Result<(), LockError> = l.diagnosed(Some(Some(info)), "me", &[notowner()]);
        assert_eq!(
            r.unwrap_err().lost().map(|l| l.cause),
            Some(LossCause::Taken)
        );
        let mut l = lease(1, true, Duration::from_secs(3), now);
        let _ = l.released(&[notowner()], false, now);
        let r: Result<(), LockError> = l.diagnosed(Some(None), "me", &[notowner()]);
        assert_eq!(
            r.unwrap_err().lost().map(|l| l.cause),
            Some(LossCause::Deleted)
        );
    }

    #[test]
    fn an_overwritten_key_and_a_closed_bound_connection_name_themselves() {
        let now = Instant::now();
        let mut l = lease(1, true, Duration::from_secs(3), now);
        let wrongtype = Outcome::Refused("WRONGTYPE Operation against a key".into());
        match l.released(&[wrongtype], false, now) {
            Verdict::Done(Err(LockError::Lost(lost))) => {
                assert_eq!(lost.cause, LossCause::Overwritten)
            }
            other => panic!("{other:?}"),
        }
        let mut l = lease(1, true, Duration::from_secs(3), now);
        let closed = Outcome::Unreachable("closed".into());
        match l.released(&[closed], true, now) {
            Verdict::Done(Err(LockError::Lost(lost))) => {
                assert_eq!(lost.cause, LossCause::ConnectionClosed)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_quorum_release_needs_only_a_majority_and_unanswered_servers_are_not_a_loss() {
        let now = Instant::now();
        let mut l = lease(2, true, Duration::from_secs(3), now);
        let slow = Outcome::Unreachable("no reply in time".into());
        let v = l.released(
            &[Outcome::Granted(0), slow.clone(), Outcome::Granted(0)],
            false,
            now,
        );
        assert!(matches!(v, Verdict::Done(Ok(()))), "{v:?}");
        let mut l = lease(2, true, Duration::from_secs(3), now);
        let v = l.released(&[Outcome::Granted(0), slow.clone(), slow], false, now);
        assert!(
            matches!(v, Verdict::Done(Err(LockError::Unreachable { .. }))),
            "{v:?}"
        );
    }

    #[test]
    fn extends_move_validity_forward_only_while_valid_and_a_loss_stays() {
        let now = Instant::now();
        let mut l = lease(1, true, Duration::from_secs(1), now);
        let ttl = Duration::from_secs(10);
        match l.extended(&[Outcome::Granted(0)], false, now, ttl, now) {
            Verdict::Done(Ok(v)) => assert!(v > Duration::from_secs(9), "{v:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(l.ttl(), ttl);
        // A shorter ttl shortens the lease.
        let short = Duration::from_secs(2);
        match l.extended(&[Outcome::Granted(0)], false, now, short, now) {
            Verdict::Done(Ok(v)) => assert!(v < short, "{v:?}"),
            other => panic!("{other:?}"),
        }
        let late = now + Duration::from_secs(20);
        assert!(l.is_lost(late));
        assert!(l.before_extend(late).is_err());
        let v = l.extended(&[Outcome::Granted(0)], false, late, ttl, late);
        assert!(matches!(v, Verdict::Done(Err(LockError::Lost(_)))), "{v:?}");
        assert!(l.is_lost(now), "a loss is never cleared by a later reading");
        assert!(!l.lose(LossCause::Deleted, Vec::new()), "reported once");
    }
}
