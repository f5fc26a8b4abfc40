"""Fixtures: one server with the module for the whole session (FLUSHALL before each test),
five for Redlock and a three-master cluster, started when a test first needs them."""

from __future__ import annotations

import os
import signal
import sys
from typing import Iterator, List

import pytest
import redis

sys.path.insert(0, os.path.dirname(__file__))

import kit  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """The interrupt tests send SIGINT and expect KeyboardInterrupt. Python installs that
    handler only when SIGINT is not ignored at start, and a shell ignores it for the jobs it
    starts in the background (a CI runner may do so): install it here either way."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def server() -> Iterator[kit.Server]:
    s = kit.Server()
    yield s
    s.close()


@pytest.fixture
def r(server: kit.Server) -> Iterator["redis.Redis[bytes]"]:
    """redis-py's default client settings (redis-py 8: 5 s read timeout, retries)."""
    c = server.client()
    c.flushall()
    c.config_set("lock.max-waiters", 100000)
    yield c
    c.close()


@pytest.fixture(scope="session")
def five() -> Iterator[List[kit.Server]]:
    servers = [kit.Server() for _ in range(5)]
    yield servers
    for s in servers:
        s.close()


@pytest.fixture
def redlock_servers(five: List[kit.Server]) -> Iterator[List[kit.Server]]:
    for s in five:
        s.resume()
        if s.proc is None or s.proc.poll() is not None:
            s.start()
        c = s.client()
        c.flushall()
        c.close()
    yield five
    for s in five:
        s.resume()
        if s.proc is None or s.proc.poll() is not None:
            s.start()


@pytest.fixture(scope="session")
def cluster() -> Iterator[kit.Cluster]:
    c = kit.Cluster()
    yield c
    c.close()
