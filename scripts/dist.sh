#!/usr/bin/env bash
# `make dist`: the release module as it ships, in dist/:
#   redis-lock-<version>-linux-<arch>.so          stripped (no debug info, no local symbols)
#   redis-lock-<version>-linux-<arch>.so.debug    its debug info and full symbol table
#   *.sha256                                      one per file, in `sha256sum -c` format
# The version is the crate's (Cargo.toml, read with `cargo pkgid`). The stripped .so names its
# debug file in a .gnu_debuglink section (with the file's CRC), so gdb, valgrind and perf find
# the symbols when the .debug file sits beside the .so (or in a .debug/ directory next to it).
# Expects target/release/libredis_lock.so built (`make dist` builds it first). DIST_SRC and
# DIST_DIR name another input and output directory (`make test-dist` packs the debug build
# into target/dist-test/ to test these steps without a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
SRC=${DIST_SRC:-target/release/libredis_lock.so}
OUT=${DIST_DIR:-dist}
[ -f "$SRC" ] || { echo "dist: $SRC is missing: run cargo build --release first" >&2; exit 1; }
command -v objcopy >/dev/null || { echo "dist: needs objcopy (apt-get install binutils)" >&2; exit 1; }

version=$($CARGO pkgid -p redis-lock | sed -E 's/.*[#@]//')
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]]; then
  echo "dist: could not read the crate version from cargo pkgid (got '$version')" >&2
  exit 1
fi
name=redis-lock-$version-linux-$(uname -m)

mkdir -p "$OUT"
rm -f "$OUT/$name.so" "$OUT/$name.so.debug" "$OUT/$name.so.sha256" "$OUT/$name.so.debug.sha256"
# Debug info first, from the unstripped build; then the stripped copy that points at it.
objcopy --only-keep-debug --compress-debug-sections=zlib "$SRC" "$OUT/$name.so.debug"
objcopy --strip-debug --strip-unneeded --add-gnu-debuglink="$OUT/$name.so.debug" "$SRC" "$OUT/$name.so"
chmod 644 "$OUT/$name.so.debug"
chmod 755 "$OUT/$name.so"
(cd "$OUT" && sha256sum "$name.so" > "$name.so.sha256" && sha256sum "$name.so.debug" > "$name.so.debug.sha256")

size() { stat -c %s "$1"; }
echo "$OUT/$name.so        $(size "$OUT/$name.so") bytes (from $SRC, $(size "$SRC") bytes)"
echo "$OUT/$name.so.debug  $(size "$OUT/$name.so.debug") bytes"
echo "$OUT/$name.so.sha256: $(cut -d' ' -f1 "$OUT/$name.so.sha256")"
