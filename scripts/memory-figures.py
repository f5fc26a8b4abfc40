#!/usr/bin/env python3
"""Memory figures for capacity planning (docs/operations.md): bytes per reader of a shared lock
(10 to a key), per held lock (32-byte owners), per extra connection, and per connection while
it waits in a lock queue, read from `used_memory` of a running server with the module.

Usage: scripts/memory-figures.py PORT [LOCKS=100000] [WAITERS=500]
(start the server with --maxclients above WAITERS; the figures move by a few per cent between
runs: the server's allocator and client pools are not exact.)
"""
import socket
import sys
import time

port = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
waiters = int(sys.argv[3]) if len(sys.argv) > 3 else 500


def cmd(*words):
    parts = [str(w) for w in words]
    return ("*%d\r\n" % len(parts) + "".join("$%d\r\n%s\r\n" % (len(p), p) for p in parts)).encode()


s = socket.create_connection(("127.0.0.1", port))


def call(*words):
    s.sendall(cmd(*words))
    time.sleep(0.05)
    return s.recv(1 << 20)


def used():
    info = call("INFO", "memory").decode()
    return int([l for l in info.split("\r\n") if l.startswith("used_memory:")][0].split(":")[1])


def fill(words_of, count):
    """Sends `count` commands in pipelined batches, reading every reply."""
    for b in range(0, count, 10000):
        m = min(count, b + 10000)
        s.sendall(b"".join(cmd(*words_of(i)) for i in range(b, m)))
        buf = b""
        while buf.count(b"\r\n") < m - b:
            buf += s.recv(1 << 20)


# Readers of shared locks, 10 to a key, each with its own 32-byte owner; then gone again.
base = used()
fill(lambda i: ("LOCK.RWREAD", "shared:%08d" % (i // 10), "%032x" % i, 600000), n)
print(f"{n} readers, 10 to a key: {(used() - base) / n:.1f} bytes per reader")
call("FLUSHALL")
time.sleep(0.5)

owner = "o" * 32
base = used()
for b in range(0, n, 10000):
    m = min(n, b + 10000)
    s.sendall(b"".join(cmd("LOCK.ACQUIRE", "lock:%08d" % i, owner, 600000) for i in range(b, m)))
    buf = b""
    while buf.count(b"\r\n") < m - b:
        buf += s.recv(1 << 20)
held = used()
print(f"{n} held locks: {(held - base) / n:.1f} bytes per lock")
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(waiters)]
time.sleep(0.5)
connected = used()
for i, w in enumerate(socks):
    w.sendall(cmd("LOCK.ACQUIRE", "lock:%08d" % (i % max(n, 1)), "w%d" % i, 600000, "WAIT", 0))
time.sleep(1)
blocked = used()
print(f"{waiters} connections: {(connected - held) / waiters:.0f} bytes each; "
      f"waiting in a queue: {(blocked - connected) / waiters:.0f} bytes more each")
