#!/usr/bin/env bash
# Requests/s of the lock commands next to `SET k v NX PX 10000`, measured by redis-benchmark
# against one server in one run, plus the server's own time per call (INFO commandstats).
# Usage: scripts/bench-commands.sh [port] [requests]   (a server with the module must run there)
set -euo pipefail
P=${1:-6379}
N=${2:-200000}
B="redis-benchmark -p $P -n $N -c 50 --csv"
cli() { redis-cli -p "$P" "$@" >/dev/null; }

cli FLUSHALL
cli CONFIG RESETSTAT
echo '"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"'
# New keys every time (-r spreads them over 100k names).
$B -r 100000 SET 'sk:__rand_int__' v NX PX 10000 | tail -n +2
$B -r 100000 LOCK.ACQUIRE 'lk:__rand_int__' me 10000 | tail -n +2
# RELEASE must hit a held lock (redis-benchmark stops at an error reply): one key acquired N
# times re-entrantly, then released N times; the last release deletes the key.
$B LOCK.ACQUIRE rk me 10000 | tail -n +2
$B LOCK.RELEASE rk me | tail -n +2
redis-cli -p "$P" INFO commandstats | grep -E '^cmdstat_(set|lock\.acquire|lock\.release):'
