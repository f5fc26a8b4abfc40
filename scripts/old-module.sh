#!/usr/bin/env bash
# Builds the lock module as released in 0.3.0 (the last version whose LOCK.INFO takes no
# OWNER or COUNT) into target/old-module/libredis_lock.so, for the clients' tests of their
# fallback on servers running an older module (REDIS_LOCK_OLD_MODULE, set by `make test`).
# The source comes from this repository's history (`git archive`), built in its own target
# directory: a few minutes the first time, nothing once the file is there.
set -euo pipefail

COMMIT=3e40c9da09f741f28fce3e7cfa2ebc8b21116c35
CARGO=${CARGO:-cargo}
out=target/old-module

if [ -f "$out/libredis_lock.so" ] && [ "$(cat "$out/commit" 2>/dev/null)" = "$COMMIT" ]; then
  exit 0
fi
if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  echo "old-module: commit $COMMIT (module 0.3.0) is not in this clone's history;" \
    "clone the repository with its history (not --depth)" >&2
  exit 1
fi
echo "old-module: building module 0.3.0 ($COMMIT) into $out (first time only)" >&2
rm -rf "$out/src"
mkdir -p "$out/src"
git archive "$COMMIT" | tar -x -C "$out/src"
(cd "$out/src" && "$CARGO" build --locked --target-dir ../target -p redis-lock)
cp "$out/target/debug/libredis_lock.so" "$out/libredis_lock.so"
echo "$COMMIT" > "$out/commit"
