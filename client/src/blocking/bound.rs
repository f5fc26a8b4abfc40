//! Bound holds (`BIND`): the dedicated connection that each server's hold is tied to, and the
//! set of them that a guard keeps.
//!
//! The server ends a bound hold the moment the connection that sent the acquire closes. So that
//! connection is opened for that one acquire, is never pooled nor shared with another lock, and
//! lives exactly as long as the guard: its extends and its release go over it, and dropping the
//! guard closes it (after the release, so a lock-delay does not apply).
//!
//! It is a plain socket of our own rather than a [`redis::Connection`], for two reasons:
//!
//! - **Liveness without a round trip.** [`BoundLink::probe`] reads whatever the socket has, without
//!   blocking: an end of stream or a reset means the server closed the connection (`CLIENT KILL`,
//!   its `timeout` for idle clients, a restart, a crash), so the hold there is gone. Nothing else
//!   arrives unasked on it. [`crate::LockGuard::is_lost`] and the watchdog use it, so a guard
//!   knows of a closed connection within a few milliseconds of the server closing it, without
//!   waiting for an extend.
//! - **A slow reply does not end the hold.** Every reply to the commands sent on it (`LOCK.*`
//!   integers or nil, `+OK`, errors) is one line, so a reply that is late is simply counted and
//!   skipped when it arrives: the connection survives a timeout. A pooled connection must be
//!   dropped after a timeout (it may still carry a late reply), which for a bound hold would end
//!   the hold itself.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionAddr, Value};

use super::instance::{exchange, scatter_gather, Instance, Wire};
use super::servers::Servers;
use crate::Outcome;

/// The `CLIENT SETNAME` of every bound connection (so `CLIENT LIST` tells them apart).
pub const BOUND_CLIENT_NAME: &str = "redis-lock:bound";

/// A reply line longer than this is not one of ours: the connection is given up.
const MAX_LINE: usize = 64 * 1024;

pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// A second handle on the same socket (one thread reads while others write).
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
        }
    }

    /// Closes both directions (a thread blocked reading it wakes up).
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    pub(crate) fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(d),
            Stream::Unix(s) => s.set_read_timeout(d),
        }
    }

    pub(crate) fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(d),
            Stream::Unix(s) => s.set_write_timeout(d),
        }
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Why a line could not be read.
enum ReadFail {
    /// Nothing complete before the deadline; the connection is still usable.
    Timeout,
    /// Closed, reset, or not speaking our protocol: the connection is given up.
    Broken(String),
}

/// One reply line, parsed.
#[derive(Debug, PartialEq)]
enum Reply {
    Value(Value),
    Error(String),
}

/// Parses a one-line RESP2 / RESP3 reply (without its CRLF). Anything else (a bulk string, an
/// array) is not a reply to a command we send.
fn parse_line(line: &[u8]) -> Result<Reply, String> {
    let text = String::from_utf8_lossy(line.get(1..).unwrap_or_default()).into_owned();
    match line.first() {
        Some(b':') => text
            .parse::<i64>()
            .map(|i| Reply::Value(Value::Int(i)))
            .map_err(|_| format!("unexpected reply :{text}")),
        Some(b'+') if text == "OK" => Ok(Reply::Value(Value::Okay)),
        Some(b'+') => Ok(Reply::Value(Value::SimpleString(text))),
        Some(b'-') => Ok(Reply::Error(text)),
        Some(b'_') if text.is_empty() => Ok(Reply::Value(Value::Nil)),
        Some(b'$' | b'*') if text == "-1" => Ok(Reply::Value(Value::Nil)),
        _ => Err(format!(
            "unexpected reply {:?}",
            String::from_utf8_lossy(line)
        )),
    }
}

/// A bound hold's dedicated connection to one server (see the module docs).
pub(crate) struct BoundLink {
    stream: Stream,
    /// Bytes read and not yet consumed (at most a partial line between requests).
    buf: Vec<u8>,
    /// Replies still owed for requests whose reply was given up on (timed out): skipped before
    /// the next reply is read.
    pending: usize,
    /// Bounds connecting and every write.
    timeout: Duration,
}

impl BoundLink {
    fn connect(instance: &Instance) -> io::Result<Stream> {
        connect_stream(instance.addr(), instance.timeout())
    }

    /// Reads one line, waiting until `deadline` at most (`None`: no limit).
    fn read_line(&mut self, deadline: Option<Instant>) -> Result<Vec<u8>, ReadFail> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let mut line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                line.truncate(pos);
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(ReadFail::Broken("reply line too long".into()));
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(ReadFail::Timeout);
                    }
                    Some(left)
                }
            };
            self.stream
                .set_read_timeout(left)
                .map_err(|e| ReadFail::Broken(e.to_string()))?;
            let mut chunk = [0u8; 512];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ReadFail::Broken("connection closed by the server".into())),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ReadFail::Timeout)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadFail::Broken(e.to_string())),
            }
        }
    }

    /// Whether the server still has this connection open, found without blocking and without a
    /// round trip: whatever the socket holds is read; late replies are skipped; an end of stream,
    /// an error or data nobody asked for means it is gone (`Err` says why). Only a closing that
    /// has reached this machine is seen (not a partition): the lease's validity covers the rest.
    pub(crate) fn probe(&mut self) -> Result<(), String> {
        self.stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let mut chunk = [0u8; 512];
        let read = loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break Err("connection closed by the server".to_string()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > MAX_LINE {
                        break Err("unexpected data from the server".to_string());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e.to_string()),
            }
        };
        let restored = self
            .stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string());
        read?;
        restored?;
        while self.pending > 0 {
            match self.read_line(Some(Instant::now())) {
                Ok(_) => self.pending -= 1,
                Err(ReadFail::Timeout) => break,
                Err(ReadFail::Broken(e)) => return Err(e),
            }
        }
        if self.pending == 0 && !self.buf.is_empty() {
            return Err("unexpected data from the server".into());
        }
        Ok(())
    }

    /// Gives the connection up after a request whose outcome is unknown (its reply timed out)
    /// or unwanted: `release` (a `LOCK.RELEASE ... ALL`) is written behind it, then the
    /// connection closes. The server runs both before it sees the close, so a grant that was
    /// still coming is released (no lock-delay), and a wait still queued ends with the close.
    pub(crate) fn abandon(mut self, release: &Cmd) {
        let _ = self.send(&release.get_packed_command());
    }
}

impl Wire for BoundLink {
    /// Connects, then sends AUTH and SELECT (when the URL has them) and `CLIENT SETNAME` in one
    /// round trip. A refused SETNAME (an ACL without `client`) is ignored.
    fn open(instance: &Instance) -> Result<Self, String> {
        let stream = Self::connect(instance).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + instance.timeout();
        let mut link = BoundLink {
            stream,
            buf: Vec::new(),
            pending: 0,
            timeout: instance.timeout(),
        };
        let (user, password, db) = instance.login();
        // (name, command, must succeed)
        let mut setup: Vec<(&str, Cmd, bool)> = Vec::new();
        if let Some(password) = password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = user {
                auth.arg(user);
            }
            auth.arg(password);
            setup.push(("AUTH", auth, true));
        }
        if db != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(db);
            setup.push(("SELECT", select, true));
        }
        let mut name = redis::cmd("CLIENT");
        name.arg("SETNAME").arg(BOUND_CLIENT_NAME);
        setup.push(("CLIENT SETNAME", name, false));
        let packed: Vec<u8> = setup
            .iter()
            .flat_map(|(_, c, _)| c.get_packed_command())
            .collect();
        link.send(&packed)?;
        for (what, _, required) in &setup {
            let line = link.read_line(Some(deadline)).map_err(|e| match e {
                ReadFail::Timeout => format!("timed out setting up the connection ({what})"),
                ReadFail::Broken(e) => e,
            })?;
            if let Reply::Error(e) = parse_line(&line)? {
                if *required {
                    return Err(format!("{what}: {e}"));
                }
            }
        }
        Ok(link)
    }

    fn send(&mut self, packed: &[u8]) -> Result<(), String> {
        self.stream
            .set_write_timeout(Some(self.timeout))
            .and_then(|_| self.stream.write_all(packed))
            .map_err(|e| e.to_string())
    }

    /// A timeout leaves the connection usable (the late reply is skipped later); an error reply
    /// too. A closed connection or a reply that is not ours does not.
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Value, (Outcome, bool)> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let timed_out = |link: &mut BoundLink| {
            // This request's reply is owed too now.
            link.pending += 1;
            Err((
                Outcome::Unreachable(crate::proto::reply::NO_REPLY.into()),
                true,
            ))
        };
        while self.pending > 0 {
            match self.read_line(deadline) {
                Ok(_) => self.pending -= 1,
                Err(ReadFail::Timeout) => return timed_out(self),
                Err(ReadFail::Broken(e)) => return Err((Outcome::Unreachable(e), false)),
            }
        }
        match self.read_line(deadline) {
            Ok(line) => match parse_line(&line) {
                Ok(Reply::Value(v)) => Ok(v),
                Ok(Reply::Error(e)) => Err((Outcome::from_error_text(e), true)),
                Err(e) => Err((Outcome::from_error_text(e), false)),
            },
            Err(ReadFail::Timeout) => timed_out(self),
            Err(ReadFail::Broken(e)) => Err((Outcome::Unreachable(e), false)),
        }
    }
}

/// A plain socket to the server (TCP or Unix; TLS is not supported here), connected within the
/// instance's timeout.
pub(crate) fn connect_stream(addr: &ConnectionAddr, timeout: Duration) -> io::Result<Stream> {
    match addr {
        ConnectionAddr::Tcp(host, port) => {
            let mut last = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "no address for the host")
            }))
        }
        ConnectionAddr::Unix(path) => UnixStream::connect(path).map(Stream::Unix),
        other => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("plain sockets do not support {other}"),
        )),
    }
}

/// One server's side of a bound guard.
struct Link {
    /// The connection while no request uses it; `None` while one does (the mutex is never held
    /// across blocking I/O), and once the connection is gone.
    slot: Mutex<Option<BoundLink>>,
    /// The server granted the hold on this connection and it has not been found closed.
    alive: AtomicBool,
    /// Why the connection is gone (for the loss report); empty while alive or never granted.
    why: Mutex<String>,
}

/// A bound guard's connections, one slot per server (empty where the server did not grant).
pub(crate) struct Links {
    links: Vec<Link>,
    /// Set when the guard releases: a connection coming back from a request is closed instead
    /// of put back.
    closed: AtomicBool,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Links {
    /// `conns[i]`: the connection over which server i granted the hold (None: not granted).
    pub(crate) fn new(conns: Vec<Option<BoundLink>>) -> Self {
        Links {
            links: conns
                .into_iter()
                .map(|c| Link {
                    alive: AtomicBool::new(c.is_some()),
                    slot: Mutex::new(c),
                    why: Mutex::new(String::new()),
                })
                .collect(),
            closed: AtomicBool::new(false),
        }
    }

    fn kill(&self, i: usize, why: String) {
        let link = &self.links[i];
        if link.alive.swap(false, Ordering::SeqCst) {
            *locked(&link.why) = why;
        }
    }

    /// Probes every idle live connection (a connection busy with a request is judged by that
    /// request), closes the dead ones, and returns how many are still alive.
    pub(crate) fn probe(&self) -> usize {
        for (i, link) in self.links.iter().enumerate() {
            if !link.alive.load(Ordering::SeqCst) {
                continue;
            }
            let mut slot = locked(&link.slot);
            if let Some(conn) = slot.as_mut() {
                if let Err(why) = conn.probe() {
                    *slot = None;
                    drop(slot);
                    self.kill(i, why);
                }
            }
        }
        self.alive()
    }

    /// How many servers still hold the lock on a live connection (as far as known).
    pub(crate) fn alive(&self) -> usize {
        self.links
            .iter()
            .filter(|l| l.alive.load(Ordering::SeqCst))
            .count()
    }

    /// (server, why) for each connection that was granted and is gone.
    pub(crate) fn dead(&self, servers: &Servers) -> Vec<(String, Outcome)> {
        self.links
            .iter()
            .zip(&servers.instances)
            .filter_map(|(l, i)| {
                let why = locked(&l.why).clone();
                (!why.is_empty()).then(|| {
                    (
                        i.name().to_string(),
                        Outcome::Unreachable(format!("bound connection closed: {why}")),
                    )
                })
            })
            .collect()
    }

    /// Runs `cmd` on every server whose hold is alive, over its bound connection; where another
    /// request of this guard is using that connection right now (the watchdog's extend), over a
    /// pooled connection instead (the owner is the same, so the server treats both alike), so a
    /// request never waits for another one. A server whose connection is gone (or that never
    /// granted) gets nothing and answers `Unreachable`; a connection found closed is marked so.
    pub(crate) fn run(&self, servers: &Servers, cmd: &Cmd) -> Vec<Result<Value, Outcome>> {
        let n = self.links.len();
        let mut conns: Vec<Option<BoundLink>> = Vec::with_capacity(n);
        let mut on_link: Vec<Option<Cmd>> = vec![None; n];
        let mut on_pool: Vec<Option<Cmd>> = vec![None; n];
        for (i, link) in self.links.iter().enumerate() {
            let conn = if link.alive.load(Ordering::SeqCst) {
                locked(&link.slot).take()
            } else {
                None
            };
            if conn.is_some() {
                on_link[i] = Some(cmd.clone());
            } else if link.alive.load(Ordering::SeqCst) {
                on_pool[i] = Some(cmd.clone());
            }
            conns.push(conn);
        }
        let mut results = exchange(&servers.instances, &mut conns, &on_link, None);
        for (i, conn) in conns.into_iter().enumerate() {
            if on_link[i].is_none() {
                continue;
            }
            match conn {
                Some(conn) => self.put_back(i, conn),
                None => {
                    let why = match &results[i] {
                        Err(o) => o.error_text().unwrap_or("connection lost").to_string(),
                        _ => "connection lost".into(),
                    };
                    self.kill(i, why);
                }
            }
        }
        if on_pool.iter().any(Option::is_some) {
            let pooled = scatter_gather(&servers.instances, &on_pool, None);
            for (i, r) in pooled.into_iter().enumerate() {
                if on_pool[i].is_some() {
                    results[i] = r;
                }
            }
        }
        for (i, r) in results.iter_mut().enumerate() {
            if on_link[i].is_none() && on_pool[i].is_none() {
                let why = locked(&self.links[i].why).clone();
                *r = Err(Outcome::Unreachable(if why.is_empty() {
                    "not held on this server".into()
                } else {
                    format!("bound connection closed: {why}")
                }));
            }
        }
        results
    }

    fn put_back(&self, i: usize, conn: BoundLink) {
        let link = &self.links[i];
        let mut slot = locked(&link.slot);
        if self.closed.load(Ordering::SeqCst) {
            drop(slot);
            drop(conn);
            link.alive.store(false, Ordering::SeqCst);
        } else {
            *slot = Some(conn);
        }
    }

    /// Closes every connection (after the release); one still in use is closed when its
    /// request returns it.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for link in &self.links {
            let conn = locked(&link.slot).take();
            link.alive.store(false, Ordering::SeqCst);
            drop(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_replies_parse() {
        assert_eq!(parse_line(b":42"), Ok(Reply::Value(Value::Int(42))));
        assert_eq!(parse_line(b":-1"), Ok(Reply::Value(Value::Int(-1))));
        assert_eq!(parse_line(b"$-1"), Ok(Reply::Value(Value::Nil)));
        assert_eq!(parse_line(b"*-1"), Ok(Reply::Value(Value::Nil)));
        assert_eq!(parse_line(b"_"), Ok(Reply::Value(Value::Nil)));
        assert_eq!(parse_line(b"+OK"), Ok(Reply::Value(Value::Okay)));
        assert_eq!(
            parse_line(b"+PONG"),
            Ok(Reply::Value(Value::SimpleString("PONG".into())))
        );
        assert_eq!(
            parse_line(b"-NOTOWNER not the owner"),
            Ok(Reply::Error("NOTOWNER not the owner".into()))
        );
        assert!(parse_line(b"$5").is_err());
        assert!(parse_line(b"*2").is_err());
        assert!(parse_line(b":x").is_err());
        assert!(parse_line(b"").is_err());
    }
}
