//! Image classifiers: the `Classifier` trait the zoo's models implement (through
//! [`classifier!`](crate::classifier): the generated `Supervised`, which runs a
//! `#[model]`'s planned methods at the batch its inputs have, and the dims of one
//! example), a data split as the [`Dataset`] kiln-train's `Learner` trains them on
//! ([`Examples`]), their accuracy, and predictions for image files.

use crate::data::Split;
// The class names, where callers of the classifier loops look for them.
pub use crate::data::{FASHION_CLASSES, MNIST_CLASSES};
use kiln::data::{DataLoader, Dataset, Example, Field, LoaderConfig, Values};
use kiln::prelude::*;
use kiln::tensor::RawTensor;
use kiln::train::learner::evaluate;
use kiln::train::learner::Supervised;
use kiln::train::metrics::{Metric, TopK};
use std::sync::Arc;

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

/// A split's images as the [`Dataset`] a classifier `M` trains on through
/// kiln-train's `Learner`: example `i` is image `i` in `M`'s input dims
/// ([`Classifier::EXAMPLE`]) and its label (dims `[]`, so a batch's targets are `[n]`).
pub struct Examples {
    split: Arc<Split>,
    dims: Vec<usize>,
}

impl Examples {
    /// `split`'s images as examples of `M`; an error when `M` takes another number of
    /// pixels.
    pub fn of<B: Backend, M: Classifier<B>>(split: Arc<Split>) -> Result<Self> {
        let dims = M::EXAMPLE.to_vec();
        if dims.iter().product::<usize>() != split.pixels {
            return Err(Error::shape(
                "Examples",
                format!(
                    "the classifier takes examples of dims {dims:?}, but the images have {} pixels",
                    split.pixels
                ),
            ));
        }
        Ok(Examples { split, dims })
    }

    /// The split the examples come from.
    pub fn split(&self) -> &Split {
        &self.split
    }
}

impl Dataset for Examples {
    fn len(&self) -> usize {
        self.split.len()
    }

    fn get(&self, index: usize) -> Result<Example> {
        let Some(&label) = self.split.labels.get(index) else {
            return Err(Error::invalid(
                "Examples",
                format!("index {index} of a split of {} examples", self.split.len()),
            ));
        };
        let px = self.split.pixels;
        let pixels = self.split.images[index * px..(index + 1) * px].to_vec();
        Ok(Example {
            input: Field::new(self.dims.clone(), Values::F32(pixels))?,
            target: Field::class(label),
        })
    }
}

/// The fraction of `split` classified correctly, in batches of [`EVAL_BATCH`]: the
/// Learner's evaluation ([`kiln::train::learner::evaluate`]) with top-1 accuracy.
pub fn accuracy<B: Backend, M: Classifier<B>>(
    model: &M,
    split: Arc<Split>,
    device: &B::Device,
) -> Result<f64> {
    if split.is_empty() {
        return Err(Error::invalid(
            "accuracy",
            "the split holds no examples: an accuracy over none is undefined",
        ));
    }
    let examples = DataLoader::new(
        Examples::of::<B, M>(split)?,
        LoaderConfig {
            batch_size: EVAL_BATCH,
            workers: 1,
            ..LoaderConfig::default().for_evaluation()
        },
    )?;
    let mut top1: [Box<dyn Metric<B>>; 1] = [Box::new(TopK::accuracy())];
    let (_, metrics) = evaluate(model, device, &examples, &mut top1)?;
    Ok(metrics[0].1)
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
