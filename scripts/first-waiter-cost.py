#!/usr/bin/env python3
"""Server time of the first waiter on a key with many holders (docs/benchmarks.md): HOLDERS
readers of one key and HOLDERS permits of one semaphore, then ROUNDS times per key: a client
queues (`WAIT 0`, the key's only waiter), and its wait ends by a timeout (`CLIENT UNBLOCK id
TIMEOUT`, which runs the module's timeout callback inside that command) or, every other round,
by its connection closing (`CLIENT KILL ID id`, which runs the disconnect path inside that
command). Prints Redis's own usec_per_call (INFO commandstats) of the request that queues and
of the two commands that empty the queue again.

Usage: scripts/first-waiter-cost.py PORT [HOLDERS] [ROUNDS]
(a release build: redis-server --loadmodule target/release/libredis_lock.so --port PORT)
"""
import socket
import sys
import time

port = int(sys.argv[1])
holders = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20


def cmd(*words):
    parts = [str(w) for w in words]
    return ("*%d\r\n" % len(parts) + "".join("$%d\r\n%s\r\n" % (len(p), p) for p in parts)).encode()


def conn():
    return socket.create_connection(("127.0.0.1", port))


def read_reply(s):
    buf = b""
    while not buf.endswith(b"\r\n"):
        buf += s.recv(1 << 16)
    if buf.startswith(b"$") and not buf.startswith(b"$-1"):
        n = int(buf[1:buf.index(b"\r\n")])
        while len(buf) < buf.index(b"\r\n") + 2 + n + 2:
            buf += s.recv(1 << 20)
    return buf


ctl = conn()


def call(*words):
    ctl.sendall(cmd(*words))
    return read_reply(ctl)


def fill(command):
    for b in range(0, holders, 10000):
        m = min(holders, b + 10000)
        ctl.sendall(b"".join(command(i) for i in range(b, m)))
        buf = b""
        while buf.count(b"\r\n") < m - b:
            buf += ctl.recv(1 << 20)


def waiting(_key):
    # INFO lock's waiters (LOCK.INFO would list every holder): this key is the only one waited.
    text = call("INFO", "lock").decode()
    for line in text.split("\r\n"):
        if line.startswith("lock_waiters:"):
            return int(line.split(":")[1])
    raise SystemExit("no lock_waiters in INFO lock: %r" % text[:200])


def stat(name):
    text = call("INFO", "commandstats").decode()
    for line in text.split("\r\n"):
        if line.startswith("cmdstat_%s:" % name):
            fields = dict(f.split("=") for f in line.split(":", 1)[1].split(","))
            return int(fields["calls"]), float(fields["usec_per_call"])
    return 0, 0.0


call("FLUSHALL")
fill(lambda i: cmd("LOCK.RWREAD", "wide", "r%d" % i, 600000))
fill(lambda i: cmd("LOCK.SEMACQUIRE", "sem", "p%d" % i, holders, 600000))
memory = [l for l in call("INFO", "memory").decode().split("\r\n") if l.startswith("used_memory:")]
print(
    f"filled: LOCK.RWREAD {stat('lock.rwread')[1]:.2f} us, LOCK.SEMACQUIRE "
    f"{stat('lock.semacquire')[1]:.2f} us per call (pipelined); {memory[0]}"
)

for key, request in (
    ("wide", ("LOCK.ACQUIRE", "wide", "w", 600000, "WAIT", 0)),
    ("sem", ("LOCK.SEMACQUIRE", "sem", "w", holders, 600000, "WAIT", 0)),
):
    call("CONFIG", "RESETSTAT")
    for r in range(rounds):
        w = conn()
        w.sendall(cmd("CLIENT", "ID"))
        wid = int(read_reply(w)[1:].strip())
        w.sendall(cmd(*request))
        while waiting(key) != 1:
            time.sleep(0.001)
        if r % 2 == 0:
            call("CLIENT", "UNBLOCK", wid, "TIMEOUT")
            read_reply(w)
        else:
            call("CLIENT", "KILL", "ID", wid)
        w.close()
        while waiting(key) != 0:
            time.sleep(0.001)
    calls, queue_us = stat(request[0].lower())
    _, timeout_us = stat("client|unblock")
    _, close_us = stat("client|kill")
    print(
        f"{holders} holders of {key!r}: the first waiter {queue_us:.1f} us ({calls} calls), "
        f"its timeout {timeout_us:.1f} us, its connection closing {close_us:.1f} us "
        f"(usec_per_call)"
    )
