//! An inference binary with the MNIST MLP's int8 checkpoint built in: `kiln::embed!`
//! checks `models/weights/mlp-mnist-int8.safetensors` against the int8 instance
//! `MlpInt8` (int8 weights with per-row scales) when this compiles; the binary
//! classifies MNIST's test split on the CPU's int8 products and says how long it took
//! to be ready.
//!
//! ```sh
//! kiln-train --model mlp --dataset mnist --out models/weights/mlp-mnist.safetensors
//! kiln-quantize models/weights/mlp-mnist.safetensors models/weights/mlp-mnist-int8.safetensors
//! cargo run --release -p kiln-models --features embedded-weights --example mlp_int8_embedded
//! ```

use kiln::cpu::{Cpu, CpuDevice};
use kiln_models::classify::accuracy;
use kiln_models::cli::ImageData;
use kiln_models::data::{Split, SplitName};
use kiln_models::mlp::MlpInt8;

fn main() {
    let started = std::time::Instant::now();
    let run = || -> kiln::Result<()> {
        let weights = kiln::embed!(MlpInt8, "../weights/mlp-mnist-int8.safetensors");
        let model: MlpInt8<Cpu> = weights.load(&CpuDevice)?;
        let ready = started.elapsed();
        let data = ImageData::Mnist;
        let test = Split::load(
            &kiln_models::data::data_dir().join(data.folder()),
            SplitName::Test,
            data.norm(),
        )?;
        let n = test.len();
        let acc = accuracy(&model, std::sync::Arc::new(test), &CpuDevice)?;
        println!(
            "ready in {:.2} ms; test accuracy {:.2}% on {} images ({} int8 products)",
            ready.as_secs_f64() * 1e3,
            100.0 * acc,
            n,
            kiln::cpu::quant::Int8Kernel::detect().name()
        );
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
