//! Argument parsing for the lock commands: plain functions over byte slices, so every rule is
//! unit-tested without a server. Nothing here looks at state; a command validates all of its
//! arguments before touching the key.
//!
//! Error texts never echo the user's bytes: they may hold anything, including NUL and CRLF.

use crate::{Millis, MAX_CAPACITY, MAX_DURATION, MAX_OWNER_LEN};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    Arity,
    Owner,
    TtlNotInteger,
    TtlRange,
    TimeoutNotInteger,
    TimeoutRange,
    UnknownOption,
    RepeatedOption,
    LockDelayNotInteger,
    LockDelayRange,
    LockDelayNotExclusive,
    CapacityNotInteger,
    CapacityRange,
    QueueOrder,
    CountNotInteger,
    CountRange,
    PrefixWithBy,
    Syntax,
}

impl ArgError {
    pub fn message(self) -> &'static str {
        match self {
            ArgError::Arity => "wrong number of arguments",
            ArgError::Owner => "ERR owner must be 1 to 1024 bytes",
            ArgError::TtlNotInteger => "ERR ttl is not an integer or out of range",
            ArgError::TtlRange => "ERR ttl must be between 1 and 140737488355328 milliseconds",
            ArgError::TimeoutNotInteger => "ERR timeout is not an integer or out of range",
            ArgError::TimeoutRange => {
                "ERR timeout must be between 0 and 140737488355328 milliseconds"
            }
            ArgError::UnknownOption => "ERR unknown option",
            ArgError::RepeatedOption => "ERR an option was given more than once",
            ArgError::LockDelayNotInteger => "ERR lock-delay is not an integer or out of range",
            ArgError::LockDelayRange => {
                "ERR lock-delay must be between 0 and 140737488355328 milliseconds"
            }
            ArgError::LockDelayNotExclusive => {
                "ERR LOCKDELAY applies to exclusive locks only (LOCK.ACQUIRE)"
            }
            ArgError::PrefixWithBy => {
                "ERR PREFIX lists queues in key order: it cannot be combined with BY"
            }
            ArgError::CapacityNotInteger => "ERR capacity is not an integer or out of range",
            ArgError::CapacityRange => "ERR capacity must be between 1 and 2147483647",
            ArgError::QueueOrder => "ERR BY must be AGE or LENGTH",
            ArgError::CountNotInteger => "ERR COUNT is not an integer or out of range",
            ArgError::CountRange => "ERR COUNT must be between 1 and 1000",
            ArgError::Syntax => "ERR syntax error",
        }
    }
}

/// `LOCK.ACQUIRE` / `LOCK.RWREAD` arguments after the key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub owner: &'a [u8],
    pub ttl: Millis,
    /// `Some(0)` is WAIT 0: no time limit.
    pub wait: Option<Millis>,
    /// BIND: the hold ends when the requesting connection closes.
    pub bind: bool,
    /// LOCKDELAY ms (0 when not given).
    pub lock_delay: Millis,
}

/// Which request the options belong to: LOCKDELAY is for exclusive requests only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    /// LOCK.ACQUIRE: `[WAIT timeout] [BIND] [LOCKDELAY ms]`.
    Exclusive,
    /// LOCK.RWREAD (and semaphores): `[WAIT timeout] [BIND]`.
    Shared,
}

/// Parses `owner ttl` and then the options in any order, each at most once, names
/// case-insensitive. Everything is checked before anything is used.
pub fn acquire<'a>(args: &[&'a [u8]], accepts: Accepts) -> Result<AcquireArgs<'a>, ArgError> {
    let (owner, ttl, mut rest) = match args {
        [owner, ttl, rest @ ..] => (*owner, *ttl, rest),
        _ => return Err(ArgError::Arity),
    };
    let mut parsed = AcquireArgs {
        owner: parse_owner(owner)?,
        ttl: parse_ttl(ttl)?,
        ..AcquireArgs::default()
    };
    let (mut seen_wait, mut seen_bind, mut seen_delay) = (false, false, false);
    while let [opt, tail @ ..] = rest {
        let once = |seen: &mut bool| {
            if std::mem::replace(seen, true) {
                Err(ArgError::RepeatedOption)
            } else {
                Ok(())
            }
        };
        if opt.eq_ignore_ascii_case(b"BIND") {
            once(&mut seen_bind)?;
            parsed.bind = true;
            rest = tail;
            continue;
        }
        let is_wait = opt.eq_ignore_ascii_case(b"WAIT");
        let is_delay = opt.eq_ignore_ascii_case(b"LOCKDELAY");
        if !is_wait && !is_delay {
            return Err(ArgError::UnknownOption);
        }
        if is_delay && accepts == Accepts::Shared {
            return Err(ArgError::LockDelayNotExclusive);
        }
        let [value, tail @ ..] = tail else {
            return Err(ArgError::Syntax);
        };
        if is_wait {
            once(&mut seen_wait)?;
            parsed.wait = Some(parse_timeout(value)?);
        } else {
            once(&mut seen_delay)?;
            parsed.lock_delay = parse_lock_delay(value)?;
        }
        rest = tail;
    }
    Ok(parsed)
}

/// How `LOCK.QUEUES` ranks the queues it lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueuesBy {
    /// The longest-waiting client's wait, longest first (the default).
    #[default]
    Age,
    /// The number of waiting clients, most first.
    Length,
}

/// `LOCK.QUEUES` arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuesArgs<'a> {
    pub by: QueuesBy,
    /// How many queues to list, 1 to [`MAX_QUEUES_COUNT`].
    pub count: usize,
    /// `PREFIX p`: only queues whose key starts with these bytes, in key order (not with BY).
    pub prefix: Option<&'a [u8]>,
}

/// The most queues one `LOCK.QUEUES` lists (it bounds the reply; the scan is bounded by the
/// number of keys with waiters anyway).
pub const MAX_QUEUES_COUNT: usize = 1000;

/// Parses `[BY AGE|LENGTH] [COUNT n] [PREFIX p]` (any order, each at most once, options
/// case-insensitive; BY and PREFIX exclude each other).
pub fn queues<'a>(args: &[&'a [u8]]) -> Result<QueuesArgs<'a>, ArgError> {
    let mut parsed = QueuesArgs {
        by: QueuesBy::Age,
        count: 10,
        prefix: None,
    };
    let (mut seen_by, mut seen_count, mut seen_prefix) = (false, false, false);
    let mut rest = args;
    while let [opt, tail @ ..] = rest {
        let seen = if opt.eq_ignore_ascii_case(b"BY") {
            &mut seen_by
        } else if opt.eq_ignore_ascii_case(b"COUNT") {
            &mut seen_count
        } else if opt.eq_ignore_ascii_case(b"PREFIX") {
            &mut seen_prefix
        } else {
            return Err(ArgError::UnknownOption);
        };
        let [value, tail @ ..] = tail else {
            return Err(ArgError::Syntax);
        };
        if std::mem::replace(seen, true) {
            return Err(ArgError::RepeatedOption);
        }
        if opt.eq_ignore_ascii_case(b"BY") {
            parsed.by = if value.eq_ignore_ascii_case(b"AGE") {
                QueuesBy::Age
            } else if value.eq_ignore_ascii_case(b"LENGTH") {
                QueuesBy::Length
            } else {
                return Err(ArgError::QueueOrder);
            };
        } else if opt.eq_ignore_ascii_case(b"COUNT") {
            let n = parse_i64(value).ok_or(ArgError::CountNotInteger)?;
            parsed.count = usize::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_QUEUES_COUNT).contains(n))
                .ok_or(ArgError::CountRange)?;
        } else {
            parsed.prefix = Some(value);
        }
        rest = tail;
    }
    if seen_by && seen_prefix {
        return Err(ArgError::PrefixWithBy);
    }
    Ok(parsed)
}

/// `LOCK.SEMACQUIRE` arguments after the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemArgs<'a> {
    pub capacity: u32,
    /// Owner, ttl, WAIT and BIND, as for LOCK.RWREAD.
    pub request: AcquireArgs<'a>,
}

/// Parses `owner capacity ttl [WAIT timeout] [BIND]`.
pub fn semacquire<'a>(args: &[&'a [u8]]) -> Result<SemArgs<'a>, ArgError> {
    let [owner, capacity, rest @ ..] = args else {
        return Err(ArgError::Arity);
    };
    if rest.is_empty() {
        return Err(ArgError::Arity);
    }
    let owner_first = parse_owner(owner)?;
    let capacity = parse_capacity(capacity)?;
    let mut with_owner: Vec<&'a [u8]> = Vec::with_capacity(rest.len() + 1);
    with_owner.push(owner_first);
    with_owner.extend_from_slice(rest);
    let request = acquire(&with_owner, Accepts::Shared)?;
    Ok(SemArgs { capacity, request })
}

fn parse_capacity(arg: &[u8]) -> Result<u32, ArgError> {
    let v = parse_i64(arg).ok_or(ArgError::CapacityNotInteger)?;
    match u32::try_from(v) {
        Ok(c) if (1..=MAX_CAPACITY).contains(&c) => Ok(c),
        _ => Err(ArgError::CapacityRange),
    }
}

fn parse_lock_delay(arg: &[u8]) -> Result<Millis, ArgError> {
    let v = parse_i64(arg).ok_or(ArgError::LockDelayNotInteger)?;
    match u64::try_from(v) {
        Ok(ms) if ms <= MAX_DURATION => Ok(ms),
        _ => Err(ArgError::LockDelayRange),
    }
}

/// Parses `owner [ALL]` (LOCK.RELEASE). Returns the owner and whether ALL was given.
pub fn release<'a>(args: &[&'a [u8]]) -> Result<(&'a [u8], bool), ArgError> {
    match args {
        [owner] => Ok((parse_owner(owner)?, false)),
        [owner, opt] => {
            let owner = parse_owner(owner)?;
            if opt.eq_ignore_ascii_case(b"ALL") {
                Ok((owner, true))
            } else {
                Err(ArgError::UnknownOption)
            }
        }
        [] => Err(ArgError::Arity),
        _ => Err(ArgError::Syntax),
    }
}

/// Parses `owner ttl` (LOCK.EXTEND).
pub fn extend<'a>(args: &[&'a [u8]]) -> Result<(&'a [u8], Millis), ArgError> {
    match args {
        [owner, ttl] => Ok((parse_owner(owner)?, parse_ttl(ttl)?)),
        _ => Err(ArgError::Arity),
    }
}

/// `LOCK.INFO` arguments after the key: which holder entries the reply lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoArgs<'a> {
    /// `OWNER o`: only that owner's holder entry (or none).
    pub owner: Option<&'a [u8]>,
    /// `COUNT n`: at most `n` holder entries, 1 to [`MAX_INFO_COUNT`].
    pub count: Option<usize>,
}

impl InfoArgs<'_> {
    /// Plain `LOCK.INFO key`: every holder, every queued client (O(holders + waiters)).
    pub fn is_full(&self) -> bool {
        self.owner.is_none() && self.count.is_none()
    }
}

/// The most holder entries `LOCK.INFO ... COUNT n` lists (as LOCK.QUEUES's COUNT).
pub const MAX_INFO_COUNT: usize = MAX_QUEUES_COUNT;

/// Parses `[OWNER owner] [COUNT n]` (any order, each at most once, case-insensitive).
pub fn info<'a>(args: &[&'a [u8]]) -> Result<InfoArgs<'a>, ArgError> {
    let mut parsed = InfoArgs {
        owner: None,
        count: None,
    };
    let mut rest = args;
    while let [opt, tail @ ..] = rest {
        let is_owner = opt.eq_ignore_ascii_case(b"OWNER");
        if !is_owner && !opt.eq_ignore_ascii_case(b"COUNT") {
            return Err(ArgError::UnknownOption);
        }
        let [value, tail @ ..] = tail else {
            return Err(ArgError::Syntax);
        };
        if is_owner {
            if parsed.owner.is_some() {
                return Err(ArgError::RepeatedOption);
            }
            parsed.owner = Some(parse_owner(value)?);
        } else {
            if parsed.count.is_some() {
                return Err(ArgError::RepeatedOption);
            }
            let n = parse_i64(value).ok_or(ArgError::CountNotInteger)?;
            parsed.count = Some(
                usize::try_from(n)
                    .ok()
                    .filter(|n| (1..=MAX_INFO_COUNT).contains(n))
                    .ok_or(ArgError::CountRange)?,
            );
        }
        rest = tail;
    }
    Ok(parsed)
}

fn parse_owner(owner: &[u8]) -> Result<&[u8], ArgError> {
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(ArgError::Owner);
    }
    Ok(owner)
}

fn parse_ttl(arg: &[u8]) -> Result<Millis, ArgError> {
    let v = parse_i64(arg).ok_or(ArgError::TtlNotInteger)?;
    match u64::try_from(v) {
        Ok(ttl) if (1..=MAX_DURATION).contains(&ttl) => Ok(ttl),
        _ => Err(ArgError::TtlRange),
    }
}

fn parse_timeout(arg: &[u8]) -> Result<Millis, ArgError> {
    let v = parse_i64(arg).ok_or(ArgError::TimeoutNotInteger)?;
    match u64::try_from(v) {
        Ok(t) if t <= MAX_DURATION => Ok(t),
        _ => Err(ArgError::TimeoutRange),
    }
}

/// A signed 64-bit decimal integer written as Redis writes them: an optional `-`, then digits
/// with no leading zero (except `0` itself), nothing else (no `+`, spaces or exponent).
pub fn parse_i64(arg: &[u8]) -> Option<i64> {
    let (negative, digits) = match arg {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, arg),
    };
    match digits {
        [] => return None,
        [b'0'] if !negative => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut value: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        let d = i64::from(b - b'0');
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(d)?
        } else {
            value.checked_add(d)?
        };
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn q(args: &[&str]) -> Result<(QueuesBy, usize), ArgError> {
        let owned = a(args);
        let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        queues(&refs).map(|r| (r.by, r.count))
    }

    #[test]
    fn queues_prefix_is_any_bytes_once_and_not_with_by() {
        let parse = |args: &[&[u8]]| queues(args).map(|r| (r.prefix.map(<[u8]>::to_vec), r.count));
        assert_eq!(
            parse(&[b"PREFIX", b"tenantA:"]),
            Ok((Some(b"tenantA:".to_vec()), 10))
        );
        assert_eq!(
            parse(&[b"count", b"5", b"prefix", b""]),
            Ok((Some(Vec::new()), 5))
        );
        assert_eq!(
            parse(&[b"PREFIX", b"\xff\x00"]),
            Ok((Some(b"\xff\x00".to_vec()), 10))
        );
        assert_eq!(parse(&[b"PREFIX"]), Err(ArgError::Syntax));
        assert_eq!(
            parse(&[b"PREFIX", b"a", b"PREFIX", b"b"]),
            Err(ArgError::RepeatedOption)
        );
        assert_eq!(
            parse(&[b"PREFIX", b"a", b"BY", b"AGE"]),
            Err(ArgError::PrefixWithBy)
        );
        assert_eq!(
            parse(&[b"BY", b"LENGTH", b"PREFIX", b"a"]),
            Err(ArgError::PrefixWithBy)
        );
        assert_eq!(
            parse(&[b"PREFIX", b"a", b"BY", b"x"]),
            Err(ArgError::QueueOrder)
        );
    }

    #[test]
    fn queues_options_in_any_order_once_each() {
        assert_eq!(q(&[]), Ok((QueuesBy::Age, 10)));
        assert_eq!(q(&["by", "length"]), Ok((QueuesBy::Length, 10)));
        assert_eq!(q(&["COUNT", "3", "BY", "Age"]), Ok((QueuesBy::Age, 3)));
        assert_eq!(q(&["count", "1000"]), Ok((QueuesBy::Age, 1000)));
        assert_eq!(q(&["BY", "size"]), Err(ArgError::QueueOrder));
        assert_eq!(q(&["COUNT", "0"]), Err(ArgError::CountRange));
        assert_eq!(q(&["COUNT", "1001"]), Err(ArgError::CountRange));
        assert_eq!(q(&["COUNT", "-1"]), Err(ArgError::CountRange));
        assert_eq!(q(&["COUNT", "x"]), Err(ArgError::CountNotInteger));
        assert_eq!(
            q(&["COUNT", "99999999999999999999"]),
            Err(ArgError::CountNotInteger)
        );
        assert_eq!(q(&["COUNT"]), Err(ArgError::Syntax));
        assert_eq!(q(&["BY"]), Err(ArgError::Syntax));
        assert_eq!(
            q(&["COUNT", "1", "COUNT", "2"]),
            Err(ArgError::RepeatedOption)
        );
        assert_eq!(
            q(&["BY", "AGE", "by", "LENGTH"]),
            Err(ArgError::RepeatedOption)
        );
        assert_eq!(q(&["LIMIT", "3"]), Err(ArgError::UnknownOption));
    }

    fn inf(args: &[&str]) -> Result<(Option<Vec<u8>>, Option<usize>), ArgError> {
        let owned = a(args);
        let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        info(&refs).map(|r| (r.owner.map(<[u8]>::to_vec), r.count))
    }

    #[test]
    fn info_owner_and_count_in_any_order_once_each() {
        assert_eq!(inf(&[]), Ok((None, None)));
        assert_eq!(inf(&["owner", "w1"]), Ok((Some(b"w1".to_vec()), None)));
        assert_eq!(
            inf(&["COUNT", "5", "Owner", "COUNT"]),
            Ok((Some(b"COUNT".to_vec()), Some(5)))
        );
        assert_eq!(inf(&["COUNT", "1000"]), Ok((None, Some(1000))));
        assert_eq!(inf(&["COUNT", "0"]), Err(ArgError::CountRange));
        assert_eq!(inf(&["COUNT", "1001"]), Err(ArgError::CountRange));
        assert_eq!(inf(&["COUNT", "x"]), Err(ArgError::CountNotInteger));
        assert_eq!(inf(&["OWNER", ""]), Err(ArgError::Owner));
        let long = "x".repeat(MAX_OWNER_LEN + 1);
        assert_eq!(inf(&["OWNER", &long]), Err(ArgError::Owner));
        assert_eq!(inf(&["OWNER"]), Err(ArgError::Syntax));
        assert_eq!(inf(&["COUNT"]), Err(ArgError::Syntax));
        assert_eq!(
            inf(&["OWNER", "a", "OWNER", "b"]),
            Err(ArgError::RepeatedOption)
        );
        assert_eq!(
            inf(&["COUNT", "1", "count", "2"]),
            Err(ArgError::RepeatedOption)
        );
        assert_eq!(inf(&["BY", "AGE"]), Err(ArgError::UnknownOption));
        assert!(info(&[]).is_ok_and(|i| i.is_full()));
    }

    fn acq(args: &[&str]) -> Result<(Vec<u8>, Millis, Option<Millis>), ArgError> {
        let owned = a(args);
        let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        acquire(&refs, Accepts::Exclusive).map(|r| (r.owner.to_vec(), r.ttl, r.wait))
    }

    fn opts(args: &[&str], accepts: Accepts) -> Result<(Option<Millis>, bool, Millis), ArgError> {
        let owned = a(args);
        let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        acquire(&refs, accepts).map(|r| (r.wait, r.bind, r.lock_delay))
    }

    #[test]
    fn integers_follow_redis_rules() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"42"), Some(42));
        assert_eq!(parse_i64(b"-7"), Some(-7));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            "",
            "-",
            "+1",
            " 1",
            "1 ",
            "01",
            "-0",
            "1e3",
            "1.0",
            "abc",
            "9223372036854775808",
            "18446744073709551616",
        ] {
            assert_eq!(parse_i64(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn acquire_accepts_the_documented_forms() {
        assert_eq!(acq(&["me", "1000"]), Ok((b"me".to_vec(), 1000, None)));
        assert_eq!(
            acq(&["me", "1", "WAIT", "0"]),
            Ok((b"me".to_vec(), 1, Some(0)))
        );
        assert_eq!(
            acq(&["me", "1", "wait", "250"]),
            Ok((b"me".to_vec(), 1, Some(250)))
        );
        assert_eq!(
            acq(&["me", "140737488355328"]).map(|r| r.1),
            Ok(MAX_DURATION)
        );
    }

    #[test]
    fn acquire_rejects_bad_ttl_owner_and_options() {
        assert_eq!(acq(&["me", "0"]), Err(ArgError::TtlRange));
        assert_eq!(acq(&["me", "-1"]), Err(ArgError::TtlRange));
        assert_eq!(acq(&["me", "140737488355329"]), Err(ArgError::TtlRange));
        assert_eq!(acq(&["me", "abc"]), Err(ArgError::TtlNotInteger));
        assert_eq!(
            acq(&["me", "18446744073709551616"]),
            Err(ArgError::TtlNotInteger)
        );
        assert_eq!(acq(&["", "10"]), Err(ArgError::Owner));
        let long = "x".repeat(1025);
        assert_eq!(acq(&[&long, "10"]), Err(ArgError::Owner));
        let max = "x".repeat(1024);
        assert!(acq(&[&max, "10"]).is_ok());
        assert_eq!(acq(&["me", "10", "WAIT"]), Err(ArgError::Syntax));
        assert_eq!(
            acq(&["me", "10", "WAIT", "-1"]),
            Err(ArgError::TimeoutRange)
        );
        assert_eq!(
            acq(&["me", "10", "WAIT", "x"]),
            Err(ArgError::TimeoutNotInteger)
        );
        assert_eq!(
            acq(&["me", "10", "WAIT", "1", "WAIT", "1"]),
            Err(ArgError::RepeatedOption)
        );
        assert_eq!(
            acq(&["me", "10", "NOWAIT", "1"]),
            Err(ArgError::UnknownOption)
        );
        assert_eq!(acq(&["me", "10", "FOO"]), Err(ArgError::UnknownOption));
        assert_eq!(acq(&["me"]), Err(ArgError::Arity));
    }

    #[test]
    fn options_come_in_any_order_and_any_case() {
        use Accepts::*;
        assert_eq!(opts(&["me", "10"], Exclusive), Ok((None, false, 0)));
        assert_eq!(
            opts(
                &["me", "10", "bind", "LockDelay", "5", "WAIT", "7"],
                Exclusive
            ),
            Ok((Some(7), true, 5))
        );
        assert_eq!(
            opts(
                &["me", "10", "LOCKDELAY", "140737488355328", "BIND"],
                Exclusive
            ),
            Ok((None, true, MAX_DURATION))
        );
        assert_eq!(
            opts(&["me", "10", "LOCKDELAY", "0"], Exclusive),
            Ok((None, false, 0))
        );
        assert_eq!(
            opts(&["me", "10", "BIND", "WAIT", "0"], Shared),
            Ok((Some(0), true, 0))
        );
    }

    #[test]
    fn bad_options_are_refused() {
        use Accepts::*;
        let cases: &[(&[&str], Accepts, ArgError)] = &[
            (&["BIND", "BIND"], Exclusive, ArgError::RepeatedOption),
            (
                &["bind", "WAIT", "1", "BIND"],
                Shared,
                ArgError::RepeatedOption,
            ),
            (
                &["LOCKDELAY", "1", "lockdelay", "2"],
                Exclusive,
                ArgError::RepeatedOption,
            ),
            (&["LOCKDELAY"], Exclusive, ArgError::Syntax),
            (&["BIND", "WAIT"], Exclusive, ArgError::Syntax),
            (&["LOCKDELAY", "-1"], Exclusive, ArgError::LockDelayRange),
            (
                &["LOCKDELAY", "140737488355329"],
                Exclusive,
                ArgError::LockDelayRange,
            ),
            (
                &["LOCKDELAY", "1.5"],
                Exclusive,
                ArgError::LockDelayNotInteger,
            ),
            (&["LOCKDELAY", "5"], Shared, ArgError::LockDelayNotExclusive),
            (&["BIND", "NOW"], Exclusive, ArgError::UnknownOption),
            (&["BIND", "1"], Exclusive, ArgError::UnknownOption),
        ];
        for (options, accepts, expected) in cases {
            let mut args = vec!["me", "10"];
            args.extend_from_slice(options);
            assert_eq!(opts(&args, *accepts), Err(*expected), "{options:?}");
        }
    }

    #[test]
    fn semacquire_forms() {
        let parse = |args: &[&str]| {
            let owned = a(args);
            let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
            semacquire(&refs).map(|r| (r.capacity, r.request.ttl, r.request.wait, r.request.bind))
        };
        assert_eq!(parse(&["me", "4", "1000"]), Ok((4, 1000, None, false)));
        assert_eq!(
            parse(&["me", "2147483647", "5", "bind", "WAIT", "0"]),
            Ok((MAX_CAPACITY, 5, Some(0), true))
        );
        assert_eq!(parse(&["me", "0", "1000"]), Err(ArgError::CapacityRange));
        assert_eq!(parse(&["me", "-1", "1000"]), Err(ArgError::CapacityRange));
        assert_eq!(
            parse(&["me", "2147483648", "1000"]),
            Err(ArgError::CapacityRange)
        );
        assert_eq!(
            parse(&["me", "x", "1000"]),
            Err(ArgError::CapacityNotInteger)
        );
        assert_eq!(parse(&["me", "4"]), Err(ArgError::Arity));
        assert_eq!(parse(&["", "4", "1000"]), Err(ArgError::Owner));
        assert_eq!(parse(&["me", "4", "0"]), Err(ArgError::TtlRange));
        assert_eq!(
            parse(&["me", "4", "10", "LOCKDELAY", "5"]),
            Err(ArgError::LockDelayNotExclusive)
        );
    }

    #[test]
    fn release_and_extend_forms() {
        assert_eq!(release(&[b"me"]), Ok((&b"me"[..], false)));
        assert_eq!(release(&[b"me", b"all"]), Ok((&b"me"[..], true)));
        assert_eq!(release(&[b"me", b"some"]), Err(ArgError::UnknownOption));
        assert_eq!(release(&[b"me", b"ALL", b"x"]), Err(ArgError::Syntax));
        assert_eq!(release(&[b""]), Err(ArgError::Owner));
        assert_eq!(extend(&[b"me", b"5"]), Ok((&b"me"[..], 5)));
        assert_eq!(extend(&[b"me", b"0"]), Err(ArgError::TtlRange));
        assert_eq!(extend(&[b"me"]), Err(ArgError::Arity));
    }
}
