#!/usr/bin/env python3
"""Runs N uncontended acquire + release pairs against a server, one command at a time.

Usage: pairs.py PORT module|setnx N
  module: LOCK.ACQUIRE + LOCK.RELEASE
  setnx:  SET key token NX PX 10000 + EVALSHA of the compare-and-delete script
Used by scripts/profile-callgrind.sh; standard library only.
"""
import socket, sys
port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
f = s.makefile("rb")
def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    s.sendall(out)
    line = f.readline()
    if line[:1] == b"$" and line[1:2] != b"-":
        f.readline()
    return line
cad = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
import hashlib
sha = hashlib.sha1(cad.encode()).hexdigest()
if mode == "setnx":
    cmd("SCRIPT", "LOAD", cad)
for i in range(n):
    k = "k:%d" % (i % 1000)
    if mode == "module":
        cmd("LOCK.ACQUIRE", k, "0123456789abcdef0123456789abcdef", 10000)
        cmd("LOCK.RELEASE", k, "0123456789abcdef0123456789abcdef")
    else:
        cmd("SET", k, "0123456789abcdef0123456789abcdef", "NX", "PX", 10000)
        cmd("EVALSHA", sha, 1, k, "0123456789abcdef0123456789abcdef")
print(cmd("PING"))
