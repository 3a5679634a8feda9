//! The GPT with int8 weights beside its f32 self (`#[model(precision = int8)]`
//! instances of the same definition): a small GPT's held-out loss in f32 and from the
//! int8 checkpoint `kiln-quantize` makes of it (over the whole held-out text, nats per
//! byte), of `--checkpoint` or else of the weights seed 1 draws (which every device
//! draws alike: a check of one device against another); and the latency of one full-context window's logits
//! (batch 1, read back to the host) in f32 and int8, for the small configuration and
//! W3's (512 wide, 6 blocks, context 256; seeded weights), and of W3's logits of one
//! token (matrix-vector products, as in generation), on `--device`.
//!
//! ```sh
//! kiln-train --model gpt --out runs/gpt-shakespeare.safetensors
//! cargo run --release -p kiln-models --example gpt_int8 -- --checkpoint runs/gpt-shakespeare.safetensors
//! ```

use clap::Parser;
use kiln::data::{DataLoader, Dataset as _, LastBatch, LoaderConfig, TextWindows};
use kiln::device::{run_on, OnDevice};
use kiln::prelude::*;
use kiln::train::checkpoint::{int8::quantize_int8, load_new, save};
use kiln::train::learner::evaluate;
use kiln_models::gpt::Gpt;
use kiln_models::text::Corpus;
use std::path::PathBuf;
use std::time::Instant;

#[model]
type SmallGpt = Gpt<128, 4, 4, 128>;
#[model(precision = int8)]
type SmallGptInt8 = Gpt<128, 4, 4, 128>;
#[model]
type W3Gpt = Gpt<512, 8, 6, 256>;
#[model(precision = int8)]
type W3GptInt8 = Gpt<512, 8, 6, 256>;

/// Held-out loss and batch-1 latency of the GPT in f32 and with int8 weights.
#[derive(Parser, Debug)]
struct Args {
    /// A small GPT's checkpoint (`kiln-train --model gpt`), whose held-out loss is
    /// reported in f32 and int8 (default: the weights seed 1 draws).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Timed windows per model and precision (the median is reported).
    #[arg(long, default_value_t = 50)]
    reps: usize,
    #[command(flatten)]
    device: kiln_models::cli::DeviceArg,
    #[command(flatten)]
    data: kiln_models::cli::DataArg,
}

struct Run<'a>(&'a Args);

impl OnDevice for Run<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, name: &str) -> Result<()> {
        let args = self.0;
        println!("device: {name}");
        held_out::<Be>(args, dev)?;
        if args.reps == 0 {
            return Ok(());
        }
        let small = SmallGpt::<Be>::init(dev, 1)?;
        let small_int8 = SmallGptInt8::<Be>::init(dev, 1)?;
        latency::<Be, 128>("small", "f32", args.reps, dev, |ids| small.logits(ids))?;
        latency::<Be, 128>("small", "int8", args.reps, dev, |ids| {
            small_int8.logits(ids)
        })?;
        let w3 = W3Gpt::<Be>::init(dev, 1)?;
        let w3_int8 = W3GptInt8::<Be>::init(dev, 1)?;
        latency::<Be, 256>("w3", "f32", args.reps, dev, |ids| w3.logits(ids))?;
        latency::<Be, 256>("w3", "int8", args.reps, dev, |ids| w3_int8.logits(ids))?;
        // One token: each product a matrix-vector product, as a step of generation is.
        latency::<Be, 1>("w3", "f32", args.reps, dev, |ids| w3.logits(ids))?;
        latency::<Be, 1>("w3", "int8", args.reps, dev, |ids| w3_int8.logits(ids))?;
        Ok(())
    }
}

/// The held-out loss of the checkpoint (or the seeded weights) and of its int8 form.
fn held_out<Be: Backend>(args: &Args, dev: &Be::Device) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("kiln-gpt-int8-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let (f32_path, int8_path) = (
        scratch.join("f32.safetensors"),
        scratch.join("int8.safetensors"),
    );
    let (what, path) = match &args.checkpoint {
        Some(p) => (p.display().to_string(), p.clone()),
        None => {
            save(
                &SmallGpt::<kiln::cpu::Cpu>::init(&kiln::cpu::CpuDevice, 1)?,
                &f32_path,
            )?;
            ("the weights of seed 1".to_string(), f32_path)
        }
    };
    let models = quantize_int8(&path, &int8_path).and_then(|_| {
        Ok((
            load_new::<Be, SmallGpt<Be>>(&path, dev, false)?,
            load_new::<Be, SmallGptInt8<Be>>(&int8_path, dev, false)?,
        ))
    });
    std::fs::remove_dir_all(&scratch).ok();
    let (f32_model, int8) = models?;
    let corpus = Corpus::shakespeare_in(&args.data.dir()?)?;
    let ids: Vec<i32> = corpus.held_out.iter().map(|&b| i32::from(b)).collect();
    let windows = TextWindows::new(ids, 256, 128, 128)?;
    let batches = LoaderConfig {
        batch_size: 16.min(windows.len()),
        shuffle: false,
        seed: 0,
        last_batch: LastBatch::Keep,
        workers: 1,
        prefetch: 2,
    };
    let windows_count = windows.len();
    let data = DataLoader::new(windows, batches)?;
    let f32_loss = evaluate(&f32_model, dev, &data, &mut [])?.0;
    let int8_loss = evaluate(&int8, dev, &data, &mut [])?.0;
    println!(
        "held-out loss of {what} over {windows_count} windows of 128 bytes: f32 {f32_loss:.4}, int8 {int8_loss:.4} nats/byte (int8 - f32 = {:+.4})",
        int8_loss - f32_loss
    );
    Ok(())
}

/// The median time of `logits` on one full-context window, read back to the host.
fn latency<Be: Backend, const T: usize>(
    config: &str,
    precision: &str,
    reps: usize,
    dev: &Be::Device,
    logits: impl Fn(
        &Tensor<Be, (Const<1>, Const<T>), i32>,
    ) -> Result<Tensor<Be, (Const<1>, Const<T>, Const<256>)>>,
) -> Result<()> {
    let ids: Vec<i32> = (0..T).map(|i| (i * 31 % 256) as i32).collect();
    let ids = Tensor::<Be, (Const<1>, Const<T>), i32>::from_vec(ids, &[1, T], dev)?;
    logits(&ids)?.to_vec()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        std::hint::black_box(logits(&ids)?.to_vec()?);
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "gpt={config} precision={precision} task=logits batch=1 tokens={T} ms={:.4}",
        times[times.len() / 2]
    );
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run_on(args.device.device, Run(&args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
