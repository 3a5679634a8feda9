//! Training and evaluating image classifiers: the `Classifier` trait the zoo's models
//! implement (through [`classifier!`](crate::classifier): the generated `Supervised`,
//! which runs a `#[model]`'s planned methods at the batch its inputs have, and the
//! dims of one example), and loops over a data split that take the batch size at run
//! time.

use crate::data::{batches, shuffled, Split};
// The class names, where callers of the classifier loops look for them.
pub use crate::data::{FASHION_CLASSES, MNIST_CLASSES};
use kiln::prelude::*;
use kiln::tensor::Collective;
use kiln::tensor::{HostData, RawTensor};
use kiln::train::learner::Supervised;
use kiln::train::optim::Optimizer;
use kiln::train::parallel::broadcast_state;
use kiln::train::replay::{StepInput, StepReplay};
use kiln::train::schedule::Schedule;

/// The batch the evaluation loop uses.
pub const EVAL_BATCH: usize = 500;

/// An image classifier: a `#[model]` with `loss(images, labels)` and `forward(images)`
/// (so `Supervised`, which runs them at the batch the inputs have), and the dims of one
/// example.
pub trait Classifier<B: Backend>: Supervised<B> {
    /// The dims of one example (`[784]` for the MLP, `[1, 28, 28]` for the CNN).
    const EXAMPLE: &'static [usize];

    /// The `[batch, 10]` class logits of a batch, in evaluation mode.
    fn logits(&self, x: &RawTensor<B>) -> Result<RawTensor<B>> {
        self.scores(x)?.ok_or_else(|| {
            Error::invalid("classifier", "the model has no `forward` giving its logits")
        })
    }
}

/// Implements [`Classifier`] for a `#[model]` with `loss(images, labels)` and
/// `forward(images)`: `classifier!(Mlp, [784]);` in the model's crate.
#[macro_export]
macro_rules! classifier {
    ($model:ident, [$($example:literal),*]) => {
        impl<B: ::kiln::tensor::Backend> $crate::classify::Classifier<B> for $model<B> {
            const EXAMPLE: &'static [usize] = &[$($example),*];
        }
    };
}

/// Uploads `batch` images (flattened, in order) in the classifier's input dims.
pub fn images<B: Backend, M: Classifier<B>>(
    pixels: Vec<f32>,
    batch: usize,
    device: &B::Device,
) -> Result<RawTensor<B>> {
    let mut dims = vec![batch];
    dims.extend_from_slice(M::EXAMPLE);
    RawTensor::from_vec(pixels, &dims, device)
}

/// What one training step reports.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// The epoch (from 0).
    pub epoch: usize,
    /// The global step (from 0).
    pub step: u64,
    /// The batch's loss.
    pub loss: f32,
    /// The learning rate used.
    pub lr: f64,
    /// A one-line notice about how steps run, on the step it concerns: the step was
    /// captured as a graph and the following ones replay it, or why it was not.
    pub notice: Option<String>,
}

/// Trains for `epochs` over `train` in shuffled batches of `batch` (a final partial
/// batch is dropped), setting the learning rate from `schedule` before each step.
/// `start` steps are taken already (a resumed run): the loop begins where they
/// ended, with the batch and learning rate the uninterrupted run would have had
/// there; `on_step` gets the model and the optimizer after each step, for a training
/// state to be saved ([`kiln::train::state`]).
/// With `replay`, on a backend that captures (CUDA), the second step is captured as a
/// graph and every later step replays it ([`StepReplay`]): each batch written into the
/// same input buffers, and the learning rate, the optimizer's per-step values and the
/// dropout seed into device memory; an optimizer a replay would not train correctly
/// runs planned, and the first step's report says why.
#[allow(clippy::too_many_arguments)]
pub fn fit<B: Backend, M: Classifier<B>, O: Optimizer<B>>(
    model: &mut M,
    opt: &mut O,
    schedule: &dyn Schedule,
    train: &Split,
    batch: usize,
    epochs: usize,
    seed: u64,
    start: u64,
    device: &B::Device,
    replay: bool,
    on_step: &mut dyn FnMut(&M, &O, StepReport) -> Result<()>,
) -> Result<()> {
    let settings = FitSettings {
        batch,
        epochs,
        seed,
        start,
        replay,
    };
    fit_ranks(
        model, opt, schedule, train, &settings, device, None, on_step,
    )
}

/// How [`fit_ranks`] trains: examples per step (per rank), passes over the data, the
/// shuffling seed, the steps already taken and whether steps may replay.
#[derive(Clone, Copy, Debug)]
pub struct FitSettings {
    /// Examples per step on each rank.
    pub batch: usize,
    /// Passes over the training set.
    pub epochs: usize,
    /// The shuffling seed.
    pub seed: u64,
    /// Steps taken already (a resumed run).
    pub start: u64,
    /// Whether steps may be captured and replayed as a graph.
    pub replay: bool,
}

/// [`fit`] as one rank of a data-parallel run when `ranks` is given: replicas start as
/// rank 0's, each step takes `batch · world` shuffled examples (every rank shuffles
/// alike), this rank trains on its `batch` of them, and the gradients and loss are
/// averaged over the ranks before every rank's identical optimizer step.
#[allow(clippy::too_many_arguments)]
pub fn fit_ranks<B: Backend, M: Classifier<B>, O: Optimizer<B>>(
    model: &mut M,
    opt: &mut O,
    schedule: &dyn Schedule,
    train: &Split,
    settings: &FitSettings,
    device: &B::Device,
    ranks: Option<Box<dyn Collective<B>>>,
    on_step: &mut dyn FnMut(&M, &O, StepReport) -> Result<()>,
) -> Result<()> {
    let FitSettings {
        batch,
        epochs,
        seed,
        start,
        replay,
    } = *settings;
    if batch == 0 {
        return Err(Error::invalid("fit", "the batch size must be at least 1"));
    }
    let mut steps = StepReplay::new(device, replay, opt, M::draws_at_random());
    let (rank, world) = match ranks {
        Some(ranks) => {
            broadcast_state(ranks.as_ref(), model, 0)?;
            let place = (ranks.rank(), ranks.world());
            if let Some(seeds) = model.step_seeds() {
                seeds.set_rank(place.0 as u64);
            }
            steps = steps.data_parallel(ranks)?;
            place
        }
        None => (0, 1),
    };
    let mut image_dims = vec![batch];
    image_dims.extend_from_slice(M::EXAMPLE);
    let label_dims = [batch];
    let global = batch * world;
    let per_epoch = (train.len() / global) as u64;
    if per_epoch == 0 {
        let ranks = if world > 1 {
            format!(" ({world} ranks of {batch})")
        } else {
            String::new()
        };
        return Err(Error::invalid(
            "fit",
            format!(
                "{} training examples make no full batch of {global}{ranks}",
                train.len()
            ),
        ));
    }
    let pixels = train.pixels;
    let mut run = || -> Result<()> {
        let mut step = start;
        for epoch in (start / per_epoch) as usize..epochs {
            let order = shuffled(train.len(), seed, epoch as u64);
            let done = if epoch as u64 == start / per_epoch {
                (start % per_epoch) as usize * global
            } else {
                0
            };
            for b in batches(train, &order[done..], global) {
                if b.labels.len() < global {
                    continue;
                }
                let lr = schedule.lr_at(step);
                opt.set_lr(lr)?;
                // This rank's share of the step's examples (all of them without ranks).
                let (images, labels) = if world == 1 {
                    (b.images, b.labels)
                } else {
                    let mine = rank * batch..(rank + 1) * batch;
                    let images = b.images[mine.start * pixels..mine.end * pixels].to_vec();
                    (images, b.labels[mine].to_vec())
                };
                let inputs = vec![
                    StepInput {
                        data: HostData::F32(images),
                        dims: &image_dims,
                    },
                    StepInput {
                        data: HostData::I32(labels),
                        dims: &label_dims,
                    },
                ];
                let outcome = steps.step(model, opt, inputs, &mut |m, xy| {
                    m.loss_and_grads(&xy[0], &xy[1])
                })?;
                let report = StepReport {
                    epoch,
                    step,
                    loss: outcome.loss,
                    lr,
                    notice: outcome.notice,
                };
                on_step(model, opt, report)?;
                step += 1;
            }
        }
        Ok(())
    };
    let result = run();
    steps.finish(model);
    result
}

/// The fraction of `split` classified correctly, in batches of [`EVAL_BATCH`] (the
/// last one padded with copies of its first example, whose predictions are ignored).
pub fn accuracy<B: Backend, M: Classifier<B>>(
    model: &M,
    split: &Split,
    device: &B::Device,
) -> Result<f64> {
    if split.is_empty() {
        return Err(Error::invalid(
            "accuracy",
            "the split holds no examples: an accuracy over none is undefined",
        ));
    }
    let order: Vec<usize> = (0..split.len()).collect();
    let mut correct = 0usize;
    for b in batches(split, &order, EVAL_BATCH) {
        let n = b.labels.len();
        let mut px = b.images;
        let first: Vec<f32> = px[..split.pixels].to_vec();
        for _ in n..EVAL_BATCH {
            px.extend_from_slice(&first);
        }
        let x = images::<B, M>(px, EVAL_BATCH, device)?;
        let pred = model.logits(&x)?.argmax(1, false)?.to_vec::<i32>()?;
        correct += pred.iter().zip(&b.labels).filter(|(p, l)| p == l).count();
    }
    Ok(correct as f64 / split.len() as f64)
}

/// What a classifier says of one example: the likeliest class and every class's
/// probability (the softmax of its logits).
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The likeliest class.
    pub class: usize,
    /// Each class's probability.
    pub probabilities: Vec<f32>,
}

impl Prediction {
    /// The prediction of `logits`.
    pub fn from_logits(logits: &[f32]) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        let probabilities: Vec<f32> = exp.iter().map(|e| e / sum).collect();
        let class = probabilities
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i);
        Prediction {
            class,
            probabilities,
        }
    }

    /// One line: the class's name and probability, then every class's.
    pub fn describe(&self, names: &[&str]) -> String {
        let all: Vec<String> = self
            .probabilities
            .iter()
            .zip(names)
            .map(|(p, n)| format!("{n} {:.1}%", 100.0 * p))
            .collect();
        format!(
            "{} ({:.1}%); {}",
            names.get(self.class).copied().unwrap_or("?"),
            100.0 * self.probabilities[self.class],
            all.join(", ")
        )
    }
}

/// The prediction of `model` for one example's `pixels` (its input dims flattened,
/// normalised as in training), run at batch 1.
pub fn predict<B: Backend, M: Classifier<B>>(
    model: &M,
    pixels: Vec<f32>,
    device: &B::Device,
) -> Result<Prediction> {
    let x = images::<B, M>(pixels, 1, device)?;
    Ok(Prediction::from_logits(&model.logits(&x)?.to_vec::<f32>()?))
}

/// Classifies image files (PNG, JPEG or PGM, any size: see [`crate::image`]) with `model`
/// trained on `data`, each framed and normalised as its images: each file's prediction,
/// or the error naming it.
pub fn classify_files<B: Backend, M: Classifier<B>>(
    model: &M,
    files: &[std::path::PathBuf],
    data: crate::cli::ImageData,
    device: &B::Device,
) -> Vec<Result<Prediction>> {
    files
        .iter()
        .map(|f| {
            let image = crate::image::read_image(f)?;
            let input = crate::image::classifier_input(&image, data.norm(), data.framing());
            predict(model, input, device)
        })
        .collect()
}

/// The main of an inference binary: with the `model` it built (or the error that
/// kept it from building, reported), classifies the image files named on the command
/// line (`model` trained on `data`), printing each file's class and every class's
/// probability, and how long the program took to start (`started`: when `main`
/// began). Returns the exit status: 0, or 1 when the model or an argument is missing
/// or a file could not be read (each named on standard error).
pub fn classify_command_line<B: Backend, M: Classifier<B>>(
    model: Result<M>,
    data: crate::cli::ImageData,
    device: &B::Device,
    started: std::time::Instant,
) -> i32 {
    let model = match model {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let usage = "usage: <this program> IMAGE... (PNG, JPEG or PGM files, any size; a dark figure on a light background is inverted)";
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "Classify image files with the {} classifier whose weights are built into this program.\n{usage}",
            data.folder()
        );
        return 0;
    }
    // `--` ends the options: files named like options come after it.
    let (options, files) = match args.iter().position(|a| a == "--") {
        Some(at) => (&args[..at], &args[at + 1..]),
        None => (&args[..], &args[args.len()..]),
    };
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    for a in options {
        if a.to_string_lossy().starts_with('-') && a.len() > 1 {
            eprintln!(
                "error: unknown option {}: this program takes image files only ({usage})",
                a.to_string_lossy()
            );
            return 1;
        }
        paths.push(a.into());
    }
    paths.extend(files.iter().map(std::path::PathBuf::from));
    let files = paths;
    if files.is_empty() {
        eprintln!("error: name the image files to classify (PNG, JPEG or PGM, any size)");
        return 1;
    }
    eprintln!(
        "ready in {:.2} ms (weights built in)",
        started.elapsed().as_secs_f64() * 1e3
    );
    let mut status = 0;
    for (file, p) in files
        .iter()
        .zip(classify_files(&model, &files, data, device))
    {
        match p {
            Ok(p) => println!("{}: {}", file.display(), p.describe(data.classes())),
            Err(e) => {
                eprintln!("error: {e}");
                status = 1;
            }
        }
    }
    status
}
