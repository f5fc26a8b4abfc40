#!/usr/bin/env bash
# Instructions per uncontended acquire + release inside Redis's call(), counted by callgrind:
# the module (LOCK.ACQUIRE + LOCK.RELEASE) next to SET NX PX + compare-and-delete. Unlike
# wall-clock server time, the counts repeat exactly from run to run.
# Usage: scripts/profile-callgrind.sh [pairs]   (needs valgrind; builds the release module)
# MODULE=path/to/module.so profiles that file instead, e.g. the stripped dist/ artifact: valgrind
# then reads the module's symbols from the .debug file beside it (its .gnu_debuglink).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
cargo build --release -q
MODULE=$(realpath "${MODULE:-$PWD/target/release/libredis_lock.so}")
OUT=$(mktemp -d)
port=17901
for mode in module setnx; do
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$mode.out" \
    redis-server --port $port --save "" --loadmodule "$MODULE" >"$OUT/$mode.log" 2>&1 &
  for _ in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.2; done
  python3 scripts/pairs.py $port $mode "$N" >/dev/null
  redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true
  wait
  total=$(callgrind_annotate --inclusive=yes "$OUT/$mode.out" 2>/dev/null | awk '/\?\?\?:call \[/ && !seen {gsub(",","",$1); print $1; seen=1}')
  echo "$mode: $((total / N)) instructions per acquire + release in call()"
  port=$((port + 1))
done
rm -rf "$OUT"
