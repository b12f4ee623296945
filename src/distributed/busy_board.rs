//! Busy periods said through the job's store, for backends whose ranks have
//! no line of their own to say it on. Over TCP a rank's heartbeats carry
//! what it is busy with; NCCL's calls wait on the GPU, where only the
//! [watchdog](super::watchdog) sees how long, so a rank writes its busy
//! period to the store (`busy/<rank>`) and a watchdog about to fire reads
//! every rank's first.

use std::io::{self, ErrorKind};
use std::time::Duration;

use super::store::StoreClient;

/// How long a read of one rank's key may wait: the key is set when the rank
/// joins, so a longer wait only means that rank never got that far.
const READ_WAIT: Duration = Duration::from_millis(20);

/// This rank's place on the board, and its view of the others'.
pub struct BusyBoard {
    client: StoreClient,
    rank: usize,
    world_size: usize,
}

impl BusyBoard {
    /// Rank `rank` of `world_size` joins the board on `client`, saying it is not busy.
    pub fn join(client: StoreClient, rank: usize, world_size: usize) -> io::Result<Self> {
        let board = Self { client, rank, world_size };
        board.say(None)?;
        Ok(board)
    }

    /// Says what long work this rank is busy with (`None`: none).
    pub fn say(&self, what: Option<&str>) -> io::Result<()> {
        self.client.set(&format!("busy/{}", self.rank), what.unwrap_or_default().as_bytes())
    }

    /// The first rank, in rank order, that says it is busy, and with what:
    /// `"rank 2: writing a checkpoint"`. A store that does not answer counts
    /// as nobody busy, so that a watchdog still fires when rank 0 is gone.
    pub fn anyone_busy(&self) -> Option<String> {
        (0..self.world_size).find_map(|rank| {
            let what = self.client.get(&format!("busy/{rank}"), READ_WAIT).ok()?;
            (!what.is_empty()).then(|| format!("rank {rank}: {}", String::from_utf8_lossy(&what)))
        })
    }

    /// Returns once `members` ranks have called it with the same `name`
    /// (each name once per job), waiting on the host, through the store. A
    /// wait of `timeout` without them fails, unless some rank says it is
    /// busy (rank 0 writing a checkpoint while the others wait after it):
    /// then it waits another `timeout`, as the watchdog does.
    pub fn barrier(&self, name: &str, members: usize, timeout: Duration) -> io::Result<()> {
        self.client.arrive(name, members)?;
        loop {
            match self.client.released(name, members, timeout) {
                Err(e) if e.kind() == ErrorKind::TimedOut => {
                    if self.anyone_busy().is_some() {
                        continue;
                    }
                    // A rank may have arrived and stopped being busy since the
                    // wait ran out: look once more, now that nobody is.
                    let again = self.client.released(name, members, Duration::ZERO);
                    return again.map_err(|again| if again.kind() == ErrorKind::TimedOut { e } else { again });
                }
                released => return released,
            }
        }
    }
}
