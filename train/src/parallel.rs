//! Data parallelism: ranks that each hold a replica of the model, compute the
//! gradients of their own share of a batch, and average them before an optimizer step
//! that is then the same on every rank. The strategy ([`broadcast_state`],
//! [`average_grads`]) is written once against [`Collective`], the ranks' exchange;
//! [`ThreadGroup`] is the in-process collective, ranks as threads of one process (the
//! CPU, and the tests that hold data-parallel training to one rank on the whole batch).
//!
//! A collective call waits for every rank. A rank that dies or falls behind does not
//! hang the others: each waits at most the group's timeout, then fails with an error
//! naming the ranks it waited for, and the group stays failed.

use crate::launch::{describe, mean_in_rank_order, tensors_like};
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, Collective, Error, RawTensor, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of gradients sent in one [`Collective::all_reduce_mean`] call, as in
/// PyTorch's DDP (25 MiB): few enough calls that each moves data at the link's rate,
/// small enough that the first bucket is sent while later ones are gathered.
pub const BUCKET_BYTES: usize = 25 << 20;

/// The ranks of one process: [`ThreadGroup::new`] gives one [`ThreadRank`] per rank,
/// each to be moved to its own thread.
pub struct ThreadGroup;

/// One rank of a [`ThreadGroup`]: a [`Collective`] for any backend, exchanging values
/// through host memory.
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
}

/// What the ranks of a group share: the round being gathered and how the last ended.
struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<Round>,
    turned: Condvar,
}

/// One rank's part of an exchange: what its tensors are (dims and dtypes, which every
/// rank must agree on) and their values one after another.
struct Part {
    kinds: String,
    values: Vec<f64>,
}

/// One exchange in progress.
struct Round {
    /// Counts the exchanges completed, so that a waiter knows its own has.
    generation: u64,
    /// Each rank's part of the round in progress.
    given: Vec<Option<Part>>,
    /// The last completed exchange: every rank's values, in rank order.
    gathered: Arc<Vec<Vec<f64>>>,
    /// Why the group cannot go on (a rank timed out, left or gave other tensors).
    failed: Option<String>,
}

impl ThreadGroup {
    /// `world` ranks whose collective calls wait at most `timeout` for one another.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(world: usize, timeout: Duration) -> Result<Vec<ThreadRank>> {
        if world == 0 {
            return Err(Error::invalid(
                "ThreadGroup",
                "a group needs at least one rank",
            ));
        }
        let shared = Arc::new(Shared {
            world,
            timeout,
            state: Mutex::new(Round {
                generation: 0,
                given: (0..world).map(|_| None).collect(),
                gathered: Arc::new(Vec::new()),
                failed: None,
            }),
            turned: Condvar::new(),
        });
        Ok((0..world)
            .map(|rank| ThreadRank {
                rank,
                shared: shared.clone(),
            })
            .collect())
    }
}

impl ThreadRank {
    /// This rank's number, `0..world` (as [`Collective::rank`], for any backend).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the group has.
    pub fn world(&self) -> usize {
        self.shared.world
    }

    /// Every rank's values, in rank order, once all have given theirs.
    fn exchange(&self, op: &'static str, part: Part) -> Result<Arc<Vec<Vec<f64>>>> {
        let s = &self.shared;
        let fail = |why: &str| Error::invalid(op, format!("rank {}: {why}", self.rank));
        let mut round = s
            .state
            .lock()
            .map_err(|_| fail("a rank panicked mid-exchange"))?;
        if let Some(why) = &round.failed {
            return Err(fail(&format!("the group has failed ({why})")));
        }
        if let Some((other, first)) = round
            .given
            .iter()
            .enumerate()
            .find_map(|(r, g)| Some((r, g.as_ref()?)))
        {
            if first.kinds != part.kinds {
                let why = format!(
                    "gave tensors {} where rank {other} gave {}",
                    part.kinds, first.kinds
                );
                round.failed = Some(why.clone());
                s.turned.notify_all();
                return Err(fail(&why));
            }
        }
        round.given[self.rank] = Some(part);
        let mine = round.generation;
        if round.given.iter().all(Option::is_some) {
            let all = round
                .given
                .iter_mut()
                .map(|g| g.take().map(|p| p.values).unwrap_or_default());
            round.gathered = Arc::new(all.collect());
            round.generation += 1;
            s.turned.notify_all();
            return Ok(round.gathered.clone());
        }
        let deadline = Instant::now() + s.timeout;
        loop {
            // The round this rank joined is complete: its result stands even if the
            // group failed since (a rank that finished and left).
            if round.generation != mine {
                return Ok(round.gathered.clone());
            }
            if let Some(why) = &round.failed {
                return Err(fail(&format!("the group has failed ({why})")));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = (0..s.world)
                    .filter(|&r| round.given[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                let why = format!(
                    "waited {:.1} s in `{op}` for rank(s) {} (a rank died, left or fell behind)",
                    s.timeout.as_secs_f64(),
                    missing.join(", ")
                );
                round.failed = Some(why.clone());
                s.turned.notify_all();
                return Err(fail(&why));
            }
            round = s
                .turned
                .wait_timeout(round, deadline - now)
                .map_err(|_| fail("a rank panicked mid-exchange"))?
                .0;
        }
    }
}

/// `tensors` as one exchange's part.
fn part_of<B: Backend>(
    op: &'static str,
    tensors: &[RawTensor<B>],
    floats_only: bool,
) -> Result<Part> {
    let (kinds, values) = describe(op, tensors, floats_only)?;
    Ok(Part { kinds, values })
}

impl<B: Backend> Collective<B> for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_mean(&self, tensors: &[RawTensor<B>]) -> Result<Vec<RawTensor<B>>> {
        let all = self.exchange(
            "all_reduce_mean",
            part_of("all_reduce_mean", tensors, true)?,
        )?;
        tensors_like(&mean_in_rank_order(&all), tensors)
    }

    fn broadcast(&self, tensors: &[RawTensor<B>], root: usize) -> Result<Vec<RawTensor<B>>> {
        if root >= self.shared.world {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a rank of {}", self.shared.world),
            ));
        }
        let all = self.exchange("broadcast", part_of("broadcast", tensors, false)?)?;
        tensors_like(&all[root], tensors)
    }
}

impl Drop for ThreadRank {
    /// A rank that leaves fails the group (a rank thread that returns an error or
    /// panics): the others' exchanges, waiting now or made later, can never complete
    /// without it, so they fail at once instead of timing out. Rounds it completed
    /// stand for the ranks still returning from them.
    fn drop(&mut self) {
        if let Ok(mut round) = self.shared.state.lock() {
            if round.failed.is_none() {
                round.failed = Some(format!("rank {} left", self.rank));
                self.shared.turned.notify_all();
            }
        }
    }
}

/// Makes every rank's parameters and buffers (batch-norm statistics) rank `root`'s, so
/// that replicas start equal whatever their initialisation.
pub fn broadcast_state<B: Backend, M: Module<B>>(
    c: &(impl Collective<B> + ?Sized),
    model: &mut M,
    root: usize,
) -> Result<()> {
    let mut names = Vec::new();
    let mut tensors = Vec::new();
    let mut take = |s: kiln_tensor::nn::Slot<'_, B>| {
        names.push(s.name.to_string());
        tensors.push(s.value.clone());
    };
    model.visit_params("", &mut take);
    model.visit_buffers("", &mut take);
    let values = c.broadcast(&tensors, root)?;
    let mut by_name: std::collections::HashMap<String, RawTensor<B>> =
        names.into_iter().zip(values).collect();
    model.load_named("", &mut |name, _| {
        by_name
            .remove(name)
            .ok_or_else(|| Error::invalid("broadcast_state", format!("{name} was not visited")))
    })
}

/// `grads` (of this rank's share of the batch) averaged over the ranks: with equal
/// shares of a batch whose loss is a mean, the gradients of the whole batch. Sent in
/// buckets of about [`BUCKET_BYTES`], last parameters first, the order a backward pass
/// produces them.
pub fn average_grads<B: Backend, M: Module<B>>(
    c: &(impl Collective<B> + ?Sized),
    model: &mut M,
    grads: &M::Grads,
) -> Result<M::Grads> {
    let mut raw: Vec<RawTensor<B>> = Vec::new();
    each_grad(model, grads, &mut |_, g| raw.push(g.clone()))?;
    let mut averaged: Vec<Option<RawTensor<B>>> = (0..raw.len()).map(|_| None).collect();
    let mut bucket: Vec<usize> = Vec::new();
    let mut bytes = 0;
    let mut send = |bucket: &mut Vec<usize>| -> Result<()> {
        let tensors: Vec<RawTensor<B>> = bucket.iter().map(|&i| raw[i].clone()).collect();
        for (&i, t) in bucket.iter().zip(c.all_reduce_mean(&tensors)?) {
            averaged[i] = Some(t);
        }
        bucket.clear();
        Ok(())
    };
    for i in (0..raw.len()).rev() {
        bucket.push(i);
        bytes += raw[i].numel() * raw[i].dtype().size_in_bytes();
        if bytes >= BUCKET_BYTES {
            send(&mut bucket)?;
            bytes = 0;
        }
    }
    if !bucket.is_empty() {
        send(&mut bucket)?;
    }
    M::grads_from_raw(&mut averaged.into_iter().flatten())
}

/// Every gradient of `grads` with its parameter's name, in `visit_params` order.
pub fn named_grads<B: Backend, M: Module<B>>(
    model: &mut M,
    grads: &M::Grads,
) -> Result<Vec<(String, RawTensor<B>)>> {
    let mut out = Vec::new();
    each_grad(model, grads, &mut |name, g| {
        out.push((name.to_string(), g.clone()))
    })?;
    Ok(out)
}

/// Calls `f` with every gradient of `grads` and its parameter's name, in
/// `visit_params` order (through `update_params`, leaving the parameters as they are).
fn each_grad<B: Backend, M: Module<B>>(
    model: &mut M,
    grads: &M::Grads,
    f: &mut dyn FnMut(&str, &RawTensor<B>),
) -> Result<()> {
    model.update_params(grads, "", &mut |name, _, g| {
        f(name, g);
        Ok(())
    })
}
