#!/usr/bin/env python3
"""How late WAIT timeouts end (docs/commands.md): a key is held; WAITERS clients queue on it
at once, each with its own WAIT timeout (100 ms + 13 ms x i, so the deadlines are spread),
and nothing else is sent meanwhile. Prints how long after its deadline each nil arrived
(client-side: from just before its request was sent), as p50, p90 and max over all waiters.

Usage: scripts/wait-lateness.py PORT WAITERS [ROUNDS]
(start the server with --maxclients above WAITERS + 2; set hz as you want to measure)
"""
import selectors
import socket
import sys
import time

port, waiters = int(sys.argv[1]), int(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1


def cmd(*words):
    parts = [str(w) for w in words]
    return ("*%d\r\n" % len(parts) + "".join("$%d\r\n%s\r\n" % (len(p), p) for p in parts)).encode()


def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


admin = connect()
late = []
for r in range(rounds):
    key = f"lateness:{r}"
    admin.sendall(cmd("LOCK.ACQUIRE", key, "holder", 600000))
    admin.recv(100)
    conns = [connect() for _ in range(waiters)]
    sel = selectors.DefaultSelector()
    sent = {}
    for i, s in enumerate(conns):
        timeout = 100 + 13 * i
        sent[s] = (time.perf_counter(), timeout)
        s.sendall(cmd("LOCK.ACQUIRE", key, f"w{i}", 600000, "WAIT", timeout))
        sel.register(s, selectors.EVENT_READ)
    left = waiters
    while left:
        for k, _ in sel.select():
            s = k.fileobj
            data = s.recv(100)
            arrived = time.perf_counter()
            assert data in (b"$-1\r\n", b"*-1\r\n", b"_\r\n"), data
            t0, timeout = sent[s]
            late.append((arrived - t0) * 1000 - timeout)
            sel.unregister(s)
            s.close()
            left -= 1
    admin.sendall(cmd("DEL", key))
    admin.recv(100)
late.sort()
n = len(late)
print(f"{n} WAIT timeouts: lateness after the deadline p50 {late[n // 2]:.1f} ms, "
      f"p90 {late[n * 9 // 10]:.1f} ms, max {late[-1]:.1f} ms (min {late[0]:.1f} ms)")
