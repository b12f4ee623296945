//! Elastic jobs, as torchrun runs them: a job that outlives the failure of a
//! rank (`--max-restarts K`) and the loss or arrival of a machine (`--nnodes
//! MIN:MAX`).
//!
//! Each node's launcher is an *agent*. Node 0's agent hosts a store of its
//! own at `MASTER_ADDR:MASTER_PORT` for the whole job, where the agents meet
//! in numbered **rounds**:
//!
//! ```text
//! round r:  every agent joins  ──►  node 0's agent closes the round once
//!           (rdzv/r/joined)         MAX agents joined, or MIN and the last
//!                                   call has passed  ──►  members, node 0 first
//!           each member starts its ranks: WORLD_SIZE = members × nproc,
//!           their own store at a fresh port that node 0's agent publishes
//!           ... a rank fails (or a node waits to join, and there is room)
//!           its agent stops its ranks and sets rdzv/r/restart; every agent
//!           sees it, stops its ranks and joins round r + 1
//! ```
//!
//! A machine that is lost never joins the next round, so the job goes on
//! with the others, a smaller world size, as long as MIN are left. A restart
//! after a failure counts against `--max-restarts`; one that admits a
//! waiting machine does not. The program learns its round from
//! `WORKBOOK_ELASTIC_ROUND` (and, as under torchrun, the failures so far
//! from `TORCHELASTIC_RESTART_COUNT`): from round 1 on, it is continuing a job,
//! so it should resume from its last checkpoint, as `train` does.
//!
//! Node 0's agent is the one the job cannot lose: without it there is no
//! rendezvous, and the other agents stop, as torchrun's do when the host of
//! its c10d store goes.

use std::time::{Duration, Instant};

use candle_core::{bail, Result};

use super::{free_port, supervise, Ended, Job, LaunchConfig};
use crate::distributed::env::ELASTIC_ROUND;
use crate::distributed::store::{self, StoreClient, StoreServer};
use crate::error::io_context;
use crate::words::count;

/// How often an agent whose ranks run asks the store whether to stop them.
const POLL_EVERY: Duration = Duration::from_millis(250);

/// Why a round ends before its ranks do.
enum Stop {
    /// A rank failed (on any node): a restart, counted against `--max-restarts`.
    Failed(String),
    /// A machine waits to join and the job has room: a restart, not counted.
    Joining,
    /// The store is gone, and with it node 0's agent: the job cannot go on.
    HostGone(String),
}

/// The values of `rdzv/<round>/restart`.
const FAILED: &str = "failed: ";
const JOINING: &str = "joining";

/// Runs this node's agent until the job ends; returns the code to exit with.
pub(super) fn run(config: &LaunchConfig, port: u16, token: &str, job: &Job) -> Result<i32> {
    let address = store::address(&config.master_addr, port);
    let _server = match config.node_rank {
        0 => Some(StoreServer::bind(&address, token).map_err(|e| io_context("launch: the rendezvous", e))?),
        _ => None,
    };
    let store = StoreClient::connect(&address, token, config.timeout())
        .map_err(|e| io_context(format!("launch: node {}: joining the job", config.node_rank), e))?;
    let agent = Agent { config, store, token, id: format!("{:016x}", rand::random::<u64>()) };
    agent.run(job)
}

struct Agent<'a> {
    config: &'a LaunchConfig,
    store: StoreClient,
    token: &'a str,
    /// This agent's name in the rendezvous.
    id: String,
}

fn key(round: usize, name: &str) -> String {
    format!("rdzv/{round}/{name}")
}

impl Agent<'_> {
    fn is_host(&self) -> bool {
        self.config.node_rank == 0
    }

    fn run(&self, job: &Job) -> Result<i32> {
        let (mut round, mut restarts) = (0, 0);
        loop {
            let (members, port) = self.join(&mut round)?;
            let node_rank = members.iter().position(|m| *m == self.id).expect("join returns a round this node is in");
            let placed =
                LaunchConfig { nnodes: members.len(), node_rank, master_port: Some(port), ..self.config.clone() };
            let (first, last) = (node_rank * placed.nproc_per_node, (node_rank + 1) * placed.nproc_per_node - 1);
            let restart = match restarts {
                0 => String::new(),
                n => format!(" (restart {n} of {})", self.config.max_restarts),
            };
            eprintln!(
                "launch: round {round}: {}, {}; this node runs {}{restart}",
                count(members.len(), "node"),
                count(placed.world_size(), "rank"),
                if first == last { format!("rank {first}") } else { format!("ranks {first} to {last}") },
            );
            let extra = [
                (ELASTIC_ROUND, round.to_string()),
                ("TORCHELASTIC_RESTART_COUNT", restarts.to_string()),
                ("TORCHELASTIC_MAX_RESTARTS", self.config.max_restarts.to_string()),
            ];
            let mut ranks = job.start(&placed, port, self.token, &extra)?;
            let mut last_poll = Instant::now();
            let ended = supervise(&mut ranks, || {
                (last_poll.elapsed() >= POLL_EVERY).then(|| {
                    last_poll = Instant::now();
                    self.should_stop(round, members.len())
                })?
            });
            let failure = match ended {
                Ended::Succeeded => return self.finish(round, members.len()),
                Ended::Failed { code, report, .. } => {
                    eprintln!("launch: {report}");
                    // Tell the other agents; this one may be the last to know the job is over.
                    let _ = self.store.set(&key(round, "restart"), format!("{FAILED}{report}").as_bytes());
                    Some((code, report))
                }
                Ended::Interrupted(Stop::Failed(report)) => {
                    eprintln!("launch: stopped this node's ranks: on another node, {report}");
                    Some((1, report))
                }
                Ended::Interrupted(Stop::Joining) => None,
                Ended::Interrupted(Stop::HostGone(why)) => {
                    bail!("launch: node 0's launcher is gone ({why}): the job cannot go on without its rendezvous")
                }
            };
            match failure {
                Some((code, report)) if restarts == self.config.max_restarts => {
                    match self.config.max_restarts {
                        0 => eprintln!(
                            "launch: the job ends: --max-restarts is 0, and a lost machine fails the other machines' \
                             ranks like any failure; give --max-restarts K for the job to go on without it"
                        ),
                        k => eprintln!("launch: no restarts left (--max-restarts {k}): {report}"),
                    }
                    self.leave(round, "stopped", members.len());
                    return Ok(code);
                }
                Some(_) => restarts += 1,
                None => eprintln!("launch: a node is waiting to join: starting the ranks again with it"),
            }
            round += 1;
        }
    }

    /// Joins `round` and waits for it to close; moves on to later rounds
    /// until one admits this node. Returns the members, node 0's agent
    /// first, and the port of the ranks' store.
    fn join(&self, round: &mut usize) -> Result<(Vec<String>, u16)> {
        loop {
            let joined = self.store.add(&key(*round, "joined"), 1).map_err(|e| self.lost(e))?;
            self.store.set(&key(*round, &format!("node/{joined}")), self.id.as_bytes()).map_err(|e| self.lost(e))?;
            let members = match self.is_host() {
                true => self.close(*round)?,
                false => {
                    let wait = self.config.timeout() + self.config.last_call;
                    let members = self.store.get(&key(*round, "members"), wait).map_err(|e| match e.kind() {
                        std::io::ErrorKind::TimedOut => candle_core::Error::Msg(format!(
                            "launch: node {}: round {round} of the rendezvous did not close within {wait:?}: the \
                             job may already hold --nnodes' most machines, or node 0's launcher is not running",
                            self.config.node_rank
                        )),
                        _ => self.lost(e),
                    })?;
                    String::from_utf8_lossy(&members).split(',').map(str::to_string).collect()
                }
            };
            if members.contains(&self.id) {
                let port = self.store.get(&key(*round, "port"), self.config.timeout()).map_err(|e| self.lost(e))?;
                let port = String::from_utf8_lossy(&port).parse().map_err(|_| {
                    candle_core::Error::Msg(format!("launch: round {round}'s port in the rendezvous is not a number"))
                })?;
                return Ok((members, port));
            }
            // The round closed without this node (it was full, or this node
            // came late): wait in the next, whose first arrival asks the
            // running ranks to make room.
            *round += 1;
        }
    }

    /// Node 0's agent closes `round` once every machine the job can hold has
    /// joined, or the fewest it needs and the last call has passed; it
    /// publishes the members and a fresh port for the round's ranks' store.
    fn close(&self, round: usize) -> Result<Vec<String>> {
        let opened = Instant::now();
        let (min, max) = (self.config.min_nnodes, self.config.nnodes);
        let joined = loop {
            let joined = self.store.add(&key(round, "joined"), 0).map_err(|e| self.lost(e))? as usize;
            if joined >= max || (joined >= min && opened.elapsed() >= self.config.last_call) {
                break joined;
            }
            if opened.elapsed() >= self.config.timeout() + self.config.last_call {
                bail!(
                    "launch: {joined} of at least {min} node(s) joined round {round} within {:?}: \
                     start a launcher on each node, with the same --master-addr and --master-port",
                    opened.elapsed()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut members = vec![self.id.clone()];
        for n in 1..=joined {
            let id =
                self.store.get(&key(round, &format!("node/{n}")), self.config.timeout()).map_err(|e| self.lost(e))?;
            let id = String::from_utf8_lossy(&id).into_owned();
            if id != self.id && members.len() < max {
                members.push(id);
            }
        }
        let port = free_port(&self.config.master_addr)?;
        self.store.set(&key(round, "port"), port.to_string().as_bytes()).map_err(|e| self.lost(e))?;
        self.store.set(&key(round, "members"), members.join(",").as_bytes()).map_err(|e| self.lost(e))?;
        Ok(members)
    }

    /// Whether this node should stop its ranks of `round`, which has
    /// `members` machines: a rank failed somewhere, or (node 0's agent
    /// decides) a machine waits to join and there is room for it.
    fn should_stop(&self, round: usize, members: usize) -> Option<Stop> {
        match self.store.get(&key(round, "restart"), Duration::ZERO) {
            Ok(value) => {
                let value = String::from_utf8_lossy(&value).into_owned();
                return Some(match value.strip_prefix(FAILED) {
                    Some(report) => Stop::Failed(report.to_string()),
                    None => Stop::Joining,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Some(Stop::HostGone(e.to_string())),
        }
        if !self.is_host() || members >= self.config.nnodes {
            return None;
        }
        match self.store.add(&key(round + 1, "joined"), 0) {
            Ok(0) => None,
            Ok(_) => {
                let _ = self.store.set(&key(round, "restart"), JOINING.as_bytes());
                Some(Stop::Joining)
            }
            Err(e) => Some(Stop::HostGone(e.to_string())),
        }
    }

    /// This node's ranks all succeeded.
    fn finish(&self, round: usize, members: usize) -> Result<i32> {
        self.leave(round, "done", members);
        Ok(0)
    }

    /// This node's agent leaves the job, counted under `name` in `round`.
    /// Node 0's agent hosts the store, so it waits (a while at most) until
    /// every member has left too: the others learn how the job ended from
    /// the store, not from finding it gone.
    fn leave(&self, round: usize, name: &str, members: usize) {
        let mut left = self.store.add(&key(round, name), 1).unwrap_or(0);
        let started = Instant::now();
        while self.is_host() && (left as usize) < members && started.elapsed() < self.config.timeout() {
            std::thread::sleep(Duration::from_millis(50));
            left = self.store.add(&key(round, name), 0).unwrap_or(0);
        }
    }

    /// The error of a rendezvous that can no longer be reached.
    fn lost(&self, e: std::io::Error) -> candle_core::Error {
        io_context(format!("launch: node {}: the rendezvous at {}", self.config.node_rank, self.config.master_addr), e)
    }
}
