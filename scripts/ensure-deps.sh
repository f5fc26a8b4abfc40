#!/usr/bin/env bash
# Installs what building and testing the module needs on a Debian machine, when missing:
# redis-server (the tests and `make run` start a real one) and libclang (bindgen, run by the
# redis-module crate's build script). Idempotent; does nothing when everything is present.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
if ! ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' && ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

# De-duplicate.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "ensure-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
