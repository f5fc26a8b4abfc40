"""How the protocol core and its two faces meet.

The core (``_core.py``, ``_redlock_core.py``, ``_watch_core.py``) is written once, as generator
functions that never touch a socket: each ``yield``s an *effect* (a plain object saying what to
do: send this command, take a connection, sleep until then) and receives the effect's result, or
has the effect's exception thrown into it at the ``yield``. Each face runs the same generator with
its own ``perform``: ``drive`` for the sync classes (threads and blocking sockets), ``drive_async``
for the asyncio classes. A face makes no decision about lock semantics; it only carries effects
out, so a fix to those semantics is made once, in the core.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, Optional, TypeVar

T = TypeVar("T")

#: A core routine: yields effects, receives their results, returns ``T``.
Steps = Generator[Any, Any, T]


def drive(steps: "Steps[T]", perform: Callable[[Any], Any]) -> T:
    """Runs ``steps`` to its end with a blocking ``perform``. An exception from ``perform`` (also
    ``KeyboardInterrupt``) is thrown into the core at its ``yield``, so the core decides what is
    left to undo; one the core does not catch comes out of here unchanged."""
    result: Any = None
    failure: Optional[BaseException] = None
    while True:
        try:
            effect = steps.send(result) if failure is None else steps.throw(failure)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            failure = None  # no reference cycle through the traceback
        try:
            result = perform(effect)
        except BaseException as e:  # noqa: BLE001 - handed to the core, which re-raises
            result, failure = None, e


async def drive_async(steps: "Steps[T]", perform: Callable[[Any], Awaitable[Any]]) -> T:
    """``drive`` for asyncio: the same generator, effects awaited. A ``CancelledError`` from an
    effect is thrown into the core like any other exception, so the core undoes what it must
    before the cancellation propagates."""
    result: Any = None
    failure: Optional[BaseException] = None
    while True:
        try:
            effect = steps.send(result) if failure is None else steps.throw(failure)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            failure = None
        try:
            result = await perform(effect)
        except BaseException as e:  # noqa: BLE001 - handed to the core, which re-raises
            result, failure = None, e
