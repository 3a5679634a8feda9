//! `kiln-classify`: classifies image files (PNG, JPEG or PGM, any size) with a checkpoint
//! written by `kiln-train` (or by PyTorch, with `--foreign`), on the CPU, printing each
//! file's class and every class's probability.

use clap::Parser;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln_models::classify::{classify_files, Classifier};
use kiln_models::cli::{ClassifierCheckpoint, ClassifierKind};
use kiln_models::{lenet::LeNet, mlp::Mlp};
use std::path::PathBuf;
use std::time::Instant;

/// Classify image files with a trained checkpoint.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    classifier: ClassifierCheckpoint,
    /// The image files (PNG, JPEG or PGM, any size; a dark figure on a light background is
    /// inverted, as the data sets show light figures on black).
    #[arg(required = true)]
    images: Vec<PathBuf>,
}

fn run<M: Classifier<Cpu>>(args: &Args) -> Result<bool> {
    let start = Instant::now();
    let model: M = args.classifier.load(&CpuDevice)?;
    eprintln!(
        "loaded {} in {:.1} ms",
        args.classifier.path().display(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let dataset = args.classifier.dataset;
    let predictions = classify_files(&model, &args.images, dataset, &CpuDevice);
    let mut all_read = true;
    for (file, p) in args.images.iter().zip(predictions) {
        match p {
            Ok(p) => println!("{}: {}", file.display(), p.describe(dataset.classes())),
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
    let result = match args.classifier.model {
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
