//! The Redlock acquire as a state machine: which commands go to which servers, how long to
//! sleep between attempts, and when a majority makes a lock. It sends nothing and reads no
//! clock: a face (sync or async) carries out each [`Step`] and hands back the replies and the
//! time. See [`WaitStrategy`] for the rounds it runs.

use std::time::{Duration, Instant};

use rand::Rng;
use redis::{Cmd, Value};

use super::error::{classify, LockError};
use super::info::random_hex;
use super::lease::quorum_valid_until;
use super::reply::{acquire_outcome, release_cmd, Outcome};
use super::request::{Acquire, Mode};

/// How a Redlock acquire with [`Acquire::wait`] waits for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitStrategy {
    /// The default: after a failed attempt (released everywhere, so nothing is held), queue on
    /// one server with the module's `WAIT` (the same server for every waiter of a key, chosen
    /// by the key, skipping servers that did not answer), in slices of at most a second and a
    /// quarter of the ttl (the validity of a lock got this way counts from the start of the
    /// slice, the earliest moment its grant can have started). When that server grants, ask
    /// the others at once (without waiting, retrying a few times over
    /// some milliseconds while the previous holder's releases arrive); without a majority,
    /// release and back off (randomly, growing to a second). A waiter then costs each server
    /// about one or two commands per second, and a released lock passes to the head waiter in
    /// about two round trips. A bound request ([`Acquire::bind`]) always polls.
    #[default]
    Queue,
    /// Retry the whole attempt after a random delay in the Redlock's `retry_delay` (1 to 20 ms
    /// by default): every waiter costs every server about a hundred commands per second.
    Poll,
}

/// When an acquire waiting `wait` gives up. A wait too long for the clock (such as
/// `Duration::MAX`, for "as long as it takes") is cut to about a century rather than overflow
/// (an `Instant` plus a huge `Duration` panics).
pub(crate) fn give_up_after(now: Instant, wait: Option<Duration>) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let wait = wait.unwrap_or_default().min(CENTURY);
    now.checked_add(wait).unwrap_or(now)
}

/// The longest server-side wait of one [`WaitStrategy::Queue`] slice.
pub(crate) const QUEUE_SLICE: Duration = Duration::from_secs(1);

/// After the designated server granted, the pauses (ms) before each ask of the others: the
/// previous holder's releases may still be on their way.
const OTHERS_PAUSES: [u64; 5] = [0, 1, 2, 4, 8];

/// The server a [`WaitStrategy::Queue`] waiter of `key` queues on: the same for every waiter
/// of the key (so they queue in one FIFO), chosen from the key's bytes, skipping servers that
/// did not answer the last attempt (`answered[i]` false).
pub(crate) fn designated_server(key: &str, answered: &[bool], n: usize) -> usize {
    let home = key.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    }) % n.max(1);
    (0..n)
        .map(|k| (home + k) % n)
        .find(|&i| answered.get(i).copied().unwrap_or(true))
        .unwrap_or(home)
}

/// Why a Redlock refuses semaphore permits.
pub(crate) const REDLOCK_NO_PERMITS: &str = "Redlock does not take semaphore permits: the \
    servers' semaphores are independent, so grants from a majority do not bound the holders to \
    the capacity (capacity 2 on 3 servers: three owners can each hold a permit on a different \
    pair of servers); take permits from one server with LockClient (for capacity 1, a Redlock \
    write lock is the same thing)";

/// Why a Redlock refuses an explicit owner.
pub(crate) const REDLOCK_NO_OWNER: &str = "Redlock does not take an explicit owner: a failed \
    attempt is released on every server, which could not tell this attempt's holds from the \
    owner's other ones; use LockClient (one server) for owners of your own";

/// How a Redlock waits and names its owners (the builder settings both faces share).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) retry_delay: (Duration, Duration),
    pub(crate) strategy: WaitStrategy,
    /// An owner prefix, empty for none.
    pub(crate) prefix: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            retry_delay: (Duration::from_millis(1), Duration::from_millis(20)),
            strategy: WaitStrategy::Queue,
            prefix: String::new(),
        }
    }
}

impl Settings {
    /// Checked as the server would check an owner (prefix + 32 hex digits).
    pub(crate) fn set_prefix(&mut self, prefix: String) -> Result<(), LockError> {
        super::info::OwnerIdentity::Prefix(prefix.clone()).check()?;
        self.prefix = prefix;
        Ok(())
    }

    /// A random delay in `[min, max)` between polling attempts.
    pub(crate) fn set_retry_delay(&mut self, min: Duration, max: Duration) {
        self.retry_delay = (min, max.max(min + Duration::from_micros(1)));
    }

    /// The rounds of one acquire over servers named `names`.
    pub(crate) fn attempts(
        &self,
        key: &str,
        request: Acquire,
        names: Vec<String>,
        allow_bind: bool,
        now: Instant,
    ) -> Result<Attempts, LockError> {
        Attempts::new(
            key,
            request,
            names,
            self.strategy,
            self.retry_delay,
            &self.prefix,
            allow_bind,
            now,
        )
    }
}

/// A Redlock over no server.
pub(crate) fn no_servers() -> LockError {
    LockError::Config {
        reason: "a Redlock needs at least one server".into(),
    }
}

/// What a face does next.
pub(crate) enum Step {
    /// Send `cmds[i]` to server `i` (`None`: not to that one) and hand every reply to
    /// [`Attempts::replied`], in server order (a server not sent to: anything). `wait` is the
    /// server-side wait of a queued request, which then goes over a connection that may block.
    Send {
        cmds: Vec<Option<Cmd>>,
        wait: Option<Duration>,
        what: Sending,
    },
    /// Sleep this long, then call [`Attempts::woke`].
    Sleep(Duration),
    /// A majority granted the lock.
    Granted(Grant),
    /// The acquire failed.
    Failed(LockError),
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Send { cmds, wait, what } => {
                let to: Vec<usize> = (0..cmds.len()).filter(|i| cmds[*i].is_some()).collect();
                write!(f, "Send({what:?} to {to:?}, wait {wait:?})")
            }
            Step::Sleep(d) => write!(f, "Sleep({d:?})"),
            Step::Granted(g) => write!(f, "Granted({g:?})"),
            Step::Failed(e) => write!(f, "Failed({e})"),
        }
    }
}

/// What a [`Step::Send`] carries (a bound request's face sends each kind its own way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sending {
    /// An attempt on every server, no server-side wait.
    Attempt,
    /// A queued wait on one server.
    QueueWait,
    /// After the designated server granted: the others, no server-side wait.
    Others,
    /// `LOCK.RELEASE key owner ALL` where the failed attempt may hold the lock.
    Release,
}

/// A lock a majority granted.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) owner: String,
    /// (server, token) of every server that granted, by server.
    pub(crate) tokens: Vec<(usize, u64)>,
    pub(crate) valid_until: Instant,
    /// What each server answered to the granting attempt.
    pub(crate) outcomes: Vec<Outcome>,
}

#[derive(Debug)]
enum Phase {
    /// An attempt's replies are due.
    Attempt {
        sent: Instant,
    },
    /// A failed attempt's release replies are due; then `error` decides.
    Released {
        error: LockError,
        answered: Vec<bool>,
    },
    /// The designated server's queued wait reply is due.
    Queued {
        designated: usize,
        sent: Instant,
    },
    /// Asking the others after a queued grant: pause `round` is done (or due).
    Others {
        sent: Instant,
        round: usize,
        tokens: Vec<(usize, u64)>,
        outcomes: Vec<Outcome>,
    },
    /// A queued round that did not make a majority is being released; then back off.
    QueueReleased {
        error: LockError,
    },
    /// Sleeping; then a new attempt.
    Backoff,
    Finished,
}

/// One Redlock acquire, from its request to a [`Grant`] or a [`LockError`].
pub(crate) struct Attempts {
    key: String,
    request: Acquire,
    names: Vec<String>,
    quorum: usize,
    strategy: WaitStrategy,
    retry_delay: (Duration, Duration),
    prefix: String,
    give_up: Instant,
    /// The owner of the current attempt (a bound request takes a new one per attempt: a hold
    /// of an earlier attempt still bound to a connection given up on is then never re-entered).
    owner: String,
    backoff: Duration,
    phase: Phase,
}

impl Attempts {
    /// Checks the request (what a Redlock refuses, before anything is sent). `names` are the
    /// servers', in order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        key: &str,
        request: Acquire,
        names: Vec<String>,
        strategy: WaitStrategy,
        retry_delay: (Duration, Duration),
        prefix: &str,
        allow_bind: bool,
        now: Instant,
    ) -> Result<Self, LockError> {
        request.check()?;
        let invalid = |reason: &str| {
            Err(LockError::InvalidRequest {
                reason: reason.to_string(),
            })
        };
        if matches!(request.mode, Mode::Permit { .. }) {
            return invalid(REDLOCK_NO_PERMITS);
        }
        if request.owner.is_some() {
            return invalid(REDLOCK_NO_OWNER);
        }
        if request.min_replicas.is_some() {
            return invalid(
                "Redlock does not take min_replicas: its safety comes from a majority of \
                 independent servers, not from replication",
            );
        }
        if request.bind && !allow_bind {
            return invalid("this Redlock does not take bind()");
        }
        if names.is_empty() {
            return invalid("a Redlock needs at least one server");
        }
        let quorum = names.len() / 2 + 1;
        let give_up = give_up_after(now, request.wait);
        Ok(Attempts {
            key: key.to_string(),
            owner: format!("{prefix}{}", random_hex()),
            request,
            names,
            quorum,
            strategy,
            retry_delay,
            prefix: prefix.to_string(),
            give_up,
            backoff: Duration::ZERO,
            phase: Phase::Finished,
        })
    }

    /// The owner of the attempt in progress.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    pub(crate) fn request(&self) -> &Acquire {
        &self.request
    }

    /// The first step.
    pub(crate) fn start(&mut self, now: Instant) -> Step {
        self.attempt(now)
    }

    fn n(&self) -> usize {
        self.names.len()
    }

    fn named(&self, outcomes: Vec<Outcome>) -> Vec<(String, Outcome)> {
        self.names.iter().cloned().zip(outcomes).collect()
    }

    fn acquire_cmd(&self, wait: Option<Duration>) -> Cmd {
        self.request.command(&self.key, &self.owner, wait)
    }

    fn attempt(&mut self, now: Instant) -> Step {
        if self.request.bind {
            self.owner = format!("{}{}", self.prefix, random_hex());
        }
        self.phase = Phase::Attempt { sent: now };
        Step::Send {
            cmds: vec![Some(self.acquire_cmd(None)); self.n()],
            wait: None,
            what: Sending::Attempt,
        }
    }

    fn left(&self, now: Instant) -> Duration {
        self.give_up.saturating_duration_since(now)
    }

    fn jitter(&self, now: Instant) -> Duration {
        let (min, max) = self.retry_delay;
        let max = max.max(min + Duration::from_micros(1));
        rand::thread_rng().gen_range(min..max).min(self.left(now))
    }

    /// Backs off, growing from `floor` to a queue slice.
    fn back_off(&mut self, floor: Duration, now: Instant) -> Step {
        self.backoff = (self.backoff * 2).clamp(floor, QUEUE_SLICE);
        let delay = rand::thread_rng().gen_range(self.backoff / 2..=self.backoff);
        self.phase = Phase::Backoff;
        Step::Sleep(delay.min(self.left(now)))
    }

    /// The replies to the last [`Step::Send`], in server order.
    pub(crate) fn replied(&mut self, replies: Vec<Result<Value, Outcome>>, now: Instant) -> Step {
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Attempt { sent } => self.attempt_replied(sent, replies, now),
            Phase::Released { error, answered } => self.after_failure(error, &answered, now),
            Phase::Queued { designated, sent } => {
                self.queue_replied(designated, sent, replies, now)
            }
            Phase::Others {
                sent,
                round,
                mut tokens,
                ..
            } => {
                let outcomes: Vec<Outcome> = replies.into_iter().map(acquire_outcome).collect();
                for (j, o) in outcomes.iter().enumerate() {
                    if let Outcome::Granted(t) = o {
                        if !tokens.iter().any(|(i, _)| *i == j) {
                            tokens.push((j, *t));
                        }
                    }
                }
                let done = tokens.len() >= self.quorum
                    || outcomes.iter().any(Outcome::is_refusal)
                    || now >= self.give_up
                    || round + 1 >= OTHERS_PAUSES.len();
                if done {
                    return self.queue_finished(sent, tokens, outcomes, now);
                }
                self.ask_others(sent, round + 1, tokens, outcomes)
            }
            Phase::QueueReleased { error } => {
                if error.is_refusal() {
                    return Step::Failed(error);
                }
                // The designated server was free but the others were not (a holder without
                // it): back off, growing, so such a round stays rare.
                let floor = self.retry_delay.0.max(Duration::from_millis(20));
                self.back_off(floor, now)
            }
            Phase::Backoff | Phase::Finished => self.attempt(now),
        }
    }

    /// After a [`Step::Sleep`].
    pub(crate) fn woke(&mut self, now: Instant) -> Step {
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Others {
                sent,
                round,
                tokens,
                outcomes,
            } => self.send_others(sent, round, tokens, outcomes),
            _ => self.attempt(now),
        }
    }

    fn attempt_replied(
        &mut self,
        sent: Instant,
        replies: Vec<Result<Value, Outcome>>,
        now: Instant,
    ) -> Step {
        let outcomes: Vec<Outcome> = replies.into_iter().map(acquire_outcome).collect();
        let tokens: Vec<(usize, u64)> = granted(&outcomes);
        let valid_until = quorum_valid_until(sent, self.request.ttl, now);
        if tokens.len() >= self.quorum {
            if let Some(valid_until) = valid_until {
                return self.granted(tokens, valid_until, outcomes);
            }
        }
        let answered: Vec<bool> = outcomes
            .iter()
            .map(|o| !matches!(o, Outcome::Unreachable(_)))
            .collect();
        // Give back what we got, and whatever a slow server may still grant later.
        let release: Vec<Option<Cmd>> = outcomes
            .iter()
            .map(|o| {
                matches!(o, Outcome::Granted(_) | Outcome::Unreachable(_))
                    .then(|| release_cmd(&self.key, &self.owner))
            })
            .collect();
        let error = if tokens.len() >= self.quorum {
            LockError::Expired {
                causes: self.named(outcomes),
            }
        } else {
            classify(&self.named(outcomes), self.quorum)
        };
        if release.iter().any(Option::is_some) {
            self.phase = Phase::Released { error, answered };
            return Step::Send {
                cmds: release,
                wait: None,
                what: Sending::Release,
            };
        }
        self.after_failure(error, &answered, now)
    }

    /// A majority granted: the acquire is over.
    fn granted(
        &mut self,
        tokens: Vec<(usize, u64)>,
        valid_until: Instant,
        outcomes: Vec<Outcome>,
    ) -> Step {
        self.phase = Phase::Finished;
        Step::Granted(Grant {
            owner: self.owner.clone(),
            tokens,
            valid_until,
            outcomes,
        })
    }

    /// After a failed (and released) attempt: give up, queue, or poll again.
    fn after_failure(&mut self, error: LockError, answered: &[bool], now: Instant) -> Step {
        if now >= self.give_up || error.is_refusal() {
            self.phase = Phase::Finished;
            return Step::Failed(error);
        }
        if self.strategy == WaitStrategy::Queue && !self.request.bind {
            return self.queue(answered, now);
        }
        self.phase = Phase::Backoff;
        Step::Sleep(self.jitter(now))
    }

    fn queue(&mut self, answered: &[bool], now: Instant) -> Step {
        let n = self.n();
        let designated = designated_server(&self.key, answered, n);
        let slice = self.left(now).min(QUEUE_SLICE).min(self.request.ttl / 4);
        if slice < Duration::from_millis(1) {
            return self.attempt(now);
        }
        let cmds = (0..n)
            .map(|j| (j == designated).then(|| self.acquire_cmd(Some(slice))))
            .collect();
        // The grant may come at any moment of the slice, and the lease starts then: the
        // validity is counted from the slice's start, the earliest moment it can have started.
        self.phase = Phase::Queued {
            designated,
            sent: now,
        };
        Step::Send {
            cmds,
            wait: Some(slice),
            what: Sending::QueueWait,
        }
    }

    fn queue_replied(
        &mut self,
        designated: usize,
        sent: Instant,
        replies: Vec<Result<Value, Outcome>>,
        now: Instant,
    ) -> Step {
        let first = replies
            .into_iter()
            .nth(designated)
            .map(acquire_outcome)
            .unwrap_or(Outcome::Unreachable("not sent".into()));
        match first {
            Outcome::Granted(token) => {
                self.ask_others(sent, 0, vec![(designated, token)], Vec::new())
            }
            // The slice ran out: the next attempt asks everyone again.
            Outcome::Held => self.attempt(now),
            // A full queue on that server: wait outside it, backing off.
            Outcome::MaxWaiters(_) => self.back_off(Duration::from_millis(20), now),
            // Whatever it may still grant late is released by the next failed attempt.
            Outcome::Unreachable(_) => {
                self.phase = Phase::Backoff;
                Step::Sleep(self.jitter(now))
            }
            // A refusal of the waiting request (MAXWAITERS, WRONGTYPE, ...): typed as the
            // server said it, whatever the quorum.
            refused => {
                let outcomes = (0..self.n())
                    .map(|i| {
                        if i == designated {
                            refused.clone()
                        } else {
                            Outcome::Unreachable("not asked".into())
                        }
                    })
                    .collect();
                self.phase = Phase::Finished;
                Step::Failed(classify(&self.named(outcomes), 1))
            }
        }
    }

    fn ask_others(
        &mut self,
        sent: Instant,
        round: usize,
        tokens: Vec<(usize, u64)>,
        outcomes: Vec<Outcome>,
    ) -> Step {
        let pause = OTHERS_PAUSES.get(round).copied().unwrap_or(0);
        if pause > 0 {
            self.phase = Phase::Others {
                sent,
                round,
                tokens,
                outcomes,
            };
            return Step::Sleep(Duration::from_millis(pause));
        }
        self.send_others(sent, round, tokens, outcomes)
    }

    fn send_others(
        &mut self,
        sent: Instant,
        round: usize,
        tokens: Vec<(usize, u64)>,
        outcomes: Vec<Outcome>,
    ) -> Step {
        let cmds = (0..self.n())
            .map(|j| (!tokens.iter().any(|(i, _)| *i == j)).then(|| self.acquire_cmd(None)))
            .collect();
        self.phase = Phase::Others {
            sent,
            round,
            tokens,
            outcomes,
        };
        Step::Send {
            cmds,
            wait: None,
            what: Sending::Others,
        }
    }

    fn queue_finished(
        &mut self,
        sent: Instant,
        mut tokens: Vec<(usize, u64)>,
        outcomes: Vec<Outcome>,
        now: Instant,
    ) -> Step {
        if tokens.len() >= self.quorum {
            if let Some(valid_until) = quorum_valid_until(sent, self.request.ttl, now) {
                tokens.sort_unstable();
                let outcomes = (0..self.n())
                    .map(|i| match tokens.iter().find(|(j, _)| *j == i) {
                        Some((_, t)) => Outcome::Granted(*t),
                        None => outcomes
                            .get(i)
                            .cloned()
                            .unwrap_or(Outcome::Unreachable("not asked".into())),
                    })
                    .collect();
                return self.granted(tokens, valid_until, outcomes);
            }
        }
        let error = classify(&self.named(outcomes), self.quorum);
        self.phase = Phase::QueueReleased { error };
        Step::Send {
            cmds: vec![Some(release_cmd(&self.key, &self.owner)); self.n()],
            wait: None,
            what: Sending::Release,
        }
    }
}

fn granted(outcomes: &[Outcome]) -> Vec<(usize, u64)> {
    outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Outcome::Granted(t) => Some((i, *t)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    fn attempts(n: usize, request: Acquire, strategy: WaitStrategy, now: Instant) -> Attempts {
        Attempts::new(
            "k",
            request,
            names(n),
            strategy,
            (Duration::from_millis(1), Duration::from_millis(20)),
            "",
            true,
            now,
        )
        .expect("valid")
    }

    fn int(t: i64) -> Result<Value, Outcome> {
        Ok(Value::Int(t))
    }

    #[test]
    fn a_majority_in_time_is_a_grant_and_too_few_is_released_where_it_may_hold() {
        let now = Instant::now();
        let mut a = attempts(
            3,
            Acquire::write(Duration::from_secs(10)),
            WaitStrategy::Poll,
            now,
        );
        assert!(matches!(
            a.start(now),
            Step::Send {
                what: Sending::Attempt,
                ..
            }
        ));
        let step = a.replied(vec![int(5), Ok(Value::Nil), int(7)], now);
        match step {
            Step::Granted(g) => assert_eq!(g.tokens, vec![(0, 5), (2, 7)]),
            other => panic!("{other:?}"),
        }
        let mut a = attempts(
            3,
            Acquire::write(Duration::from_secs(10)),
            WaitStrategy::Poll,
            now,
        );
        a.start(now);
        let unreachable = Err(Outcome::Unreachable("timed out".into()));
        match a.replied(vec![int(5), Ok(Value::Nil), unreachable], now) {
            Step::Send {
                cmds,
                what: Sending::Release,
                ..
            } => {
                let to: Vec<bool> = cmds.iter().map(Option::is_some).collect();
                assert_eq!(to, vec![true, false, true]);
            }
            other => panic!("{other:?}"),
        }
        // No wait: the failure is final once released.
        match a.replied(vec![int(0), Ok(Value::Nil), int(0)], now) {
            Step::Failed(LockError::Held { causes }) => assert_eq!(causes.len(), 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_majority_too_late_is_expired() {
        let now = Instant::now();
        let ttl = Duration::from_millis(100);
        let mut a = attempts(3, Acquire::write(ttl), WaitStrategy::Poll, now);
        a.start(now);
        let late = now + Duration::from_millis(200);
        assert!(matches!(
            a.replied(vec![int(1), int(1), int(1)], late),
            Step::Send {
                what: Sending::Release,
                ..
            }
        ));
        assert!(matches!(
            a.replied(vec![int(0), int(0), int(0)], late),
            Step::Failed(LockError::Expired { .. })
        ));
    }

    #[test]
    fn a_queued_waiter_waits_on_the_designated_server_then_asks_the_others() {
        let now = Instant::now();
        let request = Acquire::write(Duration::from_secs(10)).wait(Duration::from_secs(30));
        let mut a = attempts(3, request, WaitStrategy::Queue, now);
        a.start(now);
        let step = a.replied(vec![Ok(Value::Nil), Ok(Value::Nil), Ok(Value::Nil)], now);
        let designated = designated_server("k", &[true, true, true], 3);
        match step {
            Step::Send {
                cmds,
                wait: Some(slice),
                what: Sending::QueueWait,
            } => {
                assert_eq!(slice, QUEUE_SLICE);
                assert!(cmds[designated].is_some());
                assert_eq!(cmds.iter().filter(|c| c.is_some()).count(), 1);
            }
            other => panic!("{other:?}"),
        }
        let mut replies: Vec<Result<Value, Outcome>> = vec![Ok(Value::Nil); 3];
        replies[designated] = int(11);
        match a.replied(replies, now) {
            Step::Send {
                cmds,
                what: Sending::Others,
                ..
            } => assert!(cmds[designated].is_none()),
            other => panic!("{other:?}"),
        }
        let step = a.replied(vec![int(12), int(12), int(12)], now);
        match step {
            Step::Granted(g) => assert_eq!(g.tokens.len(), 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn redlock_refuses_what_a_majority_cannot_make_safe() {
        let now = Instant::now();
        let ttl = Duration::from_secs(1);
        let make = |r: Acquire| {
            Attempts::new(
                "k",
                r,
                names(3),
                WaitStrategy::Queue,
                (ttl, ttl),
                "",
                false,
                now,
            )
        };
        for request in [
            Acquire::permit(2, ttl),
            Acquire::write(ttl).owner("o"),
            Acquire::write(ttl).min_replicas(1, ttl),
            Acquire::write(ttl).bind(),
            Acquire::write(Duration::ZERO),
        ] {
            assert!(
                matches!(make(request), Err(LockError::InvalidRequest { .. })),
                "refused before anything is sent"
            );
        }
    }

    #[test]
    fn the_machine_never_panics_whatever_the_replies() {
        // Arbitrary reply shapes, counts and times: every step is one of the four.
        let now = Instant::now();
        let shapes = [
            int(1),
            int(-1),
            Ok(Value::Nil),
            Ok(Value::Okay),
            Err(Outcome::Unreachable("x".into())),
            Err(Outcome::MaxWaiters("MAXWAITERS".into())),
            Err(Outcome::Refused("WRONGTYPE".into())),
        ];
        let mut rng = rand::thread_rng();
        for _ in 0..2000 {
            let n = rng.gen_range(1..6);
            let request = Acquire::write(Duration::from_millis(rng.gen_range(10..5000)))
                .wait(Duration::from_millis(rng.gen_range(0..3000)));
            let strategy = if rng.gen() {
                WaitStrategy::Queue
            } else {
                WaitStrategy::Poll
            };
            let mut a = attempts(n, request, strategy, now);
            let mut t = now;
            let mut step = a.start(t);
            for _ in 0..50 {
                t += Duration::from_millis(rng.gen_range(0..400));
                step = match step {
                    Step::Send { .. } => {
                        let k = rng.gen_range(0..n + 2);
                        let replies = (0..k)
                            .map(|_| shapes[rng.gen_range(0..shapes.len())].clone())
                            .collect();
                        a.replied(replies, t)
                    }
                    Step::Sleep(_) => a.woke(t),
                    Step::Granted(_) | Step::Failed(_) => break,
                };
            }
        }
    }
}
