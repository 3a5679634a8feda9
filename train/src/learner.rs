//! [`Learner`]: one training loop for any model with a loss — a `#[model]` whose impl
//! has a `loss(input, target)` method implements [`Supervised`] — over a
//! [`DataLoader`]: the learning rate from a [`Schedule`] before each step, the
//! optimizer's step (clipping included), evaluation with [`Metric`]s after each epoch,
//! a training state saved after each epoch (and every so many steps) and resumed from
//! (the same batches, the same rates, the same result as an uninterrupted run), one
//! report line per epoch with throughput and the time left, a progress bar (plain
//! lines when standard error is not a terminal), the training curve as a PNG, a
//! checkpoint with metadata at the end, and a callback after each step.
//!
//! Steps run planned, their losses summed on the device and read once per epoch; or,
//! with [`Learner::replay`], [`Learner::ranks`], [`Learner::progress`],
//! [`Learner::curve`] or [`Learner::on_step`], through [`StepReplay`]: captured once
//! warm and replayed as a graph where the backend can (CUDA), averaged over
//! data-parallel ranks, each step's loss read (a loss that is not finite stops the run
//! at that step).

use crate::checkpoint::{self, Tensors};
use crate::curve::Curve;
use crate::metrics::{MeanLoss, Metric, Outputs};
use crate::optim::Optimizer;
use crate::parallel::broadcast_state;
use crate::progress::Progress;
use crate::replay::{StepInput, StepOutcome, StepReplay};
use crate::schedule::Schedule;
use crate::state;
use kiln_data::{
    Batches, DataLoader, Dataset, DeviceBatch, Field, HostBatch, LastBatch, LoaderConfig, Values,
};
use kiln_tensor::nn::{LossScaleState, Module};
use kiln_tensor::{Backend, Collective, Error, HostData, RawTensor, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// Seconds the epoch's steps took (`save_every` states included; its evaluation
    /// and end-of-epoch state left out).
    pub train_seconds: f64,
    /// Seconds the epoch took, evaluation included.
    pub seconds: f64,
    /// Seconds the remaining epochs should take at this epoch's pace.
    pub eta_seconds: f64,
    /// The evaluation's mean loss, when there is evaluation data.
    pub eval_loss: Option<f64>,
    /// The metrics on the evaluation data, by name.
    pub metrics: Vec<(String, f64)>,
    /// A loss-scaled (f16) model's loss scale at the epoch's end, with the steps it
    /// skipped so far; `None` for other models.
    pub loss_scale: Option<LossScaleState>,
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
        if let Some(s) = &self.loss_scale {
            write!(f, "; loss scale {}", s.scale)?;
            if s.skipped > 0 {
                write!(f, " ({} steps skipped for overflow)", s.skipped)?;
            }
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

/// Whether [`Learner::fit`] continues from its [`Learner::state_file`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Resume {
    /// Continue from the state file when it exists, start afresh when it does not.
    #[default]
    IfPresent,
    /// Continue from the state file; its absence is an error.
    Required,
    /// Start afresh, replacing any state file there.
    Never,
}

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
    on_step: Option<OnStep<'a, M, O>>,
    run: Run<'a, B>,
}

/// Everything of a [`Learner`] but its model, its optimizer and the callback that sees
/// them: what its training loop runs with, generic over the backend only, so that the
/// loop is compiled once per backend (the CPU's copy in this crate, `instances.rs`),
/// not once per model.
pub(crate) struct Run<'a, B: Backend> {
    device: B::Device,
    epochs: u64,
    schedule: Option<Box<dyn Schedule + 'a>>,
    metrics: Vec<Box<dyn Metric<B> + 'a>>,
    state_file: Option<PathBuf>,
    resume: Resume,
    settings: BTreeMap<String, String>,
    save_every: u64,
    checkpoint: Option<PathBuf>,
    metadata: BTreeMap<String, String>,
    progress: bool,
    curve: Option<(PathBuf, String)>,
    /// `None`: each report printed as a line.
    on_epoch: Option<OnEpoch<'a>>,
    replay: bool,
    ranks: Option<Box<dyn Collective<B>>>,
    /// This process's rank and the number of ranks (0 of 1 without ranks).
    place: (usize, usize),
    /// The step the last fit started from.
    first_step: u64,
}

impl<'a, B: Backend, M: Supervised<B>, O: Optimizer<B>> Learner<'a, B, M, O> {
    /// A learner of `model` with `optimizer` on `device`: one epoch, the optimizer's
    /// own learning rate, no metrics, no state file, no progress bar, each epoch's
    /// report printed to standard output as one line.
    pub fn new(model: M, optimizer: O, device: B::Device) -> Self {
        Learner {
            model,
            optimizer,
            on_step: None,
            run: Run {
                device,
                epochs: 1,
                schedule: None,
                metrics: Vec::new(),
                state_file: None,
                resume: Resume::IfPresent,
                settings: BTreeMap::new(),
                save_every: 0,
                checkpoint: None,
                metadata: BTreeMap::new(),
                progress: false,
                curve: None,
                on_epoch: None,
                replay: false,
                ranks: None,
                place: (0, 1),
                first_step: 0,
            },
        }
    }

    /// Also saves the training state every `steps` steps (0: at the end of each epoch
    /// only); needs [`Learner::state_file`].
    pub fn save_every(mut self, steps: u64) -> Self {
        self.run.save_every = steps;
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
        self.run.replay = on;
        self
    }

    /// Trains as one rank of a data-parallel run: the model starts as rank 0's, each of
    /// the loader's batches is split evenly over the ranks (every rank's loader must
    /// read the same batches: the same data, seed and batch size, the last batch
    /// dropped), and gradients and losses are averaged before every rank's identical
    /// step. Reports, callbacks and state files are rank 0's.
    pub fn ranks(mut self, ranks: Box<dyn Collective<B>>) -> Self {
        self.run.place = (ranks.rank(), ranks.world());
        self.run.ranks = Some(ranks);
        self
    }

    /// Trains for `epochs` passes over the training data.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.run.epochs = epochs;
        self
    }

    /// Sets the learning rate from `schedule` before every step (by the step's index
    /// over the whole run).
    pub fn schedule(mut self, schedule: impl Schedule + 'a) -> Self {
        self.run.schedule = Some(Box::new(schedule));
        self
    }

    /// Computes `metric` on the evaluation data after every epoch.
    pub fn metric(mut self, metric: impl Metric<B> + 'a) -> Self {
        self.run.metrics.push(Box::new(metric));
        self
    }

    /// Saves a training state to `path` after every epoch, and resumes from it as
    /// [`Learner::resume`] says (by default when it exists), refusing a state written
    /// by a run with other data, batch settings or [`Learner::setting`]s.
    pub fn state_file(mut self, path: impl AsRef<Path>) -> Self {
        self.run.state_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// Calls `f` with each epoch's report instead of printing it; an error from `f`
    /// stops the run.
    pub fn on_epoch(mut self, f: impl FnMut(&EpochReport) -> Result<()> + 'a) -> Self {
        self.run.on_epoch = Some(Box::new(f));
        self
    }

    /// Whether [`Learner::fit`] continues from the state file ([`Resume::IfPresent`]
    /// unless set).
    pub fn resume(mut self, resume: Resume) -> Self {
        self.run.resume = resume;
        self
    }

    /// Adds `key = value` to the settings a resumed run must share with the run that
    /// wrote its state (beside the Learner's own: the examples, the batch, the
    /// shuffling): a learning rate, a model's size, a fingerprint of the data. A state
    /// of other settings is refused, naming each one that differs.
    pub fn setting(mut self, key: &str, value: impl ToString) -> Self {
        self.run.settings.insert(key.to_string(), value.to_string());
        self
    }

    /// Saves the trained model to `path` when the run ends (safetensors, PyTorch's
    /// names, Kiln's checksums; [`checkpoint::save_with_metadata`]), its metadata the
    /// [`Learner::metadata`] given and the last evaluation (`eval_loss`, and
    /// `eval_<metric>` for each metric).
    pub fn checkpoint_file(mut self, path: impl AsRef<Path>) -> Self {
        self.run.checkpoint = Some(path.as_ref().to_path_buf());
        self
    }

    /// Adds `key = value` to the checkpoint's metadata (what the model is, what it was
    /// trained on).
    pub fn metadata(mut self, key: &str, value: impl ToString) -> Self {
        self.run.metadata.insert(key.to_string(), value.to_string());
        self
    }

    /// Shows the run's progress (step, running loss, examples a second, time left): a
    /// bar where standard error is a terminal, a line every twentieth of the run or 30
    /// seconds elsewhere. Lines the Learner prints go through it.
    pub fn progress(mut self, on: bool) -> Self {
        self.run.progress = on;
        self
    }

    /// Draws the training curve to `path` (a PNG titled `title`) when the run ends: the
    /// running mean of the training loss at every step above the first metric (or the
    /// evaluation loss) at every epoch, of the steps this run took (a resumed run draws
    /// its own; one that took none leaves the file as it was).
    pub fn curve(mut self, path: impl AsRef<Path>, title: &str) -> Self {
        self.run.curve = Some((path.as_ref().to_path_buf(), title.to_string()));
        self
    }

    /// Trains on `train` (evaluating on `eval` after each epoch, where given) from
    /// where the state file left off (see [`Learner::resume`]), or from the start;
    /// returns the reports of the epochs it ran. Reports, files and the progress
    /// display are rank 0's; so is the evaluation.
    pub fn fit<D: Dataset + 'static, E: Dataset + 'static>(
        &mut self,
        train: &DataLoader<D>,
        eval: Option<&DataLoader<E>>,
    ) -> Result<Vec<EpochReport>> {
        let mut trainee = Pair {
            model: &mut self.model,
            optimizer: &mut self.optimizer,
            on_step: &mut self.on_step,
        };
        self.run
            .fit(&mut trainee, train, eval.map(|e| e as &dyn Loader))
    }

    /// The step the last [`Learner::fit`] started from: 0, or where its state file left
    /// off.
    pub fn first_step(&self) -> u64 {
        self.run.first_step
    }

    /// The mean loss and every metric over `data`, in evaluation mode ([`evaluate`]
    /// with this Learner's model and metrics).
    pub fn evaluate<E: Dataset + 'static>(
        &mut self,
        data: &DataLoader<E>,
    ) -> Result<(f64, Vec<(String, f64)>)> {
        evaluate(&self.model, &self.run.device, data, &mut self.run.metrics)
    }
}

/// A Learner's model and optimizer as its training loop sees them: object safe, so the
/// loop ([`Run::fit`]) is generic over the backend only.
pub(crate) trait Trainee<B: Backend> {
    /// The model's tensors and the optimizer, for training states.
    fn parts(&mut self) -> (&mut dyn Tensors<B>, &mut dyn Optimizer<B>);
    /// The model's tensors.
    fn tensors(&self) -> &dyn Tensors<B>;
    /// The model in evaluation.
    fn evaluated(&self) -> &dyn Evaluated<B>;
    /// The optimizer.
    fn optimizer(&self) -> &dyn Optimizer<B>;
    /// [`Supervised::draws_at_random`].
    fn draws_at_random(&self) -> bool;
    /// Makes the model rank 0's ([`broadcast_state`]).
    fn broadcast(&mut self, ranks: &dyn Collective<B>) -> Result<()>;
    /// One step on an uploaded batch: its loss (on the device), the optimizer's step
    /// taken.
    fn step(&mut self, input: &RawTensor<B>, target: &RawTensor<B>) -> Result<RawTensor<B>>;
    /// One step through `steps` (replayed, data-parallel or watched).
    fn replayed_step(
        &mut self,
        steps: &mut StepReplay<B>,
        inputs: Vec<StepInput<'_>>,
    ) -> Result<StepOutcome>;
    /// Whether a callback watches every step ([`Learner::on_step`]).
    fn watched(&self) -> bool;
    /// Calls that callback.
    fn on_step(&mut self, info: &StepInfo) -> Result<()>;
    /// Ends `steps` ([`StepReplay::finish`]).
    fn finish(&self, steps: StepReplay<B>);
}

/// A [`Trainee`]: a Learner's model, optimizer and step callback, borrowed for a fit.
struct Pair<'l, 'a, M, O> {
    model: &'l mut M,
    optimizer: &'l mut O,
    on_step: &'l mut Option<OnStep<'a, M, O>>,
}

impl<B: Backend, M: Supervised<B>, O: Optimizer<B>> Trainee<B> for Pair<'_, '_, M, O> {
    fn parts(&mut self) -> (&mut dyn Tensors<B>, &mut dyn Optimizer<B>) {
        (self.model, self.optimizer)
    }
    fn tensors(&self) -> &dyn Tensors<B> {
        self.model
    }
    fn evaluated(&self) -> &dyn Evaluated<B> {
        self.model
    }
    fn optimizer(&self) -> &dyn Optimizer<B> {
        self.optimizer
    }
    fn draws_at_random(&self) -> bool {
        M::draws_at_random()
    }
    fn broadcast(&mut self, ranks: &dyn Collective<B>) -> Result<()> {
        broadcast_state(ranks, self.model, 0)
    }
    fn step(&mut self, input: &RawTensor<B>, target: &RawTensor<B>) -> Result<RawTensor<B>> {
        let (loss, grads) = self.model.loss_and_grads(input, target)?;
        self.optimizer.step(self.model, &grads)?;
        Ok(loss)
    }
    fn replayed_step(
        &mut self,
        steps: &mut StepReplay<B>,
        inputs: Vec<StepInput<'_>>,
    ) -> Result<StepOutcome> {
        steps.step(self.model, self.optimizer, inputs, &mut |m, xy| {
            m.loss_and_grads(&xy[0], &xy[1])
        })
    }
    fn watched(&self) -> bool {
        self.on_step.is_some()
    }
    fn on_step(&mut self, info: &StepInfo) -> Result<()> {
        match self.on_step.as_mut() {
            Some(f) => f(self.model, self.optimizer, info),
            None => Ok(()),
        }
    }
    fn finish(&self, steps: StepReplay<B>) {
        steps.finish(self.model);
    }
}

/// A training or evaluation loader as the training loop sees it, whatever its dataset.
pub(crate) trait Loader {
    /// The number of examples.
    fn examples(&self) -> usize;
    /// How it batches.
    fn config(&self) -> &LoaderConfig;
    /// [`DataLoader::batches_per_epoch`].
    fn batches_per_epoch(&self) -> usize;
    /// [`DataLoader::epoch_from`].
    fn epoch_from(&self, epoch: u64, first: usize) -> Result<Batches>;
    /// [`DataLoader::epoch`].
    fn epoch(&self, epoch: u64) -> Batches;
}

impl<D: Dataset + 'static> Loader for DataLoader<D> {
    fn examples(&self) -> usize {
        self.dataset().len()
    }
    fn config(&self) -> &LoaderConfig {
        DataLoader::config(self)
    }
    fn batches_per_epoch(&self) -> usize {
        DataLoader::batches_per_epoch(self)
    }
    fn epoch_from(&self, epoch: u64, first: usize) -> Result<Batches> {
        DataLoader::epoch_from(self, epoch, first)
    }
    fn epoch(&self, epoch: u64) -> Batches {
        DataLoader::epoch(self, epoch)
    }
}

impl<'a, B: Backend> Run<'a, B> {
    /// [`Learner::fit`] of any model and optimizer (`trainee`) on any data.
    #[inline(never)]
    pub(crate) fn fit(
        &mut self,
        trainee: &mut dyn Trainee<B>,
        train: &dyn Loader,
        eval: Option<&dyn Loader>,
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
        let stepped =
            self.replay || world > 1 || trainee.watched() || self.progress || self.curve.is_some();
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
        if per_epoch == 0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "{} training examples make no full batch of {}",
                    train.examples(),
                    train.config().batch_size
                ),
            ));
        }
        let total = self.epochs.saturating_mul(per_epoch);
        // The Learner's own settings win over a caller's of the same name.
        let mut run = self.settings.clone();
        run.extend(run_settings(train.examples(), train.config(), world));
        if rank == 0 {
            // Before any step: a run is not lost to a path it cannot save to.
            let files = [
                ("training state", self.state_file.as_ref()),
                ("checkpoint", self.checkpoint.as_ref()),
                ("training curve", self.curve.as_ref().map(|c| &c.0)),
            ];
            for (what, path) in files {
                if let Some(path) = path {
                    checkpoint::check_writable(what, path)?;
                }
            }
        }
        // Before any step: a metric that cannot read this model's output is refused
        // now, not after an epoch of training.
        if let (Some(data), false, 0) = (eval, self.metrics.is_empty(), rank) {
            check_metrics(trainee.evaluated(), &self.device, data, &mut self.metrics)?;
        }
        let console = Console::new(rank == 0, self.progress, total);
        let mut step = 0;
        if let Some(path) = self.resume_from()? {
            let (model, optimizer) = trainee.parts();
            step = state::load_state(&path, model, optimizer, &run)?;
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
            console.line(&match step == total {
                true => format!(
                    "resumed from {}: all {total} steps were taken, nothing is left to train",
                    path.display()
                ),
                false => format!("resumed from {} at step {step} of {total}", path.display()),
            });
        }
        console.start_at(step);
        self.first_step = step;
        let mut steps = match stepped {
            true => {
                let draws = trainee.draws_at_random();
                let mut steps =
                    StepReplay::new(&self.device, self.replay, trainee.optimizer(), draws);
                if world > 1 {
                    let Some(ranks) = self.ranks.take() else {
                        return Err(Error::invalid(
                            OP,
                            "a data-parallel Learner fits once (its ranks are spent)",
                        ));
                    };
                    trainee.broadcast(ranks.as_ref())?;
                    if let Some(seeds) = trainee.tensors().step_seeds() {
                        seeds.set_rank(rank as u64);
                    }
                    steps = steps.data_parallel(ranks)?;
                }
                Some(steps)
            }
            false => None,
        };
        let mut record = Record {
            console,
            curve: self.curve.as_ref().map(|_| {
                Curve::new(&match self.metrics.first() {
                    Some(m) => format!("evaluation {}", m.name()),
                    None => "evaluation loss".to_string(),
                })
            }),
            running_loss: f32::NAN,
            started: Instant::now(),
            evaluating: Duration::ZERO,
            examples: 0,
        };
        let result = self.epochs_from(
            trainee,
            train,
            eval,
            &run,
            &mut step,
            total,
            &mut steps,
            &mut record,
        );
        if let Some(steps) = steps {
            trainee.finish(steps);
        }
        record.console.finish();
        let reports = result?;
        if rank == 0 {
            self.save_outputs(trainee, &reports, eval, &record)?;
        }
        Ok(reports)
    }

    /// The state file to resume from, as [`Learner::resume`] says.
    fn resume_from(&self) -> Result<Option<PathBuf>> {
        let path = match (&self.state_file, self.resume) {
            (_, Resume::Never) => return Ok(None),
            (Some(path), _) => path,
            (None, Resume::Required) => {
                return Err(Error::invalid(
                    "Learner",
                    "Resume::Required needs a state file to resume from (Learner::state_file)",
                ))
            }
            (None, Resume::IfPresent) => return Ok(None),
        };
        match (path.exists(), self.resume) {
            (true, _) => Ok(Some(path.clone())),
            (false, Resume::Required) => Err(Error::invalid(
                "Learner",
                format!(
                    "there is no training state at {} to resume from",
                    path.display()
                ),
            )),
            (false, _) => Ok(None),
        }
    }

    /// What a run leaves at its end: the curve and the checkpoint (its metadata with
    /// the last evaluation: of the last epoch, or made now when no epoch ran).
    fn save_outputs(
        &mut self,
        trainee: &mut dyn Trainee<B>,
        reports: &[EpochReport],
        eval: Option<&dyn Loader>,
        record: &Record,
    ) -> Result<()> {
        // A run that took no step (resumed at its end) leaves the earlier curve alone.
        let drawn = record.curve.as_ref().filter(|c| !c.loss.is_empty());
        if let (Some((path, title)), Some(curve)) = (&self.curve, drawn) {
            curve.write_png(path, title)?;
            record
                .console
                .line(&format!("training curve {}", path.display()));
        }
        let Some(path) = self.checkpoint.clone() else {
            return Ok(());
        };
        let last = match (reports.last(), eval) {
            (Some(r), _) => r.eval_loss.map(|l| (l, r.metrics.clone())),
            (None, Some(data)) => Some(self.evaluate(trainee.evaluated(), data)?),
            (None, None) => None,
        };
        let mut meta = self.metadata.clone();
        if let Some((loss, metrics)) = last {
            meta.insert("eval_loss".into(), format!("{loss:.6}"));
            for (name, v) in metrics {
                meta.insert(format!("eval_{name}"), format!("{v:.6}"));
            }
        }
        checkpoint::save_tensors(trainee.tensors(), &path, &meta)?;
        record.console.line(&format!("saved {}", path.display()));
        Ok(())
    }

    /// The epochs of [`Learner::fit`] from step `step` on.
    #[allow(clippy::too_many_arguments)]
    fn epochs_from(
        &mut self,
        trainee: &mut dyn Trainee<B>,
        train: &dyn Loader,
        eval: Option<&dyn Loader>,
        run: &BTreeMap<String, String>,
        step: &mut u64,
        total: u64,
        steps: &mut Option<StepReplay<B>>,
        record: &mut Record,
    ) -> Result<Vec<EpochReport>> {
        let per_epoch = train.batches_per_epoch() as u64;
        let (rank, world) = self.place;
        let mut reports = Vec::new();
        for epoch in *step / per_epoch..self.epochs {
            let start = Instant::now();
            let mut device_loss = MeanLoss::<B>::new();
            let (mut host_loss, mut examples, mut lr) = (0.0, 0usize, trainee.optimizer().lr());
            let first = (*step - epoch * per_epoch) as usize;
            for batch in train.epoch_from(epoch, first)? {
                let batch = batch?;
                let n = batch.len();
                if let Some(s) = &self.schedule {
                    lr = s.lr_at(*step);
                    trainee.parts().1.set_lr(lr).map_err(|e| {
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
                        let outcome = trainee.replayed_step(steps, inputs)?;
                        // The same averaged loss on every rank: all stop together.
                        if !outcome.loss.is_finite() {
                            return Err(non_finite(format!(
                                "the loss became {} at step {step}",
                                outcome.loss
                            )));
                        }
                        host_loss += outcome.loss as f64 * n as f64;
                        if rank == 0 {
                            if let Some(notice) = &outcome.notice {
                                record.console.line(notice);
                            }
                            record.step(*step, outcome.loss, lr, n);
                        }
                        if rank == 0 && trainee.watched() {
                            let info = StepInfo {
                                epoch,
                                step: *step,
                                steps: total,
                                loss: outcome.loss,
                                lr,
                                notice: outcome.notice,
                            };
                            trainee.on_step(&info)?;
                        }
                    }
                    None => {
                        let batch = batch.to_device::<B>(&self.device)?;
                        let l = trainee.step(&batch.input, &batch.target)?;
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
                        let (model, optimizer) = trainee.parts();
                        state::save_state(path, model, optimizer, *step, run)?;
                    }
                }
            }
            let train_seconds = start.elapsed().as_secs_f64();
            let train_loss = match steps {
                Some(_) => host_loss / examples.max(1) as f64,
                None => device_loss.value()?,
            };
            if !train_loss.is_finite() {
                return Err(non_finite(format!(
                    "the mean training loss of epoch {} became {train_loss}",
                    epoch + 1
                )));
            }
            let evaluating = Instant::now();
            let (eval_loss, metrics) = match (eval, rank) {
                (Some(data), 0) => {
                    let (l, m) = self.evaluate(trainee.evaluated(), data)?;
                    (Some(l), m)
                }
                _ => (None, Vec::new()),
            };
            record.evaluating += evaluating.elapsed();
            if let (Some(path), 0) = (&self.state_file, rank) {
                let (model, optimizer) = trainee.parts();
                state::save_state(path, model, optimizer, *step, run)?;
            }
            let seconds = start.elapsed().as_secs_f64();
            let report = EpochReport {
                epoch,
                epochs: self.epochs,
                step: *step,
                train_loss,
                lr,
                examples_per_second: examples as f64 / train_seconds.max(1e-9),
                train_seconds,
                seconds,
                eta_seconds: seconds * (self.epochs - epoch - 1) as f64,
                eval_loss,
                metrics,
                loss_scale: trainee.tensors().loss_scale().map(|s| s.state()),
            };
            if rank == 0 {
                if let Some(curve) = record.curve.as_mut() {
                    let value = report.metrics.first().map(|m| m.1).or(report.eval_loss);
                    if let Some(v) = value {
                        curve.metric.push((*step, v));
                    }
                }
                match self.on_epoch.as_mut() {
                    Some(f) => f(&report)?,
                    None => record.console.line(&report.to_string()),
                }
            }
            reports.push(report);
        }
        Ok(reports)
    }

    /// The mean loss and every metric of `model` over `data`, in evaluation mode.
    fn evaluate(
        &mut self,
        model: &dyn Evaluated<B>,
        data: &dyn Loader,
    ) -> Result<(f64, Vec<(String, f64)>)> {
        evaluate_batches(model, &self.device, data.epoch(0), &mut self.metrics)
    }
}

/// The mean loss of `model` and each of `metrics` over `data`, in evaluation mode:
/// what the Learner reports after each epoch, for a model outside a Learner (an
/// inference program's test accuracy). The metrics are reset first; each batch adds
/// to them on the device, and each is read once at the end.
pub fn evaluate<B: Backend, M: Supervised<B>, E: Dataset + 'static>(
    model: &M,
    device: &B::Device,
    data: &DataLoader<E>,
    metrics: &mut [Box<dyn Metric<B> + '_>],
) -> Result<(f64, Vec<(String, f64)>)> {
    evaluate_batches(model, device, data.epoch(0), metrics)
}

/// What evaluation needs of a model: [`Supervised`]'s evaluation-mode methods, object
/// safe, so the evaluation loop is compiled once per backend, not once per model (the
/// CPU's copy in this crate, `instances.rs`).
pub(crate) trait Evaluated<B: Backend> {
    /// [`Supervised::eval_loss`].
    fn evaluation_loss(&self, input: &RawTensor<B>, target: &RawTensor<B>) -> Result<RawTensor<B>>;
    /// [`Supervised::scores`].
    fn evaluation_scores(&self, input: &RawTensor<B>) -> Result<Option<RawTensor<B>>>;
}

impl<B: Backend, M: Supervised<B>> Evaluated<B> for M {
    fn evaluation_loss(&self, input: &RawTensor<B>, target: &RawTensor<B>) -> Result<RawTensor<B>> {
        self.eval_loss(input, target)
    }
    fn evaluation_scores(&self, input: &RawTensor<B>) -> Result<Option<RawTensor<B>>> {
        self.scores(input)
    }
}

/// Each metric given the first evaluation batch's scores and targets, then reset: a
/// metric that cannot read them (accuracy of a regression model's one output) is an
/// error naming the metric and the model's output, before the run trains.
fn check_metrics<B: Backend>(
    model: &dyn Evaluated<B>,
    device: &B::Device,
    data: &dyn Loader,
    metrics: &mut [Box<dyn Metric<B> + '_>],
) -> Result<()> {
    let Some(batch) = data.epoch(0).next() else {
        return Ok(());
    };
    let batch = batch?;
    let n = batch.len();
    let DeviceBatch { input, target } = batch.to_device::<B>(device)?;
    let loss = model.evaluation_loss(&input, &target)?;
    let scores = model.evaluation_scores(&input)?;
    let outputs = Outputs {
        scores: scores.as_ref(),
        targets: Some(&target),
        loss: Some((&loss, n)),
    };
    let output = match &scores {
        Some(s) => format!("scores {} {:?}", s.dtype(), s.dims().to_vec()),
        None => "no scores (its impl has no `forward(input)`)".to_string(),
    };
    for m in metrics.iter_mut() {
        let checked = m.update(&outputs);
        m.reset();
        if let Err(e) = checked {
            return Err(Error::invalid(
                "Learner::metric",
                format!(
                    "the metric `{}` cannot read this model's output, so the run is refused before training: the model gives {output} for targets {} {:?}; {}",
                    m.name(),
                    target.dtype(),
                    target.dims().to_vec(),
                    crate::metrics::why(&e)
                ),
            ));
        }
    }
    Ok(())
}

/// [`evaluate`] of any model over one pass of `batches`.
#[inline(never)]
pub(crate) fn evaluate_batches<B: Backend>(
    model: &dyn Evaluated<B>,
    device: &B::Device,
    batches: Batches,
    metrics: &mut [Box<dyn Metric<B> + '_>],
) -> Result<(f64, Vec<(String, f64)>)> {
    let mut loss = MeanLoss::<B>::new();
    for m in metrics.iter_mut() {
        m.reset();
    }
    for batch in batches {
        let batch = batch?;
        let n = batch.len();
        let DeviceBatch { input, target } = batch.to_device::<B>(device)?;
        let l = model.evaluation_loss(&input, &target)?;
        loss.update(&Outputs {
            scores: None,
            targets: None,
            loss: Some((&l, n)),
        })?;
        if metrics.is_empty() {
            continue;
        }
        let scores = model.evaluation_scores(&input)?;
        let outputs = Outputs {
            scores: scores.as_ref(),
            targets: Some(&target),
            loss: Some((&l, n)),
        };
        for m in metrics.iter_mut() {
            m.update(&outputs)?;
        }
    }
    let metrics = metrics
        .iter()
        .map(|m| Ok((m.name(), m.value()?)))
        .collect::<Result<_>>()?;
    Ok((loss.value()?, metrics))
}

/// The error of a loss that is not finite (`what` says which and where), pointing at
/// anomaly mode unless it is on.
fn non_finite(what: String) -> Error {
    let hint = match kiln_tensor::anomaly::detecting() {
        true => "",
        false => {
            " (anomaly mode, KILN_ANOMALY=1, finds the op that first made a value that is not finite)"
        }
    };
    Error::invalid("Learner", format!("{what}{hint}"))
}

/// Where a run's lines go: rank 0's standard output, through the progress display
/// where there is one; nothing on the other ranks.
struct Console {
    leader: bool,
    progress: Option<Progress>,
}

impl Console {
    /// Rank 0's console (`leader`), with a progress display over `total` steps when
    /// `progress`.
    fn new(leader: bool, progress: bool, total: u64) -> Self {
        Console {
            leader,
            progress: (leader && progress).then(|| Progress::new(total, true)),
        }
    }

    /// Prints `line`.
    fn line(&self, line: &str) {
        match (&self.progress, self.leader) {
            (Some(p), _) => p.println(line),
            (None, true) => println!("{line}"),
            (None, false) => {}
        }
    }

    /// The run starts at `step` (a resumed run).
    fn start_at(&self, step: u64) {
        if let Some(p) = &self.progress {
            p.set_position(step);
        }
    }

    /// Clears the bar.
    fn finish(&self) {
        if let Some(p) = &self.progress {
            p.finish_and_clear();
        }
    }
}

/// What rank 0 keeps of a run's steps: the running loss for the progress display and
/// the curve, and the throughput since this run's first step.
struct Record {
    console: Console,
    curve: Option<Curve>,
    running_loss: f32,
    started: Instant,
    /// Time spent evaluating, left out of the throughput.
    evaluating: Duration,
    examples: usize,
}

impl Record {
    /// Step `step` ended with `loss` at rate `lr` on `n` examples (on this rank).
    fn step(&mut self, step: u64, loss: f32, lr: f64, n: usize) {
        self.running_loss = match self.running_loss.is_nan() {
            true => loss,
            false => 0.98 * self.running_loss + 0.02 * loss,
        };
        self.examples += n;
        if let Some(curve) = self.curve.as_mut() {
            curve.loss.push((step + 1, f64::from(self.running_loss)));
        }
        if let Some(p) = &self.console.progress {
            let training = self.started.elapsed().saturating_sub(self.evaluating);
            let rate = self.examples as f64 / training.as_secs_f64().max(1e-9);
            p.set_message(format!(
                "loss {:.4} lr {lr:.2e} {rate:.0} examples/s",
                self.running_loss
            ));
            p.inc(1);
        }
    }
}

/// The settings a resumed run must share with the run that wrote its state: what
/// decides which examples each step sees.
fn run_settings(examples: usize, c: &LoaderConfig, world: usize) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("examples".to_string(), examples.to_string()),
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
