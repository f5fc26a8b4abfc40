#!/usr/bin/env python3
"""Server cost of LOCK.QUEUES (docs/commands.md): LOCKS keys held, WAITED of them with one
waiting client each, then 200 calls of each order; prints Redis's own usec_per_call
(INFO commandstats).

Usage: scripts/queues-cost.py PORT LOCKS WAITED   (start the server with --maxclients above
WAITED)
"""
import socket
import sys
import time

port, keys, waited = (int(a) for a in sys.argv[1:4])


def cmd(*words):
    parts = [str(w) for w in words]
    return ("*%d\r\n" % len(parts) + "".join("$%d\r\n%s\r\n" % (len(p), p) for p in parts)).encode()


s = socket.create_connection(("127.0.0.1", port))


def call(*words):
    s.sendall(cmd(*words))
    return s.recv(1 << 20)


for b in range(0, keys, 10000):
    m = min(keys, b + 10000)
    s.sendall(b"".join(cmd("LOCK.ACQUIRE", "k%d" % i, "h", 600000) for i in range(b, m)))
    buf = b""
    while buf.count(b"\r\n") < m - b:
        buf += s.recv(1 << 20)
socks = []
for i in range(waited):
    w = socket.create_connection(("127.0.0.1", port))
    w.sendall(cmd("LOCK.ACQUIRE", "k%d" % i, "w", 600000, "WAIT", 0))
    socks.append(w)
time.sleep(1)
for by in ("AGE", "LENGTH"):
    call("CONFIG", "RESETSTAT")
    for _ in range(200):
        call("LOCK.QUEUES", "BY", by, "COUNT", 10)
    stats = call("INFO", "commandstats").decode()
    line = [l for l in stats.split("\r\n") if l.startswith("cmdstat_lock.queues")]
    print(f"{keys} keys held, {waited} with a waiter, BY {by}: {line[0] if line else '?'}")
