//! `kiln-generate`: samples text from a GPT checkpoint written by `kiln-train --model
//! gpt` (or `gpt-tiny`: the checkpoint's metadata names the configuration), one byte at
//! a time from a prompt, the context growing to the model's (a `Dyn` context through
//! the planned path), seeded, with a temperature and top-k; on the CPU or a GPU
//! (`--device`; the device is named on stderr, the text alone goes to stdout).

use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kiln::device::{run_on, OnDevice};
use kiln::prelude::*;
use kiln::train::checkpoint;
use kiln_models::gpt::{GptModel, Sampling};

#[path = "../gpt_instances.rs"]
mod gpt_instances;
use gpt_instances::{SmallGpt, TinyGpt};
#[path = "../w3_instances.rs"]
mod w3_instances;
use std::path::PathBuf;
use w3_instances::W3Gpt;

/// Sample text from a trained GPT.
#[derive(Parser, Debug)]
// Negative numbers parse, so that a negative value gets a message about its flag.
#[command(version, allow_negative_numbers = true)]
struct Args {
    /// The checkpoint (default: runs/gpt-shakespeare.safetensors in the current folder,
    /// where kiln-train --model gpt saves it; --model gpt-tiny and gpt-w3 save to
    /// runs/gpt-tiny-shakespeare.safetensors and runs/gpt-w3-shakespeare.safetensors).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// The text to continue.
    #[arg(long, default_value = "ROMEO:")]
    prompt: String,
    /// How many bytes to generate (at most 100,000).
    #[arg(long, default_value_t = 300)]
    bytes: usize,
    /// Sampling temperature (> 0; lower is more conservative).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k most likely bytes (1 to 256).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    foreign: kiln_models::cli::ForeignArg,
    #[command(flatten)]
    device: kiln_models::cli::DeviceArg,
}

/// Sampling from the checkpoint, on whichever backend `--device` opens.
struct Generate<'a>(&'a Args);

impl OnDevice for Generate<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, name: &str) -> Result<()> {
        let args = self.0;
        let path = args
            .checkpoint
            .clone()
            .unwrap_or_else(|| kiln_models::cli::default_checkpoint("gpt-shakespeare.safetensors"));
        let path = path.as_path();
        let meta = checkpoint::read_metadata(path)?;
        if let Some(model) = meta.get("model").filter(|m| *m != "gpt") {
            return Err(Error::invalid(
                "kiln-generate",
                format!(
                    "{} holds a model kiln-train trained as --model {model}, not a GPT: kiln-generate samples from --model gpt, gpt-tiny or gpt-w3 checkpoints",
                    path.display()
                ),
            ));
        }
        // Checkpoints from before configurations were named hold the tiny GPT.
        let config = meta
            .get("config")
            .cloned()
            .unwrap_or_else(|| "TinyGpt".to_string());
        match config.as_str() {
            "TinyGpt" => generate::<Be, TinyGpt<Be>>(args, path, dev, name),
            "SmallGpt" => generate::<Be, SmallGpt<Be>>(args, path, dev, name),
            "W3Gpt" => generate::<Be, W3Gpt<Be>>(args, path, dev, name),
            other => Err(Error::invalid(
                "kiln-generate",
                format!("{} holds a `{other}`, which kiln-generate does not know (it knows TinyGpt, SmallGpt and W3Gpt)", path.display()),
            )),
        }
    }
}

fn run(args: &Args) -> Result<()> {
    if !(args.temperature.is_finite() && args.temperature > 0.0) {
        return Err(Error::invalid(
            "kiln-generate",
            format!(
                "--temperature must be a positive number, got {}",
                args.temperature
            ),
        ));
    }
    if !(1..=256).contains(&args.top_k) {
        return Err(Error::invalid(
            "kiln-generate",
            format!("--top-k must be between 1 and 256, got {}", args.top_k),
        ));
    }
    if args.bytes > 100_000 {
        return Err(Error::invalid(
            "kiln-generate",
            format!("--bytes is at most 100000, got {}", args.bytes),
        ));
    }
    run_on(args.device.device, Generate(args))
}

/// Samples `args.bytes` bytes from the checkpoint at `path`, a `M`, on `dev` (named
/// `device_name` on stderr once the checkpoint has loaded).
fn generate<Be: Backend, M: GptModel<Be>>(
    args: &Args,
    path: &std::path::Path,
    dev: &Be::Device,
    device_name: &str,
) -> Result<()> {
    let model: M = args.foreign.load_new(path, dev)?;
    eprintln!("device: {device_name}");
    let mut out = std::io::stdout().lock();
    let sampling = Sampling {
        bytes: args.bytes,
        temperature: args.temperature,
        top_k: args.top_k,
        seed: args.seed,
    };
    kiln_models::gpt::generate(&model, args.prompt.as_bytes(), &sampling, dev, &mut out)
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
