//! Server time per reader acquire + release (LOCK.RWREAD then LOCK.RELEASE, from INFO
//! commandstats) on a key that already has 1, 100 and 10,000 readers holding it. The cost must
//! not grow with the number of readers.
//!
//! Usage: `cargo run --release --example readers -- [port] [pairs]` (defaults 6379, 20000).
//! It runs FLUSHALL and CONFIG RESETSTAT on that server.

fn usec_per_call(stats: &str, command: &str) -> f64 {
    let prefix = format!("cmdstat_{command}:");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|a| a.parse().ok()).unwrap_or(6379);
    let pairs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut c = client.get_connection()?;
    println!("| readers already holding | RWREAD µs/call | RELEASE µs/call | pair µs |");
    println!("|---:|---:|---:|---:|");
    for readers in [1usize, 100, 10_000] {
        redis::cmd("FLUSHALL").query::<()>(&mut c)?;
        for chunk in (0..readers).collect::<Vec<_>>().chunks(1000) {
            let mut p = redis::pipe();
            for i in chunk {
                p.cmd("LOCK.RWREAD")
                    .arg("shared")
                    .arg(format!("reader-{i}"))
                    .arg(3_600_000)
                    .ignore();
            }
            p.query::<()>(&mut c)?;
        }
        redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut c)?;
        for batch in 0..pairs / 100 {
            let mut p = redis::pipe();
            for j in 0..100 {
                let owner = format!("probe-{batch}-{j}");
                p.cmd("LOCK.RWREAD")
                    .arg("shared")
                    .arg(&owner)
                    .arg(10_000)
                    .ignore();
                p.cmd("LOCK.RELEASE").arg("shared").arg(&owner).ignore();
            }
            p.query::<()>(&mut c)?;
        }
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut c)?;
        let read = usec_per_call(&stats, "lock.rwread");
        let release = usec_per_call(&stats, "lock.release");
        println!(
            "| {readers} | {read:.2} | {release:.2} | {:.2} |",
            read + release
        );
    }
    Ok(())
}
