"""The asyncio face of the loss watcher (interface stub; the implementation is being built).

``watch`` registers a held lock so that its loss on the server (DEL, expiry, eviction,
failover, bound connection killed) is noticed within milliseconds; ``on_loss(reason)`` is
called once, from the watcher's task (a coroutine function's result is awaited), with a short reason ("deleted", "expired", ...).
``call`` runs one command over the watcher's own connection to the server, so that the
watchdog's renewals do not wake the watcher (the server does not tell a tracking client about
its own writes). Both return None / raise ``Unavailable`` when there is no watcher for this
client (a cluster, a server that refuses tracking): callers carry on without it.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional


class Unavailable(Exception):
    """No watcher for this client: use the client's own connections."""


class Handle:
    """A registration; pass it to ``unwatch``."""


def watch(client: Any, name: Any, owner: bytes, on_loss: Callable[[str], None]) -> Optional[Handle]:
    return None


def unwatch(handle: Optional[Handle]) -> None:
    return None


async def call(client: Any, args: List[Any], timeout: Optional[float]) -> Any:
    raise Unavailable()
