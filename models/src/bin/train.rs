//! `kiln-train`: trains a zoo model and saves a safetensors checkpoint: the MLP or the
//! CNN on MNIST or Fashion-MNIST (test accuracy after every epoch), or the GPT on the
//! Shakespeare bytes (held-out loss in nats per byte), on the CPU or a GPU
//! (`--device wgpu` / `--device cuda`, in a build with the `wgpu` / `cuda` feature).

use clap::{Parser, ValueEnum};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kiln::data::{DataLoader, Dataset as _, LastBatch, LoaderConfig};
use kiln::device::{run_on, DeviceChoice, OnDevice};
use kiln::prelude::*;
use kiln::tensor::Collective;
use kiln::train::checkpoint;
use kiln::train::launch::launch;
use kiln::train::learner::{Learner, Resume, Supervised};
use kiln::train::metrics::TopK;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln::train::rank_env::{RankEnv, Starter};
use kiln::train::schedule::CosineWithWarmup;
use kiln_models::classify::{Classifier, Examples, EVAL_BATCH};
use kiln_models::data::{ImageDataset, FASHION_NORM, MNIST_NORM};
use kiln_models::{lenet::LeNet, mlp::Mlp};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which model to train.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModelKind {
    /// MLP 784-1024-1024-10.
    Mlp,
    /// LeNet-style CNN with batch norm and dropout.
    Cnn,
    /// The small byte-level GPT (width 128, 4 blocks of 4 heads, context 128), on
    /// the Shakespeare text.
    Gpt,
    /// The tiny byte-level GPT (width 16, 2 blocks, context 32): trains in seconds.
    GptTiny,
    /// W3's GPT (width 512, 6 blocks of 8 heads, context 256; 32 windows per step):
    /// a GPU's model.
    GptW3,
}

/// Which data set to train on.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Dataset {
    /// Handwritten digits.
    Mnist,
    /// Clothing images.
    Fashion,
}

/// Which optimizer to use.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Opt {
    /// SGD with momentum.
    Sgd,
    /// AdamW.
    Adamw,
}

/// Train a model of the zoo (an MLP or a CNN on MNIST-style images, or a GPT on
/// Shakespeare) and save its checkpoint and training state.
#[derive(Parser, Debug)]
// Negative numbers parse, so that `--lr -1` gets a message about the rate.
#[command(version, allow_negative_numbers = true)]
struct Args {
    /// The model.
    #[arg(long, value_enum, default_value = "mlp")]
    model: ModelKind,
    /// The data set of the image models (default: mnist); the GPT trains on the
    /// vendored Shakespeare text.
    #[arg(long, value_enum)]
    dataset: Option<Dataset>,
    /// Passes over the training set.
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    /// Examples per step (per rank): images, or the GPT's windows of its context.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "sgd")]
    optimizer: Opt,
    /// Peak learning rate (cosine decay after a linear warm-up).
    #[arg(long, default_value_t = 0.05)]
    lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    /// Momentum (SGD).
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    /// Weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    /// Use only the first N training examples, or for the GPT the first N training
    /// bytes (0: all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
    /// Seed for initialisation and shuffling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to save the checkpoint (default: runs/MODEL-DATASET.safetensors in the
    /// current folder).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the training state (model, optimizer, step, seeds) is written every
    /// --save-every steps and at the end, and resumed from (default: beside the
    /// checkpoint, OUT.state.safetensors).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Write the training state every N steps (0: only at the end).
    #[arg(long, default_value_t = 500)]
    save_every: u64,
    /// Continue the run whose training state is at --state, taking the steps it would
    /// have taken had it not stopped (it needs the same settings).
    #[arg(long)]
    resume: bool,
    #[command(flatten)]
    anomaly: kiln_models::cli::AnomalyArg,
    #[command(flatten)]
    device: kiln_models::cli::DeviceArg,
    #[command(flatten)]
    data: kiln_models::cli::DataArg,
    /// Run every training step through the planned path, never replaying a captured
    /// graph (CUDA replays the image models' static step by default).
    #[arg(long)]
    no_graph: bool,
    /// How the GPT computes: f32 throughout, or bf16 or f16 matrix products with f32
    /// parameters, optimizer state, softmax, normalisation and loss
    /// (`#[model(precision = bf16)]` instances); f16 steps are loss-scaled.
    #[arg(long, value_enum, default_value = "f32")]
    precision: PrecisionArg,
    /// Data-parallel ranks on this machine, one process each, started by this one:
    /// every rank trains on --batch-size examples of each step (a step's batch is
    /// ranks × --batch-size) and the gradients are averaged, through NCCL between CUDA
    /// GPUs (rank r on GPU N + r of --device cuda:N) and loopback sockets elsewhere;
    /// rank 0 prints and writes the checkpoint and training state. Without it: one
    /// process, or one rank of a job that torchrun, srun or mpirun started (read from
    /// their variables; a rank takes GPU N + LOCAL_RANK).
    #[arg(long)]
    ranks: Option<usize>,
    /// Seconds a rank waits for the others, to start and in each exchange, before the
    /// run fails.
    #[arg(long, default_value_t = 300)]
    rank_timeout: u64,
}

/// `--precision`: which instance of the GPT trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PrecisionArg {
    /// f32 throughout.
    F32,
    /// bf16 matrix products, the rest f32.
    Bf16,
    /// f16 matrix products, the rest f32, training steps loss-scaled.
    F16,
}

/// The training run, on whichever backend `--device` opens: the whole run, or one rank
/// of a data-parallel one.
struct Train<'a>(&'a Args, Option<&'a RankEnv>);

impl OnDevice for Train<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, name: &str) -> Result<()> {
        let args = self.0;
        match self.1 {
            Some(env) if env.rank == 0 => {
                println!("device: {name} (rank 0 of {})", env.world)
            }
            Some(_) => {}
            None => println!("device: {name}"),
        }
        if args.precision != PrecisionArg::F32
            && matches!(args.model, ModelKind::Mlp | ModelKind::Cnn)
        {
            return Err(Error::invalid(
                "kiln-train",
                "--precision bf16 and f16 are built for the GPT (--model gpt, gpt-tiny or gpt-w3); the image models train in f32",
            ));
        }
        let ranks = match self.1 {
            Some(env) => Some(Ranks {
                rank: env.rank,
                world: env.world,
                // Ranks started with another --lr or --batch-size would train
                // together on other steps: they stop when they meet instead.
                collective: kiln::device::join_ranks::<Be>(
                    dev,
                    env,
                    Duration::from_secs(args.rank_timeout),
                    &flag_settings(args),
                )?,
            }),
            None => None,
        };
        match args.model {
            ModelKind::Mlp => run::<Be, Mlp<Be>>(args, dev, ranks),
            ModelKind::Cnn => run::<Be, LeNet<Be>>(args, dev, ranks),
            ModelKind::Gpt => gpt::run::<Be>(args, dev, ranks, gpt::Size::Small),
            ModelKind::GptTiny => gpt::run::<Be>(args, dev, ranks, gpt::Size::Tiny),
            ModelKind::GptW3 => gpt::run::<Be>(args, dev, ranks, gpt::Size::W3),
        }
    }
}

/// This process's rank of a data-parallel run, joined.
struct Ranks<Be: Backend> {
    rank: usize,
    world: usize,
    collective: Box<dyn Collective<Be>>,
}

/// What a mode (the classifiers, the GPT) hands the Learner: the model, its data,
/// the schedule, and what the run's files and reports say.
struct Job<'a, Be: Backend, M, D, E> {
    args: &'a Args,
    dev: &'a Be::Device,
    ranks: Option<Ranks<Be>>,
    model: M,
    train: DataLoader<D>,
    eval: DataLoader<E>,
    /// Test accuracy on the evaluation data (the classifiers).
    accuracy: bool,
    schedule: CosineWithWarmup,
    /// The settings a resumed run must share, keyed by flag.
    settings: BTreeMap<String, String>,
    files: Files,
    /// The curve's title.
    title: String,
    /// The checkpoint's metadata.
    metadata: BTreeMap<String, String>,
}

/// Where a run writes: the checkpoint and the training state.
struct Files {
    out: PathBuf,
    state: PathBuf,
}

impl Files {
    /// `--out` (or `runs/default`) and `--state` (or beside it), checked writable by
    /// rank 0 (`leader`) before any work; with `--resume`, the state must be there.
    fn new(args: &Args, default: &str, leader: bool) -> Result<Files> {
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| kiln_models::cli::default_checkpoint(default));
        let state = state_path(args, &out)?;
        if leader {
            checkpoint::check_writable("checkpoint", &out)?;
            checkpoint::check_writable("training state", &state)?;
        }
        if args.resume && !state.exists() {
            return Err(Error::invalid(
                "kiln-train",
                format!(
                    "there is no training state at {} to resume from (a run writes it every --save-every steps; --state names another)",
                    state.display()
                ),
            ));
        }
        Ok(Files { out, state })
    }
}

/// What a finished run measured: the steps it took and their time, the last epoch's
/// training loss, and the final evaluation.
struct Finished {
    steps: u64,
    seconds: f64,
    /// The seconds its steps took, evaluations left out.
    step_seconds: f64,
    train_loss: Option<f64>,
    eval_loss: f64,
    metrics: Vec<(String, f64)>,
}

/// A training run generic over the optimizer, which `--optimizer` chooses.
trait WithOptimizer<Be: Backend> {
    /// Trains with `opt`.
    fn train<O: Optimizer<Be>>(self, opt: O) -> Result<Option<Finished>>;
}

/// Builds the optimizer `--optimizer` names from the flags and hands it to `run`.
fn with_optimizer<Be: Backend>(
    args: &Args,
    run: impl WithOptimizer<Be>,
) -> Result<Option<Finished>> {
    match args.optimizer {
        Opt::Sgd => run.train(Sgd::<Be>::new(SgdConfig {
            lr: args.lr,
            momentum: args.momentum,
            weight_decay: args.weight_decay,
            ..SgdConfig::default()
        })?),
        Opt::Adamw => run.train(AdamW::<Be>::new(AdamWConfig {
            lr: args.lr,
            weight_decay: args.weight_decay,
            ..AdamWConfig::default()
        })?),
    }
}

impl<Be, M, D, E> WithOptimizer<Be> for Job<'_, Be, M, D, E>
where
    Be: Backend,
    M: Supervised<Be>,
    D: kiln::data::Dataset + 'static,
    E: kiln::data::Dataset + 'static,
{
    /// The run through the Learner; rank 0's measurements (`None` on the others).
    fn train<O: Optimizer<Be>>(self, opt: O) -> Result<Option<Finished>> {
        let args = self.args;
        let leader = self.ranks.as_ref().is_none_or(|r| r.rank == 0);
        let mut learner = Learner::new(self.model, opt, self.dev.clone())
            .epochs(args.epochs as u64)
            .schedule(self.schedule)
            .state_file(&self.files.state)
            .resume(match args.resume {
                true => Resume::Required,
                false => Resume::Never,
            })
            .save_every(args.save_every)
            .checkpoint_file(&self.files.out)
            .progress(true)
            .curve(self.files.out.with_extension("png"), &self.title)
            .replay(!args.no_graph);
        for (key, value) in &self.settings {
            learner = learner.setting(key, value);
        }
        for (key, value) in &self.metadata {
            learner = learner.metadata(key, value);
        }
        if self.accuracy {
            learner = learner.metric(TopK::accuracy());
        }
        if let Some(ranks) = self.ranks {
            learner = learner.ranks(ranks.collective);
        }
        let started = Instant::now();
        let reports = learner.fit(&self.train, Some(&self.eval))?;
        if !leader {
            return Ok(None);
        }
        let seconds = started.elapsed().as_secs_f64();
        let last = reports.last();
        let (eval_loss, metrics) = match last.and_then(|r| r.eval_loss.map(|l| (l, &r.metrics))) {
            Some((l, m)) => (l, m.clone()),
            None => learner.evaluate(&self.eval)?,
        };
        println!("training state {}", self.files.state.display());
        Ok(Some(Finished {
            steps: last.map_or(0, |r| r.step - learner.first_step()),
            seconds,
            step_seconds: reports.iter().map(|r| r.train_seconds).sum(),
            train_loss: last.map(|r| r.train_loss),
            eval_loss,
            metrics,
        }))
    }
}

fn run<Be: Backend, M: Classifier<Be>>(
    args: &Args,
    dev: &Be::Device,
    ranks: Option<Ranks<Be>>,
) -> Result<()> {
    let world = ranks.as_ref().map_or(1, |r| r.world);
    let leader = ranks.as_ref().is_none_or(|r| r.rank == 0);
    let batch = args.batch_size;
    let dataset = args.dataset.unwrap_or(Dataset::Mnist);
    let (dir, norm) = match dataset {
        Dataset::Mnist => ("mnist", MNIST_NORM),
        Dataset::Fashion => ("fashion-mnist", FASHION_NORM),
    };
    let name = format!("{:?}-{:?}.safetensors", args.model, dataset).to_lowercase();
    let files = Files::new(args, &name, leader)?;
    let mut data = ImageDataset::load(&args.data.dir()?.join(dir), norm)?;
    if args.limit > 0 {
        data.train = data.train.take(args.limit);
    }
    if data.test.is_empty() {
        return Err(Error::invalid(
            "kiln-train",
            "the test split is empty: there is nothing to evaluate on",
        ));
    }
    let global = batch * world;
    if data.train.len() < global {
        let ranks = match world {
            1 => String::new(),
            n => format!(" ({n} ranks of {batch})"),
        };
        return Err(Error::invalid(
            "kiln-train",
            format!(
                "{} training examples make no full batch of {global}{ranks}: the run would take no optimizer step",
                data.train.len()
            ),
        ));
    }
    let train = Examples::of::<Be, M>(Arc::new(data.train))?;
    let fingerprint = train.split().fingerprint();
    let examples = train.len();
    let train = DataLoader::new(train, training_batches(args, global))?;
    let test = Examples::of::<Be, M>(Arc::new(data.test))?;
    let eval = DataLoader::new(
        test,
        LoaderConfig {
            batch_size: EVAL_BATCH,
            ..train.config().for_evaluation()
        },
    )?;
    let total = train.batches_per_epoch() as u64 * args.epochs as u64;
    let schedule = CosineWithWarmup::new(
        args.lr,
        args.lr * 0.01,
        args.warmup.min(total / 2),
        total.max(1),
    )?;
    let model = M::init(dev, args.seed)?;
    if leader {
        let ranks = match world {
            1 => String::new(),
            n => format!(" ({n} ranks of {batch})"),
        };
        println!(
            "training {:?} ({} parameters) on {dataset:?}: {examples} examples, batch {global}{ranks}, {} epochs, {:?} lr {}",
            args.model,
            model.num_params(),
            args.epochs,
            args.optimizer,
            args.lr
        );
    }
    let job = Job {
        args,
        dev,
        ranks,
        model,
        train,
        eval,
        accuracy: true,
        schedule,
        settings: run_settings(args, &fingerprint),
        files,
        title: format!("{:?} on {dataset:?}", args.model),
        metadata: BTreeMap::from([
            ("model".into(), format!("{:?}", args.model).to_lowercase()),
            ("dataset".into(), format!("{dataset:?}").to_lowercase()),
        ]),
    };
    let Some(done) = with_optimizer(args, job)? else {
        return Ok(());
    };
    let accuracy = done
        .metrics
        .iter()
        .find(|m| m.0 == "accuracy")
        .map_or(f64::NAN, |m| m.1);
    println!(
        "trained {} steps in {:.1}s ({:.0} samples/s); test accuracy {:.2}%",
        done.steps,
        done.seconds,
        (done.steps * global as u64) as f64 / done.seconds,
        accuracy * 100.0
    );
    Ok(())
}

/// How both modes batch their training data: `global` examples a step (every rank's
/// share), shuffled with `--seed` anew each epoch, the last short batch dropped (a
/// replayed or data-parallel step takes batches of one size), read one worker ahead.
fn training_batches(args: &Args, global: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size: global,
        shuffle: true,
        seed: args.seed,
        last_batch: LastBatch::Drop,
        workers: 1,
        prefetch: 2,
    }
}

/// Where the training state goes: `--state`, or beside the checkpoint `out`.
/// (One file cannot be both: the checkpoint saved at the end would replace the state.)
fn state_path(args: &Args, out: &Path) -> Result<PathBuf> {
    let state = args
        .state
        .clone()
        .unwrap_or_else(|| out.with_extension("state.safetensors"));
    // Links followed, also to a file not written yet: a --state linked to --out would
    // be replaced by the checkpoint at the end.
    if state == out || checkpoint::same_file(&state, out) {
        return Err(Error::invalid(
            "kiln-train",
            format!(
                "--state and --out both name {}: the training state needs a file of its own",
                out.display()
            ),
        ));
    }
    Ok(state)
}

/// The settings a resumed run must share with the one it continues, keyed by flag:
/// everything that decides the steps' values ([`flag_settings`]), and a fingerprint
/// of the training data.
fn run_settings(args: &Args, data: &str) -> BTreeMap<String, String> {
    let mut settings = flag_settings(args);
    settings.insert("training data".into(), data.to_string());
    settings
}

/// The flags that decide the steps' values, keyed by flag: what the ranks of a
/// data-parallel run compare when they meet (before any reads its data), and a
/// resumed run with the run it continues.
fn flag_settings(args: &Args) -> BTreeMap<String, String> {
    let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    let dataset = match args.model {
        ModelKind::Mlp | ModelKind::Cnn => lower(&args.dataset.unwrap_or(Dataset::Mnist)),
        ModelKind::Gpt | ModelKind::GptTiny | ModelKind::GptW3 => "shakespeare".into(),
    };
    BTreeMap::from([
        ("--model".into(), lower(&args.model)),
        ("--dataset".into(), dataset),
        ("--epochs".into(), args.epochs.to_string()),
        ("--batch-size".into(), args.batch_size.to_string()),
        ("--optimizer".into(), lower(&args.optimizer)),
        ("--lr".into(), args.lr.to_string()),
        ("--warmup".into(), args.warmup.to_string()),
        ("--momentum".into(), args.momentum.to_string()),
        ("--weight-decay".into(), args.weight_decay.to_string()),
        ("--limit".into(), args.limit.to_string()),
        ("--seed".into(), args.seed.to_string()),
        ("--precision".into(), lower(&args.precision)),
    ])
}

#[path = "../gpt_instances.rs"]
mod gpt_instances;
#[path = "../w3_instances.rs"]
mod w3_instances;

/// Training a GPT on the Shakespeare bytes.
mod gpt {
    use super::{Args, Files, Job, PrecisionArg, Ranks};
    use crate::gpt_instances::{SmallGpt, TinyGpt};
    use crate::w3_instances::{SmallGptBf16, SmallGptF16, W3Gpt, W3GptBf16, W3GptF16};
    use kiln::data::{DataLoader, Dataset as _, LoaderConfig, TextWindows};
    use kiln::prelude::*;
    use kiln::train::learner::Supervised;
    use kiln::train::schedule::CosineWithWarmup;
    use kiln_models::gpt::GptModel;
    use kiln_models::text::Corpus;
    use std::collections::BTreeMap;

    /// The tiny GPT with bf16 matrix products (`--precision bf16`).
    #[model(precision = bf16)]
    type TinyGptBf16 = kiln_models::gpt::Gpt<16, 2, 2, 32>;

    /// The tiny GPT with f16 matrix products (`--precision f16`).
    #[model(precision = f16)]
    type TinyGptF16 = kiln_models::gpt::Gpt<16, 2, 2, 32>;

    kiln_models::gpt_model!(TinyGptBf16 as TinyGpt, TinyGptF16 as TinyGpt);

    /// Which GPT `--model` trains.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Size {
        /// `--model gpt-tiny`.
        Tiny,
        /// `--model gpt`.
        Small,
        /// `--model gpt-w3`.
        W3,
    }

    /// Trains the GPT of `size` on `--batch-size` windows of its context per step.
    pub fn run<Be: Backend>(
        args: &Args,
        dev: &Be::Device,
        ranks: Option<Ranks<Be>>,
        size: Size,
    ) -> Result<()> {
        if args.dataset.is_some() {
            return Err(Error::invalid(
                "kiln-train",
                "--dataset chooses the image models' data; the GPT trains on the Shakespeare text",
            ));
        }
        use PrecisionArg::{Bf16, F16, F32};
        use Size::{Small, Tiny, W3};
        match (size, args.precision) {
            (Tiny, F32) => train::<Be, TinyGpt<Be>>(args, dev, ranks),
            (Small, F32) => train::<Be, SmallGpt<Be>>(args, dev, ranks),
            (W3, F32) => train::<Be, W3Gpt<Be>>(args, dev, ranks),
            (Tiny, Bf16) => train::<Be, TinyGptBf16<Be>>(args, dev, ranks),
            (Small, Bf16) => train::<Be, SmallGptBf16<Be>>(args, dev, ranks),
            (W3, Bf16) => train::<Be, W3GptBf16<Be>>(args, dev, ranks),
            (Tiny, F16) => train::<Be, TinyGptF16<Be>>(args, dev, ranks),
            (Small, F16) => train::<Be, SmallGptF16<Be>>(args, dev, ranks),
            (W3, F16) => train::<Be, W3GptF16<Be>>(args, dev, ranks),
        }
    }

    /// Trains the GPT `M` on shuffled windows of its whole context (`M::CONTEXT`
    /// bytes, one after another through the training text), `--batch-size` per rank
    /// per step, evaluated after each epoch on the held-out text's windows.
    fn train<Be: Backend, M: GptModel<Be> + Supervised<Be>>(
        args: &Args,
        dev: &Be::Device,
        ranks: Option<Ranks<Be>>,
    ) -> Result<()> {
        let world = ranks.as_ref().map_or(1, |r| r.world);
        let leader = ranks.as_ref().is_none_or(|r| r.rank == 0);
        let (batch, context) = (args.batch_size, M::CONTEXT);
        let global = batch * world;
        let mut corpus = Corpus::shakespeare_in(&args.data.dir()?)?;
        if args.limit > 0 {
            if args.limit <= global * context {
                return Err(Error::invalid(
                    "kiln-train",
                    format!(
                        "--limit {} leaves less than one step of {global} windows of {context} bytes",
                        args.limit,
                    ),
                ));
            }
            corpus.train.truncate(args.limit);
        }
        // Each configuration its own file: `--model gpt-tiny` must not overwrite the
        // small GPT's checkpoint.
        let name = clap::ValueEnum::to_possible_value(&args.model)
            .map_or_else(|| "gpt".to_string(), |v| v.get_name().to_string());
        let files = Files::new(args, &format!("{name}-shakespeare.safetensors"), leader)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&corpus.train);
        let data = format!("{} bytes, crc32 {:08x}", corpus.train.len(), crc.finalize());
        let bytes = |text: &[u8]| text.iter().map(|&b| i32::from(b)).collect::<Vec<_>>();
        let windows = TextWindows::new(bytes(&corpus.train), 256, context, context)?;
        if windows.len() < global {
            return Err(Error::invalid(
                "kiln-train",
                format!(
                    "the training text makes {} windows of {context} bytes, no full step of {global} (--batch-size{})",
                    windows.len(),
                    if world > 1 { " × --ranks" } else { "" }
                ),
            ));
        }
        let train = DataLoader::new(windows, super::training_batches(args, global))?;
        // The whole held-out text in consecutive windows, in batches of one size (a
        // replayed step's evaluation reuses its plans), smaller when the text is.
        let held_out = TextWindows::new(bytes(&corpus.held_out), 256, context, context)?;
        let eval_batches = LoaderConfig {
            batch_size: batch.min(held_out.len()),
            shuffle: false,
            ..*train.config()
        };
        let eval = DataLoader::new(held_out, eval_batches)?;
        let total = (train.batches_per_epoch() as u64 * args.epochs as u64).max(1);
        let schedule =
            CosineWithWarmup::new(args.lr, args.lr * 0.1, args.warmup.min(total / 2), total)?;
        let model = M::init_named(dev, args.seed, "")?;
        if leader {
            let ranks = match world {
                1 => String::new(),
                n => format!(" ({n} ranks of {batch})"),
            };
            println!(
                "training {} ({} parameters) on Shakespeare: {} training bytes, {} held out, {global} windows of {context} per step{ranks}, {total} steps, {:?} lr {}",
                M::NAME,
                model.num_params(),
                corpus.train.len(),
                corpus.held_out.len(),
                args.optimizer,
                args.lr
            );
        }
        let job = Job {
            args,
            dev,
            ranks,
            model,
            train,
            eval,
            accuracy: false,
            schedule,
            settings: super::run_settings(args, &data),
            files,
            title: format!("{} on Shakespeare (evaluation loss in nats/byte)", M::NAME),
            metadata: BTreeMap::from([
                ("model".into(), "gpt".into()),
                ("config".into(), M::CONFIG.into()),
                (
                    "precision".into(),
                    format!("{:?}", args.precision).to_lowercase(),
                ),
                ("dataset".into(), "shakespeare".into()),
            ]),
        };
        let Some(done) = super::with_optimizer(args, job)? else {
            return Ok(());
        };
        let train_loss = done
            .train_loss
            .map_or_else(|| "-".to_string(), |l| format!("{l:.3}"));
        println!(
            "trained {} steps in {:.1}s ({:.1} ms per step; {:.1} steps/s without evaluations); train loss {train_loss}, held-out loss {:.3} nats/byte over the whole held-out text",
            done.steps,
            done.seconds,
            done.seconds * 1e3 / done.steps.max(1) as f64,
            done.steps as f64 / done.step_seconds.max(1e-9),
            done.eval_loss
        );
        Ok(())
    }
}

/// Refuses settings that would train nothing or train wrongly, before any work.
fn check_args(args: &Args) -> Result<()> {
    let bad = |what: String| Err(Error::invalid("kiln-train", what));
    if args.epochs == 0 {
        return bad("--epochs 0 trains nothing: give at least 1".into());
    }
    if args.batch_size == 0 {
        return bad("--batch-size 0 takes no examples a step: give at least 1".into());
    }
    if args.ranks == Some(0) {
        return bad(
            "--ranks 0 runs nothing: give at least 1 (or leave it out for one process)".into(),
        );
    }
    kiln::train::launch::check_timeout("--rank-timeout", Duration::from_secs(args.rank_timeout))?;
    if !(args.lr > 0.0 && args.lr.is_finite()) {
        return bad(format!("--lr must be a positive number, got {}", args.lr));
    }
    if !(0.0..1.0).contains(&args.momentum) {
        return bad(format!(
            "--momentum must be in [0, 1), got {}",
            args.momentum
        ));
    }
    if !(args.weight_decay >= 0.0 && args.weight_decay.is_finite()) {
        return bad(format!(
            "--weight-decay must be a number >= 0, got {}",
            args.weight_decay
        ));
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    args.anomaly.apply();
    let outcome = check_args(&args).and_then(|()| start(&args));
    if let Err(e) = &outcome {
        // A rank Kiln's launcher started leaves its error to it, which prints one line.
        let told =
            matches!(RankEnv::from_env(), Ok(Some(env)) if env.report_failure(&e.to_string()));
        if !told {
            // One write, so that a launcher merging its ranks' output (mpirun) keeps
            // the line whole.
            use std::io::Write;
            let _ = std::io::stderr().write_all(format!("error: {e}\n").as_bytes());
        }
    }
    // A failed rank of an MPI job aborts the job, so that no rank waits on it.
    kiln::device::end_ranks(outcome.is_ok());
    if outcome.is_err() {
        std::process::exit(1);
    }
}

/// Runs the training: in this process, as the launcher of `--ranks` processes, or as
/// one rank of a job (started by that launcher, torchrun, srun or mpirun, which set
/// the rank's environment).
fn start(args: &Args) -> Result<()> {
    match (RankEnv::from_env()?, args.ranks) {
        (None, None) => run_on(args.device.device, Train(args, None)),
        (None, Some(world)) => {
            let me = std::env::current_exe().map_err(|e| {
                Error::invalid("kiln-train", format!("finding this program to launch its ranks: {e}"))
            })?;
            let argv: Vec<String> = std::env::args().skip(1).collect();
            launch(world, &me, &argv)
        }
        (Some(env), ranks) if env.starter != Starter::Kiln && ranks.is_some() => {
            Err(Error::invalid(
                "kiln-train",
                format!(
                    "this process is rank {} of {} started by {} ({}), but its command line says --ranks, which starts ranks of its own on this machine: leave --ranks out",
                    env.rank,
                    env.world,
                    env.starter.name(),
                    env.starter.variables()
                ),
            ))
        }
        (Some(env), ranks) if env.starter != Starter::Kiln || ranks == Some(env.world) => {
            env.watch_launcher();
            let device = match args.device.device {
                DeviceChoice::Cuda(first) => DeviceChoice::Cuda(first + env.local_rank),
                other => other,
            };
            run_on(device, Train(args, Some(&env)))
        }
        (Some(env), _) => Err(Error::invalid(
            "kiln-train",
            format!(
                "this process is rank {} of {} (KILN_RANK, KILN_WORLD), but its command line does not say --ranks {}",
                env.rank, env.world, env.world
            ),
        )),
    }
}
