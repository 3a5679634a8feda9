//! [`Learner`]: one training loop for any model with a loss — a `#[model]` whose impl
//! has a `loss(input, target)` method implements [`Supervised`] — over a
//! [`DataLoader`]: the learning rate from a [`Schedule`] before each step, the
//! optimizer's step (clipping included), evaluation with [`Metric`]s after each epoch,
//! a training state saved after each epoch (and every so many steps) and resumed from
//! (the same batches, the same rates, the same result as an uninterrupted run), one
//! report line per epoch with throughput and the time left, and a callback after each
//! step (for a progress bar or a curve).
//!
//! Steps run planned, their losses summed on the device and read once per epoch; or,
//! with [`Learner::replay`], [`Learner::ranks`] or [`Learner::on_step`], through
//! [`StepReplay`]: captured once warm and replayed as a graph where the backend can
//! (CUDA), averaged over data-parallel ranks, each step's loss read for the callback.

use crate::metrics::{MeanLoss, Metric, Outputs};
use crate::optim::Optimizer;
use crate::parallel::broadcast_state;
use crate::replay::{StepInput, StepReplay};
use crate::schedule::Schedule;
use crate::state;
use kiln_data::{DataLoader, Dataset, DeviceBatch, Field, HostBatch, LastBatch, Values};
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, Collective, Error, HostData, RawTensor, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A model trained on (input, target) batches. `#[model]` implements it for a model
/// whose impl has a `loss` method of two tensors (the batch's inputs and targets)
/// returning a scalar, its sizes (the batch, a sequence length) read from the
/// inputs' dims; and `forward` of the inputs, where the model has one, gives the
/// scores metrics read.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a model the Learner can train",
    note = "`#[model]` implements `Supervised` for a model whose impl has `fn loss(&self, input: Tensor<..>, target: Tensor<..>) -> Tensor`"
)]
pub trait Supervised<B: Backend>: Module<B> {
    /// The batch's loss (a scalar) and every parameter's gradient, in training mode
    /// (dropout active, batch statistics used and recorded).
    fn loss_and_grads(
        &self,
        input: &RawTensor<B>,
        target: &RawTensor<B>,
    ) -> Result<(RawTensor<B>, Self::Grads)>;

    /// The batch's loss in evaluation mode.
    fn eval_loss(&self, input: &RawTensor<B>, target: &RawTensor<B>) -> Result<RawTensor<B>>;

    /// The batch's scores (`[.., classes]`) in evaluation mode, for metrics; `None`
    /// for a model without a `forward` of its inputs.
    fn scores(&self, input: &RawTensor<B>) -> Result<Option<RawTensor<B>>>;

    /// Whether a training step draws random values (dropout masks), so that a replayed
    /// step must find its seed in device memory. `#[model]` reads it from its plans;
    /// the default, `true`, is always correct.
    fn draws_at_random() -> bool
    where
        Self: Sized,
    {
        true
    }
}

/// What one step did, for [`Learner::on_step`].
#[derive(Clone, Debug, PartialEq)]
pub struct StepInfo {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The step, from 0 over the whole run.
    pub step: u64,
    /// Steps in the whole run.
    pub steps: u64,
    /// The step's loss (averaged over the ranks in a data-parallel run).
    pub loss: f32,
    /// Its learning rate.
    pub lr: f64,
    /// A one-line notice about how steps run, on the step it concerns: captured as a
    /// graph and replayed from now on, or why not.
    pub notice: Option<String>,
}

/// What one epoch did.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    /// The epoch, from 0.
    pub epoch: u64,
    /// Epochs in the run.
    pub epochs: u64,
    /// Optimizer steps taken so far.
    pub step: u64,
    /// The mean training loss over the epoch's batches (weighted by their examples).
    pub train_loss: f64,
    /// The learning rate of the epoch's last step.
    pub lr: f64,
    /// Training examples a second over the epoch (evaluation not counted).
    pub examples_per_second: f64,
    /// Seconds the epoch took, evaluation included.
    pub seconds: f64,
    /// Seconds the remaining epochs should take at this epoch's pace.
    pub eta_seconds: f64,
    /// The evaluation's mean loss, when there is evaluation data.
    pub eval_loss: Option<f64>,
    /// The metrics on the evaluation data, by name.
    pub metrics: Vec<(String, f64)>,
}

impl std::fmt::Display for EpochReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch {}/{}: loss {:.4}, lr {:.3e}, {:.0} examples/s",
            self.epoch + 1,
            self.epochs,
            self.train_loss,
            self.lr,
            self.examples_per_second
        )?;
        if let Some(l) = self.eval_loss {
            write!(f, "; eval loss {l:.4}")?;
        }
        for (name, v) in &self.metrics {
            write!(f, ", {name} {v:.4}")?;
        }
        write!(f, "; {:.1} s", self.seconds)?;
        if self.epoch + 1 < self.epochs {
            write!(f, ", {} left", clock(self.eta_seconds))?;
        }
        Ok(())
    }
}

/// `83 s` as `1m23s`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// A callback given each epoch's report.
pub type OnEpoch<'a> = Box<dyn FnMut(&EpochReport) -> Result<()> + 'a>;

/// A callback given the model, the optimizer and what each step did.
pub type OnStep<'a, M, O> = Box<dyn FnMut(&M, &O, &StepInfo) -> Result<()> + 'a>;

/// Trains a [`Supervised`] model with an [`Optimizer`] (see the module docs).
///
/// ```no_run
/// # use kiln_train::learner::{Learner, Supervised};
/// # use kiln_train::optim::{AdamW, AdamWConfig};
/// # use kiln_train::schedule::CosineWithWarmup;
/// # use kiln_train::metrics::TopK;
/// # use kiln_data::{DataLoader, Dataset};
/// # fn demo<B: kiln_tensor::Backend, M: Supervised<B>, D: Dataset + 'static>(
/// #     model: M, device: B::Device, train: DataLoader<D>, test: DataLoader<D>,
/// # ) -> kiln_tensor::Result<()> {
/// let steps = 10 * train.batches_per_epoch() as u64;
/// let mut learner = Learner::new(model, AdamW::new(AdamWConfig::default())?, device)
///     .epochs(10)
///     .schedule(CosineWithWarmup::new(1e-3, 1e-5, steps / 20, steps)?)
///     .metric(TopK::accuracy())
///     .state_file("run.state.safetensors");
/// learner.fit(&train, Some(&test))?;
/// # Ok(()) }
/// ```
pub struct Learner<'a, B: Backend, M, O> {
    /// The model being trained.
    pub model: M,
    /// Its optimizer.
    pub optimizer: O,
    device: B::Device,
    epochs: u64,
    schedule: Option<Box<dyn Schedule + 'a>>,
    metrics: Vec<Box<dyn Metric<B> + 'a>>,
    state_file: Option<PathBuf>,
    save_every: u64,
    on_epoch: OnEpoch<'a>,
    on_step: Option<OnStep<'a, M, O>>,
    replay: bool,
    ranks: Option<Box<dyn Collective<B>>>,
    /// This process's rank and the number of ranks (0 of 1 without ranks).
    place: (usize, usize),
}

impl<'a, B: Backend, M: Supervised<B>, O: Optimizer<B>> Learner<'a, B, M, O> {
    /// A learner of `model` with `optimizer` on `device`: one epoch, the optimizer's
    /// own learning rate, no metrics, no state file, each epoch's report printed to
    /// standard error as one line.
    pub fn new(model: M, optimizer: O, device: B::Device) -> Self {
        Learner {
            model,
            optimizer,
            device,
            epochs: 1,
            schedule: None,
            metrics: Vec::new(),
            state_file: None,
            save_every: 0,
            on_epoch: Box::new(|r| {
                eprintln!("{r}");
                Ok(())
            }),
            on_step: None,
            replay: false,
            ranks: None,
            place: (0, 1),
        }
    }

    /// Also saves the training state every `steps` steps (0: at the end of each epoch
    /// only); needs [`Learner::state_file`].
    pub fn save_every(mut self, steps: u64) -> Self {
        self.save_every = steps;
        self
    }

    /// Calls `f` after every step with the model, the optimizer and what the step did
    /// (each step's loss is then read from the device); an error from `f` stops the run.
    pub fn on_step(mut self, f: impl FnMut(&M, &O, &StepInfo) -> Result<()> + 'a) -> Self {
        self.on_step = Some(Box::new(f));
        self
    }

    /// Captures the second step as a graph and replays it for every later one, where
    /// the backend captures (CUDA) and the optimizer replays correctly (the first
    /// step's [`StepInfo::notice`] says which). Every batch must then have one size:
    /// the loader's last batch dropped.
    pub fn replay(mut self, on: bool) -> Self {
        self.replay = on;
        self
    }

    /// Trains as one rank of a data-parallel run: the model starts as rank 0's, each of
    /// the loader's batches is split evenly over the ranks (every rank's loader must
    /// read the same batches: the same data, seed and batch size, the last batch
    /// dropped), and gradients and losses are averaged before every rank's identical
    /// step. Reports, callbacks and state files are rank 0's.
    pub fn ranks(mut self, ranks: Box<dyn Collective<B>>) -> Self {
        self.place = (ranks.rank(), ranks.world());
        self.ranks = Some(ranks);
        self
    }

    /// Trains for `epochs` passes over the training data.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.epochs = epochs;
        self
    }

    /// Sets the learning rate from `schedule` before every step (by the step's index
    /// over the whole run).
    pub fn schedule(mut self, schedule: impl Schedule + 'a) -> Self {
        self.schedule = Some(Box::new(schedule));
        self
    }

    /// Computes `metric` on the evaluation data after every epoch.
    pub fn metric(mut self, metric: impl Metric<B> + 'a) -> Self {
        self.metrics.push(Box::new(metric));
        self
    }

    /// Saves a training state to `path` after every epoch, and resumes from it when it
    /// exists (refusing a state written by a run with other data or batch settings).
    pub fn state_file(mut self, path: impl AsRef<Path>) -> Self {
        self.state_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// Calls `f` with each epoch's report instead of printing it; an error from `f`
    /// stops the run.
    pub fn on_epoch(mut self, f: impl FnMut(&EpochReport) -> Result<()> + 'a) -> Self {
        self.on_epoch = Box::new(f);
        self
    }

    /// Trains on `train` (evaluating on `eval` after each epoch, where given) from
    /// where the state file left off, or from the start; returns the reports of the
    /// epochs it ran.
    pub fn fit<D: Dataset + 'static, E: Dataset + 'static>(
        &mut self,
        train: &DataLoader<D>,
        eval: Option<&DataLoader<E>>,
    ) -> Result<Vec<EpochReport>> {
        const OP: &str = "Learner";
        if self.epochs == 0 {
            return Err(Error::invalid(OP, "a run of 0 epochs"));
        }
        if self.save_every > 0 && self.state_file.is_none() {
            return Err(Error::invalid(
                OP,
                "save_every needs a state file to save to (Learner::state_file)",
            ));
        }
        let (rank, world) = self.place;
        let stepped = self.replay || world > 1 || self.on_step.is_some();
        if (self.replay || world > 1) && train.config().last_batch != LastBatch::Drop {
            return Err(Error::invalid(
                OP,
                "replayed or data-parallel steps need batches of one size: drop the last \
                 batch (LastBatch::Drop)",
            ));
        }
        if !train.config().batch_size.is_multiple_of(world) {
            return Err(Error::invalid(
                OP,
                format!(
                    "a batch of {} does not split evenly over {world} ranks",
                    train.config().batch_size
                ),
            ));
        }
        let per_epoch = train.batches_per_epoch() as u64;
        let total = self.epochs.saturating_mul(per_epoch);
        let run = run_settings(train, world);
        let mut step = 0;
        if let Some(path) = self.state_file.as_ref().filter(|p| p.exists()) {
            step = state::load(path, &mut self.model, &mut self.optimizer, &run)?;
            if step > total {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "{} took {step} steps, more than this run's {total} ({} epochs of {per_epoch})",
                        path.display(),
                        self.epochs
                    ),
                ));
            }
        }
        let mut steps = match stepped {
            true => {
                let draws = M::draws_at_random();
                let mut steps = StepReplay::new(&self.device, self.replay, &self.optimizer, draws);
                if world > 1 {
                    let Some(ranks) = self.ranks.take() else {
                        return Err(Error::invalid(
                            OP,
                            "a data-parallel Learner fits once (its ranks are spent)",
                        ));
                    };
                    broadcast_state(ranks.as_ref(), &mut self.model, 0)?;
                    if let Some(seeds) = self.model.step_seeds() {
                        seeds.set_rank(rank as u64);
                    }
                    steps = steps.data_parallel(ranks)?;
                }
                Some(steps)
            }
            false => None,
        };
        let result = self.epochs_from(train, eval, &run, &mut step, total, &mut steps);
        if let Some(steps) = steps {
            steps.finish(&self.model);
        }
        result
    }

    /// The epochs of [`Learner::fit`] from step `step` on.
    fn epochs_from<D: Dataset + 'static, E: Dataset + 'static>(
        &mut self,
        train: &DataLoader<D>,
        eval: Option<&DataLoader<E>>,
        run: &BTreeMap<String, String>,
        step: &mut u64,
        total: u64,
        steps: &mut Option<StepReplay<B>>,
    ) -> Result<Vec<EpochReport>> {
        let per_epoch = train.batches_per_epoch() as u64;
        let (rank, world) = self.place;
        let mut reports = Vec::new();
        for epoch in *step / per_epoch..self.epochs {
            let start = Instant::now();
            let mut device_loss = MeanLoss::<B>::new();
            let (mut host_loss, mut examples, mut lr) = (0.0, 0usize, self.optimizer.lr());
            let first = (*step - epoch * per_epoch) as usize;
            for batch in train.epoch_from(epoch, first)? {
                let batch = batch?;
                let n = batch.len();
                if let Some(s) = &self.schedule {
                    lr = s.lr_at(*step);
                    self.optimizer.set_lr(lr).map_err(|e| {
                        e.with_context(&format!("the schedule's rate at step {step}"))
                    })?;
                }
                match steps.as_mut() {
                    Some(steps) => {
                        let mine = share(batch, rank, world)?;
                        let (input, target) = (host_data(mine.input), host_data(mine.target));
                        let inputs = vec![
                            StepInput {
                                data: input.0,
                                dims: &input.1,
                            },
                            StepInput {
                                data: target.0,
                                dims: &target.1,
                            },
                        ];
                        let outcome = steps.step(
                            &mut self.model,
                            &mut self.optimizer,
                            inputs,
                            &mut |m, xy| m.loss_and_grads(&xy[0], &xy[1]),
                        )?;
                        host_loss += outcome.loss as f64 * n as f64;
                        if let (Some(f), 0) = (self.on_step.as_mut(), rank) {
                            let info = StepInfo {
                                epoch,
                                step: *step,
                                steps: total,
                                loss: outcome.loss,
                                lr,
                                notice: outcome.notice,
                            };
                            f(&self.model, &self.optimizer, &info)?;
                        }
                    }
                    None => {
                        let batch = batch.to_device::<B>(&self.device)?;
                        let (l, grads) = self.model.loss_and_grads(&batch.input, &batch.target)?;
                        self.optimizer.step(&mut self.model, &grads)?;
                        device_loss.update(&Outputs {
                            scores: None,
                            targets: None,
                            loss: Some((&l, n)),
                        })?;
                    }
                }
                examples += n;
                *step += 1;
                if self.save_every > 0 && step.is_multiple_of(self.save_every) && rank == 0 {
                    if let Some(path) = &self.state_file {
                        state::save(path, &self.model, &self.optimizer, *step, run)?;
                    }
                }
            }
            let train_seconds = start.elapsed().as_secs_f64();
            let train_loss = match steps {
                Some(_) => host_loss / examples.max(1) as f64,
                None => device_loss.value()?,
            };
            let (eval_loss, metrics) = match eval {
                Some(data) => {
                    let (l, m) = self.evaluate(data)?;
                    (Some(l), m)
                }
                None => (None, Vec::new()),
            };
            if let (Some(path), 0) = (&self.state_file, rank) {
                state::save(path, &self.model, &self.optimizer, *step, run)?;
            }
            let seconds = start.elapsed().as_secs_f64();
            let report = EpochReport {
                epoch,
                epochs: self.epochs,
                step: *step,
                train_loss,
                lr,
                examples_per_second: examples as f64 / train_seconds.max(1e-9),
                seconds,
                eta_seconds: seconds * (self.epochs - epoch - 1) as f64,
                eval_loss,
                metrics,
            };
            if rank == 0 {
                (self.on_epoch)(&report)?;
            }
            reports.push(report);
        }
        Ok(reports)
    }

    /// The mean loss and every metric over `data`, in evaluation mode.
    pub fn evaluate<E: Dataset + 'static>(
        &mut self,
        data: &DataLoader<E>,
    ) -> Result<(f64, Vec<(String, f64)>)> {
        let mut loss = MeanLoss::<B>::new();
        for m in &mut self.metrics {
            m.reset();
        }
        for batch in data.epoch(0) {
            let batch = batch?;
            let n = batch.len();
            let DeviceBatch { input, target } = batch.to_device::<B>(&self.device)?;
            let l = self.model.eval_loss(&input, &target)?;
            loss.update(&Outputs {
                scores: None,
                targets: None,
                loss: Some((&l, n)),
            })?;
            if self.metrics.is_empty() {
                continue;
            }
            let scores = self.model.scores(&input)?;
            let outputs = Outputs {
                scores: scores.as_ref(),
                targets: Some(&target),
                loss: Some((&l, n)),
            };
            for m in &mut self.metrics {
                m.update(&outputs)?;
            }
        }
        let metrics = self
            .metrics
            .iter()
            .map(|m| Ok((m.name(), m.value()?)))
            .collect::<Result<_>>()?;
        Ok((loss.value()?, metrics))
    }
}

/// The settings a resumed run must share with the run that wrote its state: what
/// decides which examples each step sees.
fn run_settings<D: Dataset + 'static>(
    train: &DataLoader<D>,
    world: usize,
) -> BTreeMap<String, String> {
    let c = train.config();
    BTreeMap::from([
        ("examples".to_string(), train.dataset().len().to_string()),
        ("batch_size".to_string(), c.batch_size.to_string()),
        ("shuffle".to_string(), c.shuffle.to_string()),
        ("seed".to_string(), c.seed.to_string()),
        ("last_batch".to_string(), format!("{:?}", c.last_batch)),
        ("ranks".to_string(), world.to_string()),
    ])
}

/// Rank `rank`'s even share of `batch`'s rows (the whole batch, unmoved, for one rank).
fn share(batch: HostBatch, rank: usize, world: usize) -> Result<HostBatch> {
    if world == 1 {
        return Ok(batch);
    }
    let n = batch.len();
    let rows = |f: &Field| -> Result<Field> {
        let per_row = f.values.len() / n.max(1);
        let (lo, hi) = (rank * n / world * per_row, (rank + 1) * n / world * per_row);
        let values = match &f.values {
            Values::F32(v) => Values::F32(v[lo..hi].to_vec()),
            Values::I32(v) => Values::I32(v[lo..hi].to_vec()),
        };
        let mut dims = f.dims.clone();
        dims[0] = n / world;
        Field::new(dims, values)
    };
    Ok(HostBatch {
        input: rows(&batch.input)?,
        target: rows(&batch.target)?,
        indices: batch.indices[rank * n / world..(rank + 1) * n / world].to_vec(),
    })
}

/// A field's values and dims, as a step's host input takes them (moved, not copied).
fn host_data(f: Field) -> (HostData, Vec<usize>) {
    let data = match f.values {
        Values::F32(v) => HostData::F32(v),
        Values::I32(v) => HostData::I32(v),
    };
    (data, f.dims)
}

/// One dim of a method's tensor argument, as `#[model]` declared it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum DimSpec {
    /// A literal size.
    Lit(usize),
    /// A size parameter of the method (`B`, `T`), bound by the first argument that
    /// has it.
    Param(&'static str),
    /// A size known at run time (the plan checks it).
    Dyn,
}

/// The size parameters of `method` bound from the dims of its arguments `values`,
/// after checking each one's dtype, rank and literal sizes against the declaration
/// `(name, dtype, dims)`: what `#[model]`'s [`Supervised`] impls call before the
/// planned raw methods. An error names the argument, its shape and the declared one.
#[doc(hidden)]
pub fn bind_sizes<B: Backend>(
    method: &str,
    declared: &[(&str, kiln_tensor::DType, &[DimSpec])],
    values: &[&RawTensor<B>],
) -> Result<Vec<(&'static str, usize)>> {
    let described: Vec<_> = declared
        .iter()
        .zip(values)
        .map(|(&(name, want, spec), v)| (name, want, spec, *v.dims(), v.dtype()))
        .collect();
    bind(method, &described)
}

/// [`bind_sizes`] on dims and dtypes: not generic, compiled once.
fn bind(
    method: &str,
    args: &[(
        &str,
        kiln_tensor::DType,
        &[DimSpec],
        kiln_tensor::Dims,
        kiln_tensor::DType,
    )],
) -> Result<Vec<(&'static str, usize)>> {
    let mut sizes: Vec<(&'static str, usize)> = Vec::new();
    for &(name, want_dtype, spec, ref dims, dtype) in args {
        let declared = || {
            let dims: Vec<String> = spec
                .iter()
                .map(|d| match d {
                    DimSpec::Lit(n) => n.to_string(),
                    DimSpec::Param(p) => p.to_string(),
                    DimSpec::Dyn => "?".into(),
                })
                .collect();
            format!("{want_dtype} [{}]", dims.join(", "))
        };
        let mismatch = |why: String| {
            Error::shape(
                "Supervised",
                format!(
                    "{method}: `{name}` is {dtype} {dims} but the method takes {}{why}",
                    declared()
                ),
            )
        };
        if dtype != want_dtype || dims.len() != spec.len() {
            return Err(mismatch(String::new()));
        }
        for (axis, (d, &got)) in spec.iter().zip(dims.as_slice()).enumerate() {
            match *d {
                DimSpec::Lit(n) if n != got => {
                    return Err(mismatch(format!(" (axis {axis} is {got}, not {n})")))
                }
                DimSpec::Param(p) => match sizes.iter().find(|(q, _)| *q == p) {
                    Some(&(_, bound)) if bound != got => {
                        return Err(mismatch(format!(
                            " (axis {axis} is {got}, but {p} is {bound} from an earlier argument)"
                        )))
                    }
                    Some(_) => {}
                    None => sizes.push((p, got)),
                },
                _ => {}
            }
        }
    }
    Ok(sizes)
}
