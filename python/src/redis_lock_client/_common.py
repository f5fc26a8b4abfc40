"""What the sync and asyncio halves share: argument checks, command building, reply parsing,
the error types and the mapping of the module's error replies onto them.

Nothing here does I/O.
"""

from __future__ import annotations

import math
import numbers
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

__all__ = [
    "LockError",
    "LockNotOwnedError",
    "LockArgumentError",
    "LockLostError",
    "LockRefusedError",
    "DeadlockError",
    "WrongKindError",
    "CapacityMismatchError",
    "MaxWaitersError",
    "WrongTypeError",
    "ModuleMissingError",
    "RedlockError",
    "LockHeldError",
    "QuorumUnreachableError",
    "LockValidityError",
    "LockInfo",
    "Holder",
]

#: The largest ttl, WAIT timeout and lock-delay the module accepts, in milliseconds (2^47).
MAX_MS = 1 << 47
#: The longest owner (token) the module accepts, in bytes.
MAX_OWNER_LEN = 1024
#: The largest semaphore capacity the module accepts.
MAX_CAPACITY = (1 << 31) - 1
#: The ttl of a hold taken with ``timeout=None``: bound to its connection, so it ends with
#: the connection (a crash frees it at once) and otherwise lasts as long as the module allows.
UNLIMITED_TTL_MS = MAX_MS
#: Extra seconds an acquire with ``blocking_timeout=n`` may take beyond ``n``, all its steps
#: together (connecting, the handshake, the reply of ``WAIT n``): the server answers at ``n``
#: itself, so this only bounds how long a dead or paused server can hold us.
WAIT_READ_MARGIN = 1.0
#: Safety margin kept off every single-server lease (the client's and the server's clocks run
#: separately), as the Rust client does.
SINGLE_SERVER_MARGIN = 0.002
#: Allowance for the transit of a waited grant's reply.
WAITED_GRANT_MARGIN = 0.005

Number = Union[int, float]
KeyT = Union[str, bytes, memoryview]
TokenT = Union[str, bytes, memoryview, int]

Number_ = numbers.Real


# ----------------------------------------------------------------------------------------------
# Errors


def _init_error(err: LockError, message: str, lock_name: Any) -> None:
    # redis-py 5 to 8 differ in LockError's constructor (``lock_name`` arrived later): set the
    # attributes here so every version shows the same ones. Before 8.1 it does not call
    # Exception.__init__, so ``args`` kept every argument given and str() showed a tuple:
    # ``args`` is the message alone on every version (pickling keeps the rest in __dict__).
    setattr(err, "message", message)
    setattr(err, "lock_name", lock_name)
    err.args = (message,)


def make_error(cls: Type[LockError], message: str, lock_name: Any = None) -> LockError:
    """``cls(message)`` with ``lock_name`` and ``message`` set on every redis-py version."""
    err = cls(message)
    _init_error(err, message, lock_name)
    return err


class LockArgumentError(LockError):
    """An argument the module would refuse (a ttl of 0, a token over 1024 bytes, ...): raised
    before anything is sent. A ``ValueError`` too, as every ``LockError`` is."""

    def __init__(self, message: str = "", lock_name: Any = None) -> None:
        super().__init__(message)
        _init_error(self, message, lock_name)


class LockLostError(LockNotOwnedError):
    """The lock is no longer certainly held: its lease ran out without a confirmed extend, the
    server said this owner no longer holds it, or (bound holds) its connection closed."""

    def __init__(self, message: str = "", lock_name: Any = None, reason: str = "") -> None:
        super().__init__(message)
        _init_error(self, message, lock_name)
        #: A short word for why: ``"expired"``, ``"notowner"``, ``"disconnected"``.
        self.reason = reason


class LockRefusedError(LockError, ResponseError):
    """The server answered the request with an error reply: the request itself is at fault and
    repeating it unchanged gets the same answer. Both a ``LockError`` and a redis-py
    ``ResponseError``; ``code`` is the reply's first word (``DEADLOCK``, ``WRONGKIND``, ...)."""

    def __init__(self, message: str = "", lock_name: Any = None, code: str = "") -> None:
        super().__init__(message)
        _init_error(self, message, lock_name)
        self.code = code


class DeadlockError(LockRefusedError):
    """``-DEADLOCK``: an owner that reads the lock asked to write it, or a wait would close a
    cycle of owners waiting for one another. Nothing was queued."""


class WrongKindError(LockRefusedError):
    """``-WRONGKIND``: a semaphore permit asked of a lock key, or a lock of a semaphore key."""


class CapacityMismatchError(LockRefusedError):
    """The semaphore key exists with another capacity."""


class MaxWaitersError(LockRefusedError):
    """``-MAXWAITERS``: the key's (or the server's) wait queue is full."""


class WrongTypeError(LockRefusedError):
    """``-WRONGTYPE``: the key holds another Redis type (a string left by redis-py's own Lock,
    for instance)."""


class ModuleMissingError(LockRefusedError):
    """The server does not know the ``LOCK.*`` commands: the module is not loaded there."""


class RedlockError(LockError):
    """A Redlock request failed. ``outcomes`` lists ``(server, outcome)`` for every server:
    ``"granted"``, ``"held"``, ``"notowner"``, ``"unreachable: ..."`` or ``"refused: ..."``."""

    def __init__(
        self,
        message: str = "",
        lock_name: Any = None,
        outcomes: Optional[List[Tuple[str, str]]] = None,
    ) -> None:
        self.outcomes: List[Tuple[str, str]] = list(outcomes or [])
        text = message
        if self.outcomes:
            text += ": " + ", ".join(f"[{s}: {o}]" for s, o in self.outcomes)
        super().__init__(text)
        _init_error(self, text, lock_name)


class LockHeldError(RedlockError):
    """Enough servers answered, but the lock is held by someone else on too many of them (also
    the answer when the blocking time ran out)."""


class QuorumUnreachableError(RedlockError):
    """Too few servers answered to reach a quorum: they are down, paused or too slow."""


class LockValidityError(RedlockError):
    """A quorum granted the lock, but acquiring took so long that no validity was left (or an
    extend was confirmed only after validity ran out). Everything was released."""


_REFUSALS: Dict[str, Type[LockRefusedError]] = {
    "DEADLOCK": DeadlockError,
    "WRONGKIND": WrongKindError,
    "MAXWAITERS": MaxWaitersError,
    "WRONGTYPE": WrongTypeError,
}


def error_code(err: BaseException) -> str:
    text = str(err).lstrip().lstrip("-")
    return text.split(" ", 1)[0].rstrip(":") if text else ""


def is_notowner(err: BaseException) -> bool:
    return isinstance(err, ResponseError) and error_code(err) == "NOTOWNER"


def map_response_error(err: ResponseError, lock_name: Any) -> LockError:
    """The typed exception for an error reply of a lock command (NOTOWNER included)."""
    if isinstance(err, LockError):
        return err
    text = str(err)
    code = error_code(err)
    if code == "NOTOWNER":
        return make_error(LockNotOwnedError, f"Cannot use a lock that's no longer owned: {text}", lock_name)
    cls: Type[LockRefusedError]
    if code in _REFUSALS:
        cls = _REFUSALS[code]
    elif "semaphore has another capacity" in text:
        cls = CapacityMismatchError
    elif "unknown command" in text.lower() and "lock." in text.lower():
        cls = ModuleMissingError
        text += " (is the redis-lock module loaded on this server?)"
    else:
        cls = LockRefusedError
    return cls(text, lock_name, code)


# ----------------------------------------------------------------------------------------------
# Argument checks and conversions


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Number_):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    f = float(value)
    if math.isnan(f):
        raise LockArgumentError(f"{what} must be a number of seconds, not NaN")
    return f


def ttl_ms(value: Any, what: str = "timeout") -> int:
    """Seconds (> 0) to the module's ttl in ms: truncated like redis-py, at least 1."""
    f = _number(value, what)
    if not f > 0:
        raise LockArgumentError(f"{what} must be more than 0 seconds (or None), not {value!r}")
    ms = _to_ms(f)
    if ms > MAX_MS:
        raise LockArgumentError(f"{what} must be at most 2^47 ms (about 4,460 years), not {value!r} s")
    return ms


def delay_ms(value: Any, what: str = "lock_delay") -> int:
    """Seconds (>= 0) to ms, rounded up (a delay is never shortened)."""
    f = _number(value, what)
    if f < 0:
        raise LockArgumentError(f"{what} must be 0 seconds or more, not {value!r}")
    if f > MAX_MS / 1000:
        raise LockArgumentError(f"{what} must be at most 2^47 ms, not {value!r} s")
    return int(math.ceil(f * 1000 - 1e-9)) if f > 0 else 0


def check_sleep(value: Any) -> Optional[float]:
    """redis-py's polling interval (``sleep``), accepted where redis-py accepts it and unused:
    a wait queues on the server, nothing polls. None (the lock's own) or seconds >= 0."""
    if value is None:
        return None
    f = _number(value, "sleep")
    if f < 0:
        raise LockArgumentError(f"sleep must be 0 seconds or more, not {value!r}")
    return f


def check_blocking_timeout(value: Any) -> Optional[float]:
    """None (wait forever) or seconds >= 0 (0: one try)."""
    if value is None:
        return None
    f = _number(value, "blocking_timeout")
    if f < 0:
        raise LockArgumentError(f"blocking_timeout must be 0 seconds or more (or None), not {value!r}")
    if _to_ms(f) > MAX_MS:
        raise LockArgumentError(f"blocking_timeout must be at most 2^47 ms, not {value!r} s")
    return f


def _to_ms(seconds: float) -> int:
    ms = int(seconds * 1000)
    if ms == 0 and seconds > 0:
        ms = 1
    return ms


def wait_ms(seconds: float) -> int:
    """A positive remaining wait in seconds to WAIT's milliseconds (>= 1: WAIT 0 is 'forever')."""
    return max(1, int(math.ceil(seconds * 1000 - 1e-9)))


def check_capacity(capacity: Any) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    c = int(capacity)
    if not 1 <= c <= MAX_CAPACITY:
        raise LockArgumentError(f"capacity must be between 1 and {MAX_CAPACITY}, not {c}")
    return c


def encode_token(token: Any) -> bytes:
    """A caller's owner token as the bytes the server compares (str: UTF-8)."""
    if isinstance(token, bytes):
        b = token
    elif isinstance(token, (bytearray, memoryview)):
        b = bytes(token)
    elif isinstance(token, str):
        b = token.encode("utf-8")
    elif isinstance(token, int) and not isinstance(token, bool):
        b = str(token).encode()
    else:
        raise TypeError(f"token must be bytes or str, not {type(token).__name__}")
    if not 1 <= len(b) <= MAX_OWNER_LEN:
        raise LockArgumentError(f"token must be 1 to {MAX_OWNER_LEN} bytes, not {len(b)}")
    return b


def new_token() -> bytes:
    """A fresh owner token: 32 hex digits like redis-py's, but from a random UUID (122 random
    bits from the OS), so that tokens made in the same instant by forked processes never
    collide. 32 bytes is also the longest owner the module stores in a held lock's compact
    form (longer owners cost about 112 bytes more per held lock)."""
    return uuid.uuid4().hex.encode()


def to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def to_str(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


# ----------------------------------------------------------------------------------------------
# Commands


@dataclass(frozen=True)
class Request:
    """What an acquire sends: the command and its arguments before the owner, after it."""

    command: str  # LOCK.ACQUIRE | LOCK.RWREAD | LOCK.SEMACQUIRE
    ttl_ms: int
    capacity: Optional[int] = None
    bind: bool = False
    lock_delay_ms: int = 0

    def args(self, name: Any, owner: bytes, wait: Optional[int]) -> List[Any]:
        """``wait``: None (no WAIT), 0 (no limit) or the ms to queue."""
        args: List[Any] = [self.command, name, owner]
        if self.capacity is not None:
            args.append(self.capacity)
        args.append(self.ttl_ms)
        if wait is not None:
            args += ["WAIT", wait]
        if self.bind:
            args.append("BIND")
        if self.lock_delay_ms:
            args += ["LOCKDELAY", self.lock_delay_ms]
        return args


def release_args(name: Any, owner: bytes) -> List[Any]:
    return ["LOCK.RELEASE", name, owner, "ALL"]


def grant_token(reply: Any) -> Optional[int]:
    """An acquire's reply: the fencing token, or None when not granted."""
    if reply is None:
        return None
    if isinstance(reply, bool):  # never sent by the module; be strict
        raise LockError(f"unexpected reply to a lock request: {reply!r}")
    if isinstance(reply, int):
        return reply
    if isinstance(reply, (bytes, str)) and to_str(reply).isdigit():
        return int(reply)
    raise LockError(f"unexpected reply to a lock request: {reply!r}")


#: Adds to (or replaces) the calling owner's remaining ttl in one step, on the server:
#: redis-py's ``extend(additional_time, replace_ttl=False)`` semantics on LOCK.EXTEND (which
#: sets now + ttl). Returns the new ttl in ms (>= 1), or 0 when the owner holds nothing (as
#: redis-py's script does): the caller counts its lease from the new ttl, not from 1.
#: It reads the caller's own entry (``LOCK.INFO key OWNER owner``, O(1) whatever the number of
#: holders); a module older than 0.4.0 refuses the option, and gets the plain form.
EXTEND_SCRIPT = """
local info = redis.pcall('LOCK.INFO', KEYS[1], 'OWNER', ARGV[1])
if type(info) == 'table' and info.err then
  if not string.find(string.lower(info.err), 'wrong number of arg', 1, true) then
    return redis.error_reply(info.err)
  end
  info = redis.call('LOCK.INFO', KEYS[1])
end
if not info then return 0 end
local holders = {}
for i = 1, #info, 2 do
  if info[i] == 'holders' then holders = info[i + 1] end
end
for _, h in ipairs(holders) do
  if h[1] == ARGV[1] then
    local ttl = tonumber(ARGV[2])
    if ARGV[3] == '0' then ttl = ttl + h[3] end
    if ttl < 1 then ttl = 1 end
    if ttl > 140737488355328 then
      return redis.error_reply('ERR the extended ttl would be over 2^47 ms')
    end
    redis.call('LOCK.EXTEND', KEYS[1], ARGV[1], string.format('%d', ttl))
    return ttl
  end
end
return 0
"""


@dataclass(frozen=True)
class Holder:
    """One holder of a key: ``held_ms`` is how long the owner has held it, from its first grant
    (module 0.3.0+; None when the server does not say or does not know the start)."""

    owner: bytes
    count: int
    ttl_ms: int
    held_ms: Optional[int] = None


def _holder(entry: Sequence[Any]) -> Holder:
    held = int(entry[3]) if len(entry) > 3 else -1
    return Holder(to_bytes(entry[0]), int(entry[1]), int(entry[2]), held if held >= 0 else None)


@dataclass(frozen=True)
class LockInfo:
    """LOCK.INFO, from RESP2 or RESP3: ``mode`` is ``write``, ``read``, ``semaphore`` or
    ``free``; ``fence`` the last token granted; ``delay`` a running lock-delay's remaining ms;
    ``capacity`` a semaphore's (None for locks); ``extra`` the fields this client does not
    know."""

    mode: str
    fence: int
    holders: Tuple[Holder, ...]
    waiting: int
    queue: Tuple[str, ...]
    delay: int = 0
    capacity: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    #: How many owners hold the key, listed or not (module 0.4.0+; None from an older module,
    #: which lists every holder). A read of one owner's entry (``OWNER``) lists that owner
    #: alone: this says whether others hold the key.
    holders_count: Optional[int] = None

    def holds(self, owner: bytes) -> bool:
        return any(h.owner == owner for h in self.holders)

    def live_holders(self) -> int:
        """How many owners hold the key: ``holders_count``, else the number listed."""
        return len(self.holders) if self.holders_count is None else self.holders_count


def owner_form_refused(error: BaseException) -> bool:
    """Whether an error reply to ``LOCK.INFO key OWNER owner`` is a module older than 0.4.0
    refusing the option ("wrong number of arguments for 'lock.info' command"): the plain form
    is then used for that server."""
    return isinstance(error, ResponseError) and "wrong number of arg" in str(error).lower()


#: Clients (of one server, or a cluster) whose server refused the owner form: the plain one is
#: sent to them from then on, without trying the owner form again on every check.
_PLAIN_INFO: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def plain_info_only(client: Any) -> bool:
    try:
        return client in _PLAIN_INFO
    except TypeError:  # not weakly referenceable
        return False


def mark_plain_info(client: Any) -> None:
    try:
        _PLAIN_INFO[client] = True
    except TypeError:
        pass


def info_args(key: Any, owner: Optional[bytes], plain_only: bool) -> Tuple[Any, ...]:
    """``LOCK.INFO key OWNER owner`` (one owner's entry, O(1) on the server), or the plain
    ``LOCK.INFO key`` when ``owner`` is None or the server does not take the option."""
    if owner is None or plain_only:
        return ("LOCK.INFO", key)
    return ("LOCK.INFO", key, "OWNER", owner)


def parse_info(reply: Any) -> Optional[LockInfo]:
    if reply is None:
        return None
    if isinstance(reply, dict):
        items: Sequence[Tuple[Any, Any]] = list(reply.items())
    elif isinstance(reply, (list, tuple)):
        if len(reply) % 2:
            raise LockError(f"unexpected LOCK.INFO reply: {reply!r}")
        items = [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]
    else:
        raise LockError(f"unexpected LOCK.INFO reply: {reply!r}")
    fields = {to_str(k): v for k, v in items}
    holders = tuple(_holder(h) for h in (fields.pop("holders", None) or []))
    known = {
        "mode": to_str(fields.pop("mode", "free")),
        "fence": int(fields.pop("fence", 0) or 0),
        "waiting": int(fields.pop("waiting", 0) or 0),
        "queue": tuple(to_str(q) for q in (fields.pop("queue", None) or [])),
        "delay": int(fields.pop("delay", 0) or 0),
    }
    cap = fields.pop("capacity", None)
    count = fields.pop("holders_count", None)
    return LockInfo(
        mode=known["mode"],  # type: ignore[arg-type]
        fence=known["fence"],  # type: ignore[arg-type]
        holders=holders,
        waiting=known["waiting"],  # type: ignore[arg-type]
        queue=known["queue"],  # type: ignore[arg-type]
        delay=known["delay"],  # type: ignore[arg-type]
        capacity=None if cap is None else int(cap),
        extra=fields,
        holders_count=None if count is None else int(count),
    )


def drift(ttl_seconds: float, factor: float) -> float:
    """Clock drift allowance of a lease: ``factor`` of it plus 2 ms (as Redlock specifies)."""
    return ttl_seconds * factor + 0.002


def no_retry(aio: bool) -> Any:
    """A redis-py ``Retry`` that never retries, of the kind the connection needs: an asyncio
    connection gets ``redis.asyncio.retry.Retry`` (there since redis-py 5.0; 8.2 converts a
    sync one given to an asyncio client, with a ``UserWarning``)."""
    from redis.backoff import NoBackoff

    if aio:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), 0)
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def dedicated_kwargs(kwargs: Dict[str, Any], socket_timeout: Optional[float], aio: bool) -> Dict[str, Any]:
    """A pool's connection arguments for a connection of our own: the given read timeout and
    no retries (a command is never sent twice, so a wait never goes back to the end of the
    queue); ``aio``: for an asyncio connection."""
    out = dict(kwargs)
    out["socket_timeout"] = socket_timeout
    out["retry"] = no_retry(aio)
    out.pop("retry_on_timeout", None)
    if "retry_on_error" in out:
        out["retry_on_error"] = []
    return out


# ----------------------------------------------------------------------------------------------
# Keys moved to another cluster node while a request waited (resharding)

#: How many times one waiting acquire follows its key to another node before it gives up (a
#: slot moves once per reshard; more means the cluster is moving it back and forth).
MAX_KEY_MOVES = 5


@dataclass(frozen=True)
class KeyMoved:
    """Where a waiting request goes next after its node said the key is elsewhere: ``TRYAGAIN``
    (the module: MIGRATE moved the key while the request waited; ask where the slot map says),
    ``ASK host:port`` (the slot is being moved: ask that node, after ``ASKING``) or ``MOVED
    host:port`` (that node owns the slot now)."""

    address: Optional[Tuple[str, int]]
    asking: bool


def key_moved(err: BaseException) -> Optional[KeyMoved]:
    """The :class:`KeyMoved` an error reply means, or None for any other error."""
    from redis.exceptions import AskError, MovedError, TryAgainError

    if isinstance(err, MovedError):
        return KeyMoved((str(err.host), int(err.port)), False)
    if isinstance(err, AskError):
        return KeyMoved((str(err.host), int(err.port)), True)
    if isinstance(err, TryAgainError):
        return KeyMoved(None, False)
    return None


def follows_moves(redis: Any) -> bool:
    """Can this client send a request to a node of its choosing (a ``RedisCluster``)?"""
    return getattr(redis, "get_node_from_key", None) is not None


def move_to_follow(err: BaseException, attempt: int, redis: Any) -> Optional[KeyMoved]:
    """The move a waiting request follows after ``err`` on its ``attempt``-th try, or None
    when ``err`` is to be raised: not a move, moves used up, or a client that cannot follow."""
    moved = key_moved(getattr(err, "__cause__", None) or err)
    if moved is None or attempt == MAX_KEY_MOVES or not follows_moves(redis):
        return None
    return moved


def wait_left(wait: Optional[float], started: float) -> Tuple[Optional[float], Optional[int]]:
    """What is left of a wait of ``wait`` seconds begun at ``started`` (monotonic), and the
    WAIT argument for it: None without a wait, 0 for no limit (``math.inf``), else ms."""
    if wait is None:
        return None, None
    remaining = wait - (time.monotonic() - started)
    return remaining, (0 if remaining == math.inf else wait_ms(remaining))
