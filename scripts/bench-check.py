#!/usr/bin/env python3
"""Regression guard on server cost (`make bench-check`, not part of `make test`): instructions
that Redis spends inside call() per operation, counted by callgrind, for each operation users
pay for, compared with the committed baseline (bench/callgrind-baseline.txt). Fails when any
operation costs more than 5 % above its baseline. Instruction counts, unlike times, repeat from
run to run (a few tenths of a per cent move with the allocator's background purges), so the
check does not flake on a loaded machine.

Usage: scripts/bench-check.py MODULE.so [--update] [--ops N]
  --update   write the measured figures as the new baseline (commit it with the change that
             explains the new cost)
Needs valgrind (callgrind_control, callgrind_annotate) and redis-server; standard library only.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

BASELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                        "callgrind-baseline.txt")
LIMIT = 1.05
OWNER = "0123456789abcdef0123456789abcdef"


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def send(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)

    def read(self):
        line = self.f.readline()
        if line[:1] == b"$" and line[1:2] != b"-":
            self.f.readline()
        elif line[:1] == b"*":
            for _ in range(int(line[1:])):
                self.read()
        return line

    def cmd(self, *args):
        self.send(*args)
        reply = self.read()
        if reply[:1] == b"-":
            raise RuntimeError("%s: %s" % (args, reply))
        return reply


# Each scenario: (name, what one operation is, setup(conn), op(conn, i)). Keys cycle over 1000
# names so the keyspace does not grow with N.
def key(i):
    return "k:%d" % (i % 1000)


def pair(c, i):
    c.cmd("LOCK.ACQUIRE", key(i), OWNER, 10000)
    c.cmd("LOCK.RELEASE", key(i), OWNER)


def reentry(c, i):
    c.cmd("LOCK.ACQUIRE", key(i), OWNER, 10000)
    c.cmd("LOCK.ACQUIRE", key(i), OWNER, 10000)
    c.cmd("LOCK.RELEASE", key(i), OWNER, "ALL")


def shared_setup(c):
    for i in range(1000):
        c.cmd("LOCK.RWREAD", "r:%d" % i, "reader-a", 600000)
        c.cmd("LOCK.RWREAD", "r:%d" % i, "reader-b", 600000)


def read_pair(c, i):
    c.cmd("LOCK.RWREAD", "r:%d" % (i % 1000), OWNER, 10000)
    c.cmd("LOCK.RELEASE", "r:%d" % (i % 1000), OWNER)


def permit_pair(c, i):
    c.cmd("LOCK.SEMACQUIRE", "s:%d" % (i % 1000), OWNER, 3, 10000)
    c.cmd("LOCK.RELEASE", "s:%d" % (i % 1000), OWNER)


def held_setup(c):
    for i in range(1000):
        c.cmd("LOCK.ACQUIRE", "h:%d" % i, "holder", 600000)


def extend(c, i):
    c.cmd("LOCK.EXTEND", "h:%d" % (i % 1000), "holder", 600000)


def busy(c, i):
    c.cmd("LOCK.ACQUIRE", "h:%d" % (i % 1000), OWNER, 10000)


def info(c, i):
    c.cmd("LOCK.INFO", "h:%d" % (i % 1000))


def info_owner(c, i):
    c.cmd("LOCK.INFO", "h:%d" % (i % 1000), "OWNER", "holder")


def setnx_pair(c, i):
    c.cmd("SET", key(i), OWNER, "NX", "PX", 10000)
    c.cmd("EVAL", CAD, 1, key(i), OWNER)


CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"

SCENARIOS = [
    ("acquire_release", "LOCK.ACQUIRE + LOCK.RELEASE, uncontended", None, pair),
    ("reentry", "LOCK.ACQUIRE twice + LOCK.RELEASE ALL", None, reentry),
    ("read_pair", "LOCK.RWREAD + LOCK.RELEASE beside two readers", shared_setup, read_pair),
    ("permit_pair", "LOCK.SEMACQUIRE (capacity 3) + LOCK.RELEASE", None, permit_pair),
    ("extend", "LOCK.EXTEND of a held lock", held_setup, extend),
    ("busy", "LOCK.ACQUIRE of a held lock, no WAIT (nil)", None, busy),
    ("info", "LOCK.INFO of a held lock", None, info),
    ("info_owner", "LOCK.INFO key OWNER owner of a held lock (a client's own check)", None,
     info_owner),
    ("setnx_reference", "SET NX PX + EVAL compare-and-delete (reference, not checked)", None,
     setnx_pair),
]
UNCHECKED = {"setnx_reference"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call_instructions(dump):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", dump], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if re.search(r"\?\?\?:call \[", line) or re.search(r"\bcall \[", line):
            return int(line.split()[0].replace(",", ""))
    raise RuntimeError("no call() in %s" % dump)


def measure(module, ops):
    work = tempfile.mkdtemp(prefix="bench-check-")
    port = free_port()
    out = os.path.join(work, "callgrind.out")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--loadmodule", module],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                c = Conn(port)
                c.cmd("PING")
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("redis-server under callgrind did not start")
                time.sleep(0.2)
        results = {}
        for name, _, setup, op in SCENARIOS:
            if setup:
                setup(c)
            for i in range(50):  # warm the key names and allocator classes
                op(c, i)
            subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True,
                           capture_output=True)
            for i in range(ops):
                op(c, i)
            subprocess.run(["callgrind_control", "-d", name, str(server.pid)], check=True,
                           capture_output=True)
            dumps = [f for f in os.listdir(work) if f.startswith("callgrind.out.")]
            latest = max((os.path.join(work, f) for f in dumps), key=os.path.getmtime)
            results[name] = call_instructions(latest) / ops
            os.remove(latest)
        return results
    finally:
        server.terminate()
        server.wait()
        subprocess.run(["rm", "-rf", work])


def read_baseline():
    base = {}
    if os.path.exists(BASELINE):
        for line in open(BASELINE):
            line = line.split("#", 1)[0].strip()
            if line:
                name, value = line.split()
                base[name] = float(value)
    return base


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    module = os.path.abspath(args[0])
    update = "--update" in args
    ops = int(args[args.index("--ops") + 1]) if "--ops" in args else 2000
    results = measure(module, ops)
    base = read_baseline()
    failed = []
    print("%-16s %12s %12s %8s  %s" % ("operation", "instr/op", "baseline", "ratio", ""))
    for name, what, _, _ in SCENARIOS:
        value = results[name]
        b = base.get(name)
        ratio = value / b if b else float("nan")
        flag = ""
        if b and name not in UNCHECKED and ratio > LIMIT:
            flag = "ABOVE +5%"
            failed.append(name)
        print("%-16s %12.0f %12s %8.3f  %s%s" % (name, value, "%.0f" % b if b else "-", ratio,
                                                 what, ("  <- " + flag) if flag else ""))
    if update:
        with open(BASELINE, "w") as f:
            f.write("# Instructions inside Redis's call() per operation (scripts/bench-check.py,\n")
            f.write("# %d operations each, release build, %s).\n" % (
                ops, subprocess.run(["redis-server", "--version"], capture_output=True,
                                    text=True).stdout.split(" sha=")[0]))
            for name, what, _, _ in SCENARIOS:
                f.write("%s %.0f  # %s\n" % (name, results[name], what))
        print("baseline written to %s" % os.path.relpath(BASELINE))
        return
    missing = [n for n, _, _, _ in SCENARIOS if n not in base]
    if missing:
        sys.exit("no baseline for %s: run with --update" % ", ".join(missing))
    if failed:
        sys.exit("bench-check: %s above the baseline by more than 5%%" % ", ".join(failed))
    print("bench-check: every operation within 5% of its baseline")


if __name__ == "__main__":
    main()
