"""The version matrix of the Python client: a named subset of the package's tests on the
newest release of each redis-py line the package claims, each on the oldest and the newest
Python that release supports (the cells and exact versions: ``matrix.txt`` beside this file).

Usage (from anywhere; ``make test-matrix-python`` runs it)::

    python3 python/compat/matrix.py [--jobs N] [--only 8.2] [--full] [pytest args...]

Each cell gets a venv ``target/python-matrix/<python>-<redis-py>`` made with pyenv's newest
``X.Y.*`` interpreter (else ``pythonX.Y`` on PATH), holding redis-py at the pin, this package
(editable) and the test tools at the pins of ``python/constraints.txt`` (its redis lines left
out); it is re-made when the pins or the constraints change. The tests need
``REDIS_LOCK_SERVER`` and ``REDIS_LOCK_MODULE`` as for ``make test-python``. Each cell's
output goes to ``target/python-matrix/<cell>.log``; a table of cell, result and time is printed
at the end. Exit status 1 when a cell failed or had no interpreter here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, List, NamedTuple, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYDIR = REPO / "python"
OUT = REPO / "target" / "python-matrix"
CONSTRAINTS = PYDIR / "constraints.txt"

#: The subset run in each cell: what differs between redis-py releases. Connections taken out
#: of the pools (test_connections, test_aio_connections: sync and asyncio, plain and blocking
#: pools, limits, deadlines), waits on the server (test_waiting), loss notice (the asyncio
#: watcher noticing a DEL with warnings as errors in test_redispy_versions; watchdog and loss in
#: test_asyncio), errors and how they print (test_rw_sem_errors, test_redispy_versions),
#: redis-py's Lock API (test_compat, test_asyncio). About 45 s a cell. The long waits that only
#: show redis-py's own default timeouts (30 s and 12 s, alike on every release) and the loss
#: watcher's own suite (test_watch.py, 30 s; it talks to the server through connections of its
#: own, not redis-py's pools) are left to `make test` (--full runs everything).
SUBSET = [
    "python/tests/test_redispy_versions.py",
    "python/tests/test_connections.py",
    "python/tests/test_aio_connections.py",
    "python/tests/test_waiting.py",
    "python/tests/test_rw_sem_errors.py",
    "python/tests/test_compat.py",
    "python/tests/test_asyncio.py",
]
SUBSET_DESELECT = "not 30_s_wait and not long_wait_with_default_settings and not control_redis_py_defaults"


class Cell(NamedTuple):
    line: str
    redis: str
    python: str


def cells() -> List[Cell]:
    out: List[Cell] = []
    for number, raw in enumerate((HERE / "matrix.txt").read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 5:
            raise SystemExit(f"matrix.txt:{number}: expected `line redis-py requires-python oldest newest`")
        for py in dict.fromkeys(fields[3:5]):
            out.append(Cell(fields[0], fields[1], py))
    return out


def interpreter(version: str) -> Optional[str]:
    """pyenv's newest ``version.*`` (not a free-threaded build), else ``pythonX.Y`` on PATH."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    found = sorted(
        (p for p in Path(root, "versions").glob(f"{version}.*/bin/python{version}") if not p.parent.parent.name.endswith("t")),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.parent.name.split(".")],
    )
    candidates = [str(found[-1])] if found else []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    for c in candidates:
        try:
            got = subprocess.run([c, "-c", "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if got.returncode == 0 and got.stdout.strip() == version:
            return c
    return None


def constraints_without_redis() -> Path:
    """python/constraints.txt less its redis lines (each cell pins redis-py itself)."""
    lines = [line for line in CONSTRAINTS.read_text().splitlines() if not line.strip().lower().startswith("redis==")]
    path = OUT / "constraints-no-redis.txt"
    text = "\n".join(lines) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def make_venv(cell: Cell, py: str, log: IO[str]) -> Path:
    venv = OUT / f"{cell.python}-{cell.redis}"
    pins = constraints_without_redis()
    stamp_text = f"redis=={cell.redis}\n{py}\n" + hashlib.sha256(pins.read_bytes() + (PYDIR / "pyproject.toml").read_bytes()).hexdigest() + "\n"
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == stamp_text and (venv / "bin" / "python").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    env = dict(os.environ, PIP_CONSTRAINT=str(pins), PIP_DISABLE_PIP_VERSION_CHECK="1")
    steps = [
        [py, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"redis=={cell.redis}", "-e", f"{PYDIR}[test]"],
    ]
    for step in steps:
        subprocess.run(step, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    stamp.write_text(stamp_text)
    return venv


def run_cell(cell: Cell, full: bool, extra: List[str]) -> Tuple[Cell, str, float, str]:
    name = f"{cell.python}-{cell.redis}"
    start = time.monotonic()
    py = interpreter(cell.python)
    if py is None:
        return cell, "NO PYTHON", 0.0, f"no Python {cell.python} here (pyenv or python{cell.python} on PATH)"
    with open(OUT / f"{name}.log", "w") as log:
        try:
            venv = make_venv(cell, py, log)
        except subprocess.CalledProcessError as e:
            return cell, "NO VENV", time.monotonic() - start, f"making the venv failed ({e}); see {log.name}"
        vpy = str(venv / "bin" / "python")
        versions = subprocess.run(
            [vpy, "-c", "import platform, redis, pytest; print(platform.python_version(), redis.__version__, pytest.__version__)"],
            capture_output=True, text=True,
        ).stdout.split()
        args = [vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(PYDIR / "pyproject.toml"), "--rootdir", str(PYDIR)]
        args += ["python/tests"] if full else SUBSET + ["-k", SUBSET_DESELECT]
        log.write(f"== {' '.join(args + extra)}\n")
        log.flush()
        tests_start = time.monotonic()
        rc = subprocess.run(args + extra, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        took = time.monotonic() - tests_start
    tail = ""
    for line in reversed((OUT / f"{name}.log").read_text().splitlines()):
        if " in " in line and ("passed" in line or "failed" in line or "error" in line):
            tail = line.strip("= ")
            break
    detail = f"Python {versions[0] if versions else '?'}, pytest {versions[2] if len(versions) > 2 else '?'}: {tail}"
    if versions and len(versions) > 1 and versions[1] != cell.redis:
        return cell, "WRONG REDIS", took, f"redis-py {versions[1]} installed, {cell.redis} pinned"
    return cell, "pass" if rc == 0 else "FAIL", took, detail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MATRIX_JOBS", "1")), help="cells run at once (default 1; MATRIX_JOBS)")
    ap.add_argument("--only", action="append", default=[], help="a redis-py line (8.2), version (8.2.0) or Python (3.8) to run; repeatable")
    ap.add_argument("--full", action="store_true", help="the whole suite in each cell instead of the subset")
    opts, extra = ap.parse_known_args()
    for var in ("REDIS_LOCK_SERVER", "REDIS_LOCK_MODULE"):
        if not os.environ.get(var):
            print(f"matrix: {var} is not set (as for make test-python)", file=sys.stderr)
            return 2
    todo = [c for c in cells() if not opts.only or {c.line, c.redis, c.python} & set(opts.only)]
    if not todo:
        print(f"matrix: no cell matches {opts.only}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    what = "the whole suite" if opts.full else f"the subset ({len(SUBSET)} files, -k '{SUBSET_DESELECT}')"
    print(f"== redis-py version matrix: {len(todo)} cells, {what}, {opts.jobs} at a time; logs in {OUT.relative_to(REPO)}/", flush=True)
    start = time.monotonic()
    results = []
    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        for cell, status, took, detail in pool.map(lambda c: run_cell(c, opts.full, extra), todo):
            print(f"   {cell.redis:<7} on Python {cell.python:<5} {status:<5} {took:6.1f} s  {detail}", flush=True)
            results.append((cell, status, took, detail))
    total = time.monotonic() - start
    print()
    print("| redis-py | Python | result | tests (s) |")
    print("| --- | --- | --- | --- |")
    for cell, status, took, _ in results:
        print(f"| {cell.redis} | {cell.python} | {status} | {took:.1f} |")
    bad = [r for r in results if r[1] != "pass"]
    print(f"\n== matrix: {len(results) - len(bad)} of {len(results)} cells passed in {total:.0f} s (venvs included)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
