"""Runs redis-py's own Lock tests (``tests/test_lock.py`` and ``tests/test_asyncio/test_lock.py``
from its sdist on PyPI, unmodified) against this package, on a server with the module.

Usage: ``<venv>/bin/python python/compat/run.py VERSION [--from-pypi] [pytest args...]`` (for instance
``--protocol 3``, an option of redis-py's conftest, or ``-k extend``; ``--their-lock`` runs
the same tests on redis-py's own Lock, nothing deselected, to check the harness), with the venv made
by ``make test-python-redispy`` (redis-py VERSION, the test requirements pinned in
``versions.txt`` and this package). The sdist is downloaded once into
``target/redispy/`` (its sha256 checked against the pin, which is the one PyPI publishes),
and its ``tests/`` extracted beside it. The server is started by the package tests' kit
(``python/tests/kit.py``: ``REDIS_LOCK_SERVER``, ``REDIS_LOCK_MODULE``) on a free loopback
port and given to redis-py's conftest with ``--redis-url``; the plugin
``redis_lock_swap.py`` swaps the Lock classes and deselects what ``deselected.txt`` lists.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = REPO / "target" / "redispy"
INDEX = "https://pypi.org/simple/redis/"
TEST_FILES = ["tests/test_lock.py", "tests/test_asyncio/test_lock.py"]


def pins() -> Dict[str, Tuple[str, List[str]]]:
    """``{version: (sdist sha256, [test requirements])}`` from versions.txt."""
    out: Dict[str, Tuple[str, List[str]]] = {}
    for number, raw in enumerate((HERE / "versions.txt").read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) < 2 or len(fields[1]) != 64:
            raise SystemExit(f"versions.txt:{number}: expected `version sha256 requirements...`")
        out[fields[0]] = (fields[1].lower(), fields[2:])
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist_entry(version: str) -> Dict[str, Any]:
    """PyPI's simple-index entry (JSON form, PEP 691) for ``redis-VERSION.tar.gz``."""
    name = f"redis-{version}.tar.gz"
    req = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        index = json.load(resp)
    for f in index.get("files", []):
        if f.get("filename") == name:
            return dict(f)
    raise SystemExit(f"{name} is not on {INDEX}")


def published_sha256(version: str) -> str:
    """The sha256 PyPI publishes for ``redis-VERSION.tar.gz`` (``--from-pypi``: a version not
    pinned here, such as the newest one for ``make test-latest-python``)."""
    return str(sdist_entry(version).get("hashes", {}).get("sha256", ""))


def sdist_url(version: str, sha: str) -> str:
    """The sdist's URL, after checking that the hash PyPI publishes for it is the pinned one."""
    entry = sdist_entry(version)
    published = entry.get("hashes", {}).get("sha256", "")
    if published != sha:
        raise SystemExit(f"redis-{version}.tar.gz: PyPI publishes sha256 {published}, versions.txt pins {sha}")
    return str(entry["url"])


def fetch_sdist(version: str, sha: str) -> Path:
    """The sdist in the cache, downloaded when missing; its hash checked either way."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"redis-{version}.tar.gz"
    if path.exists() and sha256_of(path) == sha:
        return path
    url = sdist_url(version, sha)
    print(f"downloading {url}", flush=True)
    fd, tmp = tempfile.mkstemp(dir=CACHE, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as resp:
            shutil.copyfileobj(resp, out)
        got = sha256_of(Path(tmp))
        if got != sha:
            raise SystemExit(f"{url}: sha256 {got}, expected {sha}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def extract_tests(version: str, sdist: Path, sha: str) -> Path:
    """``target/redispy/redis-VERSION/tests/`` (only the tests: the redis package imported is
    the venv's). Re-extracted when the stamp does not name this sdist's hash."""
    dest = CACHE / f"redis-{version}"
    stamp = dest / ".extracted"
    if stamp.exists() and stamp.read_text().strip() == sha:
        return dest
    prefix = f"redis-{version}/tests/"
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".redis-{version}-"))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                if not m.name.startswith(prefix):
                    continue
                rel = m.name[len(f"redis-{version}/"):]
                parts = Path(rel).parts
                if Path(rel).is_absolute() or ".." in parts or not (m.isfile() or m.isdir()):
                    raise SystemExit(f"{sdist}: unexpected member {m.name!r}")
                m.name = rel
                members.append(m)
            for m in members:
                target = tmp / m.name
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None
                with src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
        for name in TEST_FILES:
            if not (tmp / name).is_file():
                raise SystemExit(f"{sdist} has no {name}")
        (tmp / ".extracted").write_text(sha + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


def asyncio_options() -> List[str]:
    """pytest-asyncio 0.24 and later warn unless the fixtures' loop scope is set, and older
    ones do not know the option: set it only where it exists."""
    from importlib.metadata import version as installed

    from packaging.version import Version

    if Version(installed("pytest-asyncio")) >= Version("0.24"):
        return ["-o", "asyncio_default_fixture_loop_scope=function"]
    return []


def main(argv: List[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    version, extra = argv[0], argv[1:]
    # --their-lock: the same run with redis-py's own Lock and nothing deselected, to check the
    # harness (every test passes there).
    theirs = "--their-lock" in extra
    extra = [a for a in extra if a != "--their-lock"]
    # --from-pypi: a version not in versions.txt, its sdist checked against the hash PyPI
    # publishes (make test-latest-python).
    from_pypi = "--from-pypi" in extra
    extra = [a for a in extra if a != "--from-pypi"]
    table = pins()
    if from_pypi and version not in table:
        table[version] = (published_sha256(version), [])
    if version not in table:
        raise SystemExit(f"redis-py {version} is not pinned in versions.txt ({', '.join(table)}); --from-pypi takes PyPI's hash")
    import redis

    if redis.__version__ != version:
        raise SystemExit(f"this venv has redis-py {redis.__version__}, not {version}: rebuild it (make test-python-redispy)")
    sha, _ = table[version]
    root = extract_tests(version, fetch_sdist(version, sha), sha)

    sys.path.insert(0, str(REPO / "python" / "tests"))
    import kit  # type: ignore[import-untyped]  # the package tests' kit (REDIS_LOCK_SERVER, REDIS_LOCK_MODULE)

    server = kit.Server()
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(HERE), env.get("PYTHONPATH", "")] if p)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [
            sys.executable, "-m", "pytest",
            "-c", str(HERE / "pytest.ini"), "--rootdir", str(root),
            *([] if theirs else ["-p", "redis_lock_swap"]), "-p", "no:cacheprovider",
            *asyncio_options(),
            "--redis-url", server.url,
            *extra, *TEST_FILES,
        ]
        print(
            f"== redis-py {version}'s Lock tests against {'its own Lock' if theirs else 'redis_lock_client'} on {kit.SERVER} "
            f"(port {server.port}) {' '.join(extra)}".rstrip(),
            flush=True,
        )
        start = time.monotonic()
        code = subprocess.call(cmd, cwd=str(root), env=env)
        print(f"== redis-py {version}: {time.monotonic() - start:.1f} s", flush=True)
        return code
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
