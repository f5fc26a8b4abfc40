//! `lock-bench`: the module against the ways people lock with Redis today, in one run, on one
//! server that the tool starts itself. Writes a markdown report and an SVG chart.
//!
//! Usage: `lock-bench [--quick] [--module PATH] [--out docs/benchmarks.md]`
//! (`make bench` / `make bench-quick` build the module and run it pinned to a core).

mod detect;
mod locks;
mod measure;
mod server;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use detect::Waiting;
use locks::{Lock, LuaFair, Module, ModuleSemaphore, SetNx, ZsetSemaphore};
use server::Server;

struct Options {
    quick: bool,
    module: PathBuf,
    out: PathBuf,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        module: PathBuf::from("target/release/libredis_lock.so"),
        out: PathBuf::from("docs/benchmarks.md"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--module" => o.module = args.next().ok_or("--module needs a path")?.into(),
            "--out" => o.out = args.next().ok_or("--out needs a path")?.into(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

fn pct(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut v = samples.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

/// Handoff figures per approach, for the chart.
struct Handoff {
    name: &'static str,
    p50: Duration,
    p99: Duration,
    max: Duration,
    n: usize,
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lock-bench: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let server = match Server::start(&o.module, Some(0)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lock-bench: {e}");
            std::process::exit(1);
        }
    };
    let module = Module;
    let setnx = SetNx::new(Duration::from_millis(100));
    let fair = LuaFair::new(Duration::from_millis(100));
    let approaches: [&dyn Lock; 3] = [&module, &setnx, &fair];
    let q = o.quick;
    let mut md = String::new();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());

    // 1. Server time and throughput.
    step("server time per acquire + release");
    let pairs = if q { 5_000 } else { 20_000 };
    let rounds = 7;
    let times = measure::server_times(&server, &approaches, pairs / rounds, rounds);
    let floor = times[1];
    let _ = writeln!(md, "## 1. Server time and throughput, uncontended\n");
    let _ = writeln!(
        md,
        "Server time is INFO commandstats µs per acquire + release, one connection, no pipelining: the median of 7 rounds of {} pairs, the approaches taking turns. \
         Throughput is acquire + release pairs per second with N connections, each on its own lock, no pipelining \
         ({} s each). The SET NX row is the floor: `SET key token NX PX ttl` + the compare-and-delete script.\n",
        pairs / rounds,
        if q { 1 } else { 3 }
    );
    let _ = writeln!(
        md,
        "| approach | server µs / pair | vs SET NX | pairs/s, 1 conn | 16 conns | 64 conns |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    let duration = Duration::from_secs(if q { 1 } else { 3 });
    for (l, t) in approaches.iter().zip(&times) {
        step(&format!("throughput: {}", l.name()));
        let tp: Vec<f64> = [1, 16, 64]
            .iter()
            .map(|&n| measure::throughput(&server, *l, n, duration))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {t:.2} | {:.2}x | {:.0} | {:.0} | {:.0} |",
            l.name(),
            t / floor,
            tp[0],
            tp[1],
            tp[2]
        );
    }

    // 2. Contended handoff.
    let _ = writeln!(md, "\n## 2. Contended handoff, 16 waiters on one lock\n");
    let _ = writeln!(
        md,
        "From a release being sent to the next holder's grant reply, with 16 clients looping acquire / release \
         on one lock. Polling sleeps 100 ms between tries (redis-py's default); the Lua lock's waiters BLPOP a \
         per-waiter list the releaser pushes to, waking at least every 100 ms.\n"
    );
    let _ = writeln!(md, "| approach | samples | p50 | p99 | max |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    let mut handoffs = Vec::new();
    for l in approaches {
        step(&format!("handoff: {}", l.name()));
        let (samples, budget) = if l.name() == setnx.name() {
            (
                if q { 40 } else { 150 },
                Duration::from_secs(if q { 8 } else { 20 }),
            )
        } else {
            (
                if q { 1_000 } else { 5_000 },
                Duration::from_secs(if q { 8 } else { 20 }),
            )
        };
        let s = measure::handoff(&server, l, 16, 1, samples, budget).samples;
        let h = Handoff {
            name: l.name(),
            p50: pct(&s, 0.5),
            p99: pct(&s, 0.99),
            max: pct(&s, 1.0),
            n: s.len(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            h.name,
            h.n,
            fmt_d(h.p50),
            fmt_d(h.p99),
            fmt_d(h.max)
        );
        handoffs.push(h);
    }
    let _ = writeln!(md, "\n![handoff latency](img/handoff.svg)");

    // 3. Crash hand-over.
    let _ = writeln!(md, "\n## 3. Crash hand-over\n");
    let _ = writeln!(
        md,
        "A holder takes the lock with a 200 ms TTL and never releases; one waiter blocks. Figure: how long after \
         the TTL (counted from the holder's request being sent) the waiter has the lock.\n"
    );
    let _ = writeln!(md, "| approach | rounds | p50 | max |");
    let _ = writeln!(md, "|---|---:|---:|---:|");
    let rounds = if q { 5 } else { 20 };
    let mut module_crash_max = Duration::ZERO;
    let mut module_crash_p50 = Duration::ZERO;
    for l in approaches {
        step(&format!("crash: {}", l.name()));
        let s = measure::crash(&server, l, rounds, 200);
        if l.name() == module.name() {
            module_crash_max = pct(&s, 1.0);
            module_crash_p50 = pct(&s, 0.5);
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            l.name(),
            s.len(),
            fmt_d(pct(&s, 0.5)),
            fmt_d(pct(&s, 1.0))
        );
    }

    step("crash: module, BIND");
    let bound = measure::bound_crash(&server, rounds);
    let _ = writeln!(
        md,
        "\nWith `BIND` the holder's hold is tied to its connection: when the holder crashes, its \
         connection closes and the waiter is served then, without waiting for the TTL. Figure: how \
         long after the holder's socket was closed the waiter has the lock (TTL 600 s, never reached).\n"
    );
    let _ = writeln!(md, "| module, the holder's... | rounds | p50 | max |");
    let _ = writeln!(md, "|---|---:|---:|---:|");
    let _ = writeln!(
        md,
        "| TTL (200 ms) passes: the figure above | {} | {} | {} |",
        rounds,
        fmt_d(module_crash_p50),
        fmt_d(module_crash_max)
    );
    let _ = writeln!(
        md,
        "| connection closes (`BIND`), counted from the close | {} | {} | {} |",
        bound.len(),
        fmt_d(pct(&bound, 0.5)),
        fmt_d(pct(&bound, 1.0))
    );

    // 4. Fairness.
    let _ = writeln!(md, "\n## 4. Fairness\n");
    let rounds = if q { 5 } else { 20 };
    let _ = writeln!(
        md,
        "{rounds} rounds; in each, 16 waiters arrive 5 ms apart while the lock is held, then it is released. A grant \
         is out of order when a waiter that arrived earlier was still waiting.\n"
    );
    let _ = writeln!(md, "| approach | out-of-order grants | grants |");
    let _ = writeln!(md, "|---|---:|---:|");
    let mut module_out_of_order = 0;
    for l in approaches {
        step(&format!("fairness: {}", l.name()));
        let (bad, total) = measure::fairness(&server, l, rounds, 16);
        if l.name() == module.name() {
            module_out_of_order = bad;
        }
        let _ = writeln!(md, "| {} | {bad} | {total} |", l.name());
    }

    // 5. Memory.
    let _ = writeln!(md, "\n## 5. Memory\n");
    let n = if q { 20_000 } else { 100_000 };
    let _ = writeln!(
        md,
        "`used_memory` per held lock over {n} locks (32-byte owner, TTL set).\n"
    );
    let _ = writeln!(md, "| approach | bytes per held lock | vs SET NX |");
    let _ = writeln!(md, "|---|---:|---:|");
    let mems: Vec<f64> = approaches
        .iter()
        .map(|l| {
            step(&format!("memory: {}", l.name()));
            measure::memory_per_lock(&server, *l, n)
        })
        .collect();
    for (l, m) in approaches.iter().zip(&mems) {
        let _ = writeln!(md, "| {} | {m:.0} | {:.2}x |", l.name(), m / mems[1]);
    }
    step("memory per waiter");
    let waiters = if q { 500 } else { 2_000 };
    let (module_part, pool_part, client_part) = measure::memory_per_waiter(&server, waiters);
    let _ = writeln!(
        md,
        "\nPer blocked waiter, {waiters} waiters on one lock. Baseline: as many clients blocked in BLPOP on one list \
         ({client_part:.0} bytes each: what Redis spends on any connection blocked in a command).\n\n\
         | part | bytes per waiter |\n|---|---:|\n\
         | the module's own data (queue entry, blocked-client registry) | {module_part:.0} |\n\
         | Redis 7.0's two temp clients per module-blocked client (`moduleBlockClient`; pooled and reused) | {pool_part:.0} |\n\
         | any connection blocked in a command (BLPOP baseline) | {client_part:.0} |"
    );

    // 6. Scale.
    let _ = writeln!(md, "\n## 6. Scale\n");
    let _ = writeln!(md, "| what | figure |");
    let _ = writeln!(md, "|---|---:|");
    let held: &[usize] = if q {
        &[1_000, 100_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    let mut held_costs = Vec::new();
    for &h in held {
        step(&format!("scale: {h} locks held"));
        let t = measure::cost_with_locks_held(&server, &module, h, 10_000);
        held_costs.push((h, t));
        let base = measure::cost_with_locks_held(&server, &setnx, h, 10_000);
        let _ = writeln!(
            md,
            "| acquire + release with {h} locks held: module / SET NX baseline | {t:.2} µs / {base:.2} µs |"
        );
    }
    let deep = if q { 2_000 } else { 10_000 };
    step(&format!("scale: {deep} waiters"));
    let t = measure::release_with_waiters(&server, deep, 1_000);
    let _ = writeln!(
        md,
        "| release that grants the next of {deep} queued waiters | {t:.2} µs |"
    );
    for readers in [1usize, 10_000] {
        step(&format!("scale: {readers} readers"));
        let t = measure::reader_pair_with_readers(&server, readers, 10_000);
        let _ = writeln!(
            md,
            "| reader acquire + release with {readers} readers holding | {t:.2} µs |"
        );
    }

    // 7. Semaphores.
    let capacity = 4u32;
    let rounds_st = 7;
    let module_sem = ModuleSemaphore { capacity };
    let zset_sem = ZsetSemaphore::new(capacity, Duration::from_millis(10));
    let sems: [&dyn Lock; 2] = [&module_sem, &zset_sem];
    let _ = writeln!(md, "\n## 7. Semaphores, capacity {capacity}\n");
    step("semaphore: server time per acquire + release");
    let sem_pairs = if q { 5_000 } else { 10_000 };
    let sem_times = measure::server_times(&server, &sems, sem_pairs / rounds_st, rounds_st);
    let _ = writeln!(
        md,
        "Server time is INFO commandstats µs per acquire + release of one permit, as in section 1 (one connection, \
         no pipelining, the median of {rounds_st} rounds of {} pairs, the approaches taking turns, 1000 keys). The module: \
         `LOCK.SEMACQUIRE key owner {capacity} ttl` + `LOCK.RELEASE key owner`. The baseline is the sorted-set \
         semaphore that redis-semaphore and Redisson's `RPermitExpirableSemaphore` keep: a script that drops \
         expired members (`ZREMRANGEBYSCORE`), then, when `ZCARD` < {capacity}, adds the owner scored by its expiry \
         (`ZADD`, `PEXPIRE`); the release is `ZREM`.\n",
        sem_pairs / rounds_st
    );
    let _ = writeln!(md, "| approach | server µs / pair | vs sorted set + Lua |");
    let _ = writeln!(md, "|---|---:|---:|");
    for (l, t) in sems.iter().zip(&sem_times) {
        let _ = writeln!(md, "| {} | {t:.2} | {:.2}x |", l.name(), t / sem_times[1]);
    }
    let sem_ratio = sem_times[0] / sem_times[1];
    let sem_run = Duration::from_secs(if q { 2 } else { 3 });
    let _ = writeln!(
        md,
        "\nHand-over with 16 clients looping acquire / release on one semaphore of capacity {capacity} for {} s: from a \
         release being sent to the next grant's reply (as section 2; with {capacity} permits each grant is paired \
         with the oldest release not yet paired). The module's clients block with `WAIT`; the sorted-set \
         clients sleep 10 ms between tries (redis-semaphore's default), so a releasing client, which tries again at \
         once, often takes its own permit back before a sleeping one wakes (a fast hand-over to itself). The last \
         two columns show what that costs the others: how many of the 16 clients got a permit while the run \
         lasted, and the longest one acquire call waited for its grant (calls made after the first release; \
         clients still waiting when the run stops count once they get through).\n",
        sem_run.as_secs()
    );
    let _ = writeln!(
        md,
        "| approach | samples | p50 | p99 | max | clients served (of 16) | longest wait of a client |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    let mut module_sem_p99 = Duration::ZERO;
    for l in sems {
        step(&format!("semaphore handoff: {}", l.name()));
        let run = measure::handoff(&server, l, 16, capacity as usize, usize::MAX, sem_run);
        let s = &run.samples;
        if l.name() == module_sem.name() {
            module_sem_p99 = pct(s, 0.99);
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            l.name(),
            s.len(),
            fmt_d(pct(s, 0.5)),
            fmt_d(pct(s, 0.99)),
            fmt_d(pct(s, 1.0)),
            run.clients_served,
            fmt_d(run.longest_wait)
        );
    }

    // 8. Deadlock detection.
    let _ = writeln!(
        md,
        "\n## 8. Deadlock detection: cost of a blocking request\n"
    );
    let _ = writeln!(
        md,
        "Server time of one blocking request that cannot be granted: `LOCK.ACQUIRE key owner ttl WAIT 0`, which is \
         checked for a wait-for cycle before it queues; `CLIENT UNBLOCK id ERROR` takes it out again before the \
         next one. The requester holds a key of its own that another owner waits for, so a cycle could close on \
         it and the walk runs; none closes. (A requester that holds no key anyone waits for cannot close a cycle, \
         and the module skips the walk for it: the last row.) Checked in every \
         run: each timed request is answered by CLIENT UNBLOCK (it queued: neither granted nor refused), and \
         afterwards an owner at the far end of what the request waits for queues on the requester's key, after \
         which the same request is refused with `-DEADLOCK` (for the chain only a walk of all N links sees that).\n\n\
         - *queue*: N owners queued (as readers) on the requested key behind its writer holder; the request (a \
         writer) waits for all N.\n\
         - *chain*: N owners each hold a key and wait for the next one's; the request asks for the first key, so \
         the check walks N links and reads N keys.\n\
         - *semaphore*: the same blocking request on a full semaphore (`LOCK.SEMACQUIRE ... WAIT 0`), which is not \
         part of detection: what blocking costs without a check.\n\n\
         Figure: Redis's own time for the command (`c->duration`: the first try, the check, queueing, blocking \
         the client), from the SLOWLOG (threshold 0, one entry per request); mean and median. INFO commandstats \
         for the same requests is shown beside it: Redis 7.0 adds a blocked command's time there twice (when it \
         runs and again when it is unblocked), so it reads twice the work.\n"
    );
    let _ = writeln!(
        md,
        "| owners already waiting | samples | server µs / request | p50 µs | commandstats µs / call |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    let small = if q { 1_000 } else { 3_000 };
    let large = if q { 40 } else { 100 };
    let cases: [(&str, Waiting, usize, bool); 8] = [
        (
            "semaphore request, nobody queued (no check: semaphores are not part of detection)",
            Waiting::Semaphore(0),
            small,
            true,
        ),
        (
            "0 (the key's holder waits for nothing)",
            Waiting::Nobody,
            small,
            true,
        ),
        ("10, queue", Waiting::Queue(10), small, true),
        ("10, chain", Waiting::Chain(10), small, true),
        (
            "semaphore request, 10000 permit requests queued (no check)",
            Waiting::Semaphore(10_000),
            small,
            true,
        ),
        ("10000, queue", Waiting::Queue(10_000), large, true),
        ("10000, chain", Waiting::Chain(10_000), large, true),
        (
            "10000, queue, but the requester holds no key anyone waits for (walk skipped)",
            Waiting::Queue(10_000),
            small,
            false,
        ),
    ];
    let mut check_costs = Vec::new();
    for (label, waiting, samples, contended_own) in cases {
        step(&format!("deadlock check: {label}"));
        let r = detect::blocking_request(&server, waiting, samples, contended_own);
        let _ = writeln!(
            md,
            "| {label} | {} | {:.1} | {:.0} | {:.1} |",
            r.samples, r.mean_us, r.p50_us, r.commandstats_us
        );
        if contended_own {
            check_costs.push((waiting, r.mean_us));
        }
    }
    let cost_of = |waiting: Waiting| {
        check_costs
            .iter()
            .find(|(w, _)| *w == waiting)
            .map_or(f64::NAN, |(_, t)| *t)
    };
    let base = cost_of(Waiting::Nobody);
    let queue_per_owner = (cost_of(Waiting::Queue(10_000)) - base) / 10_000.0;
    let chain_per_owner = (cost_of(Waiting::Chain(10_000)) - base) / 10_000.0;
    let _ = writeln!(
        md,
        "\nAt 10000 waiting owners the check costs about {queue_per_owner:.2} µs per owner for a queue and \
         {chain_per_owner:.2} µs for a chain (the row minus the 0 row, divided by 10000), all of it inside the one \
         request: the server does nothing else meanwhile."
    );

    // 9. Contention as waiters grow.
    let _ = writeln!(md, "\n## 9. One key, more and more waiters\n");
    let _ = writeln!(
        md,
        "N clients (one connection and thread each) take the same lock in turn with `WAIT`, hold it for no \
         time and release it, so every release hands over to the head waiter (with one client there is \
         nobody to hand over to: each grant is immediate). Hand-overs per second over the \
         chain, release-to-grant latency, and the server time of LOCK.ACQUIRE + LOCK.RELEASE (INFO \
         commandstats) per hand-over.\n"
    );
    let _ = writeln!(
        md,
        "| waiters | hand-overs/s | p50 | p99 | server µs per hand-over |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|");
    let crowds: &[usize] = if q {
        &[1, 10, 100]
    } else {
        &[1, 10, 100, 1_000]
    };
    for &n in crowds {
        step(&format!("contention: {n} waiters"));
        let samples = if q { 400 } else { 2_000 };
        let mut c = server.connect();
        let began = Instant::now();
        let run = measure::handoff(&server, &module, n, 1, samples, Duration::from_secs(20));
        // The run lets its waiters queue for 200 ms before the chain starts.
        let chain = began.elapsed().saturating_sub(Duration::from_millis(200));
        // Every hand-over is one release and one grant; the chain also drains the waiters still
        // queued when enough samples were taken, so count them all from the server's figures.
        let (usec, calls) = server::command_usec(&mut c, &["lock.acquire", "lock.release"]);
        let handed = (calls / 2.0).max(1.0);
        let mut sorted = run.samples.clone();
        sorted.sort();
        let _ = writeln!(
            md,
            "| {n} | {:.0} | {} | {} | {:.1} |",
            handed / chain.as_secs_f64(),
            fmt_d(pct(&sorted, 0.5)),
            fmt_d(pct(&sorted, 0.99)),
            usec / handed,
        );
    }

    // 10. The same memory figures on each server of the matrix.
    let _ = writeln!(md, "\n## 10. Memory on each server\n");
    let _ = writeln!(
        md,
        "For capacity planning on each server binary found (Redis 7.0 and Valkey 8 are the tested \
         matrix), each measured on a fresh server of its own: `used_memory` per held lock ({n} locks, \
         32-byte owners), per idle client connection that has sent one command (PING), and how much more \
         it costs while it waits in a lock queue ({} waiters on one lock). Redis 7.0 keeps a query buffer \
         per client for a while after a command, where Valkey 8 shares one between idle clients: that is \
         most of the difference in the idle figure. The waiting figure is the server's state for a blocked \
         client (for a module-blocked one, temporary clients it allocates and pools), the query buffer a \
         blocked client keeps, and the module's queue entry (a few hundred bytes, section 5).\n",
        if q { 500 } else { 2_000 }
    );
    let _ = writeln!(
        md,
        "| server | bytes per held lock | bytes per idle connection | bytes more while waiting |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|");
    for binary in ["redis-server", "valkey-server"] {
        let s = match Server::start_binary(&o.module, Some(0), binary) {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(md, "| {binary} | not measured: {e} | | |");
                continue;
            }
        };
        step(&format!("memory on {binary}"));
        let per_lock = measure::memory_per_lock(&s, &module, n);
        let (per_conn, per_wait) =
            measure::memory_per_connection_and_wait(&s, if q { 500 } else { 2_000 });
        let _ = writeln!(
            md,
            "| {binary} {} | {per_lock:.0} | {per_conn:.0} | {per_wait:.0} |",
            s.version()
        );
    }

    // Targets: figures compared, nothing asserted.
    let module_handoff_p99 = handoffs.first().map_or(Duration::ZERO, |h| h.p99);
    let (first_held, last_held) = (held_costs.first().copied(), held_costs.last().copied());
    let flat = match (first_held, last_held) {
        (Some((a, ta)), Some((b, tb))) => format!("{:.2}x from {a} to {b} locks", tb / ta),
        _ => "n/a".into(),
    };
    let flat_ratio = match (first_held, last_held) {
        (Some((_, ta)), Some((_, tb))) => tb / ta,
        _ => f64::NAN,
    };
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    let mut targets = String::new();
    let _ = writeln!(
        targets,
        "## Targets
"
    );
    let _ = writeln!(targets, "| target | figure | |");
    let _ = writeln!(targets, "|---|---:|---|");
    let rows: [(&str, String, Option<bool>); 9] = [
        (
            "server time per acquire + release at most 1.2x SET NX PX + compare-and-delete",
            format!("{:.2}x", times[0] / floor),
            Some(times[0] / floor <= 1.2),
        ),
        (
            "handoff p99 at most 0.2 ms (16 waiters)",
            fmt_d(module_handoff_p99),
            Some(module_handoff_p99 <= Duration::from_micros(200)),
        ),
        (
            "crash hand-over at most 5 ms (worst round)",
            fmt_d(module_crash_max),
            Some(module_crash_max <= Duration::from_millis(5)),
        ),
        (
            "0 out-of-order grants",
            module_out_of_order.to_string(),
            Some(module_out_of_order == 0),
        ),
        (
            "memory per held lock at most 1.5x a SET NX key",
            format!("{:.2}x", mems[0] / mems[1]),
            Some(mems[0] / mems[1] <= 1.5),
        ),
        (
            "acquire + release cost flat with the number of locks held (within 1.3x)",
            flat,
            Some(flat_ratio <= 1.3),
        ),
        (
            "semaphore server time per acquire + release vs a sorted set + Lua semaphore (section 7)",
            format!("{sem_ratio:.2}x"),
            None,
        ),
        (
            "semaphore handoff p99 (16 waiters, capacity 4; section 7)",
            fmt_d(module_sem_p99),
            None,
        ),
        (
            "server time of a blocking lock request (deadlock check) with 0 / 10 / 10000 owners queued ahead (section 8)",
            format!(
                "{} / {} / {}",
                fmt_d(Duration::from_secs_f64(cost_of(Waiting::Nobody).max(0.0) / 1e6)),
                fmt_d(Duration::from_secs_f64(cost_of(Waiting::Queue(10)).max(0.0) / 1e6)),
                fmt_d(Duration::from_secs_f64(cost_of(Waiting::Queue(10_000)).max(0.0) / 1e6)),
            ),
            None,
        ),
    ];
    for (what, figure, ok) in rows {
        let _ = writeln!(
            targets,
            "| {what} | {figure} | {} |",
            ok.map_or("figure only", verdict)
        );
    }
    let _ = writeln!(targets);
    let md = targets + &md;
    let header = format!(
        "# Benchmarks\n\nOne run of `{}` ({} mode) on {}: {} cores, Redis {}, server pinned to CPU 0 and the \
         clients to CPU 1 ({}). Written by the tool; took {:.0} s.\n\n",
        if q { "make bench-quick" } else { "make bench" },
        if q { "quick" } else { "full" },
        machine(),
        online_cpus(),
        server.version(),
        if server::taskset_available() { "taskset" } else { "no taskset: unpinned" },
        started.elapsed().as_secs_f64()
    );
    let report = header + &md;
    if let Some(dir) = o.out.parent() {
        let _ = std::fs::create_dir_all(dir.join("img"));
        let _ = std::fs::write(dir.join("img/handoff.svg"), chart(&handoffs));
    }
    if let Err(e) = std::fs::write(&o.out, &report) {
        eprintln!("lock-bench: cannot write {}: {e}", o.out.display());
        std::process::exit(1);
    }
    println!("{report}");
}

/// CPUs of the machine (not of this pinned process).
fn online_cpus() -> usize {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|t| t.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(1)
        .max(1)
}

fn machine() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "an unknown CPU".into())
}

/// A horizontal bar chart of handoff p50 and p99 per approach, on a log scale (10 µs to 1 s).
fn chart(rows: &[Handoff]) -> String {
    let (w, left, right, row_h, top) = (900.0, 200.0, 170.0, 56.0, 50.0);
    let h = top + row_h * rows.len() as f64 + 50.0;
    let span = w - left - right;
    let x = |d: Duration| {
        let us = (d.as_secs_f64() * 1e6).clamp(10.0, 1e6);
        left + span * (us.log10() - 1.0) / 5.0
    };
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="13">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="10" y="22" font-size="15" font-weight="bold">Handoff latency, 16 waiters (release sent to next grant), log scale</text>"#
    );
    for (i, label) in ["10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s"]
        .iter()
        .enumerate()
    {
        let gx = left + span * i as f64 / 5.0;
        let _ = write!(
            s,
            r##"<line x1="{gx}" y1="{top}" x2="{gx}" y2="{}" stroke="#ddd"/>"##,
            h - 40.0
        );
        let _ = write!(
            s,
            r##"<text x="{gx}" y="{}" text-anchor="middle" fill="#555">{label}</text>"##,
            h - 22.0
        );
    }
    for (i, r) in rows.iter().enumerate() {
        let y = top + row_h * i as f64 + 8.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 8.0,
            y + 20.0,
            r.name
        );
        let _ = write!(
            s,
            r##"<rect x="{left}" y="{y}" width="{:.1}" height="16" fill="#4c78a8"/>"##,
            x(r.p50) - left
        );
        let _ = write!(
            s,
            r##"<rect x="{left}" y="{}" width="{:.1}" height="16" fill="#f58518"/>"##,
            y + 18.0,
            x(r.p99) - left
        );
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{}" fill="#333">p50 {}</text>"##,
            x(r.p50) + 4.0,
            y + 13.0,
            fmt_d(r.p50)
        );
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{}" fill="#333">p99 {} (n={})</text>"##,
            x(r.p99) + 4.0,
            y + 31.0,
            fmt_d(r.p99),
            r.n
        );
        let _ = r.max;
    }
    s.push_str("</svg>\n");
    s
}
