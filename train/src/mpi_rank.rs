//! Ranks started by an MPI launcher (`mpirun`, `mpiexec`): [`MpiRank`], the collective
//! of CPU ranks across machines on the system's MPI library (Open MPI or MPICH, through
//! the `mpi` crate), and [`end_job`], which ends a rank's part in the MPI job (MPI
//! wants every process to finalise, or abort the job when it fails).
//!
//! MPI's own collectives wait forever for a rank that is alive but never calls them,
//! so every exchange starts with a check under the group's timeout: each rank tells
//! rank 0 what it exchanges, rank 0 waits at most the timeout for every rank and
//! answers each with a verdict naming the ranks that did not come or disagree. The
//! values then go through MPI's reduce and broadcast from rank 0, so every rank gets
//! rank 0's bits. A rank that dies is MPI's to report: its launcher stops the job and
//! names the rank and its node.

use crate::parallel::{describe, tensors_like};
use crate::rank_env::{rank_name, Meeting, RankEnv};
use kiln_tensor::{Backend, Collective, Error, RawTensor, Result};
use mpi::collective::SystemOperation;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Equivalence, Root};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The MPI environment of this process, from the first [`MpiRank::join`] to
/// [`end_job`].
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

/// The longest verdict rank 0 sends, in bytes: under every MPI's eager limit, so that
/// sending it to a rank that is late never waits for that rank.
const VERDICT_BYTES: usize = 1024;

/// The longest host name the ranks share.
const HOST_BYTES: usize = 256;

/// One rank of an MPI job.
pub struct MpiRank {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Each rank's machine, as MPI names it.
    hosts: Vec<String>,
    /// Why the group cannot go on: later calls fail at once.
    failed: std::cell::RefCell<Option<String>>,
}

/// A digest of an exchange's description, which every rank must agree on.
fn digest(kinds: &str, values: usize) -> [u64; 2] {
    // FNV-1a: the same on every machine and build, unlike std's hasher.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in kinds.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    [h, values as u64]
}

impl MpiRank {
    /// Joins the MPI job this process was started in (`env` is its place, which MPI
    /// must agree with). Each exchange waits at most `timeout` for every rank.
    pub fn join(env: &RankEnv, timeout: Duration) -> Result<MpiRank> {
        let fail = |why: String| Error::invalid("MPI", format!("{}: {why}", env.describe()));
        let timeout = crate::launch::check_timeout("the rank timeout", timeout)?;
        if env.meeting != Meeting::Mpi {
            return Err(fail(format!(
                "this rank was started by {}, not by an MPI launcher",
                env.starter.name()
            )));
        }
        {
            let mut universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner());
            if universe.is_none() {
                if mpi::environment::is_finalized() {
                    return Err(fail("MPI has ended in this process".into()));
                }
                *universe = Some(
                    mpi::initialize().ok_or_else(|| fail("MPI was started outside Kiln".into()))?,
                );
            }
        }
        let world = SimpleCommunicator::world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        if (rank, size) != (env.rank, env.world) {
            return Err(fail(format!(
                "MPI says this is rank {rank} of {size}, its launcher's variables rank {} of {}: was this program built against another MPI than the one running it?",
                env.rank, env.world
            )));
        }
        let mut name = [0u8; HOST_BYTES];
        let mine = mpi::environment::processor_name().unwrap_or_default();
        let n = mine.len().min(HOST_BYTES);
        name[..n].copy_from_slice(&mine.as_bytes()[..n]);
        let mut all = vec![0u8; HOST_BYTES * size];
        world.all_gather_into(&name[..], &mut all[..]);
        let hosts = all
            .chunks(HOST_BYTES)
            .map(|c| {
                let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                String::from_utf8_lossy(&c[..end]).into_owned()
            })
            .collect();
        Ok(MpiRank {
            world,
            rank,
            size,
            timeout,
            hosts,
            failed: std::cell::RefCell::new(None),
        })
    }

    /// Rank `rank` as errors name it.
    fn who(&self, rank: usize) -> String {
        let host = self.hosts.get(rank).filter(|h| !h.is_empty());
        rank_name(rank, None, host.map(String::as_str))
    }

    /// Rank 0's `bytes`, on every rank (an NCCL unique id, say).
    pub fn share_from_root(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let mut len = [bytes.len() as u64];
        let root = self.world.process_at_rank(0);
        root.broadcast_into(&mut len[..]);
        let mut out = if self.rank == 0 {
            bytes.to_vec()
        } else {
            vec![0u8; len[0] as usize]
        };
        root.broadcast_into(&mut out[..]);
        Ok(out)
    }

    /// Checks under the timeout that every rank came to this exchange with the same
    /// description; the error names the ranks that did not.
    fn agree(&self, kinds: &str, values: usize) -> std::result::Result<(), String> {
        let mine = digest(kinds, values);
        let deadline = Instant::now() + self.timeout;
        if self.rank == 0 {
            let mut theirs = vec![[0u64; 2]; self.size - 1];
            let mut late = Vec::new();
            mpi::request::scope(|scope| {
                let mut pending: Vec<_> = theirs
                    .iter_mut()
                    .enumerate()
                    .map(|(i, buf)| {
                        Some(
                            self.world
                                .process_at_rank(i as i32 + 1)
                                .immediate_receive_into(scope, &mut buf[..]),
                        )
                    })
                    .collect();
                while pending.iter().any(Option::is_some) && Instant::now() < deadline {
                    for slot in pending.iter_mut() {
                        if let Some(req) = slot.take() {
                            if let Err(req) = req.test() {
                                *slot = Some(req);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                for (i, slot) in pending.into_iter().enumerate() {
                    if let Some(req) = slot {
                        late.push(i + 1);
                        req.cancel();
                        req.wait();
                    }
                }
            });
            let verdict = if !late.is_empty() {
                let named: Vec<String> = late.iter().map(|&r| self.who(r)).collect();
                format!(
                    "waited {:.1} s for {} (a rank died, left or fell behind)",
                    self.timeout.as_secs_f64(),
                    named.join(", ")
                )
            } else if let Some(r) = theirs.iter().position(|d| *d != mine) {
                format!(
                    "{} gave other tensors than rank 0's {kinds}",
                    self.who(r + 1)
                )
            } else {
                String::new()
            };
            let mut cut = verdict.len().min(VERDICT_BYTES);
            while !verdict.is_char_boundary(cut) {
                cut -= 1;
            }
            // Late ranks are told too: they read it when they come.
            for r in 1..self.size {
                self.world
                    .process_at_rank(r as i32)
                    .send(&verdict.as_bytes()[..cut]);
            }
            if verdict.is_empty() {
                Ok(())
            } else {
                Err(verdict)
            }
        } else {
            let root = self.world.process_at_rank(0);
            root.send(&mine[..]);
            let mut verdict = vec![0u8; VERDICT_BYTES];
            // Rank 0 may wait a timeout for a slow rank before it answers.
            let deadline = deadline + self.timeout;
            let status = mpi::request::scope(|scope| {
                let mut req = root.immediate_receive_into(scope, &mut verdict[..]);
                loop {
                    match req.test() {
                        Ok(status) => return Some(status),
                        Err(r) => req = r,
                    }
                    if Instant::now() >= deadline {
                        req.cancel();
                        req.wait();
                        return None;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            });
            let Some(status) = status else {
                return Err(format!(
                    "waited {:.1} s for {} (it died, left or fell behind)",
                    2.0 * self.timeout.as_secs_f64(),
                    self.who(0)
                ));
            };
            let n = status.count(u8::equivalent_datatype()) as usize;
            if n == 0 {
                Ok(())
            } else {
                Err(format!(
                    "the group has failed ({})",
                    String::from_utf8_lossy(&verdict[..n])
                ))
            }
        }
    }

    /// One exchange: the check, then `move_values` over MPI.
    fn exchange(
        &self,
        op: &'static str,
        kinds: String,
        values: &mut [f64],
        move_values: &dyn Fn(&mut [f64]),
    ) -> Result<()> {
        let fail = |why: String| Error::invalid(op, format!("rank {}: {why}", self.rank));
        if let Some(why) = self.failed.borrow().as_ref() {
            return Err(fail(format!("the group has failed ({why})")));
        }
        if let Err(why) = self.agree(&kinds, values.len()) {
            *self.failed.borrow_mut() = Some(why.clone());
            return Err(fail(why));
        }
        move_values(values);
        Ok(())
    }
}

impl<B: Backend> Collective<B> for MpiRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn all_reduce_mean(&self, tensors: &[RawTensor<B>]) -> Result<Vec<RawTensor<B>>> {
        let (kinds, mut values) = describe("all_reduce_mean", tensors, true)?;
        let root = self.world.process_at_rank(0);
        let scale = 1.0 / self.size as f64;
        self.exchange(
            "all_reduce_mean",
            format!("mean {kinds}"),
            &mut values,
            &|values| {
                if self.rank == 0 {
                    let mut sum = vec![0.0f64; values.len()];
                    root.reduce_into_root(&values[..], &mut sum[..], SystemOperation::sum());
                    for (v, s) in values.iter_mut().zip(sum) {
                        *v = s * scale;
                    }
                } else {
                    root.reduce_into(&values[..], SystemOperation::sum());
                }
                // Every rank takes rank 0's bits.
                root.broadcast_into(values);
            },
        )?;
        tensors_like(&values, tensors)
    }

    fn broadcast(&self, tensors: &[RawTensor<B>], root: usize) -> Result<Vec<RawTensor<B>>> {
        if root >= self.size {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a rank of {}", self.size),
            ));
        }
        let (kinds, mut values) = describe("broadcast", tensors, false)?;
        let from = self.world.process_at_rank(root as i32);
        self.exchange(
            "broadcast",
            format!("broadcast from {root} {kinds}"),
            &mut values,
            &|values| from.broadcast_into(values),
        )?;
        tensors_like(&values, tensors)
    }
}

/// Ends this process's part in its MPI job, if it joined one: finalises MPI when the
/// rank succeeded, and aborts the whole job (every rank, on every node) when it
/// failed, so that no rank waits on it. Nothing outside an MPI job.
pub fn end_job(succeeded: bool) {
    let mut universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner());
    if universe.is_none() {
        return;
    }
    if !succeeded {
        SimpleCommunicator::world().abort(1);
    }
    // Dropping the universe finalises MPI.
    *universe = None;
}
