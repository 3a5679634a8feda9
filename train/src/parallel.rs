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

use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, Collective, Error, HostData, RawTensor, Result};
use std::cell::RefCell;
use std::rc::Rc;
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
    let mut by_name = broadcast_named(c, names, tensors, root)?;
    model.load_named("", &mut |name, _| by_name.take(name))
}

/// Rank `root`'s values of the tensors `names`, `tensors` (every rank's in the same
/// order), by name: [`broadcast_state`]'s exchange, generic over the backend and the
/// collective only (the CPU's copy for `dyn Collective` compiled in this crate,
/// `instances.rs`).
#[inline(never)]
pub(crate) fn broadcast_named<B: Backend, C: Collective<B> + ?Sized>(
    c: &C,
    names: Vec<String>,
    tensors: Vec<RawTensor<B>>,
    root: usize,
) -> Result<ByName<B>> {
    let values = c.broadcast(&tensors, root)?;
    Ok(ByName(names.into_iter().zip(values).collect()))
}

/// Tensors by parameter or buffer name, each taken once.
pub(crate) struct ByName<B: Backend>(std::collections::HashMap<String, RawTensor<B>>);

impl<B: Backend> ByName<B> {
    /// The tensor named `name`, removed; an error if there is none.
    #[inline(never)]
    pub(crate) fn take(&mut self, name: &str) -> Result<RawTensor<B>> {
        self.0
            .remove(name)
            .ok_or_else(|| Error::invalid("broadcast_state", format!("{name} was not visited")))
    }
}

/// `grads` (of this rank's share of the batch) averaged over the ranks: with equal
/// shares of a batch whose loss is a mean, the gradients of the whole batch. Sent in
/// buckets of about [`BUCKET_BYTES`], last parameters first, the order a backward pass
/// produces them, after the backward pass ([`GradExchange`] sends them during it).
pub fn average_grads<B: Backend, M: Module<B>>(
    c: &(impl Collective<B> + ?Sized),
    model: &mut M,
    grads: &M::Grads,
) -> Result<M::Grads> {
    let mut raw: Vec<RawTensor<B>> = Vec::new();
    each_grad(model, grads, &mut |_, g| raw.push(g.clone()))?;
    let mut averaged: Vec<Option<RawTensor<B>>> = (0..raw.len()).map(|_| None).collect();
    average_in_buckets(c, &raw, (0..raw.len()).rev(), false, &mut averaged)?;
    M::grads_from_raw(&mut averaged.into_iter().flatten())
}

/// Averages `raw[i]` for each `i` of `order`, in buckets of about [`BUCKET_BYTES`] in
/// that order, each result into `averaged[i]`; `beside`: each bucket started beside
/// later work (see [`Collective::start_all_reduce_mean`]).
fn average_in_buckets<B: Backend>(
    c: &(impl Collective<B> + ?Sized),
    raw: &[RawTensor<B>],
    order: impl Iterator<Item = usize>,
    beside: bool,
    averaged: &mut [Option<RawTensor<B>>],
) -> Result<()> {
    let mut bucket = Bucket::new(beside);
    for i in order {
        if let Some(sent) = bucket.add(c, i, &raw[i])? {
            sent.into_iter().for_each(|(i, t)| averaged[i] = Some(t));
        }
    }
    bucket
        .send(c)?
        .into_iter()
        .for_each(|(i, t)| averaged[i] = Some(t));
    Ok(())
}

/// The results of a bucket's exchange, each with its gradient's key.
type Sent<B> = Vec<(usize, RawTensor<B>)>;

/// Gradients gathered for one exchange, each with its key (its parameter's index, or
/// its place among a step's outputs).
struct Bucket<B: Backend> {
    tensors: Vec<RawTensor<B>>,
    keys: Vec<usize>,
    bytes: usize,
    /// Whether exchanges are started beside later work or made at once.
    beside: bool,
}

impl<B: Backend> Bucket<B> {
    /// An empty bucket whose exchanges are started `beside` later work, or made at
    /// once.
    fn new(beside: bool) -> Self {
        Bucket {
            tensors: Vec::new(),
            keys: Vec::new(),
            bytes: 0,
            beside,
        }
    }

    /// Adds gradient `g` under `key`; starts the bucket's exchange once it holds
    /// [`BUCKET_BYTES`], returning the keys and results of what it started.
    fn add(
        &mut self,
        c: &(impl Collective<B> + ?Sized),
        key: usize,
        g: &RawTensor<B>,
    ) -> Result<Option<Sent<B>>> {
        self.tensors.push(g.clone());
        self.keys.push(key);
        self.bytes += g.numel() * g.dtype().size_in_bytes();
        match self.bytes >= BUCKET_BYTES {
            true => self.send(c).map(Some),
            false => Ok(None),
        }
    }

    /// Starts the exchange of what the bucket holds, if anything, and empties it.
    fn send(&mut self, c: &(impl Collective<B> + ?Sized)) -> Result<Sent<B>> {
        if self.tensors.is_empty() {
            return Ok(Vec::new());
        }
        let averaged = match self.beside {
            true => c.start_all_reduce_mean(&self.tensors)?,
            false => c.all_reduce_mean(&self.tensors)?,
        };
        self.tensors.clear();
        self.bytes = 0;
        Ok(self.keys.drain(..).zip(averaged).collect())
    }
}

/// What a step's watcher records while the backward pass runs.
struct During<B: Backend> {
    /// Every output handed out, in order.
    handed: Vec<RawTensor<B>>,
    /// The exchanges started, keyed by the place of the output they average.
    started: Vec<(usize, RawTensor<B>)>,
    /// The gradients gathered for the next exchange.
    bucket: Bucket<B>,
    /// Why an exchange could not start: the step fails with it.
    failed: Option<Error>,
}

/// A data-parallel step's exchange of gradients: each step's gradients and loss
/// averaged over the ranks, in buckets of about [`BUCKET_BYTES`] sent in the order the
/// backward pass computes them, each as soon as its last gradient is computed (through
/// [`kiln_tensor::collective::watch_outputs`]), so that a collective that overlaps
/// ([`Collective::start_all_reduce_mean`], NCCL on its own stream) sends them while
/// the rest of the backward pass runs.
///
/// Which of the plan's outputs is which parameter's gradient is learnt on the first
/// step, from the buffers the gradients are in (as DDP rebuilds its buckets after its
/// first iteration), and checked on every step. Gradients not handed out during the
/// backward pass (the first step's, a dynamic part's, a parameter the loss does not
/// use, a hand-written model's) are sent after it, last parameters first. Every rank
/// runs the same plans, so every rank makes the same exchanges in the same order.
#[derive(Default)]
pub struct GradExchange {
    /// Whether every gradient is sent after the backward pass instead.
    after: bool,
    /// For each output handed out during a step, in order: the index (in
    /// `visit_params` order) of the parameter whose gradient it is.
    learnt: Option<Vec<Option<usize>>>,
    /// How many gradients the last step sent during its backward pass, of how many.
    overlapped: (usize, usize),
}

impl GradExchange {
    /// An exchange that learns its buckets on its first step.
    pub fn new() -> Self {
        Self::default()
    }

    /// An exchange that sends every gradient after the backward pass, on the stream
    /// the step runs on, as [`average_grads`] does (to measure what sending during it
    /// saves, or to rule it out when looking for a fault).
    pub fn after_backward() -> Self {
        GradExchange {
            after: true,
            ..Self::default()
        }
    }

    /// Whether it sends gradients during the backward pass (not [`Self::after_backward`]).
    pub fn during_backward(&self) -> bool {
        !self.after
    }

    /// How many of the last step's gradients were sent while its backward pass ran,
    /// and how many it had.
    pub fn sent_during_backward(&self) -> (usize, usize) {
        self.overlapped
    }

    /// Runs `backward` (a step's loss and gradients on this rank's share of the batch)
    /// and gives its loss and gradients averaged over the ranks of `c`. The exchange
    /// holds `c` (shared) while the backward pass runs, because it starts buckets from
    /// the watcher the model's methods hand their outputs to.
    pub fn run<B: Backend, M: Module<B>, C: Collective<B> + ?Sized + 'static>(
        &mut self,
        c: &Rc<C>,
        model: &mut M,
        backward: impl FnOnce(&M) -> Result<(RawTensor<B>, M::Grads)>,
    ) -> Result<(RawTensor<B>, M::Grads)> {
        let mut backward = Some(backward);
        let (loss, averaged) = self.exchange(c, &mut || {
            let backward = backward
                .take()
                .expect("an exchange runs its backward pass once");
            let (loss, grads) = backward(&*model)?;
            let mut raw = Vec::new();
            each_grad(model, &grads, &mut |_, g| raw.push(g.clone()))?;
            Ok((loss, raw))
        })?;
        let grads = M::grads_from_raw(&mut averaged.into_iter())?;
        Ok((loss, grads))
    }

    /// [`GradExchange::run`] of any model: `backward` gives the loss and the gradients
    /// in `visit_params` order; so are the averaged ones returned.
    #[inline(never)]
    pub(crate) fn exchange<B: Backend, C: Collective<B> + ?Sized + 'static>(
        &mut self,
        c: &Rc<C>,
        backward: &mut Backward<'_, B>,
    ) -> Result<(RawTensor<B>, Vec<RawTensor<B>>)> {
        let learnt: Rc<[Option<usize>]> = match (self.after, &self.learnt) {
            (false, Some(learnt)) => learnt.as_slice().into(),
            _ => Rc::new([]),
        };
        let during = Rc::new(RefCell::new(During {
            handed: Vec::new(),
            started: Vec::new(),
            bucket: Bucket::new(!self.after),
            failed: None,
        }));
        let watch = {
            let (during, c, learnt) = (during.clone(), c.clone(), learnt.clone());
            move |out: &dyn std::any::Any| {
                let Some(t) = out.downcast_ref::<RawTensor<B>>() else {
                    return;
                };
                let During {
                    handed,
                    started,
                    bucket,
                    failed,
                } = &mut *during.borrow_mut();
                let k = handed.len();
                handed.push(t.clone());
                // An output learnt as a gradient goes into the bucket, keyed by its place.
                if failed.is_none() && learnt.get(k).is_some_and(Option::is_some) {
                    match bucket.add(&*c, k, t) {
                        Ok(sent) => started.extend(sent.into_iter().flatten()),
                        Err(e) => *failed = Some(e),
                    }
                }
            }
        };
        let (loss, raw) = kiln_tensor::collective::watch_outputs(Box::new(watch), backward)?;
        let During {
            handed,
            mut started,
            mut bucket,
            failed,
        } = Rc::into_inner(during)
            .expect("the watcher is dropped when its scope ends")
            .into_inner();
        if let Some(e) = failed {
            return Err(e);
        }
        let c: &C = c;
        started.extend(bucket.send(c)?);
        let mut averaged: Vec<Option<RawTensor<B>>> = (0..raw.len()).map(|_| None).collect();
        let mut relearn = self.learnt.is_none();
        for (k, avg) in started {
            let param = learnt[k].expect("only outputs learnt as gradients are sent");
            // A plan output that was not this parameter's gradient after all (another
            // model's plan): its exchange is wasted, the gradient is sent below.
            match raw.get(param).is_some_and(|g| same_buffer(g, &handed[k])) {
                true => averaged[param] = Some(avg),
                false => relearn = true,
            }
        }
        self.overlapped = (averaged.iter().flatten().count(), raw.len());
        let rest: Vec<usize> = (0..raw.len())
            .rev()
            .filter(|&i| averaged[i].is_none())
            .collect();
        average_in_buckets(c, &raw, rest.into_iter(), !self.after, &mut averaged)?;
        let mut loss = match self.after {
            true => c.all_reduce_mean(&[loss])?,
            false => c.start_all_reduce_mean(&[loss])?,
        };
        c.finish_exchanges()?;
        if relearn {
            self.learnt = Some(
                handed
                    .iter()
                    .map(|t| raw.iter().position(|g| same_buffer(g, t)))
                    .collect(),
            );
        }
        Ok((loss.remove(0), averaged.into_iter().flatten().collect()))
    }
}

/// A backward pass as [`GradExchange::exchange`] runs it: the loss and every gradient,
/// in `visit_params` order.
pub(crate) type Backward<'a, B> = dyn FnMut() -> Result<(RawTensor<B>, Vec<RawTensor<B>>)> + 'a;

/// Whether two tensors are the same values: one buffer, one layout.
fn same_buffer<B: Backend>(a: &RawTensor<B>, b: &RawTensor<B>) -> bool {
    std::sync::Arc::ptr_eq(a.storage(), b.storage()) && a.layout() == b.layout()
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

/// `tensors` as an exchange's description (op, dims and dtypes, which every rank must
/// agree on) and values.
pub(crate) fn describe<B: Backend>(
    op: &'static str,
    tensors: &[RawTensor<B>],
    floats_only: bool,
) -> Result<(String, Vec<f64>)> {
    let mut kinds = Vec::with_capacity(tensors.len());
    let mut values = Vec::new();
    for t in tensors {
        if floats_only && !t.dtype().is_float() {
            return Err(Error::dtype(
                op,
                format!("averages float tensors, not {}", t.dtype()),
            ));
        }
        kinds.push(format!("{}{:?}", t.dtype(), &t.dims()[..]));
        values.extend(t.to_f64_vec()?);
    }
    Ok((format!("[{}]", kinds.join(", ")), values))
}

/// `values` cut back into tensors of the dims, dtypes and devices of `like`.
pub(crate) fn tensors_like<B: Backend>(
    values: &[f64],
    like: &[RawTensor<B>],
) -> Result<Vec<RawTensor<B>>> {
    let mut at = 0;
    like.iter()
        .map(|t| {
            let n = t.numel();
            let host = HostData::from_f64_slice(t.dtype(), &values[at..at + n]);
            at += n;
            RawTensor::from_host(host, &t.dims()[..], t.device())
        })
        .collect()
}

/// The element-wise mean of every rank's values, summed in rank order.
pub(crate) fn mean_in_rank_order(all: &[Vec<f64>]) -> Vec<f64> {
    let scale = 1.0 / all.len() as f64;
    let n = all.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| all.iter().map(|r| r[i]).sum::<f64>() * scale)
        .collect()
}
