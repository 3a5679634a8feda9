//! `kiln-infer`: loads a checkpoint written by `kiln-train` (or its int8 form,
//! `kiln-quantize`'s, into the model's int8 instance), reports test accuracy and the
//! latency of classifying one image at a time, on the CPU or a GPU (`--device`).

use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kiln::device::{run_on, OnDevice};
use kiln::prelude::*;
use kiln_models::classify::{accuracy, images, Classifier};
use kiln_models::cli::{ClassifierCheckpoint, ClassifierKind};
use kiln_models::data::{Split, SplitName};
use kiln_models::lenet::{LeNet, LeNetInt8};
use kiln_models::mlp::{Mlp, MlpInt8};
use std::time::Instant;

/// Evaluate an image classifier's checkpoint on its data set's test split: accuracy
/// and batch-1 latency.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    classifier: ClassifierCheckpoint,
    /// Images timed one at a time.
    #[arg(long, default_value_t = 1000)]
    latency_images: usize,
    #[command(flatten)]
    device: kiln_models::cli::DeviceArg,
    #[command(flatten)]
    data: kiln_models::cli::DataArg,
}

/// The evaluation, on whichever backend `--device` opens; `int8`: the checkpoint is
/// `kiln-quantize`'s, which the model's int8 instance holds.
struct Infer<'a> {
    args: &'a Args,
    int8: bool,
}

impl OnDevice for Infer<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, name: &str) -> Result<()> {
        println!("device: {name}");
        if self.int8 && Be::NAME == "cpu" {
            println!(
                "int8 products on {}",
                kiln::cpu::quant::Int8Kernel::detect().name()
            );
        }
        let args = self.args;
        match (args.classifier.model, self.int8) {
            (ClassifierKind::Mlp, false) => run::<Be, Mlp<Be>>(args, dev),
            (ClassifierKind::Cnn, false) => run::<Be, LeNet<Be>>(args, dev),
            (ClassifierKind::Mlp, true) => run::<Be, MlpInt8<Be>>(args, dev),
            (ClassifierKind::Cnn, true) => run::<Be, LeNetInt8<Be>>(args, dev),
        }
    }
}

fn run<Be: Backend, M: Classifier<Be>>(args: &Args, dev: &Be::Device) -> Result<()> {
    let classifier = &args.classifier;
    let path = classifier.path();
    let model: M = classifier.load(dev)?;
    // Evaluation reads the test split alone.
    let dataset = classifier.dataset;
    let test = std::sync::Arc::new(Split::load(
        &args.data.dir()?.join(dataset.folder()),
        SplitName::Test,
        dataset.norm(),
    )?);
    let acc = accuracy(&model, test.clone(), dev)?;
    println!(
        "{}: test accuracy {:.2}% on {} images",
        path.display(),
        acc * 100.0,
        test.len()
    );

    let n = args.latency_images.min(test.len());
    let mut times = Vec::with_capacity(n);
    let mut correct = 0;
    for i in 0..n {
        let px = test.images[i * test.pixels..(i + 1) * test.pixels].to_vec();
        let start = Instant::now();
        let x = images::<Be, M>(px, 1, dev)?;
        let pred = model.logits(&x)?.argmax(1, false)?.to_vec::<i32>()?[0];
        times.push(start.elapsed().as_secs_f64() * 1e6);
        correct += usize::from(pred == test.labels[i]);
    }
    times.sort_by(f64::total_cmp);
    if n > 0 {
        println!(
            "latency per image (batch 1, {n} images): median {:.1} µs, p90 {:.1} µs; accuracy on them {:.2}%",
            times[n / 2],
            times[n * 9 / 10],
            100.0 * correct as f64 / n as f64
        );
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    // An unreadable file is reported by the load, as any other.
    let int8 = kiln::train::checkpoint::int8::quantization(&args.classifier.path())
        .is_ok_and(|q| q.is_some());
    let r = run_on(args.device.device, Infer { args: &args, int8 });
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
