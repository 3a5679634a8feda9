//! `kiln-classify`: classifies image files (PNG or PGM, any size) with a checkpoint
//! written by `kiln-train` (or by PyTorch, with `--foreign`), on the CPU, printing each
//! file's class and every class's probability.

use clap::Parser;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln_models::classify::{classify_files, Classifier};
use kiln_models::cli::{
    check_recorded, default_classifier_checkpoint, ClassifierKind, ForeignArg, ImageData,
};
use kiln_models::{lenet::LeNet, mlp::Mlp};
use std::path::PathBuf;
use std::time::Instant;

/// Classify image files with a trained checkpoint.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The model.
    #[arg(long, value_enum, default_value = "mlp")]
    model: ClassifierKind,
    /// The data set it was trained on (its normalisation and class names).
    #[arg(long, value_enum, default_value = "mnist")]
    dataset: ImageData,
    /// The checkpoint (default: runs/<model>-<dataset>.safetensors in the current
    /// folder, where kiln-train saves it).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    #[command(flatten)]
    foreign: ForeignArg,
    /// The image files (PNG or PGM, any size; a dark figure on a light background is
    /// inverted, as the data sets show light figures on black).
    #[arg(required = true)]
    images: Vec<PathBuf>,
}

fn run<M: Classifier<Cpu>>(args: &Args) -> Result<bool> {
    let start = Instant::now();
    let path = args
        .checkpoint
        .clone()
        .unwrap_or_else(|| default_classifier_checkpoint(args.model, args.dataset));
    check_recorded(&path, args.model, args.dataset)?;
    let model: M = args.foreign.load_new(&path, &CpuDevice)?;
    eprintln!(
        "loaded {} in {:.1} ms",
        path.display(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let predictions = classify_files(&model, &args.images, args.dataset.norm(), &CpuDevice);
    let mut all_read = true;
    for (file, p) in args.images.iter().zip(predictions) {
        match p {
            Ok(p) => println!("{}: {}", file.display(), p.describe(args.dataset.classes())),
            Err(e) => {
                eprintln!("error: {e}");
                all_read = false;
            }
        }
    }
    Ok(all_read)
}

fn main() {
    let args = Args::parse();
    let result = match args.model {
        ClassifierKind::Mlp => run::<Mlp<Cpu>>(&args),
        ClassifierKind::Cnn => run::<LeNet<Cpu>>(&args),
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
