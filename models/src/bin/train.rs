//! `kiln-train`: trains a model on MNIST on the CPU and reports test accuracy.

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln::cpu::{Cpu, CpuDevice};
use kiln_models::data::ImageDataset;
use kiln_models::dynamic::{fit, DynamicMlp};
use std::time::Instant;

/// Train an MLP on MNIST (dynamic path) and report test accuracy.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Passes over the training set.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Examples per step.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// SGD learning rate (momentum 0.9).
    #[arg(long, default_value_t = 0.02)]
    lr: f64,
    /// Hidden layer width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Use only the first N training examples (0: all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
    /// Seed for initialisation and shuffling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> kiln::Result<()> {
    let args = Args::parse();
    let dev = CpuDevice;
    let mut data = ImageDataset::mnist()?;
    if args.limit > 0 {
        data.train = data.train.take(args.limit);
    }
    let mut model = DynamicMlp::<Cpu>::new(&[784, args.hidden, 10], args.seed, &dev)?;
    let steps = data.train.len().div_ceil(args.batch_size) * args.epochs;
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]")
            .expect("static template"),
    );
    let start = Instant::now();
    let mut avg = 0.0;
    let mut done = 0usize;
    fit(&mut model, &data.train, args.epochs, args.batch_size, args.lr, args.seed, &dev, |epoch, _, loss| {
        done += 1;
        avg = if done == 1 { loss } else { 0.98 * avg + 0.02 * loss };
        let rate = (done * args.batch_size) as f64 / start.elapsed().as_secs_f64();
        bar.set_message(format!("epoch {} loss {avg:.4} {rate:.0} samples/s", epoch + 1));
        bar.inc(1);
    })?;
    bar.finish();
    let acc = model.accuracy(&data.test, 1000, &dev)?;
    println!(
        "trained {} epochs in {:.1}s; test accuracy {:.2}%",
        args.epochs,
        start.elapsed().as_secs_f64(),
        acc * 100.0
    );
    Ok(())
}
