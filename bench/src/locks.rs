//! The locks compared: the module, and the ways people lock with Redis today, written here the
//! way their libraries and the popular articles write them.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

/// One way to lock. Every call uses the caller's connection.
pub trait Lock: Send + Sync {
    fn name(&self) -> &'static str;
    /// Loads scripts (once per server).
    fn prepare(&self, _c: &mut Connection) {}
    /// One attempt, no waiting.
    fn try_acquire(&self, c: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> bool;
    /// Waits up to `timeout` for the lock.
    fn acquire(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> bool;
    fn release(&self, c: &mut Connection, key: &str, owner: &str) -> bool;
    /// The top-level commands one acquire + release runs (for INFO commandstats).
    fn commands(&self) -> &'static [&'static str];
    /// A pipeline-able acquire, for filling the server with held locks.
    fn acquire_cmd(&self, key: &str, owner: &str, ttl_ms: u64) -> redis::Cmd;
    /// How many clients the server has queued for `key`, for an approach that keeps a queue
    /// there (None: it keeps none, so the order in which waiters arrived cannot be seen).
    fn queued(&self, _c: &mut Connection, _key: &str) -> Option<i64> {
        None
    }
}

/// Clients waiting for `key` in the module's queue (LOCK.INFO `waiting`; 0 for a missing key).
pub fn module_waiting(c: &mut Connection, key: &str) -> i64 {
    let v: Vec<Value> = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(c)
        .unwrap_or_default();
    v.chunks(2)
        .find_map(|p| match p {
            [Value::BulkString(k), Value::Int(n)] if k == b"waiting" => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

/// Tries `attempt` every `poll` until it succeeds or `timeout` has passed (the sleep-and-retry
/// loop of polling locks and semaphores).
fn poll_until(timeout: Duration, poll: Duration, mut attempt: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + timeout;
    loop {
        if attempt() {
            return true;
        }
        let now = Instant::now();
        if now >= give_up {
            return false;
        }
        std::thread::sleep(poll.min(give_up - now));
    }
}

fn is_int(v: redis::RedisResult<Value>) -> bool {
    matches!(v, Ok(Value::Int(_)))
}

/// The module: LOCK.ACQUIRE (with server-side WAIT) and LOCK.RELEASE.
pub struct Module;

impl Lock for Module {
    fn name(&self) -> &'static str {
        "module"
    }
    fn try_acquire(&self, c: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> bool {
        is_int(self.acquire_cmd(key, owner, ttl_ms).query(c))
    }
    fn acquire(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> bool {
        let wait = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        is_int(
            redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(owner)
                .arg(ttl_ms)
                .arg("WAIT")
                .arg(wait)
                .query(c),
        )
    }
    fn release(&self, c: &mut Connection, key: &str, owner: &str) -> bool {
        is_int(redis::cmd("LOCK.RELEASE").arg(key).arg(owner).query(c))
    }
    fn commands(&self) -> &'static [&'static str] {
        &["lock.acquire", "lock.release"]
    }
    fn acquire_cmd(&self, key: &str, owner: &str, ttl_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(key).arg(owner).arg(ttl_ms);
        cmd
    }
    fn queued(&self, c: &mut Connection, key: &str) -> Option<i64> {
        Some(module_waiting(c, key))
    }
}

/// The release every SET NX lock uses: delete the key only if it still holds our token.
const COMPARE_AND_DELETE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

fn load_script(c: &mut Connection, body: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(body)
        .query(c)
        .expect("SCRIPT LOAD")
}

/// `SET key token NX PX ttl` + compare-and-delete Lua release. A blocking acquire sleeps and
/// retries, as redis-py's `Lock` does (its default sleep is 0.1 s).
pub struct SetNx {
    pub poll: Duration,
    sha: std::sync::OnceLock<String>,
}

impl SetNx {
    pub fn new(poll: Duration) -> Self {
        SetNx {
            poll,
            sha: std::sync::OnceLock::new(),
        }
    }
}

impl Lock for SetNx {
    fn name(&self) -> &'static str {
        "SET NX + polling"
    }
    fn prepare(&self, c: &mut Connection) {
        let sha = load_script(c, COMPARE_AND_DELETE);
        let _ = self.sha.set(sha);
    }
    fn try_acquire(&self, c: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> bool {
        matches!(
            self.acquire_cmd(key, owner, ttl_ms).query(c),
            Ok(Value::Okay)
        )
    }
    fn acquire(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> bool {
        poll_until(timeout, self.poll, || {
            self.try_acquire(c, key, owner, ttl_ms)
        })
    }
    fn release(&self, c: &mut Connection, key: &str, owner: &str) -> bool {
        let sha = self.sha.get().expect("prepared");
        matches!(
            redis::cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg(key)
                .arg(owner)
                .query(c),
            Ok(Value::Int(1))
        )
    }
    fn commands(&self) -> &'static [&'static str] {
        &["set", "evalsha"]
    }
    fn acquire_cmd(&self, key: &str, owner: &str, ttl_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(owner).arg("NX").arg("PX").arg(ttl_ms);
        cmd
    }
}

/// A fair reentrant lock in Lua, as the popular articles build it: a hash (owner, count) with
/// a TTL, a FIFO list of waiting owners, and a per-waiter list the releaser pushes to, on which
/// the waiter BLPOPs. A waiter wakes at the latest every `poll` to notice a holder that expired
/// (nobody pushes for a crashed holder).
pub struct LuaFair {
    pub poll: Duration,
    shas: std::sync::OnceLock<(String, String)>,
}

const FAIR_ACQUIRE: &str = r#"
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not owner then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if (not head) or head == ARGV[1] then
    if head then redis.call('LPOP', KEYS[2]) end
    redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
  end
end
if ARGV[3] == '1' and not redis.call('LPOS', KEYS[2], ARGV[1]) then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
return 0
"#;

const FAIR_RELEASE: &str = r#"
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
local left = redis.call('HINCRBY', KEYS[1], 'count', -1)
if left > 0 then return left end
redis.call('DEL', KEYS[1])
local head = redis.call('LINDEX', KEYS[2], 0)
if head then
  redis.call('RPUSH', ARGV[2] .. head, '1')
  redis.call('PEXPIRE', ARGV[2] .. head, 60000)
end
return 0
"#;

impl LuaFair {
    pub fn new(poll: Duration) -> Self {
        LuaFair {
            poll,
            shas: std::sync::OnceLock::new(),
        }
    }

    /// The acquire script call; with `enqueue` a refused caller joins the FIFO list.
    fn script_cmd(&self, key: &str, owner: &str, ttl_ms: u64, enqueue: bool) -> redis::Cmd {
        let (acquire, _) = self.shas.get().expect("prepared");
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(acquire)
            .arg(2)
            .arg(key)
            .arg(format!("{key}:queue"))
            .arg(owner)
            .arg(ttl_ms)
            .arg(if enqueue { "1" } else { "0" });
        cmd
    }

    fn attempt(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        enqueue: bool,
    ) -> bool {
        matches!(
            self.script_cmd(key, owner, ttl_ms, enqueue).query(c),
            Ok(Value::Int(1))
        )
    }
}

impl Lock for LuaFair {
    fn name(&self) -> &'static str {
        "Lua fair lock + BLPOP"
    }
    fn prepare(&self, c: &mut Connection) {
        let shas = (load_script(c, FAIR_ACQUIRE), load_script(c, FAIR_RELEASE));
        let _ = self.shas.set(shas);
    }
    fn try_acquire(&self, c: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> bool {
        self.attempt(c, key, owner, ttl_ms, false)
    }
    fn acquire(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> bool {
        let give_up = Instant::now() + timeout;
        let wake = format!("{key}:wake:{owner}");
        loop {
            if self.attempt(c, key, owner, ttl_ms, true) {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&wake).query(c);
                return true;
            }
            let now = Instant::now();
            if now >= give_up {
                let _: redis::RedisResult<()> = redis::cmd("LREM")
                    .arg(format!("{key}:queue"))
                    .arg(0)
                    .arg(owner)
                    .query(c);
                return false;
            }
            let wait = self.poll.min(give_up - now).as_secs_f64().max(0.001);
            let _: redis::RedisResult<Value> = redis::cmd("BLPOP").arg(&wake).arg(wait).query(c);
        }
    }
    fn release(&self, c: &mut Connection, key: &str, owner: &str) -> bool {
        let (_, release) = self.shas.get().expect("prepared");
        matches!(
            redis::cmd("EVALSHA")
                .arg(release)
                .arg(2)
                .arg(key)
                .arg(format!("{key}:queue"))
                .arg(owner)
                .arg(format!("{key}:wake:"))
                .query(c),
            Ok(Value::Int(0))
        )
    }
    fn commands(&self) -> &'static [&'static str] {
        &["evalsha"]
    }
    fn acquire_cmd(&self, key: &str, owner: &str, ttl_ms: u64) -> redis::Cmd {
        self.script_cmd(key, owner, ttl_ms, false)
    }
    fn queued(&self, c: &mut Connection, key: &str) -> Option<i64> {
        redis::cmd("LLEN").arg(format!("{key}:queue")).query(c).ok()
    }
}

/// The module's counting semaphore: LOCK.SEMACQUIRE (with server-side WAIT) and LOCK.RELEASE
/// of one permit.
pub struct ModuleSemaphore {
    pub capacity: u32,
}

impl Lock for ModuleSemaphore {
    fn name(&self) -> &'static str {
        "module semaphore"
    }
    fn try_acquire(&self, c: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> bool {
        is_int(self.acquire_cmd(key, owner, ttl_ms).query(c))
    }
    fn acquire(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> bool {
        let wait = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut cmd = self.acquire_cmd(key, owner, ttl_ms);
        cmd.arg("WAIT").arg(wait);
        is_int(cmd.query(c))
    }
    fn release(&self, c: &mut Connection, key: &str, owner: &str) -> bool {
        is_int(redis::cmd("LOCK.RELEASE").arg(key).arg(owner).query(c))
    }
    fn commands(&self) -> &'static [&'static str] {
        &["lock.semacquire", "lock.release"]
    }
    fn acquire_cmd(&self, key: &str, owner: &str, ttl_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("LOCK.SEMACQUIRE");
        cmd.arg(key).arg(owner).arg(self.capacity).arg(ttl_ms);
        cmd
    }
}

/// A semaphore in a sorted set, the kind redis-semaphore (Node) and Redisson's
/// `RPermitExpirableSemaphore` keep: one member per permit holder, scored by its expiry. The
/// acquire script drops expired members, then adds the owner if fewer than `capacity` are
/// left; a release removes the member. A blocking acquire sleeps and retries (redis-semaphore's
/// default retry interval is 10 ms). The script is written here, not copied.
pub struct ZsetSemaphore {
    pub capacity: u32,
    pub poll: Duration,
    sha: std::sync::OnceLock<String>,
}

/// KEYS[1] the semaphore; ARGV: owner, capacity, ttl (ms), the client's clock (ms).
const ZSET_ACQUIRE: &str = r#"
local now = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
"#;

impl ZsetSemaphore {
    pub fn new(capacity: u32, poll: Duration) -> Self {
        ZsetSemaphore {
            capacity,
            poll,
            sha: std::sync::OnceLock::new(),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Lock for ZsetSemaphore {
    fn name(&self) -> &'static str {
        "sorted set + Lua semaphore"
    }
    fn prepare(&self, c: &mut Connection) {
        let sha = load_script(c, ZSET_ACQUIRE);
        let _ = self.sha.set(sha);
    }
    fn try_acquire(&self, c: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> bool {
        matches!(
            self.acquire_cmd(key, owner, ttl_ms).query(c),
            Ok(Value::Int(1))
        )
    }
    fn acquire(
        &self,
        c: &mut Connection,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> bool {
        poll_until(timeout, self.poll, || {
            self.try_acquire(c, key, owner, ttl_ms)
        })
    }
    fn release(&self, c: &mut Connection, key: &str, owner: &str) -> bool {
        matches!(
            redis::cmd("ZREM").arg(key).arg(owner).query(c),
            Ok(Value::Int(1))
        )
    }
    fn commands(&self) -> &'static [&'static str] {
        &["evalsha", "zrem"]
    }
    fn acquire_cmd(&self, key: &str, owner: &str, ttl_ms: u64) -> redis::Cmd {
        let sha = self.sha.get().expect("prepared");
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha)
            .arg(1)
            .arg(key)
            .arg(owner)
            .arg(self.capacity)
            .arg(ttl_ms)
            .arg(now_ms());
        cmd
    }
}
