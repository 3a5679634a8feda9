//! `kiln-infer`: loads a checkpoint written by `kiln-train`, reports test accuracy and
//! the latency of classifying one image at a time, on the CPU or a GPU (`--device`).

use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kiln::device::DeviceChoice;
use kiln::device::{run_on, OnDevice};
use kiln::prelude::*;
use kiln_models::classify::{accuracy, images, Classifier};
use kiln_models::cli::{ClassifierCheckpoint, ClassifierKind};
use kiln_models::data::{Split, SplitName};
use kiln_models::mlp_int8::MlpInt8;
use kiln_models::{lenet::LeNet, mlp::Mlp};
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

/// The evaluation, on whichever backend `--device` opens.
struct Infer<'a>(&'a Args);

impl OnDevice for Infer<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, name: &str) -> Result<()> {
        println!("device: {name}");
        match self.0.classifier.model {
            ClassifierKind::Mlp => run::<Be, Mlp<Be>>(self.0, dev),
            ClassifierKind::Cnn => run::<Be, LeNet<Be>>(self.0, dev),
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

/// An int8 checkpoint (`kiln-quantize`): the MLP's int8 products on the CPU.
fn run_int8(args: &Args) -> Result<()> {
    let classifier = &args.classifier;
    if classifier.model != ClassifierKind::Mlp || args.device.device != DeviceChoice::Cpu {
        return Err(kiln::Error::invalid(
            "kiln-infer",
            "int8 checkpoints run the MLP on the CPU so far (--model mlp --device cpu)",
        ));
    }
    classifier.check_recorded()?;
    let path = classifier.path();
    let model = MlpInt8::load(&path)?;
    println!(
        "device: cpu, int8 products on {}",
        kiln::cpu::quant::Int8Kernel::detect().name()
    );
    let test = Split::load(
        &args.data.dir()?.join(classifier.dataset.folder()),
        SplitName::Test,
        classifier.dataset.norm(),
    )?;
    if test.is_empty() {
        return Err(kiln::Error::invalid(
            "accuracy",
            "the split holds no examples: an accuracy over none is undefined",
        ));
    }
    let predict = |from: usize, n: usize| -> Result<Vec<i32>> {
        let px = &test.images[from * test.pixels..(from + n) * test.pixels];
        let logits = model.logits(px, n)?;
        Ok(logits
            .chunks(10)
            .map(|r| (0..10).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap_or(0) as i32)
            .collect())
    };
    let mut correct = 0;
    for from in (0..test.len()).step_by(1000) {
        let n = 1000.min(test.len() - from);
        let p = predict(from, n)?;
        correct += p
            .iter()
            .zip(&test.labels[from..from + n])
            .filter(|(a, b)| a == b)
            .count();
    }
    println!(
        "{}: test accuracy {:.2}% on {} images",
        path.display(),
        100.0 * correct as f64 / test.len().max(1) as f64,
        test.len()
    );
    let n = args.latency_images.min(test.len());
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        std::hint::black_box(predict(i, 1)?);
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    if n > 0 {
        println!(
            "latency per image (batch 1, {n} images): median {:.1} µs, p90 {:.1} µs",
            times[n / 2],
            times[n * 9 / 10]
        );
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let int8 = kiln::train::checkpoint::int8::quantization(&args.classifier.path());
    let r = match int8 {
        Ok(Some(_)) => run_int8(&args),
        // An unreadable file is reported by the f32 path's load, as before.
        _ => run_on(args.device.device, Infer(&args)),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
