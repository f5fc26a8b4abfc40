//! Tests of the request checks and of how answers name failures.

use std::time::Duration;

use super::error::classify;
use crate::{Acquire, LockError, Outcome, MAX_CAPACITY};

fn one(text: &str) -> LockError {
    classify(&[("s1".into(), Outcome::Refused(text.into()))], 1)
}

#[test]
fn error_replies_map_to_their_variants() {
    // As the pooled path (`CODE detail`), the bound path (the line after `-`) and the
    // `redis` crate's Display (`CODE: detail`) carry them.
    for text in [
        "DEADLOCK the owner holds this lock shared and asked for it exclusively",
        "-DEADLOCK waiting would close a cycle",
        "DEADLOCK: a cycle",
    ] {
        assert!(matches!(one(text), LockError::Deadlock { .. }), "{text}");
    }
    for text in [
        "WRONGKIND the key holds a lock, not a semaphore",
        "WRONGKIND: the key holds a semaphore, not a lock",
    ] {
        assert!(matches!(one(text), LockError::WrongKind { .. }), "{text}");
    }
    assert!(matches!(
        one("ERR the semaphore has another capacity (LOCK.INFO shows it)"),
        LockError::CapacityMismatch { .. }
    ));
    for text in [
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR capacity must be between 1 and 2147483647",
        "DEADLOCKED not our code",
    ] {
        assert!(matches!(one(text), LockError::Refused { .. }), "{text}");
    }
    assert!(matches!(
        one("MAXWAITERS the lock's wait queue is full"),
        LockError::MaxWaiters { .. }
    ));
    assert!(matches!(
        one("NOTOWNER the owner does not hold this lock"),
        LockError::NotOwner { .. }
    ));
    assert_eq!(
        Outcome::from_error_text("MAXWAITERS: full"),
        Outcome::MaxWaiters("MAXWAITERS: full".into())
    );
    let e = one("DEADLOCK x");
    assert_eq!(e.causes().len(), 1);
    assert!(e.to_string().contains("deadlock"), "{e}");
    assert!(e.to_string().contains("DEADLOCK x"), "{e}");
}

#[test]
fn the_redis_crates_errors_map_by_their_code_not_their_display() {
    // How the `redis` crate hands over `-ERR the semaphore has another capacity ...`: its
    // Display starts with a description, not with `ERR`.
    let e = redis::RedisError::from((
        redis::ServerErrorKind::ResponseError.into(),
        "An error was signalled by the server",
        "the semaphore has another capacity (LOCK.INFO shows it)".to_string(),
    ));
    assert!(e.to_string().starts_with("An error"), "{e}");
    assert!(matches!(
        super::reply::error_outcome(&e),
        Outcome::CapacityMismatch(_)
    ));
    let e = redis::RedisError::from((
        redis::ServerErrorKind::ResponseError.into(),
        "An error was signalled by the server",
        "ttl must be between 1 and 140737488355328 milliseconds".to_string(),
    ));
    assert!(
        matches!(super::reply::error_outcome(&e), Outcome::Refused(t) if t.starts_with("ERR ttl"))
    );
}

#[test]
fn the_most_specific_refusal_wins_and_too_few_answers_are_unreachable() {
    let causes = vec![
        ("a".to_string(), Outcome::Refused("WRONGTYPE x".into())),
        ("b".to_string(), Outcome::Refused("DEADLOCK y".into())),
        ("c".to_string(), Outcome::Held),
    ];
    assert!(matches!(
        classify(&causes, 2),
        LockError::Deadlock { causes } if causes.len() == 3
    ));
    let causes = vec![
        ("a".to_string(), Outcome::Refused("DEADLOCK y".into())),
        ("b".to_string(), Outcome::Unreachable("down".into())),
        ("c".to_string(), Outcome::Unreachable("down".into())),
    ];
    assert!(matches!(
        classify(&causes, 2),
        LockError::Unreachable { .. }
    ));
    assert!(matches!(
        classify(&[("a".into(), Outcome::Held)], 1),
        LockError::Held { .. }
    ));
}

#[test]
fn permit_requests_are_checked_and_spelled_as_the_module_wants() {
    let ttl = Duration::from_millis(1500);
    let cmd = Acquire::permit(3, ttl)
        .wait(Duration::from_secs(2))
        .bind()
        .command("k", "o", Some(Duration::from_secs(2)));
    let words: Vec<Vec<u8>> = cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => b.to_vec(),
            _ => Vec::new(),
        })
        .collect();
    let expected: Vec<&[u8]> = vec![
        b"LOCK.SEMACQUIRE",
        b"k",
        b"o",
        b"3",
        b"1500",
        b"WAIT",
        b"2000",
        b"BIND",
    ];
    assert_eq!(words, expected);
    for bad in [0, MAX_CAPACITY + 1, u32::MAX] {
        assert!(matches!(
            Acquire::permit(bad, ttl).check(),
            Err(LockError::InvalidRequest { .. })
        ));
    }
    assert!(Acquire::permit(1, ttl).check().is_ok());
    assert!(Acquire::permit(MAX_CAPACITY, ttl).check().is_ok());
    let e = Acquire::permit(2, ttl)
        .lock_delay(Duration::from_secs(1))
        .check()
        .unwrap_err();
    assert!(e.to_string().contains("semaphore permits"), "{e}");
    assert!(Acquire::permit(2, ttl).release_all());
    assert!(!Acquire::permit(2, ttl).owner("o").release_all());
}

#[test]
fn explicit_owners_are_checked() {
    let ttl = Duration::from_secs(1);
    assert!(Acquire::write(ttl).owner("o").check().is_ok());
    assert!(Acquire::write(ttl).owner("o".repeat(1024)).check().is_ok());
    for bad in [String::new(), "o".repeat(1025)] {
        assert!(matches!(
            Acquire::write(ttl).owner(bad).check(),
            Err(LockError::InvalidRequest { .. })
        ));
    }
    let e = Acquire::read(ttl).owner("o").bind().check().unwrap_err();
    assert!(e.to_string().contains("bind"), "{e}");
}
