"""pytest plugin (``-p redis_lock_swap``): redis-py's own Lock tests, run unmodified, test
this package's locks instead of redis-py's.

Those tests do ``from redis.lock import Lock`` (asyncio: ``from redis.asyncio.lock import
Lock``) when they are collected and pass that class as ``lock_class``. Loaded with ``-p``, this
module is imported before any conftest or test file, and replaces both names by
``redis_lock_client.Lock`` and ``redis_lock_client.asyncio.Lock``, so their imports get ours.
Every collected test is checked to really use the swap (the test module's ``Lock`` is ours).

The tests that read redis-py's own storage or count its polling sleeps are deselected by the
exact ids listed in ``deselected.txt`` next to this file: ``nodeid  # reason``, or
``nodeid ; redis<6  # reason`` for an entry that holds only for the redis-py versions the
specifier (PEP 440) matches. An id without ``[...]`` stands for all the parametrizations of
that one test. An entry that holds for this version but names no collected test fails a
whole-file run, so the list cannot go stale (or carry a typo) unseen: a test that only some
versions have gets a specifier.
"""

from __future__ import annotations

import os
from typing import Dict, List, Set

from packaging.specifiers import InvalidSpecifier, SpecifierSet

import pytest
import redis
import redis.asyncio.lock
import redis.lock

import redis_lock_client
import redis_lock_client.asyncio

OURS = {
    "redis.lock": redis_lock_client.Lock,
    "redis.asyncio.lock": redis_lock_client.asyncio.Lock,
}
THEIRS = {
    "redis.lock": redis.lock.Lock,
    "redis.asyncio.lock": redis.asyncio.lock.Lock,
}

redis.lock.Lock = redis_lock_client.Lock  # type: ignore[misc, assignment]
redis.asyncio.lock.Lock = redis_lock_client.asyncio.Lock  # type: ignore[misc, assignment]

DESELECTED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deselected.txt")


def read_deselected(version: str, path: str = DESELECTED_FILE) -> Dict[str, str]:
    """``{nodeid: reason}`` of the entries that hold for redis-py ``version``; every entry
    must carry a reason."""
    entries: Dict[str, str] = {}
    seen: Set[str] = set()
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            head, sep, reason = line.partition("#")
            nodeid, _, spec = head.partition(";")
            nodeid, spec, reason = nodeid.strip(), spec.strip(), reason.strip()
            if not sep or not reason or " " in nodeid or "::" not in nodeid:
                raise pytest.UsageError(f"{path}:{number}: expected `nodeid [; redis<spec>]  # reason`, got {line!r}")
            if nodeid in seen:
                raise pytest.UsageError(f"{path}:{number}: {nodeid} listed twice")
            seen.add(nodeid)
            if spec:
                if not spec.startswith("redis"):
                    raise pytest.UsageError(f"{path}:{number}: the specifier must read `redis<version>`, got {spec!r}")
                try:
                    applies = version in SpecifierSet(spec[len("redis"):].strip())
                except InvalidSpecifier as e:
                    raise pytest.UsageError(f"{path}:{number}: {e}") from e
                if not applies:
                    continue
            entries[nodeid] = reason
    return entries


def pytest_configure(config: pytest.Config) -> None:
    # Their sessionstart also asks a "module" server (redis-py 8: --redis-mod-url, default
    # localhost:6379) for its modules: point it at the same server, not whatever may listen
    # on 6379.
    url = config.getoption("--redis-url", default=None)
    if url is not None and hasattr(config.option, "redis_mod_url"):
        config.option.redis_mod_url = url
    config.addinivalue_line("markers", "onlynoncluster: redis-py's marker (standalone only)")
    config.addinivalue_line("markers", "onlycluster: redis-py's marker (cluster only)")


def _base(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        lock_class = getattr(module, "Lock", None)
        if lock_class is not None and lock_class not in OURS.values():
            raise pytest.UsageError(
                f"{item.nodeid}: its module's Lock is {lock_class!r}, not this package's: "
                "the swap happened too late"
            )
    wanted = read_deselected(redis.__version__)
    used: Set[str] = set()
    keep: List[pytest.Item] = []
    dropped: List[pytest.Item] = []
    for item in items:
        hit = item.nodeid if item.nodeid in wanted else _base(item.nodeid) if _base(item.nodeid) in wanted else None
        if hit is None:
            keep.append(item)
        else:
            used.add(hit)
            dropped.append(item)
    # Checked on whole-file runs (what make runs), not when -k, -m or test ids narrow it.
    whole = not config.option.keyword and not config.option.markexpr and all("::" not in a for a in config.args)
    stale = [nodeid for nodeid in wanted if nodeid not in used]
    if stale and whole:
        raise pytest.UsageError(
            f"deselected.txt names tests that redis-py {redis.__version__}'s files do not have "
            "(give a test only some versions have a specifier): " + ", ".join(stale)
        )
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> List[str]:
    return [
        f"redis-py {redis.__version__} Lock tests against redis_lock_client "
        f"(redis.lock.Lock -> {OURS['redis.lock'].__module__}.Lock, "
        f"redis.asyncio.lock.Lock -> {OURS['redis.asyncio.lock'].__module__}.Lock)"
    ]
