"""redis-lock-client: Python client of the redis-lock module (native FIFO locks for Redis).

- ``Lock``: a drop-in for ``redis.lock.Lock`` (``r.lock(name, lock_class=Lock)``), waiting in
  the server's FIFO queue instead of polling, with fencing tokens.
- ``ReadLock`` / ``RWLock``: read-write locks; ``Semaphore``: counting semaphores.
- ``Redlock``: one lock over N independent servers (N/2+1 must grant it).
- ``redis_lock_client.asyncio``: the same for ``redis.asyncio``.
- ``configure_connections(client, max_wait_connections=..., max_idle_connections=...)``: the
  limits on the connections that waits and bound holds take from the client's pool (sync and
  asyncio clients alike); ``ConnectionLimitError`` when none can be had.

See docs/python.md in the redis-lock repository.
"""

from __future__ import annotations

from redis.exceptions import LockError, LockNotOwnedError

from ._common import (
    CapacityMismatchError,
    DeadlockError,
    Holder,
    LockArgumentError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockRefusedError,
    LockValidityError,
    MaxWaitersError,
    ModuleMissingError,
    QuorumUnreachableError,
    RedlockError,
    WrongKindError,
    WrongTypeError,
)
from ._connections import ConnectionLimitError, configure_connections
from .lock import Lock, ReadLock, RWLock, Semaphore
from .redlock import Redlock

__version__ = "0.1.0"

__all__ = [
    "CapacityMismatchError",
    "ConnectionLimitError",
    "DeadlockError",
    "Holder",
    "Lock",
    "LockArgumentError",
    "LockError",
    "LockHeldError",
    "LockInfo",
    "LockLostError",
    "LockNotOwnedError",
    "LockRefusedError",
    "LockValidityError",
    "MaxWaitersError",
    "ModuleMissingError",
    "QuorumUnreachableError",
    "RWLock",
    "ReadLock",
    "Redlock",
    "RedlockError",
    "Semaphore",
    "WrongKindError",
    "WrongTypeError",
    "__version__",
    "configure_connections",
]
