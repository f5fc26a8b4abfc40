//! `lock-bench`: the module against the ways people lock with Redis today, in one run, on one
//! server that the tool starts itself (and, for Redlock, five more). Writes a markdown report
//! and SVG charts (in `img/` next to it).
//!
//! Usage: `lock-bench [--quick] [--module PATH] [--before PATH] [--worst-case-only] [--out
//! docs/benchmarks.md]`. `--before` names an earlier build of the module whose worst case per
//! command (section 13) is measured beside this one's; `--worst-case-only` runs that section
//! alone and writes only it.
//! (`make bench` / `make bench-quick` build the module and run it pinned to a core).

mod aio;
mod chart;
mod detect;
mod locks;
mod measure;
mod redlock;
mod server;
mod worst;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chart::{bar_chart, fmt_bytes, fmt_num, fmt_us, fmt_us1, Panel, Scale, Series};
use detect::Waiting;
use locks::{Lock, LuaFair, Module, ModuleSemaphore, SetNx, ZsetSemaphore};
use redis_lock_client::WaitStrategy;
use server::Server;

struct Options {
    quick: bool,
    module: PathBuf,
    out: PathBuf,
    /// An earlier build, for section 13's before / after.
    before: Option<PathBuf>,
    worst_case_only: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        module: PathBuf::from("target/release/libredis_lock.so"),
        out: PathBuf::from("docs/benchmarks.md"),
        before: None,
        worst_case_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--module" => o.module = args.next().ok_or("--module needs a path")?.into(),
            "--out" => o.out = args.next().ok_or("--out needs a path")?.into(),
            "--before" => o.before = Some(args.next().ok_or("--before needs a path")?.into()),
            "--worst-case-only" => o.worst_case_only = true,
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
    if o.worst_case_only {
        let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
        let mut md = String::new();
        section_worst_case(&mut md, &o, &step);
        if let Err(e) = std::fs::write(&o.out, &md) {
            eprintln!("lock-bench: cannot write {}: {e}", o.out.display());
            std::process::exit(1);
        }
        println!("{md}");
        return;
    }
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
    // (file name under img/, SVG), written next to the report at the end.
    let mut charts: Vec<(&str, String)> = Vec::new();
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
        "{rounds} rounds; in each, 16 waiters arrive one after another while the lock is held, then it is \
         released. Where the approach keeps a queue on the server, each waiter starts once the server shows the one \
         before it queued; SET NX polling has none, so its waiters start 5 ms apart. A grant is out of order when a \
         waiter that arrived earlier was still waiting.\n"
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
    step("memory per reader");
    let readers = n;
    let per_key: &[usize] = &[1, 10, 100, 1_000, readers];
    let reader_mems: Vec<(usize, f64)> = per_key
        .iter()
        .map(|&k| (k, measure::memory_per_reader(&server, readers, k)))
        .collect();
    let _ = writeln!(
        md,
        "\nShared (read) locks: `used_memory` per reader over {readers} readers with 32-byte owners, N readers to a key (with one reader a key is the compact form above; from two on, the readers of a key are indexed by owner and by expiry).\n\n\
         | readers per key | bytes per reader | vs a SET NX key |\n|---:|---:|---:|"
    );
    for (k, m) in &reader_mems {
        let _ = writeln!(md, "| {k} | {m:.0} | {:.2}x |", m / mems[1]);
    }
    let worst_reader = reader_mems.iter().map(|(_, m)| *m).fold(0.0f64, f64::max);
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
    // (locks held, the module's figures, the SET NX baseline's figures)
    let mut held_costs = Vec::new();
    for &h in held {
        step(&format!("scale: {h} locks held"));
        let (m, base) = measure::costs_with_locks_held(&server, &module, &setnx, h, 20_000);
        let _ = writeln!(
            md,
            "| acquire + release with {h} locks held: module / SET NX baseline | {:.2} µs / {:.2} µs |",
            m.usec, base.usec
        );
        held_costs.push((h, m, base));
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
    let held_memory_ratio = scale_table(&mut md, &held_costs, &mut charts);

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
         which the same request is refused with `-DEADLOCK` (for the chain only a walk of all N links sees that; \
         that check runs with `lock.deadlock-budget` raised so the walk is not cut). Since version 3 the check \
         searches backwards, from the owners that wait for the requester (here the one bystander), so these \
         setups no longer make it walk the queue or the chain: section 13 has the states that cost the most now.\n\n\
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
    // Since version 3 the check walks backwards from the requester and skips owners that wait
    // for nothing it holds, so the queue and the chain cost about what the 0 row does: say so
    // rather than print a per-owner cost of 0.00.
    let extra = cost_of(Waiting::Queue(10_000)).max(cost_of(Waiting::Chain(10_000))) - base;
    let _ = if queue_per_owner.max(chain_per_owner) >= 0.005 {
        writeln!(
            md,
            "\nAt 10000 waiting owners the check costs about {queue_per_owner:.2} µs per owner for a queue and \
             {chain_per_owner:.2} µs for a chain (the row minus the 0 row, divided by 10000), all of it inside the one \
             request: the server does nothing else meanwhile."
        )
    } else {
        writeln!(
            md,
            "\nWith 10000 owners waiting the request costs within {extra:.1} µs of the 0 row: the check does not walk \
             owners that wait for nothing the requester holds (section 13 has a check that walks its whole budget)."
        )
    };

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
    // (waiters, hand-overs/s, server µs per hand-over)
    let mut contention = Vec::new();
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
        contention.push((n, handed / chain.as_secs_f64(), usec / handed));
    }
    let _ = writeln!(md, "\n![hand-overs as waiters grow](img/contention.svg)");
    let groups: Vec<String> = contention
        .iter()
        .map(|(n, _, _)| format!("{n} waiter{}", if *n == 1 { "" } else { "s" }))
        .collect();
    charts.push((
        "contention.svg",
        bar_chart(
            "One key, more and more waiters (section 9)",
            &[
                Panel {
                    title: "hand-overs per second".into(),
                    groups: groups.clone(),
                    series: vec![Series::new(
                        "hand-overs/s",
                        contention.iter().map(|c| c.1).collect(),
                    )],
                    scale: Scale::Linear,
                    format: fmt_num,
                },
                Panel {
                    title: "server time per hand-over (LOCK.ACQUIRE + LOCK.RELEASE)".into(),
                    groups,
                    series: vec![Series::new(
                        "server µs",
                        contention.iter().map(|c| c.2).collect(),
                    )],
                    scale: Scale::Linear,
                    format: fmt_us1,
                },
            ],
        ),
    ));

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
    // (server, bytes per held lock, per idle connection, more while waiting)
    let mut per_server: Vec<(String, f64, f64, f64)> = Vec::new();
    for binary in ["redis-server", "valkey-server"] {
        let s = match Server::start_binary(&o.module, Some(0), binary) {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(md, "| {binary} | not measured: {e} | | |");
                per_server.push((binary.into(), f64::NAN, f64::NAN, f64::NAN));
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
        per_server.push((
            format!("{binary} {}", s.version()),
            per_lock,
            per_conn,
            per_wait,
        ));
    }
    let _ = writeln!(md, "\n![memory by approach and by server](img/memory.svg)");
    let servers: Vec<String> = per_server.iter().map(|p| p.0.clone()).collect();
    charts.push((
        "memory.svg",
        bar_chart(
            "Memory (sections 5 and 10)",
            &[
                Panel {
                    title: format!("bytes per held lock, by approach ({n} locks, section 5)"),
                    groups: approaches.iter().map(|l| l.name().to_string()).collect(),
                    series: vec![Series::new("bytes per held lock", mems.clone())],
                    scale: Scale::Linear,
                    format: fmt_bytes,
                },
                Panel {
                    title: "bytes per held lock, module, by server (section 10)".into(),
                    groups: servers.clone(),
                    series: vec![Series::new(
                        "bytes per held lock",
                        per_server.iter().map(|p| p.1).collect(),
                    )],
                    scale: Scale::Linear,
                    format: fmt_bytes,
                },
                Panel {
                    title: "bytes per client connection, by server (section 10)".into(),
                    groups: servers,
                    series: vec![
                        Series::new("idle", per_server.iter().map(|p| p.2).collect()),
                        Series::new(
                            "more while waiting in a lock queue",
                            per_server.iter().map(|p| p.3).collect(),
                        ),
                    ],
                    scale: Scale::Linear,
                    format: fmt_bytes,
                },
            ],
        ),
    ));

    let redlock_figures = section_redlock(&mut md, &mut charts, &o.module, q, &step);
    let async_figures = section_async(&mut md, &server, q, &step);
    section_worst_case(&mut md, &o, &step);

    // Targets: figures compared, nothing asserted.
    let module_handoff_p99 = handoffs.first().map_or(Duration::ZERO, |h| h.p99);
    // The fewest and the most locks held in section 6.
    let (first_held, last_held) = (
        held_costs.first().map(|(h, _, _)| *h),
        held_costs.last().map(|(h, _, _)| *h),
    );
    // Flat means the module adds no cost of its own as locks pile up. Redis's keyspace does
    // (a bigger dictionary, more cache misses): in runs on this machine the SET NX baseline
    // grew between 1.35x and 2.18x from 1k to 1M keys, and the module's figure moved with it
    // (between 1.24x and 1.81x). So the target compares the module's growth with the
    // baseline's in the same run, and the raw growth of both is shown.
    let growth = |pick: fn(&(usize, measure::HeldCost, measure::HeldCost)) -> f64| match (
        held_costs.first(),
        held_costs.last(),
    ) {
        (Some(a), Some(b)) if held_costs.len() > 1 => pick(b) / pick(a),
        _ => f64::NAN,
    };
    let module_growth = growth(|(_, m, _)| m.usec);
    let base_growth = growth(|(_, _, b)| b.usec);
    let flat_ratio = module_growth / base_growth;
    let flat = match (first_held, last_held) {
        (Some(a), Some(b)) => format!(
            "{flat_ratio:.2}x (module {module_growth:.2}x, SET NX {base_growth:.2}x from {a} to {b} locks)"
        ),
        _ => "n/a".into(),
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
    let rows: [(&str, String, Option<bool>); 14] = [
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
            "memory per held lock at most 1.2x a SET NX key",
            format!("{:.2}x", mems[0] / mems[1]),
            Some(mems[0] / mems[1] <= 1.2),
        ),
        (
            "memory per reader of a shared lock at most 1.2x a SET NX key (section 5, worst of 1 to all readers on a key)",
            format!("{:.2}x", worst_reader / mems[1]),
            Some(worst_reader / mems[1] <= 1.2),
        ),
        (
            "acquire + release cost flat with the number of locks held: the module's growth at most 1.1x the SET NX baseline's (Redis's own keyspace) in the same run",
            flat,
            Some(flat_ratio <= 1.1),
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
        (
            "memory per held lock, module, as the number of locks held grows (section 6)",
            match (first_held, last_held) {
                (Some(a), Some(b)) => {
                    format!("{held_memory_ratio:.2}x from {a} to {b} locks")
                }
                _ => "n/a".into(),
            },
            None,
        ),
        (
            "Redlock over 5 servers, uncontended acquire + release p50: Redlock / LockClient on one server (section 11)",
            redlock_figures.latency.clone(),
            None,
        ),
        (
            "Redlock waiter cost, lock commands per second per waiter on the busiest server, 16 waiters: queued / polling (section 11)",
            redlock_figures.waiter_cost.clone(),
            None,
        ),
        (
            "async client uncontended acquire + release p50: AsyncLockClient / raw commands (section 12)",
            async_figures,
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
    charts.push(("handoff.svg", handoff_chart(&handoffs)));
    if let Some(dir) = o.out.parent() {
        let img = dir.join("img");
        if let Err(e) = std::fs::create_dir_all(&img) {
            eprintln!("lock-bench: cannot create {}: {e}", img.display());
        }
        for (name, svg) in &charts {
            if let Err(e) = std::fs::write(img.join(name), svg) {
                eprintln!("lock-bench: cannot write {}: {e}", img.join(name).display());
            }
        }
    }
    // The sections measured elsewhere (the Rust client's by its own tests, the version 4 bounds
    // by their scripts) are kept as they were.
    let mut report = report;
    if let Ok(old) = std::fs::read_to_string(&o.out) {
        for (start, end) in [
            (V4_BOUNDS_START, V4_BOUNDS_END),
            (RUST_CLIENT_START, RUST_CLIENT_END),
        ] {
            if let Some(kept) = marked_section(&old, start, end) {
                report.push('\n');
                report.push_str(kept);
                report.push('\n');
            }
        }
    }
    if let Err(e) = std::fs::write(&o.out, &report) {
        eprintln!("lock-bench: cannot write {}: {e}", o.out.display());
        std::process::exit(1);
    }
    println!("{report}");
}

/// The markers around the Rust client's section of docs/benchmarks.md (loss-detection
/// latency, from `cargo test -p redis-lock-client --test loss_latency`).
const RUST_CLIENT_START: &str = "<!-- rust-client:start -->";
const RUST_CLIENT_END: &str = "<!-- rust-client:end -->";

/// The markers around the version 4 bounds (first waiter, closing connection, WAIT deadlines),
/// measured by scripts/first-waiter-cost.py, bound-close-cost.py and wait-lateness.py.
const V4_BOUNDS_START: &str = "<!-- v4-bounds:start -->";
const V4_BOUNDS_END: &str = "<!-- v4-bounds:end -->";

/// The text from `start` to `end` (both included), if `text` has them in that order.
fn marked_section<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)?;
    let to = text[from..].find(end)? + from + end.len();
    text.get(from..to)
}

/// Section 13: the worst case per command (see `worst`), on a fresh server per build: this
/// one, and `--before` when given.
fn section_worst_case(md: &mut String, o: &Options, step: &dyn Fn(&str)) {
    let _ = writeln!(md, "\n## 13. Worst case per command\n");
    let _ = writeln!(
        md,
        "Server time of each lock command in the states that cost the most, all at once on one \
         server: a key with {} readers and a writer queued behind them; a chain of {} locks, each \
         holder waiting for the next key, whose end waits for the requester's own key; a semaphore \
         of 100,000 permits, all held; about 10,000 queues. The requests that close a cycle do so \
         through the writer (on the readers' key) and through the far end of the chain. Each \
         request alone, its time from the SLOWLOG (the figure INFO commandstats adds up; a request \
         that waited is taken out with CLIENT UNBLOCK ... ERROR, and commandstats is not shown for \
         it since Redis 7.0 counts such a request twice). Default settings (`lock.deadlock-budget` \
         500).\n",
        worst::READERS,
        worst::CHAIN,
    );
    let mut builds: Vec<(String, Vec<worst::Row>)> = Vec::new();
    let mut runs: Vec<(String, &std::path::Path)> = Vec::new();
    if let Some(before) = &o.before {
        runs.push(("before".into(), before.as_path()));
    }
    runs.push((
        if o.before.is_some() {
            "after"
        } else {
            "this build"
        }
        .into(),
        &o.module,
    ));
    for (name, module) in runs {
        step(&format!("worst case: {name} ({})", module.display()));
        let server = match Server::start(module, Some(0)) {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(md, "({name}: the server did not start: {e})\n");
                continue;
            }
        };
        builds.push((name, worst::measure(&server, o.quick, step)));
    }
    let refs: Vec<(&str, &[worst::Row])> = builds
        .iter()
        .map(|(n, r)| (n.as_str(), r.as_slice()))
        .collect();
    worst::table(md, &refs);
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

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Handoff p50 and p99 per approach (section 2), on a log scale.
fn handoff_chart(rows: &[Handoff]) -> String {
    bar_chart(
        "Handoff latency, 16 waiters (release sent to next grant), log scale",
        &[Panel {
            title: String::new(),
            groups: rows
                .iter()
                .map(|r| format!("{} (n={})", r.name, r.n))
                .collect(),
            series: vec![
                Series::new("p50", rows.iter().map(|r| us(r.p50)).collect()),
                Series::new("p99", rows.iter().map(|r| us(r.p99)).collect()),
            ],
            scale: Scale::Log,
            format: fmt_us,
        }],
    )
}

/// Section 6's growth table: each figure at every number of locks held and its last / first
/// ratio, and its chart. Returns the module's memory ratio.
fn scale_table(
    md: &mut String,
    held: &[(usize, measure::HeldCost, measure::HeldCost)],
    charts: &mut Vec<(&str, String)>,
) -> f64 {
    let (Some(first), Some(last)) = (held.first(), held.last()) else {
        return f64::NAN;
    };
    let _ = writeln!(
        md,
        "\nHow each figure grows with the number of locks held: the acquire + release rows above, and \
         `used_memory` per held lock, read while those locks were held (they are taken over a connection \
         of their own, closed before the reading, so its buffers are not counted).\n"
    );
    let mut head = "| figure |".to_string();
    let mut rule = "|---|".to_string();
    for (h, _, _) in held {
        let _ = write!(head, " {h} locks |");
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{head} {} / {} |", last.0, first.0);
    let _ = writeln!(md, "{rule}---:|");
    type Pick = fn(&(usize, measure::HeldCost, measure::HeldCost)) -> f64;
    let rows: [(&str, Pick, bool); 4] = [
        (
            "server µs per acquire + release, module",
            |r| r.1.usec,
            false,
        ),
        (
            "server µs per acquire + release, SET NX baseline",
            |r| r.2.usec,
            false,
        ),
        ("bytes per held lock, module", |r| r.1.bytes_per_lock, true),
        (
            "bytes per held lock, SET NX baseline",
            |r| r.2.bytes_per_lock,
            true,
        ),
    ];
    for (label, pick, bytes) in rows {
        let mut line = format!("| {label} |");
        for r in held {
            if bytes {
                let _ = write!(line, " {:.0} |", pick(r));
            } else {
                let _ = write!(line, " {:.2} |", pick(r));
            }
        }
        let _ = writeln!(md, "{line} {:.2}x |", pick(last) / pick(first));
    }
    let _ = writeln!(md, "\n![growth with the locks held](img/scale.svg)");
    let groups = vec!["module".to_string(), "SET NX baseline".to_string()];
    let per_held = |f: fn(&measure::HeldCost) -> f64| -> Vec<Series> {
        held.iter()
            .map(|(h, m, b)| Series::new(format!("{h} locks"), vec![f(m), f(b)]))
            .collect()
    };
    charts.push((
        "scale.svg",
        bar_chart(
            "Growth with the number of locks held (section 6)",
            &[
                Panel {
                    title: "server time per acquire + release".into(),
                    groups: groups.clone(),
                    series: per_held(|c| c.usec),
                    scale: Scale::Linear,
                    format: fmt_us1,
                },
                Panel {
                    title: "used_memory per held lock".into(),
                    groups,
                    series: per_held(|c| c.bytes_per_lock),
                    scale: Scale::Linear,
                    format: fmt_bytes,
                },
            ],
        ),
    ));
    last.1.bytes_per_lock / first.1.bytes_per_lock
}

/// Section 11's figures for the targets table.
struct RedlockFigures {
    latency: String,
    waiter_cost: String,
}

/// Section 11: Redlock over five servers started for it.
fn section_redlock(
    md: &mut String,
    charts: &mut Vec<(&str, String)>,
    module: &std::path::Path,
    q: bool,
    step: &dyn Fn(&str),
) -> RedlockFigures {
    let not_measured = |e: &str| RedlockFigures {
        latency: format!("not measured: {e}"),
        waiter_cost: format!("not measured: {e}"),
    };
    let _ = writeln!(md, "\n## 11. Redlock over 5 servers\n");
    step("redlock: starting 5 servers");
    let servers = match redlock::start(module, 5, Some(0)) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(md, "Not measured: {e}");
            return not_measured(&e);
        }
    };
    let samples = if q { 300 } else { 2_000 };
    let _ = writeln!(
        md,
        "The Rust client's `Redlock` (redis-lock-client, the sync API) over five servers of its own, \
         each a redis-server with the module on a loopback port, pinned like the main one; quorum 3, \
         per-server timeout 500 ms. Uncontended: acquire + release of a free lock, from the acquire \
         call to the release's return ({samples} samples; the three take turns, `LockClient` and the \
         raw commands on the first of the five servers).\n"
    );
    step("redlock: uncontended");
    let u = match redlock::uncontended(&servers, samples) {
        Ok(u) => u,
        Err(e) => {
            let _ = writeln!(md, "Not measured: {e}");
            return not_measured(&e);
        }
    };
    let _ = writeln!(md, "| client | p50 | p99 |");
    let _ = writeln!(md, "|---|---:|---:|");
    for (label, s) in [
        ("`Redlock`, 5 servers (quorum 3)", &u.redlock),
        ("`LockClient`, 1 server", &u.single),
        ("raw `LOCK.ACQUIRE` + `LOCK.RELEASE`, 1 server", &u.raw),
    ] {
        let _ = writeln!(
            md,
            "| {label} | {} | {} |",
            fmt_d(pct(s, 0.5)),
            fmt_d(pct(s, 0.99))
        );
    }
    let latency = format!(
        "{} / {}",
        fmt_d(pct(&u.redlock, 0.5)),
        fmt_d(pct(&u.single, 0.5))
    );

    let crowds: [(usize, usize); 2] = if q {
        [(4, 10), (16, 3)]
    } else {
        [(4, 60), (16, 15)]
    };
    let settle = Duration::from_millis(if q { 300 } else { 1_000 });
    let window = Duration::from_secs(if q { 1 } else { 2 });
    let _ = writeln!(
        md,
        "\nContended: W threads ask for one key (`Acquire::write(30 s).wait(30 s)`) while another \
         holds it. *Waiter cost*: the lock commands (every `LOCK.*`, INFO commandstats) each server \
         received over {} s of waiting (from {} ms after the waiters asked), per second and per \
         waiter, on the busiest of the five. Queued (`WaitStrategy::Queue`, the default) waits in \
         the queue of one server chosen by the key, in slices of up to a second, and asks the others \
         when that one grants; polling (`WaitStrategy::Poll`) retries the whole attempt after 1 to \
         20 ms. *Hand-over*: then the holder releases and each waiter in turn gets the lock, holds it \
         1 ms and releases it; from a release call to the next holder's acquire returning \
         ({} rounds of 4 waiters, {} of 16: W hand-overs a round; the later rounds start {} ms \
         after the waiters asked).\n",
        window.as_secs(),
        settle.as_millis(),
        crowds[0].1,
        crowds[1].1,
        redlock::LATER_SETTLE.as_millis()
    );
    let _ = writeln!(
        md,
        "| waiters | waiting | lock commands/s per waiter, busiest server | hand-overs | p50 | p99 |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|---:|");
    let strategies = [
        (WaitStrategy::Queue, "queued (default)"),
        (WaitStrategy::Poll, "polling"),
    ];
    // [crowd][strategy]: (commands/s per waiter, p50 µs, p99 µs)
    let mut figures = vec![vec![(f64::NAN, f64::NAN, f64::NAN); 2]; crowds.len()];
    for (ci, &(waiters, rounds)) in crowds.iter().enumerate() {
        for (si, &(strategy, label)) in strategies.iter().enumerate() {
            step(&format!("redlock: {waiters} waiters, {label}"));
            match redlock::contended(&servers, strategy, waiters, rounds, settle, window) {
                Ok(c) => {
                    let (p50, p99) = (pct(&c.handovers, 0.5), pct(&c.handovers, 0.99));
                    let _ = writeln!(
                        md,
                        "| {waiters} | {label} | {:.1} | {} | {} | {} |",
                        c.commands_per_waiter,
                        c.handovers.len(),
                        fmt_d(p50),
                        fmt_d(p99)
                    );
                    figures[ci][si] = (c.commands_per_waiter, us(p50), us(p99));
                }
                Err(e) => {
                    let _ = writeln!(md, "| {waiters} | {label} | not measured: {e} | | | |");
                }
            }
        }
    }
    let _ = writeln!(md, "\n![Redlock waiters](img/redlock.svg)");
    let groups: Vec<String> = crowds.iter().map(|c| format!("{} waiters", c.0)).collect();
    let column = |si: usize, f: fn(&(f64, f64, f64)) -> f64| -> Vec<f64> {
        figures.iter().map(|row| f(&row[si])).collect()
    };
    charts.push((
        "redlock.svg",
        bar_chart(
            "Redlock over 5 servers, waiters on one key (section 11), log scales",
            &[
                Panel {
                    title: "lock commands per second per waiter, busiest server".into(),
                    groups: groups.clone(),
                    series: vec![
                        Series::new("queued (default)", column(0, |f| f.0)),
                        Series::new("polling", column(1, |f| f.0)),
                    ],
                    scale: Scale::Log,
                    format: fmt_num,
                },
                Panel {
                    title: "hand-over, release call to the next holder's grant".into(),
                    groups,
                    series: vec![
                        Series::new("queued p50", column(0, |f| f.1)),
                        Series::new("queued p99", column(0, |f| f.2)),
                        Series::new("polling p50", column(1, |f| f.1)),
                        Series::new("polling p99", column(1, |f| f.2)),
                    ],
                    scale: Scale::Log,
                    format: fmt_us,
                },
            ],
        ),
    ));
    let last = figures
        .last()
        .map_or((f64::NAN, f64::NAN), |row| (row[0].0, row[1].0));
    RedlockFigures {
        latency,
        waiter_cost: format!("{:.1} / {:.1}", last.0, last.1),
    }
}

/// Section 12: the async client on the main server. Returns the targets table's figure.
fn section_async(md: &mut String, server: &Server, q: bool, step: &dyn Fn(&str)) -> String {
    let _ = writeln!(md, "\n## 12. The Rust async client\n");
    let samples = if q { 300 } else { 2_000 };
    let (handoff_samples, budget) = if q {
        (1_000, Duration::from_secs(2))
    } else {
        (5_000, Duration::from_secs(5))
    };
    let _ = writeln!(
        md,
        "`AsyncLockClient` (redis-lock-client on tokio, a multi-threaded runtime of two workers) on \
         the main server, next to the same commands sent raw over redis's async connections on the \
         same runtime. Uncontended: `try_lock` + `release` of a free lock against `LOCK.ACQUIRE` + \
         `LOCK.RELEASE` over one multiplexed connection, from the call to the release's return \
         ({samples} samples each, taking turns).\n"
    );
    let rt = match aio::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(md, "Not measured: {e}");
            return format!("not measured: {e}");
        }
    };
    step("async client: uncontended");
    let target = match rt.block_on(aio::uncontended(server, samples)) {
        Ok(u) => {
            let _ = writeln!(md, "| path | p50 | p99 |");
            let _ = writeln!(md, "|---|---:|---:|");
            for (label, s) in [
                ("`AsyncLockClient`", &u.client),
                ("raw commands, multiplexed connection", &u.raw),
            ] {
                let _ = writeln!(
                    md,
                    "| {label} | {} | {} |",
                    fmt_d(pct(s, 0.5)),
                    fmt_d(pct(s, 0.99))
                );
            }
            format!(
                "{} / {}",
                fmt_d(pct(&u.client, 0.5)),
                fmt_d(pct(&u.raw, 0.5))
            )
        }
        Err(e) => {
            let _ = writeln!(md, "Not measured: {e}");
            format!("not measured: {e}")
        }
    };
    let _ = writeln!(
        md,
        "\nContended: 16 tasks loop acquire (waiting) / release on one key, as section 2: from a \
         release being sent to the next grant's reply, until {handoff_samples} hand-overs or {} s. \
         The client's tasks share one `AsyncLockClient` (`lock(key, ttl, wait)`, whose waits take \
         dedicated connections); the raw tasks have a multiplexed connection each and send \
         `LOCK.ACQUIRE ... WAIT`.\n",
        budget.as_secs()
    );
    let _ = writeln!(md, "| path | samples | p50 | p99 | hand-overs/s |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for (label, raw) in [
        ("`AsyncLockClient`", false),
        ("raw commands, a connection per task", true),
    ] {
        step(&format!("async client: hand-over, {label}"));
        match rt.block_on(aio::handoff(server, raw, 16, handoff_samples, budget)) {
            Ok(h) => {
                let _ = writeln!(
                    md,
                    "| {label} | {} | {} | {} | {:.0} |",
                    h.samples.len(),
                    fmt_d(pct(&h.samples, 0.5)),
                    fmt_d(pct(&h.samples, 0.99)),
                    h.per_second
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| {label} | not measured: {e} | | | |");
            }
        }
    }
    target
}
