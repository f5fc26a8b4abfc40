//! The sync face's loss watcher and short-command link (see [`crate::proto::watch`] for the
//! decisions).
//!
//! Per server, one plain socket in RESP3 with broadcast tracking and `NOLOOP` carries the
//! client's short commands (try-acquires, extends, releases, `LOCK.INFO`), pipelined from any
//! thread: a writer puts its reply slot in line and writes under one mutex, and one reader
//! thread hands each reply to the slot at the front. Pushes are read by the same thread: an
//! invalidation of a watched key is followed by a `LOCK.INFO key OWNER owner` per owner among
//! the key's guards (a plain `LOCK.INFO key` on a server whose module predates `OWNER`), whose
//! answers those guards judge. Because the client's own commands go over the tracking connection, they push
//! nothing to it, so a held lock costs no more than its extends. A TLS server, or a server
//! that refuses tracking, gets no link: short commands then use the pooled connections and a
//! loss is found by extends and validity alone.

use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use redis::{Cmd, PushKind, Value};

use super::bound::{connect_stream, Stream};
use super::guard::State as GuardState;
use crate::proto::reply::{info_cmd, InfoForm};
use crate::proto::watch::{
    invalidated_keys, register_cmds, reread_info, tracking_on, tracking_refused, Register, Watched,
};
use crate::Outcome;

/// After a failed connect, the link is not tried again for this long (short commands use the
/// pooled connections meanwhile).
const RETRY_AFTER: Duration = Duration::from_millis(500);

type Reply = Result<Value, Outcome>;

/// Who waits for the reply at the front of the line.
enum Slot {
    /// The reply of server `.0` of a caller's request.
    Caller(usize, Sender<(usize, Reply)>),
    /// A watcher's re-read of a key, numbered: of one owner's hold (`OWNER`), or of the whole
    /// key (`None`); `last` for the last read of the re-read (one per owner of the key's
    /// guards).
    Reread {
        key: String,
        number: u64,
        owner: Option<String>,
        last: bool,
    },
    /// The reply to a tracking registration: a refusal turns the link's watcher off.
    Tracking,
    /// A reply nobody waits for.
    Ignore,
}

/// The writing side of the current connection and its line of reply slots.
struct Writer {
    stream: Stream,
    slots: Arc<Mutex<VecDeque<Slot>>>,
    alive: Arc<AtomicBool>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Wakes the reader thread, which then ends.
        self.stream.shutdown();
    }
}

/// Where and how the link connects.
pub(crate) struct Target {
    pub(crate) addr: redis::ConnectionAddr,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    pub(crate) timeout: Duration,
}

/// One server's link.
pub(crate) struct WatchLink {
    target: Target,
    writer: Mutex<Option<Writer>>,
    /// A timer thread is sleeping until the next due re-read.
    timer: AtomicBool,
    /// A thread is opening the connection.
    connecting: AtomicBool,
    watched: Mutex<Watched<GuardState>>,
    /// No link for this server (TLS, or tracking refused).
    off: AtomicBool,
    retry_at: Mutex<Option<Instant>>,
    /// Whether this server takes `LOCK.INFO key OWNER owner` (the client's own checks use it
    /// too, over this link or the pooled connections).
    pub(crate) info_form: InfoForm,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WatchLink {
    pub(crate) fn new(target: Target) -> Self {
        let tls = !matches!(
            target.addr,
            redis::ConnectionAddr::Tcp(..) | redis::ConnectionAddr::Unix(_)
        );
        WatchLink {
            target,
            writer: Mutex::new(None),
            timer: AtomicBool::new(false),
            connecting: AtomicBool::new(false),
            watched: Mutex::new(Watched::default()),
            off: AtomicBool::new(tls),
            retry_at: Mutex::new(None),
            info_form: InfoForm::default(),
        }
    }

    fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    /// The number of the last invalidation received (taken before a request that may grant).
    pub(crate) fn pushes(&self) -> u64 {
        locked(&self.watched).core.pushes()
    }

    /// Whether short commands go over the link now.
    pub(crate) fn is_up(&self) -> bool {
        !self.is_off()
            && locked(&self.writer)
                .as_ref()
                .is_some_and(|w| w.alive.load(Ordering::SeqCst))
    }

    /// Sends `cmd` over the link; false when there is no link (the caller uses a pooled
    /// connection). The reply comes on `tx`, tagged `index`.
    pub(crate) fn send(
        self: &Arc<Self>,
        cmd: &Cmd,
        index: usize,
        tx: &Sender<(usize, Reply)>,
    ) -> bool {
        if self.is_off() {
            return false;
        }
        let mut writer = locked(&self.writer);
        if writer
            .as_ref()
            .is_none_or(|w| !w.alive.load(Ordering::SeqCst))
        {
            // Never connect in a caller's request: the pooled connections serve meanwhile.
            *writer = None;
            drop(writer);
            self.connect_in_background();
            return false;
        }
        let Some(w) = writer.as_mut() else {
            return false;
        };
        // The slot goes in line only if the reader is still there to answer it (it drains the
        // line under the same lock when it ends).
        {
            let mut slots = locked(&w.slots);
            if !w.alive.load(Ordering::SeqCst) {
                return false;
            }
            slots.push_back(Slot::Caller(index, tx.clone()));
        }
        if w.stream.write_all(&cmd.get_packed_command()).is_err() {
            // Nothing was answered for it: take the slot back (the caller tries elsewhere, and
            // must not also get a late "connection closed" for this server).
            w.alive.store(false, Ordering::SeqCst);
            drop(locked(&w.slots).pop_back());
            w.stream.shutdown();
            *writer = None;
            return false;
        }
        true
    }

    /// Writes `cmd` on the link (behind whatever was written before it) without waiting for
    /// its reply; false when the link is down.
    pub(crate) fn send_and_forget(&self, cmd: &Cmd) -> bool {
        self.send_slot(cmd, Slot::Ignore)
    }

    /// Sends a command whose reply goes to `slot`, if the link is up.
    fn send_slot(&self, cmd: &Cmd, slot: Slot) -> bool {
        self.send_all(vec![(cmd, slot)])
    }

    /// Sends commands in one write, so no other thread's command falls between them (a
    /// `MULTI` ... `EXEC` must not take in someone else's request).
    fn send_all(&self, cmds: Vec<(&Cmd, Slot)>) -> bool {
        let mut writer = locked(&self.writer);
        Self::write_all(&mut writer, cmds)
    }

    /// [`WatchLink::send_all`] with the writer already locked.
    fn write_all(writer: &mut Option<Writer>, cmds: Vec<(&Cmd, Slot)>) -> bool {
        let Some(w) = writer.as_mut().filter(|w| w.alive.load(Ordering::SeqCst)) else {
            return false;
        };
        let mut bytes = Vec::new();
        {
            let mut slots = locked(&w.slots);
            if !w.alive.load(Ordering::SeqCst) {
                return false;
            }
            for (cmd, slot) in cmds {
                bytes.extend(cmd.get_packed_command());
                slots.push_back(slot);
            }
        }
        if w.stream.write_all(&bytes).is_err() {
            w.alive.store(false, Ordering::SeqCst);
            w.stream.shutdown();
            *writer = None;
            return false;
        }
        true
    }

    /// Opens the connection: login, RESP3, tracking of what is registered; then the reader
    /// thread, and a re-read of every watched key (changes while it was down were not
    /// pushed).
    fn connect(self: &Arc<Self>) -> Option<Writer> {
        if locked(&self.retry_at).is_some_and(|t| Instant::now() < t) {
            return None;
        }
        match self.handshake() {
            Ok(w) => Some(w),
            Err(refused) => {
                if refused {
                    self.off.store(true, Ordering::SeqCst);
                }
                *locked(&self.retry_at) = Some(Instant::now() + RETRY_AFTER);
                None
            }
        }
    }

    /// `Err(true)`: the server refused something the link needs (no retry).
    fn handshake(self: &Arc<Self>) -> Result<Writer, bool> {
        let t = &self.target;
        let mut stream = connect_stream(&t.addr, t.timeout).map_err(|_| false)?;
        stream
            .set_read_timeout(Some(t.timeout))
            .map_err(|_| false)?;
        stream
            .set_write_timeout(Some(t.timeout))
            .map_err(|_| false)?;
        let mut hello = redis::cmd("HELLO");
        hello.arg(3);
        if let Some(password) = &t.password {
            hello
                .arg("AUTH")
                .arg(t.user.as_deref().unwrap_or("default"))
                .arg(password);
        }
        let mut setup = vec![hello];
        if t.db != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(t.db);
            setup.push(select);
        }
        let (prefixes, keys) = {
            let mut w = locked(&self.watched);
            (w.core.connected(), w.core.keys())
        };
        if !prefixes.is_empty() {
            setup.push(tracking_on(&prefixes));
        }
        let packed: Vec<u8> = setup.iter().flat_map(|c| c.get_packed_command()).collect();
        stream.write_all(&packed).map_err(|_| false)?;
        let read = stream.try_clone().map_err(|_| false)?;
        let mut reader = BufReader::new(read);
        let mut parser = redis::Parser::new();
        for _ in &setup {
            match parser.parse_value(&mut reader) {
                Ok(Value::ServerError(_)) => return Err(true),
                Ok(_) => {}
                Err(_) => return Err(false),
            }
        }
        reader.get_ref().set_read_timeout(None).map_err(|_| false)?;
        let slots = Arc::new(Mutex::new(VecDeque::new()));
        let alive = Arc::new(AtomicBool::new(true));
        let me = Arc::downgrade(self);
        let (s, a) = (Arc::clone(&slots), Arc::clone(&alive));
        std::thread::Builder::new()
            .name("redis-lock-watch".into())
            .spawn(move || read_loop(me, reader, s, a))
            .map_err(|_| false)?;
        let writer = Writer {
            stream,
            slots,
            alive,
        };
        for key in keys {
            self.reread_on(&writer, key);
        }
        Ok(writer)
    }

    /// A re-read of `key` over `writer` (used while the writer mutex is held).
    fn reread_on(&self, writer: &Writer, key: String) {
        let Some(reads) = self.reread_cmds(&key) else {
            return;
        };
        let mut stream = match writer.stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        let mut bytes = Vec::new();
        {
            let mut slots = locked(&writer.slots);
            for (cmd, slot) in reads {
                bytes.extend(cmd.get_packed_command());
                slots.push_back(slot);
            }
        }
        if stream.write_all(&bytes).is_err() {
            writer.alive.store(false, Ordering::SeqCst);
        }
    }

    /// The reads that make a re-read of `key`, numbered: `LOCK.INFO key OWNER owner` for each
    /// owner among the key's guards, or one plain `LOCK.INFO key` for a server without the
    /// option. `None` (and the key's read done) when no guard of the key is left.
    fn reread_cmds(&self, key: &str) -> Option<Vec<(Cmd, Slot)>> {
        let mut watched = locked(&self.watched);
        let owners = watched.owners(key);
        if owners.is_empty() {
            watched.core.read(key);
            return None;
        }
        let number = watched.next_read();
        let slot = |owner: Option<String>, last: bool| Slot::Reread {
            key: key.to_string(),
            number,
            owner,
            last,
        };
        if self.info_form.plain_only() {
            return Some(vec![(info_cmd(key), slot(None, true))]);
        }
        let n = owners.len();
        Some(
            owners
                .into_iter()
                .enumerate()
                .map(|(j, owner)| {
                    (
                        self.info_form.cmd(key, &owner),
                        slot(Some(owner), j + 1 == n),
                    )
                })
                .collect(),
        )
    }

    fn reread(&self, key: String) {
        let Some(reads) = self.reread_cmds(&key) else {
            return;
        };
        let (cmds, slots): (Vec<Cmd>, Vec<Slot>) = reads.into_iter().unzip();
        if !self.send_all(cmds.iter().zip(slots).collect()) {
            locked(&self.watched).core.read(&key);
        }
    }

    /// Opens the link from a thread of its own (one at a time).
    fn connect_in_background(self: &Arc<Self>) {
        if self.connecting.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("redis-lock-watch-connect".into())
            .spawn(move || {
                if let Some(link) = me.upgrade() {
                    link.reconnect();
                    link.connecting.store(false, Ordering::SeqCst);
                }
            });
        if spawned.is_err() {
            self.connecting.store(false, Ordering::SeqCst);
        }
    }

    /// Opens a connection if there is none that works, without holding the writer lock while
    /// it connects (requests meanwhile use the pooled connections); true when one is up.
    fn reconnect(self: &Arc<Self>) -> bool {
        if self.is_up() {
            return true;
        }
        let Some(fresh) = self.connect() else {
            return false;
        };
        {
            let mut writer = locked(&self.writer);
            if writer
                .as_ref()
                .is_some_and(|w| w.alive.load(Ordering::SeqCst))
            {
                return true;
            }
            *writer = Some(fresh);
        }
        // The handshake registered the keys watched when it began; guards watched while it
        // ran are registered now (the whole set, replacing), and every key re-read.
        self.register_with(None, |w| (Some(w.core.resync()), ()));
        true
    }

    /// Decides a registration and writes it under the writer lock, so that registrations
    /// reach the server in the order they were decided (a replacement of the set must not
    /// overtake an addition decided before it); then the re-reads that follow it
    /// ([`Register::rereads`], `granted` being the key of a guard just granted), behind it on
    /// the link. `decide` runs with the watcher state locked.
    fn register_with<R>(
        &self,
        granted: Option<&str>,
        decide: impl FnOnce(&mut Watched<GuardState>) -> (Option<Register>, R),
    ) -> R {
        let mut writer = locked(&self.writer);
        let (register, out) = decide(&mut locked(&self.watched));
        let Some(register) = register else {
            return out;
        };
        let cmds = register_cmds(&register);
        Self::write_all(
            &mut writer,
            cmds.iter().map(|c| (c, Slot::Tracking)).collect(),
        );
        drop(writer);
        for key in register.rereads(granted) {
            self.reread(key);
        }
        out
    }

    /// A new guard of `key` on server `i` of its guard. A key not covered yet is registered
    /// and then re-read (both written in that order on the link; the re-read covers the
    /// moment between the grant and the registration). A link that is down opens in the
    /// background and re-reads every watched key once up.
    pub(crate) fn watch(
        self: &Arc<Self>,
        key: &str,
        i: usize,
        guard: &Arc<GuardState>,
        since: u64,
    ) {
        if self.is_off() {
            return;
        }
        if !self.is_up() {
            // Opening it registers every watched key and re-reads each.
            locked(&self.watched).watch(key, i, guard, &guard.hold.owner, since);
            self.connect_in_background();
            return;
        }
        let owner = &guard.hold.owner;
        self.register_with(Some(key), |w| (w.watch(key, i, guard, owner, since), ()));
    }

    /// A guard of `key` is done.
    pub(crate) fn unwatch(self: &Arc<Self>, key: &str, guard: &GuardState) {
        if self.is_off() {
            return;
        }
        self.register_with(None, |w| (Some(w.unwatch(key, guard)), ()));
    }

    /// An invalidation push.
    fn invalidated(self: &Arc<Self>, keys: Option<Vec<String>>) {
        let now_keys = self.register_with(None, |w| {
            let now_keys = w.core.invalidated(keys, Instant::now());
            (w.core.noisy(), now_keys)
        });
        for key in now_keys {
            self.reread(key);
        }
        self.arm_timer();
    }

    /// Keys changed again within the spacing are re-read when it is over, by a short-lived
    /// timer thread (one at a time).
    fn arm_timer(self: &Arc<Self>) {
        let Some(at) = locked(&self.watched).core.next_due() else {
            return;
        };
        if self.timer.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("redis-lock-watch-timer".into())
            .spawn(move || {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                if let Some(link) = me.upgrade() {
                    link.timer.store(false, Ordering::SeqCst);
                    let keys = locked(&link.watched).core.due_now(Instant::now());
                    for key in keys {
                        link.reread(key);
                    }
                    link.arm_timer();
                }
            });
        if spawned.is_err() {
            self.timer.store(false, Ordering::SeqCst);
        }
    }

    /// A re-read's answer, judged by the key's guards (those of `owner` for a read of one
    /// owner's hold); `last`: the last read of the re-read.
    fn judge(
        self: &Arc<Self>,
        key: &str,
        number: u64,
        owner: Option<&str>,
        last: bool,
        reply: Reply,
    ) {
        // An older module refuses `OWNER`: the key is due again, and read in the plain form.
        let refused = owner.is_some() && self.info_form.refused(&reply);
        let unanswered = refused || matches!(reply, Err(Outcome::Unreachable(_)));
        let info = if refused { None } else { reread_info(reply) };
        let listed = info
            .as_ref()
            .map(|i| i.as_ref().map_or(0, |i| i.holders.len()));
        let guards = {
            let mut watched = locked(&self.watched);
            if last || unanswered {
                watched.core.read_with(key, listed, unanswered);
            }
            watched.judged(key, number, owner)
        };
        if let Some(info) = info {
            for (i, guard) in guards {
                guard.check_info(i, &info);
            }
        }
        self.arm_timer();
    }
}

impl Drop for WatchLink {
    fn drop(&mut self) {
        if let Some(w) = locked(&self.writer).take() {
            w.alive.store(false, Ordering::SeqCst);
        }
    }
}

/// The reader thread of one connection: replies to their slots, pushes to the watcher. Ends
/// when the connection closes (every waiting slot then gets `Unreachable`, and the watched
/// keys are re-read once a new connection is up) or the link is gone.
fn read_loop(
    link: Weak<WatchLink>,
    mut reader: BufReader<Stream>,
    slots: Arc<Mutex<VecDeque<Slot>>>,
    alive: Arc<AtomicBool>,
) {
    let mut parser = redis::Parser::new();
    loop {
        let frame = parser.parse_value(&mut reader);
        let Some(me) = link.upgrade() else {
            break;
        };
        match frame {
            Ok(Value::Push { kind, data }) => {
                if let Some(keys) = invalidated_keys(kind == PushKind::Invalidate, &data) {
                    me.invalidated(keys);
                }
            }
            Ok(value) => {
                let reply = match value {
                    Value::ServerError(e) => Err(Outcome::from_error_text(format!(
                        "{} {}",
                        e.code(),
                        e.details().unwrap_or("")
                    ))),
                    v => Ok(v),
                };
                let slot = locked(&slots).pop_front();
                match slot {
                    Some(Slot::Caller(index, tx)) => {
                        let _ = tx.send((index, reply));
                    }
                    Some(Slot::Reread {
                        key,
                        number,
                        owner,
                        last,
                    }) => me.judge(&key, number, owner.as_deref(), last, reply),
                    Some(Slot::Ignore) => {}
                    Some(Slot::Tracking) => {
                        if let Err(o) = &reply {
                            let text = o.error_text().unwrap_or_default();
                            if o.is_refusal() && tracking_refused(text) {
                                me.off.store(true, Ordering::SeqCst);
                            }
                        }
                    }
                    None => {}
                }
            }
            Err(_) => break,
        }
    }
    let drained: Vec<Slot> = {
        let mut line = locked(&slots);
        alive.store(false, Ordering::SeqCst);
        line.drain(..).collect()
    };
    for slot in drained {
        if let Slot::Caller(index, tx) = slot {
            let _ = tx.send((index, Err(Outcome::Unreachable("connection closed".into()))));
        }
    }
    // While guards are watched, reconnect now rather than at the next request, so their keys
    // are re-read (a restarted or failed-over server no longer has their holds).
    loop {
        let Some(me) = link.upgrade() else {
            return;
        };
        if !locked(&me.watched).core.has_keys() || me.is_off() {
            return;
        }
        *locked(&me.retry_at) = None;
        if me.reconnect() {
            return;
        }
        drop(me);
        std::thread::sleep(RETRY_AFTER);
    }
}
