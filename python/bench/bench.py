"""Benchmark of the Python client: redis_lock_client against redis-py's own Lock and
python-redis-lock, on one server with the module (started here, on a free loopback port).

1. Uncontended acquire + release pairs per second from one thread, with what each pair costs
   the server: the ``usec`` of INFO commandstats and the server's CPU time (INFO CPU
   used_cpu_sys + used_cpu_user), both per pair.
2. Hand-over with 16 waiters (threads of one process): the time from a holder starting its
   release to the next holder's acquire returning, p50 and p99.
3. How soon a held lock's loss is noticed (``on_lost`` called), sync and asyncio, after the
   server ends the hold: DEL, the hold's expiry on the server, the bound connection killed, a
   failover to a server without the hold.

Writes a markdown section between two markers at the end of ``--out`` (replacing an earlier
one), or prints it without ``--out``. Run by ``make bench-python`` and by ``make bench`` after
lock-bench; the module comes from REDIS_LOCK_MODULE (default: the release build).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ.setdefault("REDIS_LOCK_MODULE", str(REPO / "target" / "release" / "libredis_lock.so"))
sys.path.insert(0, str(HERE.parent / "tests"))

import redis  # noqa: E402
import redis.lock  # noqa: E402

import kit  # noqa: E402
import redis_lock_client.asyncio as aio  # noqa: E402
from redis_lock_client import Lock  # noqa: E402
from redis_lock_client._common import parse_info  # noqa: E402

try:
    import redis_lock as python_redis_lock  # python-redis-lock
except ImportError:  # pragma: no cover - the section then says it was not measured
    python_redis_lock = None

START = "<!-- python-bench:start -->"
END = "<!-- python-bench:end -->"

Pair = Callable[[], None]


def server_figures(c: "redis.Redis[bytes]") -> Tuple[float, float, int]:
    """(commandstats usec, CPU seconds, calls) of everything but INFO and CONFIG."""
    stats = c.info("commandstats")
    usec = 0.0
    calls = 0
    for name, v in stats.items():
        if name in ("cmdstat_info", "cmdstat_config"):
            continue
        usec += float(v["usec"])
        calls += int(v["calls"])
    cpu = c.info("cpu")
    return usec, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


def measure_pairs(admin: "redis.Redis[bytes]", make_pair: Callable[[], Pair], n: int, repeats: int) -> Dict[str, float]:
    pair = make_pair()
    for _ in range(min(300, n)):
        pair()
    rates: List[float] = []
    usecs: List[float] = []
    cpus: List[float] = []
    calls: List[float] = []
    for _ in range(repeats):
        admin.config_resetstat()
        u0, c0, k0 = server_figures(admin)
        t0 = time.perf_counter()
        for _ in range(n):
            pair()
        elapsed = time.perf_counter() - t0
        u1, c1, k1 = server_figures(admin)
        rates.append(n / elapsed)
        usecs.append((u1 - u0) / n)
        cpus.append((c1 - c0) * 1e6 / n)
        calls.append((k1 - k0) / n)
    return {
        "rate": statistics.median(rates),
        "usec": statistics.median(usecs),
        "cpu": statistics.median(cpus),
        "calls": statistics.median(calls),
    }


def measure_handover(make_lock: Callable[[], Tuple[Callable[[], bool], Callable[[], None]]], waiters: int, rounds: int) -> Dict[str, float]:
    """``waiters`` threads each take the lock ``rounds`` times, holding it 1 ms."""
    latencies: List[float] = []
    state: Dict[str, float] = {}
    guard = threading.Lock()
    errors: List[BaseException] = []
    start = threading.Barrier(waiters)

    def worker() -> None:
        acquire, release = make_lock()
        try:
            start.wait()
            for _ in range(rounds):
                if not acquire():
                    raise RuntimeError("acquire timed out")
                now = time.perf_counter()
                with guard:
                    released = state.pop("released", None)
                    if released is not None:
                        latencies.append(now - released)
                time.sleep(0.001)
                with guard:
                    state["released"] = time.perf_counter()
                release()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(waiters)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    latencies.sort()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "p50": statistics.median(latencies) * 1000,
        "p99": q[98] * 1000,
        "max": latencies[-1] * 1000,
        "rate": waiters * rounds / elapsed,
        "samples": len(latencies),
    }


LOSS_EVENTS = ["DEL", "expiry on the server", "bound connection killed", "failover (REPLICAOF)"]


class LossTrial:
    """One trial of one event: ``start`` provokes it and returns the time (perf_counter) the
    hold ended on the server, or the earliest time it can have ended."""

    def __init__(self, admin: "redis.Redis[bytes]", other: "kit.Server", key: str) -> None:
        self.admin = admin
        self.other = other
        self.key = key

    def provoke(self, event: str, owner: bytes) -> float:
        a = self.admin
        if event == "DEL":
            t = time.perf_counter()
            a.delete(self.key)
            return t
        if event == "expiry on the server":
            # The owner shortens its own hold to 50 ms from another connection: the client
            # still believes in a 30 s lease, so only the server's word can tell it. The hold
            # ends when the server's expiry runs (up to about 1/hz after the 50 ms): the figure
            # counts from the first time the key is seen without the holder.
            a.execute_command("LOCK.EXTEND", self.key, owner, 50)
            while True:
                t = time.perf_counter()
                info = parse_info(a.execute_command("LOCK.INFO", self.key))
                if info is None or not info.holds(owner):
                    return t
                time.sleep(0.0002)
        if event == "bound connection killed":
            for c in a.client_list():
                if c.get("cmd") == "lock.acquire":
                    t = time.perf_counter()
                    a.client_kill_filter(_id=c["id"])
                    return t
            raise RuntimeError("no bound connection found")
        if event == "failover (REPLICAOF)":
            # This server becomes a replica of one without the hold: its dataset is replaced,
            # which is what a client sees after a failover to a replica that missed the grant.
            a.replicaof("127.0.0.1", self.other.port)
            while True:
                t = time.perf_counter()
                if not a.exists(self.key):
                    return t
                time.sleep(0.0002)
        raise ValueError(event)

    def reset(self, event: str) -> None:
        if event == "failover (REPLICAOF)":
            self.admin.replicaof("no", "one")
            kit.wait_for(lambda: self.admin.info("replication")["role"] == "master", what="master again")
        self.admin.delete(self.key)


def measure_loss_sync(port: int, trial: LossTrial, event: str, n: int) -> List[float]:
    out: List[float] = []
    for _ in range(n):
        seen = threading.Event()
        stamp: List[float] = []

        def on_lost(_err: Exception) -> None:
            stamp.append(time.perf_counter())
            seen.set()

        client = redis.Redis(host="127.0.0.1", port=port)
        timeout = None if event == "bound connection killed" else 30
        lock = Lock(client, trial.key, timeout=timeout, on_lost=on_lost)
        if not lock.acquire(blocking_timeout=5):
            raise RuntimeError("could not take the lock")
        time.sleep(0.05)  # let the client settle (a watcher registers the key after the grant)
        ended = trial.provoke(event, lock.local.token)
        if not seen.wait(30):
            raise RuntimeError(f"sync: loss after {event} not noticed within 30 s")
        out.append((stamp[0] - ended) * 1000)
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - the lock is lost: the release says so
            pass
        client.close()
        trial.reset(event)
    return out


def measure_loss_async(port: int, trial: LossTrial, event: str, n: int) -> List[float]:
    async def run() -> List[float]:
        out: List[float] = []
        loop = asyncio.get_running_loop()
        for _ in range(n):
            seen = asyncio.Event()
            stamp: List[float] = []

            def on_lost(_err: Exception) -> None:
                stamp.append(time.perf_counter())
                seen.set()

            import redis.asyncio as redis_aio

            client = redis_aio.Redis(host="127.0.0.1", port=port)
            timeout = None if event == "bound connection killed" else 30
            lock = aio.Lock(client, trial.key, timeout=timeout, on_lost=on_lost)
            if not await lock.acquire(blocking_timeout=5):
                raise RuntimeError("could not take the lock")
            await asyncio.sleep(0.05)
            # Provoked from a thread: the admin client is sync and the loop must keep running.
            ended = await loop.run_in_executor(None, trial.provoke, event, lock.local.token)
            await asyncio.wait_for(seen.wait(), 30)
            out.append((stamp[0] - ended) * 1000)
            try:
                await lock.release()
            except Exception:  # noqa: BLE001 - the lock is lost: the release says so
                pass
            await client.aclose() if hasattr(client, "aclose") else await client.close()
            await loop.run_in_executor(None, trial.reset, event)
        return out

    return asyncio.run(run())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="markdown file to append the section to (replacing an earlier one)")
    ap.add_argument("--pairs", type=int, default=3000, help="acquire+release pairs per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    # 100 rounds give about 1,600 hand-overs per lock, so the p99 is not just the 4th-largest
    # sample: at 20 rounds (319 samples) two runs read 0.56 and 0.86 ms.
    ap.add_argument("--rounds", type=int, default=100, help="acquires per waiter in the hand-over test")
    ap.add_argument("--loss-trials", type=int, default=20, help="trials per event in the loss-noticed test")
    ap.add_argument("--loss-only", action="store_true", help="print the loss-noticed figures only (no --out)")
    args = ap.parse_args()

    server = kit.Server()
    try:
        port = server.port
        admin = server.client()
        version = admin.info("server")
        server_name = f"{Path(kit.SERVER).name} {version.get('valkey_version') or version['redis_version']}"

        def client(**kw: Any) -> "redis.Redis[bytes]":
            return redis.Redis(host="127.0.0.1", port=port, **kw)

        pairs: List[Tuple[str, Dict[str, float]]] = []

        def ours(timeout: Any) -> Callable[[], Pair]:
            def make() -> Pair:
                lock = Lock(client(), "bench:pairs", timeout=timeout)

                def pair() -> None:
                    lock.acquire(blocking=False)
                    lock.release()

                return pair

            return make

        def redis_py() -> Pair:
            lock = redis.lock.Lock(client(), "bench:pairs", timeout=10)

            def pair() -> None:
                lock.acquire(blocking=False)
                lock.release()

            return pair

        def prl() -> Pair:
            assert python_redis_lock is not None
            c = client()

            def pair() -> None:
                lock = python_redis_lock.Lock(c, "bench:pairs", expire=10)
                lock.acquire(blocking=False)
                lock.release()

            return pair

        variants: List[Tuple[str, Callable[[], Pair]]] = [
            ("redis_lock_client `Lock(timeout=10)`", ours(10)),
            ("redis_lock_client `Lock(timeout=None)` (bound to its connection)", ours(None)),
            ("redis-py `redis.lock.Lock(timeout=10)`", redis_py),
        ]
        if python_redis_lock is not None:
            variants.append(("python-redis-lock `Lock(expire=10)`", prl))
        if args.loss_only:
            variants, args.out = [], None
        for name, make in variants:
            print(f"pairs: {name} ...", file=sys.stderr)
            pairs.append((name, measure_pairs(admin, make, args.pairs, args.repeats)))
            admin.flushall()

        handovers: List[Tuple[str, Dict[str, float]]] = []

        def ours_handover() -> Tuple[Callable[[], bool], Callable[[], None]]:
            lock = Lock(client(), "bench:handover", timeout=10, blocking_timeout=60)
            return lock.acquire, lock.release

        def prl_handover() -> Tuple[Callable[[], bool], Callable[[], None]]:
            assert python_redis_lock is not None
            c = client(socket_timeout=None)  # its BLPOP waits up to expire: no 5 s read timeout
            box: Dict[str, Any] = {}

            def acquire() -> bool:
                box["lock"] = python_redis_lock.Lock(c, "bench:handover", expire=10)
                return bool(box["lock"].acquire(blocking=True, timeout=10))

            def release() -> None:
                box["lock"].release()

            return acquire, release

        def redis_py_handover() -> Tuple[Callable[[], bool], Callable[[], None]]:
            lock = redis.lock.Lock(client(), "bench:handover", timeout=10, blocking_timeout=60)  # sleep=0.1
            return lambda: bool(lock.acquire()), lock.release

        hvariants: List[Tuple[str, Callable[[], Tuple[Callable[[], bool], Callable[[], None]]], int]] = [
            ("redis_lock_client `Lock` (server FIFO queue, WAIT)", ours_handover, args.rounds),
        ]
        if python_redis_lock is not None:
            hvariants.append(("python-redis-lock `Lock` (SET NX + BLPOP signal)", prl_handover, args.rounds))
        hvariants.append(("redis-py `redis.lock.Lock` (polling, default sleep=0.1)", redis_py_handover, max(4, args.rounds // 4)))
        if args.loss_only:
            hvariants = []
        for name, make_lock, rounds in hvariants:
            print(f"hand-over: {name} ...", file=sys.stderr)
            handovers.append((name, measure_handover(make_lock, 16, rounds)))
            admin.flushall()

        losses: List[Tuple[str, List[float], List[float]]] = []
        other = kit.Server()
        try:
            trial = LossTrial(admin, other, "bench:loss")
            for event in LOSS_EVENTS:
                print(f"loss noticed: {event} ...", file=sys.stderr)
                sync_ms = measure_loss_sync(port, trial, event, args.loss_trials)
                async_ms = measure_loss_async(port, trial, event, args.loss_trials)
                losses.append((event, sync_ms, async_ms))
        finally:
            other.close()
    finally:
        server.close()

    import redis as redis_mod

    prl_version = "not installed"
    if python_redis_lock is not None:
        from importlib.metadata import version as dist_version

        prl_version = dist_version("python-redis-lock")
    lines = [
        START,
        "## Python client (redis-lock-client)",
        "",
        "Measured by `python/bench/bench.py`; reproduce with `make bench-python` (or `make bench`, which",
        "runs it after lock-bench). "
        f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs ({platform.machine()}), "
        f"Python {platform.python_version()}, redis-py {redis_mod.__version__}, python-redis-lock {prl_version}, "
        f"{server_name} with the module's release build, on loopback; the client and the server are not pinned",
        "to CPUs, so figures move with the machine's load.",
        "",
        f"Uncontended acquire + release from one thread (median of {args.repeats} runs of {args.pairs} pairs; each",
        "lock's client has redis-py's default settings). Server cost per pair: the `usec` of INFO",
        "commandstats, and the server process's CPU time (INFO CPU `used_cpu_sys` + `used_cpu_user`), which",
        "also counts reading and writing the sockets. Each lock takes two round trips per pair, so pairs/s",
        "is bound by the round trips and the client's own (Python) CPU and moves with the machine's load;",
        "the server columns are the cost comparison.",
        "",
        "| lock | pairs/s | server µs per pair (commandstats) | server CPU µs per pair | commands per pair (with those inside scripts) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, m in pairs:
        lines.append(f"| {name} | {m['rate']:,.0f} | {m['usec']:.1f} | {m['cpu']:.1f} | {m['calls']:.1f} |")
    lines += [
        "",
        f"Hand-over with 16 waiters: 16 threads of one process each take the lock {args.rounds} times and hold it",
        "1 ms; the latency is from a holder starting its release to the next holder's acquire returning.",
        "",
        "| lock | p50 ms | p99 ms | max ms | hand-overs/s | samples |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in handovers:
        lines.append(
            f"| {name} | {m['p50']:.2f} | {m['p99']:.2f} | {m['max']:.1f} | {m['rate']:,.0f} | {m['samples']:.0f} |"
        )
    lines += [
        "",
        "redis_lock_client's waiters block in the server's queue and the lock is handed to the head waiter",
        "inside the release, so a hand-over costs one reply; python-redis-lock wakes one BLPOP waiter per",
        "release, which then has to win a `SET NX` against everyone else; redis-py's Lock polls every",
        "`sleep` seconds (fewer rounds for it: each hand-over waits out part of a sleep). All 16 waiters",
        "are threads of one Python process, so the tail (p99, max) includes waiting for the GIL.",
        "",
        f"Loss noticed: a lock held with `on_lost` (ttl 30 s, watchdog every 10 s; `timeout=None` for the",
        f"bound case), then the server ends the hold; the figure is from the hold's end on the server to",
        f"`on_lost` being called, {args.loss_trials} trials per row. The hold's end: the DEL sent; for the",
        "expiry (the owner's hold shortened to 50 ms from another connection), the first time `LOCK.INFO`",
        "shows it gone, which is up to about 1/hz after the 50 ms (the server's expiry cycle); the CLIENT",
        "KILL sent; for the failover, the first time the key is seen gone after `REPLICAOF` to a server",
        "without it. The figures are upper bounds: a poll every 0.2 ms, and a callback in another thread.",
        "redis-py's Lock has no loss notice: it learns of a loss at its next `extend` or `release`.",
        "",
        "| event | sync p50 ms | sync max ms | asyncio p50 ms | asyncio max ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for event, sync_ms, async_ms in losses:
        lines.append(
            f"| {event} | {statistics.median(sync_ms):.1f} | {max(sync_ms):.1f} | "
            f"{statistics.median(async_ms):.1f} | {max(async_ms):.1f} |"
        )
    lines += [
        END,
        "",
    ]
    section = "\n".join(lines)
    if args.out:
        path = Path(args.out)
        text = path.read_text() if path.exists() else ""
        if START in text:
            before, _, rest = text.partition(START)
            _, _, after = rest.partition(END)
            text = before.rstrip("\n") + "\n\n" + after.lstrip("\n")
        text = text.rstrip("\n") + "\n\n" + section
        path.write_text(text)
        print(f"wrote the Python section of {path}", file=sys.stderr)
    else:
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
