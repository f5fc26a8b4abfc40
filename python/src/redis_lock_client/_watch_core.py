"""The loss watcher's decisions, with no I/O (the faces are ``_watch_sync.py`` and
``_watch_aio.py``; the Rust client's ``proto/watch.rs`` is the model).

Per server and process the watcher keeps two connections of its own:

- the *command* connection turns on client-side-caching invalidations in broadcast mode,
  ``CLIENT TRACKING on REDIRECT <id> BCAST NOLOOP PREFIX <key> ...``, and carries the re-reads
  (``LOCK.INFO``) and whatever the callers send through ``call`` (the watchdog's renewals);
- the *push* connection (RESP2) is subscribed to ``__redis__:invalidate``, where the server
  sends, for each change of a tracked key by any *other* connection, a message naming it (a
  flush names none: every key).

The module signals a change of the key whenever a lock's state changes (grant, release,
expiry, queue changes, a bound connection's close), Redis does on ``DEL``, eviction, overwrite
and the flush of a full resync. ``NOLOOP`` keeps the command connection's own writes quiet, so
a held lock costs the server its renewals and nothing more. An invalidation only says "this
key may have changed": the watcher re-reads the key, ``LOCK.INFO key OWNER owner`` for each
owner among its registrations (one entry each, O(1) on the server whatever the number of
holders; one plain ``LOCK.INFO key`` on a server whose module predates ``OWNER``), and judges,
for each registration, whether its owner still holds (``judge``). A prefix also matches longer
keys: the re-read decides.

Rules (as the Rust client's):

- re-reads of one key at least ``RECHECK_SPACING`` apart (and ``SPACING_PER_HOLDER`` per
  holder the last re-read listed), one at a time: a change while a re-read is out or within
  the spacing makes the key *due*, re-read once the spacing is over;
- the prefixes registered never overlap (the server refuses overlapping ones); a key covered
  by a registered prefix needs nothing, a key that is the prefix of registered ones makes the
  watcher replace the set; the set is replaced (one ``MULTI``/``EXEC``) only when it changes:
  once ``MAX_STALE`` prefixes of keys no longer held pile up, or ``MAX_IGNORED_PUSHES`` pushes
  came for keys no longer held; every held key is re-read after a replacement (``CLIENT
  TRACKING off`` frees a prefix left with no client together with the changed keys the server
  has not pushed yet, which it pushes at the end of its event-loop iteration: a ``DEL`` run in
  the same iteration, just before the replacement, is never pushed);
- a new registration is followed by a re-read of its key (covering the moment between the
  grant and the registration); a re-read sent before a registration does not judge it;
- after (re)connecting, every key is registered again and re-read (changes while the
  connections were down were not pushed).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from redis.exceptions import ConnectionError as RedisConnectionError

from ._common import dedicated_kwargs, owner_form_refused, parse_info, to_bytes

logger = logging.getLogger(__name__)

#: The channel a RESP2 redirect target receives invalidations on.
INVALIDATE_CHANNEL = b"__redis__:invalidate"

#: The shortest time between two re-reads of one key (seconds).
RECHECK_SPACING = 0.005
#: At least this long per holder the last re-read listed between two re-reads of a key: a
#: plain ``LOCK.INFO`` (a server without ``OWNER``) lists every holder, so a large semaphore or
#: read lock is then re-read less often. A read of one owner's entry lists at most one.
SPACING_PER_HOLDER = 50e-6
#: Replace the registered set once more than this many prefixes are stale.
MAX_STALE = 64
#: Replace it once this many pushes came for keys no registration holds.
MAX_IGNORED_PUSHES = 4
#: A watcher with nothing to watch for this long closes its connections and ends.
IDLE_STOP = 10.0
#: How often (seconds) an idle watcher looks whether its command connection was closed by the
#: server (no command is sent: the socket is only polled).
LIVENESS_POLL = 0.05
#: Waits between connection attempts after a failure (seconds), growing to the last.
RECONNECT_BACKOFF = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

#: The read timeout of the watcher's connections (a reply that takes longer: the connection
#: is dropped and set up again).
IO_TIMEOUT = 5.0

Args = Tuple[Any, ...]

#: The connection arguments that tell one server (and user) from another.
_IDENT_FIELDS = ("host", "port", "path", "db", "username", "password", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs")


def server_ident(cls: type, kwargs: Dict[str, Any], pool: Any) -> Tuple[Any, ...]:
    """What tells one watcher from another: the connection class, the server's address, db and
    user (a Sentinel pool's connections follow that pool's master: one watcher per pool)."""
    fields = tuple((f, kwargs.get(f)) for f in _IDENT_FIELDS if f in kwargs)
    follows = id(pool) if "connection_pool" in kwargs else None
    return (cls, kwargs.get("host"), kwargs.get("port") or kwargs.get("path"), fields, follows)


#: The name (``CLIENT SETNAME``) of the watcher's connections when the user's pool sets none;
#: with a ``client_name``, theirs is that name with ``WATCHER_NAME_SUFFIX``.
WATCHER_NAME = "redis-lock-watcher"
WATCHER_NAME_SUFFIX = ":lock-watcher"


def watcher_name(client_name: Any) -> str:
    """The name of the watcher's connections, so that ``CLIENT LIST`` tells them from the
    pool's: the user's ``client_name`` + ``":lock-watcher"``, or ``"redis-lock-watcher"``."""
    if isinstance(client_name, (bytes, bytearray)):
        client_name = bytes(client_name).decode("utf-8", "replace")
    if not client_name:
        return WATCHER_NAME
    return f"{client_name}{WATCHER_NAME_SUFFIX}"


def watcher_kwargs(kwargs: Dict[str, Any], aio: bool) -> Dict[str, Any]:
    """The watcher's connection arguments from the user's pool's: RESP2 (invalidations come as
    Pub/Sub messages), undecoded replies, no retries, no health-check pings, a read timeout,
    a name of their own (``watcher_name``); ``aio``: for asyncio connections."""
    out = dedicated_kwargs(kwargs, IO_TIMEOUT, aio)
    out["client_name"] = watcher_name(kwargs.get("client_name"))
    out["protocol"] = 2
    out["decode_responses"] = False
    out["health_check_interval"] = 0
    # redis-py 7+: maintenance notifications need RESP3; ours is RESP2 and never moved.
    for k in ("maint_notifications_config", "maint_notifications_pool_handler", "oss_cluster_maint_notifications_handler"):
        out.pop(k, None)
    return out


def check_subscribed(reply: Any) -> None:
    """The reply to ``SUBSCRIBE __redis__:invalidate``."""
    ok = (
        isinstance(reply, (list, tuple))
        and len(reply) == 3
        and to_bytes(reply[0]) == b"subscribe"
        and to_bytes(reply[1]) == INVALIDATE_CHANNEL
    )
    if not ok:
        raise RedisConnectionError(f"unexpected reply to SUBSCRIBE {INVALIDATE_CHANNEL!r}: {reply!r}")


def tracking_on(redirect: int, prefixes: Iterable[bytes]) -> Args:
    out: List[Any] = ["CLIENT", "TRACKING", "on", "REDIRECT", redirect, "BCAST", "NOLOOP"]
    for p in prefixes:
        out += ["PREFIX", p]
    return tuple(out)


TRACKING_OFF: Args = ("CLIENT", "TRACKING", "off")


def info_cmd(key: bytes) -> Args:
    return ("LOCK.INFO", key)


def owner_info_cmd(key: bytes, owner: bytes) -> Args:
    return ("LOCK.INFO", key, "OWNER", owner)


def tracking_refused(error_text: str) -> bool:
    """Whether an error reply to a registration means the server will not track for us (an ACL
    without ``client|tracking``, an unknown subcommand). "Overlapping" prefixes are no refusal:
    the prefix was registered already."""
    return "overlap" not in error_text.lower()


def minimal(keys: Iterable[bytes]) -> List[bytes]:
    """The smallest prefix set covering ``keys``: no member a prefix of another."""
    out: List[bytes] = []
    for k in sorted(set(keys)):
        if out and k.startswith(out[-1]):
            continue
        out.append(k)
    return out


def invalidated_keys(message: Any) -> Tuple[bool, Optional[List[bytes]]]:
    """A message read on the push connection: ``(True, keys)`` for an invalidation (``keys``
    None for a flush: every key), ``(False, None)`` for anything else (a subscribe
    confirmation, ...)."""
    if not isinstance(message, (list, tuple)) or len(message) != 3:
        return False, None
    kind, channel, data = message
    if to_bytes(kind) != b"message" or to_bytes(channel) != INVALIDATE_CHANNEL:
        return False, None
    if data is None:
        return True, None
    if isinstance(data, (list, tuple)):
        return True, [to_bytes(k) for k in data if isinstance(k, (bytes, str))]
    if isinstance(data, (bytes, str)):
        return True, [to_bytes(data)]
    return False, None


def judge(reply: Any, error: Optional[BaseException], owner: bytes) -> Tuple[bool, Optional[str]]:
    """A re-read's outcome for one owner: ``(decided, reason)``. ``(True, None)``: still held;
    ``(True, reason)``: lost ("deleted": no key; "expired": the key has no holder, the hold
    ran out or was ended by someone else; "taken": others hold it; "overwritten": the key is
    of another type now); ``(False, None)``: nothing can be concluded (the re-read failed)."""
    if error is not None:
        if "WRONGTYPE" in str(error):
            return True, "overwritten"
        return False, None
    try:
        info = parse_info(reply)
    except (ValueError, TypeError, IndexError):
        return False, None
    if info is None:
        return True, "deleted"
    if any(h.owner == owner for h in info.holders):
        return True, None
    # A read of one owner's entry lists nobody else: ``holders_count`` says whether others hold.
    return True, ("taken" if info.live_holders() else "expired")


def holder_count(reply: Any) -> Optional[int]:
    try:
        info = parse_info(reply)
    except (ValueError, TypeError, IndexError):
        return None
    return None if info is None else len(info.holders)


class Unavailable(Exception):
    """No watcher for this client: use the client's own connections."""


class Handle:
    """A registration; pass it to ``unwatch``."""

    __slots__ = ("_watcher", "_reg")

    def __init__(self, watcher: Any, reg: "Registration") -> None:
        self._watcher = watcher
        self._reg = reg

    def __repr__(self) -> str:
        return f"<watch handle {self._reg!r}>"


_NO_POOL_NOTED: Set[type] = set()


def server_of(client: Any) -> Optional[Tuple[Any, type, Dict[str, Any]]]:
    """The key of the client's server, its connection class and arguments; None for clients
    without one connection pool (a cluster)."""
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if pool is None or cls is None or not isinstance(kwargs, dict):
        if type(client) not in _NO_POOL_NOTED:
            _NO_POOL_NOTED.add(type(client))
            logger.info(
                "redis-lock: no loss watcher for %s clients (no single connection pool): a lost "
                "lock is noticed at its next renewal",
                type(client).__name__,
            )
        return None
    return server_ident(cls, kwargs, pool), cls, dict(kwargs)


class Registration:
    """One ``watch``: a key, an owner, the callback; ``first``: the number of the first
    re-read that may judge it; ``done``: found lost or unwatched; ``cancelled``: unwatched."""

    __slots__ = ("key", "owner", "on_loss", "first", "done", "cancelled")

    def __init__(self, key: bytes, owner: bytes, on_loss: Callable[[str], Any]) -> None:
        self.key = key
        self.owner = owner
        self.on_loss = on_loss
        self.first = 0
        self.done = False
        self.cancelled = False  # unwatched: no callback from now on

    def __repr__(self) -> str:
        return f"<watch registration {self.key!r} owner={self.owner!r}{' done' if self.done else ''}>"


@dataclass
class Plan:
    """What a face does next: send ``commands`` (replies checked by ``registered``), then
    re-read ``reads`` (key, number)."""

    commands: List[Args] = field(default_factory=list)
    reads: List[Tuple[bytes, int]] = field(default_factory=list)
    #: Set by :meth:`Watcher.read_requests`: for each re-read, the owners whose entries it
    #: reads (one command each; ``None``: one plain ``LOCK.INFO key``).
    sent: Optional[List[Tuple[bytes, int, List[Optional[bytes]]]]] = None

    def __bool__(self) -> bool:
        return bool(self.commands or self.reads)

    def extend(self, other: "Plan") -> None:
        self.commands += other.commands
        self.reads += other.reads


class Watcher:
    """The state of one server's watcher. Not thread-safe: a face serializes the calls."""

    def __init__(self) -> None:
        self.regs: Dict[bytes, List[Registration]] = {}
        self.registered: Set[bytes] = set()
        self.redirect: Optional[int] = None  # the push connection's id, while connected
        self.in_flight: Set[bytes] = set()
        self.due: Set[bytes] = set()
        self.last_read: Dict[bytes, float] = {}
        self.spacing: Dict[bytes, float] = {}
        self.ignored = 0
        self.reads_sent = 0
        self.refused: Optional[str] = None  # the server refused tracking: why
        self.idle_since: Optional[float] = time.monotonic()
        self.failures = 0
        self.generation = 0  # connections set up so far
        self.queued: List[Tuple[int, Plan]] = []  # plans of ``add``/``remove`` not yet sent
        #: The server refused ``LOCK.INFO key OWNER owner`` (a module before 0.4.0): re-reads
        #: use the plain form from then on.
        self.plain_info = False

    def queue(self, plan: Plan) -> bool:
        """Keeps a plan made outside the face's loop for its next ``step``; True when the
        face's loop must be woken."""
        if not plan:
            return False
        self.queued.append((self.generation, plan))
        return True

    def step(self, messages: Sequence[Any], now: float) -> Plan:
        """One turn of a face's loop: what the pushes read since the last turn, the queued
        registrations (only those made for the connections up now: a reconnect registered
        every key anew) and the due re-reads ask for."""
        plan = Plan()
        for m in messages:
            plan.extend(self.message(m, now))
        queued, self.queued = self.queued, []
        for generation, p in queued:
            if generation == self.generation:
                plan.extend(p)
        plan.extend(self.tick(now))
        return plan

    # -- registrations ------------------------------------------------------------------------

    def watched(self) -> bool:
        return bool(self.regs)

    def add(self, reg: Registration) -> Plan:
        """A held lock to watch: the registration to send (if the key is not covered) and a
        re-read of the key (if connected; otherwise the reconnect re-reads every key)."""
        self.regs.setdefault(reg.key, []).append(reg)
        self.idle_since = None
        reg.first = self.reads_sent + 1
        if self.redirect is None:
            return Plan()
        now = time.monotonic()
        plan = self._cover(reg.key, now)
        if all(k != reg.key for k, _ in plan.reads):  # (a replacement re-reads every key)
            plan.extend(self._read_now_or_due(reg.key, now))
        return plan

    def cancel(self, reg: Registration) -> Plan:
        """``unwatch``: no callback from now on (also one found lost but not yet reported)."""
        reg.cancelled = True
        return self.remove(reg)

    def remove(self, reg: Registration) -> Plan:
        reg.done = True
        lst = self.regs.get(reg.key)
        if lst is None or reg not in lst:
            return Plan()
        lst.remove(reg)
        if not lst:
            del self.regs[reg.key]
            self.due.discard(reg.key)
            self.last_read.pop(reg.key, None)
            self.spacing.pop(reg.key, None)
        if not self.regs:
            self.idle_since = time.monotonic()
        if self.redirect is not None and len(self.registered) > len(self.regs) + MAX_STALE:
            return self._rebuild(time.monotonic())
        return Plan()

    def _covered(self, key: bytes) -> bool:
        return any(key.startswith(p) for p in self.registered)

    def _cover(self, key: bytes, now: float) -> Plan:
        if self._covered(key):
            return Plan()
        if any(p.startswith(key) for p in self.registered):
            return self._rebuild(now)
        self.registered.add(key)
        assert self.redirect is not None
        return Plan(commands=[tracking_on(self.redirect, [key])])

    def _rebuild(self, now: float) -> Plan:
        """Replaces the registered set with the held keys' (one ``MULTI``/``EXEC``) if it
        differs, then re-reads every held key: ``CLIENT TRACKING off`` frees a prefix left with
        no client together with the changed keys not yet pushed (the server pushes them at the
        end of its event-loop iteration), so a change run in the same iteration as the
        replacement, before it, is never pushed. A key with a re-read out (sent before the
        replacement) or within its spacing is made due: re-read after the replacement."""
        new = minimal(self.regs)
        self.ignored = 0
        if set(new) == self.registered:
            return Plan()
        self.registered = set(new)
        assert self.redirect is not None
        cmds: List[Args] = [("MULTI",), TRACKING_OFF]
        if new:
            cmds.append(tracking_on(self.redirect, new))
        cmds.append(("EXEC",))
        plan = Plan(commands=cmds)
        for key in sorted(self.regs):
            plan.extend(self._read_now_or_due(key, now))
        return plan

    def registered_reply(self, reply: Any, error: Optional[BaseException]) -> bool:
        """The reply to a registration command (an ``EXEC`` reply's inner errors included).
        Returns True when the connections must be set up again (the push connection the
        registration redirects to is gone); a refusal (an ACL without ``client|tracking``, ...)
        turns this watcher off (``refused``)."""
        errors = [error] if error is not None else []
        if isinstance(reply, (list, tuple)):
            errors += [e for e in reply if isinstance(e, BaseException)]
        reconnect = False
        for e in errors:
            text = str(e)
            if "redirect" in text.lower():
                reconnect = True
            elif tracking_refused(text):
                self.refused = text
        return reconnect

    # -- connections --------------------------------------------------------------------------

    def connected(self, redirect: int) -> Plan:
        """Both connections are up (the push one subscribed, with this client id): register
        every key and re-read every key."""
        self.redirect = redirect
        self.failures = 0
        self.generation += 1
        self.in_flight.clear()
        self.due.clear()
        self.registered = set(minimal(self.regs))
        plan = Plan()
        if self.registered:
            plan.commands.append(tracking_on(redirect, sorted(self.registered)))
        now = time.monotonic()
        for key in list(self.regs):
            self.last_read.pop(key, None)
            plan.extend(self._read_now_or_due(key, now))
        return plan

    def disconnected(self) -> float:
        """The connections are gone (closed by the face): how long to wait before the next
        attempt."""
        self.redirect = None
        self.registered = set()
        self.in_flight.clear()
        delay = RECONNECT_BACKOFF[min(self.failures, len(RECONNECT_BACKOFF) - 1)]
        self.failures += 1
        return delay

    def is_up(self) -> bool:
        return self.redirect is not None and self.refused is None

    # -- pushes and re-reads ------------------------------------------------------------------

    def message(self, message: Any, now: float) -> Plan:
        """A message from the push connection."""
        is_inval, keys = invalidated_keys(message)
        if not is_inval:
            return Plan()
        if keys is None:
            held = list(self.regs)
        else:
            held = []
            for k in keys:
                if k in self.regs:
                    held.append(k)
                else:
                    self.ignored += 1
        plan = Plan()
        for k in held:
            plan.extend(self._read_now_or_due(k, now))
        if self.ignored >= MAX_IGNORED_PUSHES and self.redirect is not None:
            plan.extend(self._rebuild(now))
        return plan

    def _spacing_of(self, key: bytes) -> float:
        return self.spacing.get(key, RECHECK_SPACING)

    def _too_soon(self, key: bytes, now: float) -> bool:
        last = self.last_read.get(key)
        return last is not None and now - last < self._spacing_of(key) - 1e-9

    def _read_now_or_due(self, key: bytes, now: float) -> Plan:
        if key in self.in_flight or self._too_soon(key, now):
            self.due.add(key)
            return Plan()
        return Plan(reads=[self._start_read(key, now)])

    def _start_read(self, key: bytes, now: float) -> Tuple[bytes, int]:
        self.in_flight.add(key)
        self.last_read[key] = now
        self.reads_sent += 1
        return key, self.reads_sent

    def next_due(self) -> Optional[float]:
        """When the next due re-read may go out (monotonic seconds), if any is due."""
        times = [
            self.last_read.get(k, 0.0) + self._spacing_of(k) for k in self.due if k not in self.in_flight
        ]
        return min(times) if times else None

    def tick(self, now: float) -> Plan:
        """The due re-reads whose spacing is over."""
        ready = [k for k in self.due if k not in self.in_flight and not self._too_soon(k, now)]
        plan = Plan()
        for k in sorted(ready):
            self.due.discard(k)
            plan.reads.append(self._start_read(k, now))
        return plan

    def read_requests(self, plan: Plan) -> List[Args]:
        """The commands of ``plan``'s re-reads, after its ``commands``: for each key one
        ``LOCK.INFO key OWNER owner`` per owner among its registrations (O(1) on the server
        whatever the number of holders), or one plain ``LOCK.INFO key`` on a server that does
        not take the option. Kept on the plan for :meth:`answered`."""
        plan.sent = []
        out: List[Args] = []
        for key, number in plan.reads:
            owners: List[Optional[bytes]]
            if self.plain_info:
                owners = [None]
            else:
                owners = list(sorted({r.owner for r in self.regs.get(key, []) if not r.done}))
            plan.sent.append((key, number, owners))
            out += [info_cmd(key) if o is None else owner_info_cmd(key, o) for o in owners]
        return out

    def read_done(
        self, key: bytes, number: int, reply: Any, error: Optional[BaseException]
    ) -> List[Tuple[Registration, str]]:
        """Re-read ``number`` of ``key`` came back (``error``: an error reply, or none at all):
        the registrations found lost, now marked done, with their reasons (the face calls
        each ``on_loss(reason)``). A re-read that decided nothing is due again."""
        return self.reads_done(key, number, {None: (reply, error)})

    def reads_done(
        self,
        key: bytes,
        number: int,
        got: Dict[Optional[bytes], Tuple[Any, Optional[BaseException]]],
    ) -> List[Tuple[Registration, str]]:
        """As :meth:`read_done`, for a re-read made of one read per owner (``got``: owner →
        reply and error; ``None``: a plain read, for every owner)."""
        self.in_flight.discard(key)
        if any(o is not None and e is not None and owner_form_refused(e) for o, (_, e) in got.items()):
            self.plain_info = True  # an older module: the key is due again, read plainly
        lst = self.regs.get(key)
        if not lst:
            return []
        counts = [holder_count(r) if e is None else None for r, e in got.values()]
        n = None if not counts or None in counts else sum(c for c in counts if c is not None)
        if n is not None and n * SPACING_PER_HOLDER > RECHECK_SPACING:
            self.spacing[key] = n * SPACING_PER_HOLDER
        else:
            self.spacing.pop(key, None)
        lost: List[Tuple[Registration, str]] = []
        undecided = False
        for reg in list(lst):
            if reg.done or reg.first > number:
                continue
            answer = got.get(None, got.get(reg.owner))
            if answer is None:  # an owner whose entry this re-read did not read
                undecided = True
                continue
            reply, error = answer
            decided, reason = judge(reply, error, reg.owner)
            if not decided:
                undecided = True
            elif reason is not None:
                lost.append((reg, reason))
        for reg, _ in lost:
            # (a replacement the removal asks for goes out at the face's next ``step``)
            self.queue(self.remove(reg))
        if undecided or any(r.first > number for r in self.regs.get(key, [])):
            self.due.add(key)
        return lost

    def answered(
        self, plan: Plan, replies: Sequence[Tuple[Any, Optional[BaseException]]], failed: bool
    ) -> Tuple[bool, List[Tuple[Registration, str]]]:
        """The replies to ``plan`` (its commands', then its re-reads', each a reply or an error
        reply; fewer when the connection failed, ``failed``): whether the connections must be
        set up again, and the registrations found lost with their reasons (now marked done;
        the face calls each ``on_loss(reason)``)."""
        reconnect = failed
        if failed:
            self.connection_lost_reads(plan.reads)
        for reply, error in replies[: len(plan.commands)]:
            if self.registered_reply(reply, error):
                reconnect = True
        lost: List[Tuple[Registration, str]] = []
        answers = list(replies[len(plan.commands) :])
        sent = plan.sent if plan.sent is not None else [(k, n, [None]) for k, n in plan.reads]
        at = 0
        for key, number, owners in sent:
            mine = answers[at : at + len(owners)]
            at += len(owners)
            if len(mine) < len(owners):
                break  # the connection failed: the reconnect re-reads
            lost += self.reads_done(key, number, dict(zip(owners, mine)))
        return reconnect, lost

    def connection_lost_reads(self, reads: Sequence[Tuple[bytes, int]]) -> None:
        """Re-reads that got no answer because the connection failed: the reconnect re-reads."""
        for key, _ in reads:
            self.in_flight.discard(key)

    def idle_for(self, now: float) -> float:
        """How long nothing has been watched (0 while something is)."""
        return 0.0 if self.idle_since is None else now - self.idle_since


def wait_timeout(w: Watcher, now: float) -> float:
    """How long a face may block on its push connection before calling ``tick``."""
    nd = w.next_due()
    t = LIVENESS_POLL if nd is None else max(0.0, min(nd - now, LIVENESS_POLL))
    return t


def should_stop(w: Watcher, now: float) -> bool:
    return w.refused is not None or (not w.watched() and w.idle_for(now) >= IDLE_STOP)
