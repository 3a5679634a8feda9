//! `kiln-train-dynamic`: the character-level GPT trained on the Shakespeare text
//! through the dynamic path, with a sequence length drawn anew for every batch (from
//! `--min-len` to the context). Each step records the model's forward pass over lazy
//! tensors, `backward()` plans and runs loss and gradients in one program, and AdamW
//! updates the parameters; the progress bar shows the plan cache settling (hits
//! against misses: a length whose sizes coincide with another size of the model gets a
//! plan of its own, every other length reuses one). On the CPU or a GPU (`--device`).

use clap::Parser;
use kiln::device::{run_on, OnDevice};
use kiln::dynamic::{cache_stats, no_grad, LazyTensor};
use kiln::tensor::nn::{step_seed, Mode};
use kiln::tensor::{rng, Backend, Error, RawTensor, Result};
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
use kiln::train::progress::Progress;
use kiln_models::dynamic::DynamicGpt;
use kiln_models::text::{windows, Corpus};
use std::time::Instant;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train the character-level GPT on the dynamic path, with variable sequence lengths.
#[derive(Parser, Debug)]
// Negative numbers parse, so that a negative value gets a message about its flag.
#[command(version, allow_negative_numbers = true)]
struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Windows per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Shortest sequence length drawn.
    #[arg(long, default_value_t = 32)]
    min_len: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Context: the longest sequence length drawn.
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the initial parameters, the windows and the lengths.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    anomaly: kiln_models::cli::AnomalyArg,
    #[command(flatten)]
    device: kiln_models::cli::DeviceArg,
    #[command(flatten)]
    data: kiln_models::cli::DataArg,
}

/// The training run, on whichever backend `--device` opens.
struct Train<'a>(&'a Args);

impl OnDevice for Train<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, name: &str) -> Result<()> {
        println!("device: {name}");
        train::<Be>(self.0, dev)
    }
}

fn check(args: &Args) -> Result<()> {
    let bad = |m: String| Err(Error::invalid("kiln-train-dynamic", m));
    if args.steps == 0 || args.batch == 0 {
        return bad("--steps and --batch must be at least 1".into());
    }
    if args.min_len == 0 || args.min_len > args.context {
        return bad(format!(
            "--min-len {} must be between 1 and the context {}",
            args.min_len, args.context
        ));
    }
    if args.heads == 0 || !args.width.is_multiple_of(args.heads) {
        return bad(format!(
            "--width {} does not split into --heads {}",
            args.width, args.heads
        ));
    }
    if !(args.lr > 0.0 && args.lr.is_finite()) {
        return bad(format!("--lr {} must be a positive number", args.lr));
    }
    Ok(())
}

fn train<Be: Backend>(args: &Args, dev: &Be::Device) -> Result<()> {
    let corpus = Corpus::shakespeare_in(&args.data.dir()?)?;
    let mut model = DynamicGpt::<Be>::new(
        args.width,
        args.heads,
        args.layers,
        args.context,
        dev,
        args.seed,
    )?;
    let mut opt = AdamW::<Be>::new(AdamWConfig {
        lr: args.lr,
        ..AdamWConfig::default()
    })?;
    let lengths = args.context - args.min_len + 1;
    let key = rng::stream_key(args.seed, 7);
    let bar = Progress::new(args.steps, true);
    let start = Instant::now();
    let mut tokens = 0usize;
    let mut last = f64::NAN;
    for step in 0..args.steps {
        let len = args.min_len + (rng::bits(key, step as u32) as usize % lengths);
        let (ids, next) = windows(&corpus.train, args.batch, len, args.seed ^ step)?;
        let ids = LazyTensor::from_raw(RawTensor::from_vec(ids, &[args.batch, len], dev)?);
        let next = LazyTensor::from_raw(RawTensor::from_vec(next, &[args.batch, len], dev)?);
        let mode = Mode::Train {
            seed: step_seed(step),
        };
        let loss = model.loss(&ids, &next, mode)?;
        let grads = loss.backward()?;
        opt.step(&mut model, &grads)?;
        last = loss.scalar_value()?;
        tokens += args.batch * len;
        let s = cache_stats::<Be>();
        bar.set_message(format!(
            "loss {last:.3} len {len:3} | plans: {} hits, {} misses | {:.0} tok/s",
            s.hits,
            s.misses,
            tokens as f64 / start.elapsed().as_secs_f64()
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let (ids, next) = windows(&corpus.held_out, args.batch, args.context, 99)?;
    let held_out = no_grad(|| {
        let ids = LazyTensor::from_raw(RawTensor::from_vec(ids, &[args.batch, args.context], dev)?);
        let next =
            LazyTensor::from_raw(RawTensor::from_vec(next, &[args.batch, args.context], dev)?);
        model.loss(&ids, &next, Mode::Eval)?.scalar_value()
    })?;
    let s = cache_stats::<Be>();
    println!(
        "trained {} steps ({} lengths from {} to {}) in {:.1} s: last loss {last:.3}, held-out loss {held_out:.3} nats/byte",
        args.steps,
        lengths,
        args.min_len,
        args.context,
        start.elapsed().as_secs_f64()
    );
    println!("plan cache: {s}");
    Ok(())
}

fn main() {
    let args = Args::parse();
    args.anomaly.apply();
    if let Err(e) = check(&args).and_then(|()| run_on(args.device.device, Train(&args))) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
