//! `kiln-train`: trains a zoo model and saves a safetensors checkpoint: the MLP or the
//! CNN on MNIST or Fashion-MNIST (test accuracy after every epoch), or the GPT on the
//! Shakespeare bytes (held-out loss in nats per byte), on the CPU or a GPU
//! (`--device wgpu` / `--device cuda`, in a build with the `wgpu` / `cuda` feature).

use clap::{Parser, ValueEnum};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kiln::device::{run_on, DeviceChoice, OnDevice};
use kiln::prelude::*;
use kiln::tensor::nn::Module;
use kiln::tensor::Collective;
use kiln::train::checkpoint;
use kiln::train::launch::{launch, RankEnv};
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln::train::schedule::CosineWithWarmup;
use kiln::train::state;
use kiln_models::classify::{accuracy, fit_ranks, Classifier, FitSettings};
use kiln_models::curve::Curve;
use kiln_models::data::{ImageDataset, FASHION_NORM, MNIST_NORM};
use kiln_models::progress::Progress;
use kiln_models::{lenet::LeNet, mlp::Mlp};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
    /// Examples per step: 16, 32, 64, 128, 256 or 512 (a model's batch is static).
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
    /// How the GPT computes: f32 throughout, or bf16 matrix products with f32
    /// parameters, optimizer state, softmax, normalisation and loss
    /// (`#[model(precision = bf16)]` instances).
    #[arg(long, value_enum, default_value = "f32")]
    precision: PrecisionArg,
    /// Data-parallel ranks, one process each, started by this one: every rank trains
    /// on --batch-size examples of each step (a step's batch is ranks × --batch-size)
    /// and the gradients are averaged, through NCCL between CUDA GPUs (rank r on GPU
    /// N + r of --device cuda:N) and loopback sockets elsewhere; rank 0 prints and
    /// writes the checkpoint and training state. Without it: one process, no exchange.
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
                "--precision bf16 is built for the GPT (--model gpt, gpt-tiny or gpt-w3); the image models train in f32",
            ));
        }
        let ranks = match self.1 {
            Some(env) => Some(Ranks {
                rank: env.rank,
                world: env.world,
                collective: kiln::device::join_ranks::<Be>(
                    dev,
                    env,
                    Duration::from_secs(args.rank_timeout),
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

/// A training run generic over the optimizer, which `--optimizer` chooses.
trait WithOptimizer<Be: Backend> {
    /// Trains with `opt`.
    fn train<O: Optimizer<Be>>(self, opt: O) -> Result<()>;
}

/// Builds the optimizer `--optimizer` names from the flags and hands it to `run`.
fn with_optimizer<Be: Backend>(args: &Args, run: impl WithOptimizer<Be>) -> Result<()> {
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

/// Training an image classifier `M`.
struct ClassifierRun<'a, Be: Backend, M> {
    args: &'a Args,
    dev: &'a Be::Device,
    ranks: Option<Ranks<Be>>,
    model: std::marker::PhantomData<M>,
}

impl<Be: Backend, M: Classifier<Be>> WithOptimizer<Be> for ClassifierRun<'_, Be, M> {
    fn train<O: Optimizer<Be>>(self, opt: O) -> Result<()> {
        train_classifier::<Be, M, O>(self.args, self.dev, self.ranks, opt)
    }
}

fn run<Be: Backend, M: Classifier<Be>>(
    args: &Args,
    dev: &Be::Device,
    ranks: Option<Ranks<Be>>,
) -> Result<()> {
    let run = ClassifierRun::<Be, M> {
        args,
        dev,
        ranks,
        model: std::marker::PhantomData,
    };
    with_optimizer(args, run)
}

fn train_classifier<Be: Backend, M: Classifier<Be>, O: Optimizer<Be>>(
    args: &Args,
    dev: &Be::Device,
    ranks: Option<Ranks<Be>>,
    mut opt: O,
) -> Result<()> {
    let (rank, world) = ranks.as_ref().map_or((0, 1), |r| (r.rank, r.world));
    // Rank 0 reports and writes files; the others train in silence.
    let leader = rank == 0;
    let batch = args.batch_size;
    if !TRAIN_BATCHES.contains(&batch) {
        return Err(Error::invalid(
            "kiln-train",
            format!("batch size {batch} is not one of {TRAIN_BATCHES:?}"),
        ));
    }
    let dataset = args.dataset.unwrap_or(Dataset::Mnist);
    let (dir, norm) = match dataset {
        Dataset::Mnist => ("mnist", MNIST_NORM),
        Dataset::Fashion => ("fashion-mnist", FASHION_NORM),
    };
    let out = args.out.clone().unwrap_or_else(|| {
        let name = format!("{:?}-{:?}.safetensors", args.model, dataset).to_lowercase();
        kiln_models::cli::default_checkpoint(&name)
    });
    let state_path = state_path(args, &out)?;
    if leader {
        check_writable("checkpoint", &out)?;
        check_writable("training state", &state_path)?;
    }
    let mut data = ImageDataset::load(&args.data.dir()?.join(dir), norm)?;
    if args.limit > 0 {
        data.train = data.train.take(args.limit);
    }
    let global = batch * world;
    if data.train.len() < global {
        return Err(Error::invalid(
            "kiln-train",
            format!(
                "{} training examples make no full batch of {global}: the run would take no optimizer step",
                data.train.len()
            ),
        ));
    }
    if data.test.is_empty() {
        return Err(Error::invalid(
            "kiln-train",
            "the test split is empty: there is nothing to evaluate on",
        ));
    }
    let mut model = M::init(dev, args.seed)?;
    let steps_per_epoch = (data.train.len() / global) as u64;
    let total = steps_per_epoch * args.epochs as u64;
    let schedule = CosineWithWarmup::new(
        args.lr,
        args.lr * 0.01,
        args.warmup.min(total / 2),
        total.max(1),
    )?;
    let settings = run_settings(args, &format!("{dataset:?}"), &data.train.fingerprint());
    let start = resume(args, &state_path, &mut model, &mut opt, &settings, total)?;
    if leader {
        let ranks = match world {
            1 => String::new(),
            n => format!(" ({n} ranks of {batch})"),
        };
        println!(
            "training {:?} ({} parameters) on {:?}: {} examples, batch {global}{ranks}, {} epochs, {:?} lr {}",
            args.model,
            model.num_params(),
            dataset,
            data.train.len(),
            args.epochs,
            args.optimizer,
            args.lr
        );
    }
    let bar = Progress::new(total, leader);
    bar.set_position(start);
    let started = Instant::now();
    let mut avg = f32::NAN;
    let mut last_acc = String::from("-");
    // The step and accuracy (a fraction) of the latest evaluation: a run that ends on an epoch's end
    // reports that one instead of evaluating the same weights twice.
    let mut evaluated: Option<(u64, f64)> = None;
    let test = data.test.clone();
    let mut curve = Curve::new("test accuracy (%)");
    let mut on_step = |m: &M, o: &O, r: kiln_models::classify::StepReport| -> Result<()> {
        avg = if avg.is_nan() {
            r.loss
        } else {
            0.98 * avg + 0.02 * r.loss
        };
        curve.loss.push((r.step + 1, avg as f64));
        if !r.loss.is_finite() {
            return Err(kiln_models::cli::non_finite_loss(r.loss, r.step));
        }
        if !leader {
            return Ok(());
        }
        if let Some(notice) = &r.notice {
            bar.suspend(|| println!("{notice}"));
        }
        if args.save_every > 0 && (r.step + 1).is_multiple_of(args.save_every) {
            state::save(&state_path, m, o, r.step + 1, &settings)?;
        }
        if (r.step + 1).is_multiple_of(steps_per_epoch) {
            let fraction = accuracy(m, &test, dev)?;
            evaluated = Some((r.step + 1, fraction));
            let acc = 100.0 * fraction;
            curve.metric.push((r.step + 1, acc));
            last_acc = format!("{acc:.2}%");
            // `suspend` prints even when the bar is hidden (output not a terminal).
            bar.suspend(|| {
                println!(
                    "epoch {} done: loss {avg:.4}, test accuracy {last_acc}",
                    r.epoch + 1
                )
            });
        }
        let rate = ((r.step + 1 - start) * global as u64) as f64 / started.elapsed().as_secs_f64();
        bar.set_message(format!(
            "epoch {} loss {avg:.4} acc {last_acc} {rate:.0} samples/s",
            r.epoch + 1
        ));
        bar.inc(1);
        Ok(())
    };
    let fitting = FitSettings {
        batch,
        epochs: args.epochs,
        seed: args.seed,
        start,
        replay: !args.no_graph,
    };
    let collective = ranks.map(|r| r.collective);
    fit_ranks(
        &mut model,
        &mut opt,
        &schedule,
        &data.train,
        &fitting,
        dev,
        collective,
        &mut on_step,
    )?;
    bar.finish_and_clear();
    if !leader {
        return Ok(());
    }
    if start < total {
        state::save(&state_path, &model, &opt, total, &settings)?;
    }
    let acc = match evaluated {
        Some((step, fraction)) if step == total => fraction,
        _ => accuracy(&model, &data.test, dev)?,
    };
    let secs = started.elapsed().as_secs_f64();
    let trained = total - start;
    println!(
        "trained {trained} steps in {secs:.1}s ({:.0} samples/s); test accuracy {:.2}%",
        (trained * global as u64) as f64 / secs,
        acc * 100.0
    );
    let mut meta = BTreeMap::new();
    meta.insert(
        "model".to_string(),
        format!("{:?}", args.model).to_lowercase(),
    );
    meta.insert(
        "dataset".to_string(),
        format!("{:?}", dataset).to_lowercase(),
    );
    meta.insert("test_accuracy".to_string(), format!("{acc:.4}"));
    checkpoint::save_with_metadata(&model, &out, &meta)?;
    println!("saved {}", out.display());
    println!("training state {}", state_path.display());
    let png = out.with_extension("png");
    curve.write_png(&png, &format!("{:?} on {:?}", args.model, dataset))?;
    println!("training curve {}", png.display());
    Ok(())
}

/// Where the training state goes: `--state`, or beside the checkpoint `out`.
/// (One file cannot be both: the checkpoint saved at the end would replace the state.)
fn state_path(args: &Args, out: &Path) -> Result<PathBuf> {
    let state = args
        .state
        .clone()
        .unwrap_or_else(|| out.with_extension("state.safetensors"));
    let same = state == out
        || matches!((state.canonicalize(), out.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if same {
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
/// everything that decides the steps' values, and a fingerprint of the training data.
fn run_settings(args: &Args, dataset: &str, data: &str) -> BTreeMap<String, String> {
    let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    BTreeMap::from([
        ("--model".into(), lower(&args.model)),
        ("--dataset".into(), dataset.to_lowercase()),
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
        ("training data".into(), data.to_string()),
    ])
}

/// With `--resume`, restores the model and optimizer from the training state at `path`
/// and returns the steps it had taken (of `total`); otherwise 0.
fn resume<Be: Backend, M: Module<Be>, O: Optimizer<Be>>(
    args: &Args,
    path: &Path,
    model: &mut M,
    opt: &mut O,
    settings: &BTreeMap<String, String>,
    total: u64,
) -> Result<u64> {
    if !args.resume {
        return Ok(0);
    }
    if !path.exists() {
        return Err(Error::invalid(
            "kiln-train",
            format!(
                "there is no training state at {} to resume from (a run writes it every --save-every steps; --state names another)",
                path.display()
            ),
        ));
    }
    let step = state::load(path, model, opt, settings)?;
    if step > total {
        return Err(Error::invalid(
            "kiln-train",
            format!(
                "{} has taken {step} steps, more than this run's {total}",
                path.display()
            ),
        ));
    }
    if step == total {
        println!(
            "resumed from {}: all {total} steps were taken, nothing is left to train",
            path.display()
        );
    } else {
        println!("resumed from {} at step {step} of {total}", path.display());
    }
    Ok(step)
}

#[path = "../gpt_instances.rs"]
mod gpt_instances;
#[path = "../w3_instances.rs"]
mod w3_instances;

/// Training a GPT on the Shakespeare bytes.
mod gpt {
    use super::{Args, PrecisionArg, Ranks};
    use crate::gpt_instances::{SmallGpt, TinyGpt};
    use crate::w3_instances::{W3Gpt, W3GptBf16};
    use kiln::prelude::*;
    use kiln::tensor::HostData;
    use kiln::train::checkpoint;
    use kiln::train::optim::Optimizer;
    use kiln::train::parallel::broadcast_state;
    use kiln::train::replay::{StepInput, StepReplay};
    use kiln::train::schedule::{CosineWithWarmup, Schedule};
    use kiln::train::state;
    use kiln_models::curve::Curve;
    use kiln_models::gpt::{GptModel, Ids};
    use kiln_models::text::{windows, Corpus};
    use std::collections::BTreeMap;
    use std::time::Instant;

    /// The tiny GPT with bf16 matrix products (`--precision bf16`).
    #[model(precision = bf16)]
    type TinyGptBf16 = kiln_models::gpt::Gpt<16, 2, 2, 32>;

    /// The small GPT with bf16 matrix products (`--precision bf16`).
    #[model(precision = bf16)]
    type SmallGptBf16 = kiln_models::gpt::Gpt<128, 4, 4, 128>;

    kiln_models::gpt_model!(TinyGptBf16 as TinyGpt, SmallGptBf16 as SmallGpt);

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

    /// Trains the GPT of `size` with `--batch-size` 16, 32 or 64 windows of its context
    /// per step (W3: 32).
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
        let bf16 = args.precision == PrecisionArg::Bf16;
        use Size::{Small, Tiny, W3};
        match (size, bf16, args.batch_size) {
            (Tiny, false, 16) => train::<Be, TinyGpt<Be>, 16, 32>(args, dev, ranks),
            (Tiny, false, 32) => train::<Be, TinyGpt<Be>, 32, 32>(args, dev, ranks),
            (Tiny, false, 64) => train::<Be, TinyGpt<Be>, 64, 32>(args, dev, ranks),
            (Small, false, 16) => train::<Be, SmallGpt<Be>, 16, 128>(args, dev, ranks),
            (Small, false, 32) => train::<Be, SmallGpt<Be>, 32, 128>(args, dev, ranks),
            (Small, false, 64) => train::<Be, SmallGpt<Be>, 64, 128>(args, dev, ranks),
            (Tiny, true, 16) => train::<Be, TinyGptBf16<Be>, 16, 32>(args, dev, ranks),
            (Tiny, true, 32) => train::<Be, TinyGptBf16<Be>, 32, 32>(args, dev, ranks),
            (Tiny, true, 64) => train::<Be, TinyGptBf16<Be>, 64, 32>(args, dev, ranks),
            (Small, true, 16) => train::<Be, SmallGptBf16<Be>, 16, 128>(args, dev, ranks),
            (Small, true, 32) => train::<Be, SmallGptBf16<Be>, 32, 128>(args, dev, ranks),
            (Small, true, 64) => train::<Be, SmallGptBf16<Be>, 64, 128>(args, dev, ranks),
            (W3, false, 32) => train::<Be, W3Gpt<Be>, 32, 256>(args, dev, ranks),
            (W3, true, 32) => train::<Be, W3GptBf16<Be>, 32, 256>(args, dev, ranks),
            (W3, _, other) => Err(Error::invalid(
                "kiln-train",
                format!("W3's GPT trains on 32 windows per step, not {other}"),
            )),
            (_, _, other) => Err(Error::invalid(
                "kiln-train",
                format!("the GPT trains on 16, 32 or 64 windows per step, not {other}"),
            )),
        }
    }

    /// `B` seeded windows of `text` and their next bytes.
    fn batch<Be: Backend, const B: usize, const T: usize>(
        text: &[u8],
        seed: u64,
        dev: &Be::Device,
    ) -> Result<(Ids<Be, B, T>, Ids<Be, B, T>)> {
        let (ids, next) = windows(text, B, T, seed)?;
        Ok((
            Tensor::from_vec(ids, &[B, T], dev)?,
            Tensor::from_vec(next, &[B, T], dev)?,
        ))
    }

    /// Mean loss (nats per byte) over 16 seeded held-out batches: the estimate
    /// printed while training.
    fn held_out_sample<Be: Backend, M: GptModel<Be>, const B: usize, const T: usize>(
        model: &M,
        corpus: &Corpus,
        dev: &Be::Device,
    ) -> Result<f32> {
        let mut total = 0.0;
        for s in 0..16u64 {
            let (x, y) = batch::<Be, B, T>(&corpus.held_out, u64::MAX - s, dev)?;
            total += model.loss(&x, &y)?.raw().to_vec::<f32>()?[0];
        }
        Ok(total / 16.0)
    }

    /// Mean loss (nats per byte) over the whole held-out text, cut into consecutive
    /// windows of `T` bytes (the figure reported at the end; the PyTorch script
    /// measures the same windows).
    fn held_out_full<Be: Backend, M: GptModel<Be>, const B: usize, const T: usize>(
        model: &M,
        corpus: &Corpus,
        dev: &Be::Device,
    ) -> Result<f32> {
        let text = &corpus.held_out;
        let windows = (text.len() - 1) / T;
        let mut sum = 0.0f64;
        let mut counted = 0usize;
        for first in (0..windows).step_by(B) {
            if first + B > windows {
                break;
            }
            let mut ids = Vec::with_capacity(B * T);
            let mut next = Vec::with_capacity(B * T);
            for w in first..first + B {
                ids.extend(text[w * T..(w + 1) * T].iter().map(|&c| c as i32));
                next.extend(text[w * T + 1..(w + 1) * T + 1].iter().map(|&c| c as i32));
            }
            let x = Ids::<Be, B, T>::from_vec(ids, &[B, T], dev)?;
            let y = Ids::<Be, B, T>::from_vec(next, &[B, T], dev)?;
            sum += model.loss(&x, &y)?.raw().to_vec::<f32>()?[0] as f64;
            counted += 1;
        }
        if counted == 0 {
            return Err(Error::invalid(
                "kiln-train",
                "the held-out text is shorter than one batch",
            ));
        }
        Ok((sum / counted as f64) as f32)
    }

    /// Training the GPT `M` on `B` windows of `T` bytes per step.
    struct GptRun<'a, Be: Backend, M, const B: usize, const T: usize> {
        args: &'a Args,
        dev: &'a Be::Device,
        ranks: Option<Ranks<Be>>,
        model: std::marker::PhantomData<M>,
    }

    impl<Be: Backend, M: GptModel<Be>, const B: usize, const T: usize> super::WithOptimizer<Be>
        for GptRun<'_, Be, M, B, T>
    {
        fn train<O: Optimizer<Be>>(self, opt: O) -> Result<()> {
            train_with::<Be, M, O, B, T>(self.args, self.dev, self.ranks, opt)
        }
    }

    fn train<Be: Backend, M: GptModel<Be>, const B: usize, const T: usize>(
        args: &Args,
        dev: &Be::Device,
        ranks: Option<Ranks<Be>>,
    ) -> Result<()> {
        let run = GptRun::<Be, M, B, T> {
            args,
            dev,
            ranks,
            model: std::marker::PhantomData,
        };
        super::with_optimizer(args, run)
    }

    fn train_with<
        Be: Backend,
        M: GptModel<Be>,
        O: Optimizer<Be>,
        const B: usize,
        const T: usize,
    >(
        args: &Args,
        dev: &Be::Device,
        ranks: Option<Ranks<Be>>,
        mut opt: O,
    ) -> Result<()> {
        let (rank, world) = ranks.as_ref().map_or((0, 1), |r| (r.rank, r.world));
        // Rank 0 reports and writes files; the others train in silence.
        let leader = rank == 0;
        let mut corpus = Corpus::shakespeare_in(&args.data.dir()?)?;
        if args.limit > 0 {
            if args.limit <= B * T * world {
                return Err(Error::invalid(
                    "kiln-train",
                    format!(
                        "--limit {} leaves less than one step of {} windows of {T} bytes",
                        args.limit,
                        B * world
                    ),
                ));
            }
            corpus.train.truncate(args.limit);
        }
        // Each configuration its own file: `--model gpt-tiny` must not overwrite the
        // small GPT's checkpoint.
        let out = args.out.clone().unwrap_or_else(|| {
            let model = clap::ValueEnum::to_possible_value(&args.model)
                .map_or_else(|| "gpt".to_string(), |v| v.get_name().to_string());
            kiln_models::cli::default_checkpoint(&format!("{model}-shakespeare.safetensors"))
        });
        let state_path = super::state_path(args, &out)?;
        if leader {
            super::check_writable("checkpoint", &out)?;
            super::check_writable("training state", &state_path)?;
        }
        let mut model = M::init_named(dev, args.seed, "")?;
        let per_epoch = (corpus.train.len() / (B * world * T)) as u64;
        let total = (per_epoch * args.epochs as u64).max(1);
        let schedule =
            CosineWithWarmup::new(args.lr, args.lr * 0.1, args.warmup.min(total / 2), total)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&corpus.train);
        let data = format!("{} bytes, crc32 {:08x}", corpus.train.len(), crc.finalize());
        let settings = super::run_settings(args, "shakespeare", &data);
        let start = super::resume(args, &state_path, &mut model, &mut opt, &settings, total)?;
        if leader {
            let ranks = match world {
                1 => String::new(),
                n => format!(" ({n} ranks of {B})"),
            };
            println!(
                "training {} ({} parameters) on Shakespeare: {} training bytes, {} held out, {} windows of {T} per step{ranks}, {total} steps, {:?} lr {}",
                M::NAME,
                model.num_params(),
                corpus.train.len(),
                corpus.held_out.len(),
                B * world,
                args.optimizer,
                args.lr
            );
        }
        let bar = kiln_models::progress::Progress::new(total, leader);
        bar.set_position(start);
        let started = Instant::now();
        let mut steps = StepReplay::new(dev, !args.no_graph, &opt, M::draws_at_random());
        if let Some(ranks) = ranks {
            broadcast_state(ranks.collective.as_ref(), &mut model, 0)?;
            if let Some(seeds) = model.step_seeds() {
                seeds.set_rank(rank as u64);
            }
            steps = steps.data_parallel(ranks.collective)?;
        }
        let mut avg = f32::NAN;
        let mut curve = Curve::new("held-out loss (nats/byte, 16 batches)");
        let mut run = || -> Result<()> {
            for step in start..total {
                // The step's windows for every rank, and this rank's share of them.
                let (ids, next) = windows(
                    &corpus.train,
                    B * world,
                    T,
                    args.seed.wrapping_mul(1_000_003) ^ step,
                )?;
                let (ids, next) = if world == 1 {
                    (ids, next)
                } else {
                    let mine = rank * B * T..(rank + 1) * B * T;
                    (ids[mine.clone()].to_vec(), next[mine].to_vec())
                };
                opt.set_lr(schedule.lr_at(step))?;
                let inputs = vec![
                    StepInput {
                        data: HostData::I32(ids),
                        dims: &[B, T],
                    },
                    StepInput {
                        data: HostData::I32(next),
                        dims: &[B, T],
                    },
                ];
                let outcome = steps.step(&mut model, &mut opt, inputs, &mut |m, xy| {
                    let (ids, next) = (
                        Tensor::from_raw(xy[0].clone())?,
                        Tensor::from_raw(xy[1].clone())?,
                    );
                    let (loss, grads) = m.loss_and_grad::<B, T>(&ids, &next)?;
                    Ok((loss.into_raw(), grads))
                })?;
                let loss = outcome.loss;
                if !loss.is_finite() {
                    return Err(kiln_models::cli::non_finite_loss(loss, step));
                }
                if !leader {
                    continue;
                }
                if let Some(notice) = &outcome.notice {
                    bar.suspend(|| println!("{notice}"));
                }
                avg = if avg.is_nan() {
                    loss
                } else {
                    0.98 * avg + 0.02 * loss
                };
                curve.loss.push((step + 1, avg as f64));
                if args.save_every > 0 && (step + 1).is_multiple_of(args.save_every) {
                    state::save(&state_path, &model, &opt, step + 1, &settings)?;
                }
                if (step + 1) % per_epoch.max(1) == 0 {
                    let h = held_out_sample::<Be, M, B, T>(&model, &corpus, dev)?;
                    curve.metric.push((step + 1, h as f64));
                    bar.suspend(|| {
                        println!(
                            "step {}: train loss {avg:.3}, held-out loss {h:.3} nats/byte ({:.0}s)",
                            step + 1,
                            started.elapsed().as_secs_f64()
                        )
                    });
                }
                let rate = ((step + 1 - start) * (B * world * T) as u64) as f64
                    / started.elapsed().as_secs_f64();
                bar.set_message(format!("loss {avg:.3} {rate:.0} tokens/s"));
                bar.inc(1);
            }
            Ok(())
        };
        let result = run();
        steps.finish(&model);
        result?;
        bar.finish_and_clear();
        if !leader {
            return Ok(());
        }
        if start < total {
            state::save(&state_path, &model, &opt, total, &settings)?;
        }
        let secs = started.elapsed().as_secs_f64();
        let h = held_out_full::<Be, M, B, T>(&model, &corpus, dev)?;
        println!(
            "trained {} steps in {secs:.1}s ({:.1} ms per step); train loss {avg:.3}, held-out loss {h:.3} nats/byte over the whole held-out text",
            total - start,
            secs * 1e3 / (total - start).max(1) as f64
        );
        let meta = BTreeMap::from([
            ("model".to_string(), "gpt".to_string()),
            ("config".to_string(), M::CONFIG.to_string()),
            (
                "precision".to_string(),
                format!("{:?}", args.precision).to_lowercase(),
            ),
            ("dataset".to_string(), "shakespeare".to_string()),
            ("held_out_loss".to_string(), format!("{h:.4}")),
        ]);
        checkpoint::save_with_metadata(&model, &out, &meta)?;
        println!("saved {}", out.display());
        println!("training state {}", state_path.display());
        let png = out.with_extension("png");
        curve.write_png(&png, &format!("{} on Shakespeare", M::NAME))?;
        println!("training curve {}", png.display());
        Ok(())
    }
}

/// The batch sizes `--batch-size` takes (the zoo's classifiers are built for these).
const TRAIN_BATCHES: [usize; 6] = [16, 32, 64, 128, 256, 512];

/// Refuses settings that would train nothing or train wrongly, before any work.
fn check_args(args: &Args) -> Result<()> {
    let bad = |what: String| Err(Error::invalid("kiln-train", what));
    if args.epochs == 0 {
        return bad("--epochs 0 trains nothing: give at least 1".into());
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

/// Creates `out`'s folder and checks a file can be written there, before training:
/// a run is not lost to a path that cannot be saved to. `what` names the file.
fn check_writable(what: &str, out: &Path) -> Result<()> {
    let cannot = |e: std::io::Error| {
        Error::invalid(
            "kiln-train",
            format!("cannot write the {what} {}: {e}", out.display()),
        )
    };
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(cannot)?;
    if out.is_dir() {
        return Err(Error::invalid(
            "kiln-train",
            format!("the {what} path {} is a folder", out.display()),
        ));
    }
    let probe = dir.join(format!(".kiln-train-probe-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(cannot)?;
    std::fs::remove_file(&probe).map_err(cannot)
}

fn main() {
    let args = Args::parse();
    args.anomaly.apply();
    if let Err(e) = check_args(&args).and_then(|()| start(&args)) {
        // A launched rank leaves its error to the launcher, which prints one line.
        let told =
            matches!(RankEnv::from_env(), Ok(Some(env)) if env.report_failure(&e.to_string()));
        if !told {
            eprintln!("error: {e}");
        }
        std::process::exit(1);
    }
}

/// Runs the training: in this process, as the launcher of `--ranks` processes, or as
/// one of those ranks (started by a launcher, which set the rank's environment).
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
        (Some(env), Some(world)) if env.world == world => {
            env.watch_launcher();
            let device = match args.device.device {
                DeviceChoice::Cuda(first) => DeviceChoice::Cuda(first + env.rank),
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
