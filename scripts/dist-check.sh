#!/usr/bin/env bash
# `make dist-check`: checks what `make dist` wrote, as an operator would use it.
#   - each checksum file verifies with `sha256sum -c`;
#   - the .so has no debug sections and names its .debug file (.gnu_debuglink), which holds
#     the debug info and the symbol table (so profilers resolve the module's functions);
#   - SERVER (default redis-server; valkey-server works too) loads the .so: MODULE LIST shows
#     `lock` with the version of the file name (MAJOR*10000 + MINOR*100 + PATCH), and a lock
#     can be taken and released.
# DIST_DIR: where to look (default dist/; `make test-dist` uses target/dist-test/).
# Prints one line per check; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
SERVER=${SERVER:-redis-server}
OUT=${DIST_DIR:-dist}

version=$($CARGO pkgid -p redis-lock | sed -E 's/.*[#@]//')
name=redis-lock-$version-linux-$(uname -m)
so=$OUT/$name.so
fail() { echo "dist-check: FAILED: $*" >&2; exit 1; }
[ -f "$so" ] || fail "$so is missing (run make dist)"

(cd "$OUT" && sha256sum --quiet -c "$name.so.sha256" && sha256sum --quiet -c "$name.so.debug.sha256") \
  || fail "checksum mismatch"
echo "ok: $name.so and $name.so.debug match their .sha256 files"

sections=$(readelf -S --wide "$so")
! grep -q '\.debug_info' <<<"$sections" || fail "$so still has .debug_info"
link=$(readelf --string-dump=.gnu_debuglink "$so" 2>/dev/null | sed -n 's/^ *\[ *0\] *//p')
[ "$link" = "$name.so.debug" ] || fail "$so's .gnu_debuglink names '$link', not $name.so.debug"
debug_sections=$(readelf -S --wide "$OUT/$name.so.debug")
grep -q '\.debug_info' <<<"$debug_sections" || fail "$name.so.debug has no .debug_info"
grep -q '\.symtab' <<<"$debug_sections" || fail "$name.so.debug has no symbol table"
echo "ok: $name.so has no debug info and links to $name.so.debug (debug info, symbol table)"

IFS=. read -r major minor patch <<<"${version%%[-+]*}"
want_ver=$((major * 10000 + minor * 100 + patch))
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
"$SERVER" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --loadmodule "$PWD/$so" >"$dir/server.log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
modules=$(redis-cli -p "$port" --no-raw MODULE LIST 2>&1) || { cat "$dir/server.log" >&2; fail "$SERVER did not start with $so"; }
# One module: name, lock, ver, N, path, ..., args, ...
got_name=$(redis-cli -p "$port" MODULE LIST | sed -n 2p)
got_ver=$(redis-cli -p "$port" MODULE LIST | sed -n 4p)
[ "$got_name" = "lock" ] || fail "MODULE LIST shows '$got_name', not lock: $modules"
[ "$got_ver" = "$want_ver" ] || fail "MODULE LIST shows ver $got_ver, the file name says $version ($want_ver)"
token=$(redis-cli -p "$port" LOCK.ACQUIRE dist-check me 10000)
[[ $token =~ ^[0-9]+$ ]] || fail "LOCK.ACQUIRE replied '$token'"
[ "$(redis-cli -p "$port" LOCK.RELEASE dist-check me)" = "0" ] || fail "LOCK.RELEASE did not release"
echo "ok: $($SERVER --version | cut -d' ' -f1-3) loads $name.so: MODULE LIST shows lock ver $got_ver; a lock was taken and released"
