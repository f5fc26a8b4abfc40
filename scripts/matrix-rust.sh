#!/usr/bin/env bash
# The Rust client (client/, crate redis-lock-client) against each `redis` crate version its
# Cargo.toml claims: for every minor line of `redis` inside the claimed range, the newest patch
# release (and the range's floor, the oldest version the claim lets a user's lockfile pick),
# builds the client's tests and runs a named subset of them against real servers; prints a table
# version -> pass/fail/time. Exit status 1 when any version fails.
#
#   scripts/matrix-rust.sh            the claimed range (floor + newest patch of each minor line)
#   scripts/matrix-rust.sh --latest   only the newest release the claim allows (semver-compatible
#                                     with it), and says whether a newer major exists
#   scripts/matrix-rust.sh 1.8.0 ...  the versions given
#
# The checkout is never changed: the workspace's manifests and sources are copied into
# target/matrix-rust/work/<version>/ and `cargo update -p redis@<locked> --precise <version>`
# runs on that copy's Cargo.lock; every version builds into one shared target dir,
# target/matrix-rust/target, so compiled dependencies are reused between versions.
#
# Environment: REDIS_LOCK_SERVER (default redis-server) and REDIS_LOCK_MODULE (default the
# checkout's debug build, target/debug/libredis_lock.so, as `cargo build --features test-hooks`
# makes it) are passed to the tests; MATRIX_TESTS overrides the test files run (space-separated
# names of client/tests/*.rs); MATRIX_ALL=1 runs every client test file.
#
# Versions come from the crates.io sparse index (https://index.crates.io/re/di/redis): one
# request, for this crate only. Yanked and pre-release versions are left out.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/matrix-rust"
TARGET="$OUT/target"
CARGO="${CARGO:-cargo}"

# Connections (client, async_client, bind), waits (wait_cap, redlock_wait), loss notice
# (loss_latency, watcher_races, truthful) and errors (errors, bounds): about 2 minutes of tests
# per version on 2 cores, plus the build.
DEFAULT_TESTS="client async_client bind errors bounds wait_cap redlock_wait loss_latency truthful watcher_races"
if [ "${MATRIX_ALL:-}" = 1 ]; then
  TESTS="$(cd "$ROOT/client/tests" && ls ./*.rs | sed 's|^\./||; s|\.rs$||' | tr '\n' ' ')"
else
  TESTS="${MATRIX_TESTS:-$DEFAULT_TESTS}"
fi
for t in $TESTS; do
  [ -f "$ROOT/client/tests/$t.rs" ] || { echo "matrix-rust: no test file client/tests/$t.rs" >&2; exit 2; }
done

export REDIS_LOCK_SERVER="${REDIS_LOCK_SERVER:-redis-server}"
export REDIS_LOCK_MODULE="${REDIS_LOCK_MODULE:-$ROOT/target/debug/libredis_lock.so}"
if [ ! -f "$REDIS_LOCK_MODULE" ]; then
  echo "matrix-rust: no module at $REDIS_LOCK_MODULE; build it with 'cargo build --features test-hooks' or set REDIS_LOCK_MODULE" >&2
  exit 2
fi
command -v "$REDIS_LOCK_SERVER" >/dev/null || { echo "matrix-rust: $REDIS_LOCK_SERVER not found" >&2; exit 2; }

# The claim: `redis = { version = "1.8", ... }` (caret: >= 1.8.0, < 2.0.0) or
# `version = ">=1.8, <1.9"` (a floor and an exclusive ceiling).
CLAIM="$(sed -n 's/^redis = {[^}]*version = "\([^"]*\)".*/\1/p' "$ROOT/client/Cargo.toml" | head -n1)"
CLAIM_CEIL=
case "$CLAIM" in
  ">="[0-9]*.[0-9]*", <"[0-9]*.[0-9]*)
    floor="${CLAIM#>=}"; floor="${floor%%,*}"; CLAIM_CEIL="${CLAIM##*<}" ;;
  [0-9]*.[0-9]*) floor="$CLAIM" ;;
  *) echo "matrix-rust: cannot read the redis version claim from client/Cargo.toml (got '$CLAIM')" >&2; exit 2 ;;
esac
CLAIM_MAJOR="${floor%%.*}"
CLAIM_MINOR="$(echo "$floor" | cut -d. -f2)"
CLAIM_PATCH="$(echo "$floor" | cut -d. -f3)"
CLAIM_FLOOR="$CLAIM_MAJOR.$CLAIM_MINOR.${CLAIM_PATCH:-0}"
[ -n "$CLAIM_CEIL" ] || CLAIM_CEIL="$((CLAIM_MAJOR + 1)).0"
case "$CLAIM_CEIL" in *.*.*) ;; *) CLAIM_CEIL="$CLAIM_CEIL.0" ;; esac
# The locked 1.x version (the lockfile also has the test kit's redis 0.27).
LOCKED="$(awk '/^name = "redis"$/ {getline; print}' "$ROOT/Cargo.lock" | sed 's/version = "\(.*\)"/\1/' | grep "^$CLAIM_MAJOR\." | head -n1)"
[ -n "$LOCKED" ] || { echo "matrix-rust: Cargo.lock has no redis $CLAIM_MAJOR.x" >&2; exit 2; }

# Every non-yanked, non-pre-release version of `redis`, oldest first.
index_versions() {
  curl -fsS --max-time 60 https://index.crates.io/re/di/redis \
    | python3 -c 'import json, sys; [print(d["vers"]) for d in map(json.loads, sys.stdin) if not d["yanked"]]'
}

# Versions of the claim's major line at or above the floor (for 0.x: the floor's minor line).
in_major() {
  while read -r v; do
    maj="${v%%.*}"; min="$(echo "$v" | cut -d. -f2)"
    [ "$maj" = "$CLAIM_MAJOR" ] || continue
    if [ "$CLAIM_MAJOR" = 0 ] && [ "$min" != "$CLAIM_MINOR" ]; then continue; fi
    [ "$(printf '%s\n%s\n' "$CLAIM_FLOOR" "$v" | sort -V | head -n1)" = "$CLAIM_FLOOR" ] || continue
    echo "$v"
  done
}

# Versions the claim allows: in_major, below the ceiling.
in_claim() {
  in_major | while read -r v; do
    [ "$(printf '%s\n%s\n' "$v" "$CLAIM_CEIL" | sort -V | head -n1)" = "$v" ] && [ "$v" != "$CLAIM_CEIL" ] && echo "$v"
  done
}

LATEST_ONLY=0
EXPLICIT=()
for arg in "$@"; do
  case "$arg" in
    --latest) LATEST_ONLY=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    [0-9]*.[0-9]*.[0-9]*) EXPLICIT+=("$arg") ;;
    *) echo "matrix-rust: unknown argument '$arg' (--latest, or versions like 1.8.0)" >&2; exit 2 ;;
  esac
done

if [ "${#EXPLICIT[@]}" -gt 0 ]; then
  VERSIONS="${EXPLICIT[*]}"
else
  INDEX="$(index_versions)" || { echo "matrix-rust: could not read the redis versions from index.crates.io" >&2; exit 2; }
  ALL="$(echo "$INDEX" | grep -E '^[0-9]+\.[0-9]+\.[0-9]+$' | sort -V)"
  CLAIMED="$(echo "$ALL" | in_claim)"
  [ -n "$CLAIMED" ] || { echo "matrix-rust: no published redis version inside the claim $CLAIM" >&2; exit 2; }
  NEWEST="$(echo "$CLAIMED" | tail -n1)"
  # The newest release of the claim's major line, past the ceiling too: what a user of the redis
  # crate gets next, so --latest tests it (in its copy, with the ceiling lifted).
  NEWEST_LINE="$(echo "$ALL" | in_major | tail -n1)"
  NEWER_MAJOR="$(echo "$ALL" | awk -F. -v m="$CLAIM_MAJOR" '$1 > m' | tail -n1)"
  NEWER_PRE="$(echo "$INDEX" | awk -F. -v m="$CLAIM_MAJOR" '$1 > m' | grep -- - | sort -V | tail -n1 || true)"
  echo "== redis crate: client/Cargo.toml claims \"$CLAIM\" (>= $CLAIM_FLOOR, < $CLAIM_CEIL); Cargo.lock pins $LOCKED"
  echo "== newest release inside the claim: $NEWEST"
  if [ "$NEWEST_LINE" != "$NEWEST" ]; then
    echo "== newer release of the same major, OUTSIDE the claim: $NEWEST_LINE (--latest tests it; add its line to the claim once the matrix passes on it)"
  fi
  if [ -n "$NEWER_MAJOR" ]; then
    echo "== a newer major exists: redis $NEWER_MAJOR (outside the claim; not tested here)"
  elif [ -n "$NEWER_PRE" ]; then
    echo "== no newer stable major; newest pre-release of a newer major: $NEWER_PRE (not tested)"
  else
    echo "== no newer major release"
  fi
  if [ "$LATEST_ONLY" = 1 ]; then
    VERSIONS="$NEWEST_LINE"
  else
    # The floor, then the newest patch of each minor line.
    LINES="$(echo "$CLAIMED" | awk -F. '{print $1"."$2}' | sort -uV)"
    VERSIONS="$(echo "$CLAIMED" | head -n1)"
    for line in $LINES; do
      VERSIONS="$VERSIONS $(echo "$CLAIMED" | grep "^${line//./\\.}\." | tail -n1)"
    done
    VERSIONS="$(echo "$VERSIONS" | tr ' ' '\n' | sort -uV | tr '\n' ' ')"
  fi
fi

echo "== $(rustc --version); server $("$REDIS_LOCK_SERVER" --version | cut -d' ' -f1-3)"
echo "== versions: $VERSIONS"
echo "== tests (client/tests): $TESTS"
mkdir -p "$OUT/logs"

TEST_ARGS=()
for t in $TESTS; do TEST_ARGS+=(--test "$t"); done

RESULTS=()
FAILED=0
for v in $VERSIONS; do
  work="$OUT/work/$v"
  log="$OUT/logs/$v.log"
  rm -rf "$work"
  mkdir -p "$work"
  # The workspace's members and manifests; no target/, no other clients, no .git.
  (cd "$ROOT" && tar cf - Cargo.toml Cargo.lock src core client bench testkit) | (cd "$work" && tar xf -)
  # A version past the claim's ceiling (--latest, or one named on the command line) is tried
  # with the copy's claim lifted to the floor alone.
  sed -i 's/^\(redis = {[^}]*version = "\)[^"]*"/\1'"$CLAIM_FLOOR"'"/' "$work/client/Cargo.toml"
  start=$(date +%s)
  status=pass
  (
    echo "== redis $v in $work"
    (cd "$work" && "$CARGO" update -p "redis@$LOCKED" --precise "$v") &&
      (cd "$work" && grep -A1 '^name = "redis"$' Cargo.lock) &&
      (cd "$work" && CARGO_TARGET_DIR="$TARGET" "$CARGO" test --locked -p redis-lock-client --all-features \
        "${TEST_ARGS[@]}" --no-run) || exit 11
    (cd "$work" && CARGO_TARGET_DIR="$TARGET" "$CARGO" test --locked -p redis-lock-client --all-features \
      "${TEST_ARGS[@]}") || exit 12
  ) >"$log" 2>&1 || status=$?
  took=$(( $(date +%s) - start ))
  case "$status" in
    pass) verdict=pass ;;
    11) verdict="FAIL (build)"; FAILED=1 ;;
    *) verdict="FAIL (tests)"; FAILED=1 ;;
  esac
  passed="$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$log" \
    | awk '{p += $4; f += $6} END {printf "%d passed, %d failed", p, f}' || true)"
  failing="$(grep -E '^test .* \.\.\. FAILED$' "$log" | awk '{print $2}' | sort -u | tr '\n' ' ' || true)"
  [ -z "$failing" ] || passed="$passed: $failing"
  RESULTS+=("$(printf '| %-8s | %-13s | %5ss | %s |' "$v" "$verdict" "$took" "$passed")")
  echo "== redis $v: $verdict in ${took}s ($passed); log $log"
done

echo
echo "| redis    | result        |  time | tests |"
echo "|----------|---------------|-------|-------|"
printf '%s\n' "${RESULTS[@]}"
exit "$FAILED"
