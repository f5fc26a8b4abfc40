//! The servers of a sync client or Redlock, and each request the guards and clients send
//! them, over pooled or bound connections.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};

use super::bound::BoundLink;
use super::guard::State;
use super::instance::{self, Instance};
use crate::proto::error::classify;
use crate::proto::reply::{acquire_outcome, info_cmd, release_cmd, Outcome};
use crate::{Acquire, LockError, LockInfo};

/// The servers a lock lives on, and how many must agree.
pub(crate) struct Servers {
    pub(crate) instances: Vec<Instance>,
    pub(crate) quorum: usize,
}

impl Servers {
    pub(crate) fn new(instances: Vec<Instance>) -> Self {
        let quorum = instances.len() / 2 + 1;
        Servers { instances, quorum }
    }

    /// The same command to every server at once; `wait` for a blocking request (see
    /// [`instance::scatter_gather`]).
    pub(crate) fn run(&self, cmd: &Cmd, wait: Option<Duration>) -> Vec<Result<Value, Outcome>> {
        let cmds = vec![Some(cmd.clone()); self.instances.len()];
        instance::scatter_gather(&self.instances, &cmds, wait)
    }

    /// LOCK.ACQUIRE / LOCK.RWREAD / LOCK.SEMACQUIRE everywhere over pooled connections, with
    /// server-side WAIT when `wait` is set.
    pub(crate) fn acquire(
        &self,
        key: &str,
        owner: &str,
        request: &Acquire,
        wait: Option<Duration>,
    ) -> Vec<Outcome> {
        self.run(&request.command(key, owner, wait), wait)
            .into_iter()
            .map(acquire_outcome)
            .collect()
    }

    /// The same over bound connections: `links[i]` is used for server i, opened when `None`.
    /// On return `links[i]` holds the connections that can carry more requests: the one a
    /// grant came on, and also one whose reply timed out (it may still grant).
    pub(crate) fn acquire_bound(
        &self,
        links: &mut [Option<BoundLink>],
        key: &str,
        owner: &str,
        request: &Acquire,
        wait: Option<Duration>,
    ) -> Vec<Outcome> {
        let cmds = vec![Some(request.command(key, owner, wait)); self.instances.len()];
        instance::exchange(&self.instances, links, &cmds, wait)
            .into_iter()
            .map(acquire_outcome)
            .collect()
    }

    /// After a bound acquire that is not used (or for the servers that did not grant): closes
    /// the connections, each behind a `LOCK.RELEASE ... ALL` where it granted or may still grant
    /// (its reply timed out), so that no hold is left and no lock-delay starts. Does not wait.
    pub(crate) fn discard(
        &self,
        links: Vec<Option<BoundLink>>,
        outcomes: &[Outcome],
        key: &str,
        owner: &str,
    ) {
        let release = release_cmd(key, owner);
        for (link, outcome) in links.into_iter().zip(outcomes) {
            if let Some(link) = link {
                if matches!(outcome, Outcome::Granted(_) | Outcome::Unreachable(_)) {
                    link.abandon(&release);
                }
            }
        }
    }

    /// `LOCK.INFO key` on server `i`.
    pub(crate) fn info(&self, i: usize, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.info_with(i, &info_cmd(key))
    }

    /// What server `i` says of `owner`'s hold of `key`: `LOCK.INFO key OWNER owner`, or the
    /// plain form on a server whose module predates the option
    /// (see [`crate::proto::reply::InfoForm`]).
    pub(crate) fn own_info(
        &self,
        i: usize,
        key: &str,
        owner: &str,
    ) -> Result<Option<LockInfo>, LockError> {
        let Some(form) = self.instances.get(i).map(|s| &s.link.info_form) else {
            return self.info(i, key);
        };
        if form.plain_only() {
            return self.info(i, key);
        }
        let reply = self.send_to(i, &form.cmd(key, owner));
        if form.refused(&reply) {
            return self.info(i, key);
        }
        self.info_reply(i, reply)
    }

    fn info_with(&self, i: usize, cmd: &Cmd) -> Result<Option<LockInfo>, LockError> {
        let reply = self.send_to(i, cmd);
        self.info_reply(i, reply)
    }

    /// `cmd` to server `i` alone.
    fn send_to(&self, i: usize, cmd: &Cmd) -> Result<Value, Outcome> {
        let cmds: Vec<Option<Cmd>> = (0..self.instances.len())
            .map(|j| (j == i).then(|| cmd.clone()))
            .collect();
        instance::scatter_gather(&self.instances, &cmds, None)
            .into_iter()
            .nth(i)
            .unwrap_or_else(|| Err(Outcome::Unreachable("no such server".into())))
    }

    fn info_reply(
        &self,
        i: usize,
        reply: Result<Value, Outcome>,
    ) -> Result<Option<LockInfo>, LockError> {
        let name = self
            .instances
            .get(i)
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        match reply {
            Ok(v) => LockInfo::from_reply(&v).map_err(|e| LockError::Refused {
                causes: vec![(name, Outcome::Refused(e))],
            }),
            Err(o) => Err(classify(&[(name, o)], 1)),
        }
    }

    /// `cmd` to every server, each on a thread of its own, answered as soon as `enough`
    /// servers replied (any reply): a paused or dead server does not hold up a quorum's
    /// answer. The slower ones finish (or time out) in the background and read "no answer
    /// awaited". With one server this is [`Servers::run`].
    pub(crate) fn run_until(
        self: &Arc<Self>,
        cmd: &Cmd,
        enough: usize,
    ) -> Vec<Result<Value, Outcome>> {
        let n = self.instances.len();
        if n <= 1 || enough >= n {
            return self.run(cmd, None);
        }
        if self.instances.iter().all(|i| i.link.is_up()) {
            let cmds = vec![Some(cmd.clone()); n];
            return instance::short_commands(&self.instances, &cmds, Some(enough));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..n {
            let servers = Arc::clone(self);
            let tx = tx.clone();
            let cmd = cmd.clone();
            std::thread::spawn(move || {
                let cmds: Vec<Option<Cmd>> =
                    (0..n).map(|j| (j == i).then(|| cmd.clone())).collect();
                let reply = instance::scatter_gather(&servers.instances, &cmds, None)
                    .into_iter()
                    .nth(i)
                    .unwrap_or_else(|| Err(Outcome::Unreachable("not sent".into())));
                let _ = tx.send((i, reply));
            });
        }
        drop(tx);
        let mut results: Vec<Result<Value, Outcome>> = (0..n)
            .map(|_| Err(Outcome::Unreachable("no answer awaited".into())))
            .collect();
        let mut replied = 0;
        for (i, reply) in rx.iter() {
            if reply.is_ok() {
                replied += 1;
            }
            if let Some(slot) = results.get_mut(i) {
                *slot = reply;
            }
            if replied >= enough {
                break;
            }
        }
        results
    }

    /// The servers' names, in order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.instances
            .iter()
            .map(|i| i.name().to_string())
            .collect()
    }

    /// Each server's watcher's push count, taken before a request that may grant.
    pub(crate) fn pushes(&self) -> Vec<u64> {
        self.instances.iter().map(|i| i.link.pushes()).collect()
    }

    /// Puts a new guard under the loss watchers of the servers that granted it (`since`: the
    /// push counts taken before its request was sent).
    pub(crate) fn watch(&self, state: &Arc<State>, since: &[u64]) {
        for (i, instance) in self.instances.iter().enumerate() {
            if state.hold.tokens.iter().any(|(j, _)| *j == i) {
                let since = since.get(i).copied().unwrap_or(0);
                instance.link.watch(&state.hold.key, i, state, since);
            }
        }
    }

    /// The guard is done.
    pub(crate) fn unwatch(&self, state: &State) {
        for instance in &self.instances {
            instance.link.unwatch(&state.hold.key, state);
        }
    }

    pub(crate) fn named(&self, outcomes: Vec<Outcome>) -> Vec<(String, Outcome)> {
        self.instances
            .iter()
            .map(|i| i.name().to_string())
            .zip(outcomes)
            .collect()
    }
}

/// `n` empty bound-connection slots.
pub(crate) fn no_links(n: usize) -> Vec<Option<BoundLink>> {
    (0..n).map(|_| None).collect()
}
