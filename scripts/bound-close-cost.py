#!/usr/bin/env python3
"""What closing a connection with many bound holds (BIND) costs the server (docs/commands.md):
one connection takes HOLDS bound holds (one key each), WAITED of those keys get a waiting
client (the last key among them), then the connection is killed while another client sends
PING after PING. Prints, per round, how long until the last key's waiter was served (every
hold of the connection has ended by then: the last key is settled last) and the PING round
trips seen meanwhile (the worst one is the longest the server went without answering).
Odd rounds send no PING: their time is the close's alone, with the server's main-thread CPU
time it took (INFO cpu).

Usage: scripts/bound-close-cost.py PORT HOLDS WAITED [ROUNDS]
(start the server with --maxclients above WAITED + 3)
"""
import multiprocessing
import os
import socket
import sys
import time

port, holds, waited = (int(a) for a in sys.argv[1:4])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5


def cmd(*words):
    parts = [str(w) for w in words]
    return ("*%d\r\n" % len(parts) + "".join("$%d\r\n%s\r\n" % (len(p), p) for p in parts)).encode()


def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_lines(s, n):
    buf = b""
    while buf.count(b"\r\n") < n:
        buf += s.recv(1 << 20)
    return buf


def call(s, *words):
    s.sendall(cmd(*words))
    return read_lines(s, 1)


def info_int(s, field, section="lock"):
    s.sendall(cmd("INFO", section))
    buf = b""
    while True:
        buf += s.recv(1 << 20)
        head, _, rest = buf.partition(b"\r\n")
        if len(rest) >= int(head[1:]):
            break
    for line in buf.decode().split("\r\n"):
        if line.startswith(field + ":"):
            return float(line.split(":")[1])
    raise SystemExit(f"no {field} in INFO {section}")


def cpu(s):
    return sum(info_int(s, f, "cpu") for f in ("used_cpu_sys_main_thread", "used_cpu_user_main_thread"))


def pinger(stop, started, into):
    """PING after PING until `stop`; sends back each round trip as (start, seconds), on the
    monotonic clock that the parent reads too."""
    p = connect()
    rtts = []
    started.set()
    while not stop.is_set():
        t = time.perf_counter()
        p.sendall(b"PING\r\n")
        read_lines(p, 1)
        rtts.append((t, time.perf_counter() - t))
    into.send(rtts)
    p.close()


admin = connect()
for r in range(rounds):
    call(admin, "FLUSHALL")
    before = info_int(admin, "lock_disconnects_total")
    holder = connect()
    holder_id = int(call(holder, "CLIENT", "ID")[1:-2])
    prefix = f"r{r}:"
    for b in range(0, holds, 10000):
        m = min(holds, b + 10000)
        holder.sendall(b"".join(cmd("LOCK.ACQUIRE", "%s%07d" % (prefix, i), "h", 600000, "BIND")
                                for i in range(b, m)))
        read_lines(holder, m - b)
    # The waited keys: spread over the range, the last key last.
    step = max(1, holds // max(1, waited))
    waited_keys = [holds - 1 - j * step for j in range(waited)]
    waiters = []
    for i in waited_keys:
        w = connect()
        w.sendall(cmd("LOCK.ACQUIRE", "%s%07d" % (prefix, i), "w", 600000, "WAIT", 0))
        waiters.append(w)
    time.sleep(0.5)
    # The pinger is its own process, so that nothing in this one (Python's lock between
    # threads) delays its round trips.
    stop = multiprocessing.Event()
    started = multiprocessing.Event()
    out, into = multiprocessing.Pipe(duplex=False)
    th = multiprocessing.Process(target=pinger, args=(stop, started, into))
    ping = r % 2 == 0
    if ping:
        th.start()
        started.wait()
    time.sleep(float(os.environ.get("BOUND_CLOSE_PAUSE", "0.2")))
    cpu0 = cpu(admin)
    t0 = time.perf_counter()
    call(admin, "CLIENT", "KILL", "ID", holder_id)
    read_lines(waiters[0], 1)  # the last key's waiter
    t_last = time.perf_counter() - t0
    for w in waiters[1:]:
        read_lines(w, 1)
    t_all = time.perf_counter() - t0
    cpu1 = cpu(admin)
    stop.set()
    if ping:
        rtts = out.recv()
        th.join()
        # Round trips that overlap the close, and those that ended before it.
        during = sorted(d for (t, d) in rtts if t + d >= t0 and t <= t0 + t_all)
        before_close = [d for (t, d) in rtts if t + d < t0]
    ended = int(info_int(admin, "lock_disconnects_total") - before)
    line = (f"round {r}: {holds} bound holds, {waited} waited: last key's waiter served after "
            f"{t_last * 1000:.1f} ms (all waiters {t_all * 1000:.1f} ms), {ended} holds ended; ")
    if ping:
        idle_max = max(before_close) if before_close else 0.0
        line += (f"PING during the close: {len(during)} round trips, "
                 f"p50 {during[len(during) // 2] * 1e3:.3f} ms, "
                 f"p99 {during[len(during) * 99 // 100] * 1e3:.3f} ms, max {during[-1] * 1e3:.3f} ms "
                 f"(before the close: max {idle_max * 1e3:.3f} ms)")
    else:
        line += f"no PING; server main-thread CPU {(cpu1 - cpu0) * 1e3:.1f} ms"
    print(line, flush=True)
    for w in waiters:
        w.close()
    holder.close()
