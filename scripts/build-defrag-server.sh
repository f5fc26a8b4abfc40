#!/usr/bin/env bash
# Builds a redis-server that can run active defragmentation, for tests/defrag.rs
# (`make defrag-server`, `make test-defrag`).
#
# Why: active defragmentation needs Redis's own copy of jemalloc, which carries the hint
# (je_get_defrag_hint) that says whether a block sits in a sparsely used page. Debian builds
# redis-server and valkey-server against the system jemalloc, which has no such hint, so both
# refuse `CONFIG SET activedefrag yes`. Redis's upstream tarball ships its jemalloc in
# deps/jemalloc, and Debian's source package of redis uses that tarball unchanged as its
# .orig.tar.gz: this script fetches it with apt-get (a deb-src entry in a private apt state
# under OUT, the system's apt configuration untouched), checks its sha256, and builds it with
# the bundled jemalloc (no TLS: the test does not need it).
#
# Usage: scripts/build-defrag-server.sh VERSION OUT   (VERSION 7.0.15; the binary ends up in
# OUT/redis-VERSION/src/redis-server). Needs apt-get, gcc and make; 4 to 8 minutes on 2 busy cores.
set -euo pipefail
version=${1:?version}
out=${2:?output directory}
declare -A SHA256=(
  [7.0.15]=4b1dc4ee6d622a09fff9c6777191209750fb5e5a725ef78ea012d6eef4c22982
)
want=${SHA256[$version]:-}
[ -n "$want" ] || { echo "build-defrag-server: no checksum pinned for redis $version" >&2; exit 1; }
command -v gcc >/dev/null && command -v make >/dev/null || {
  echo "build-defrag-server: needs gcc and make (apt-get install build-essential)" >&2; exit 1; }

mkdir -p "$out/apt/lists/partial"
out=$(cd "$out" && pwd)
tarball=$out/redis_$version.orig.tar.gz
if [ ! -f "$tarball" ] || [ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$want" ]; then
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  echo "deb-src http://deb.debian.org/debian $codename main" > "$out/apt/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$out/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::State::Lists=$out/apt/lists" -o "Dir::Cache::archives=$out/apt")
  apt-get "${apt_opts[@]}" -q update >/dev/null
  (cd "$out" && apt-get "${apt_opts[@]}" -q source --download-only "redis" >/dev/null)
  [ -f "$tarball" ] || { echo "build-defrag-server: Debian's source package of redis is not version $version here" \
    "($(ls "$out"/redis_*.orig.tar.* 2>/dev/null || echo none)); pin that version's checksum" >&2; exit 1; }
fi
got=$(sha256sum "$tarball" | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "build-defrag-server: $tarball has sha256 $got, expected $want" >&2; exit 1; }

rm -rf "$out/redis-$version"
tar -xzf "$tarball" -C "$out"
# GIT_CEILING_DIRECTORIES: the build stamps a git commit into the binary; not this checkout's.
GIT_CEILING_DIRECTORIES="$out" make -C "$out/redis-$version" -j"$(nproc)" MALLOC=jemalloc BUILD_TLS=no >"$out/build.log" 2>&1 \
  || { tail -20 "$out/build.log" >&2; echo "build-defrag-server: build failed (log: $out/build.log)" >&2; exit 1; }
"$out/redis-$version/src/redis-server" --version
