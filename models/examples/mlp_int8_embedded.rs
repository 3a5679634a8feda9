//! An inference binary with the MNIST MLP's int8 checkpoint built in: `kiln::embed!(..,
//! int8)` checks `models/weights/mlp-mnist-int8.safetensors` against `Mlp`'s weights as
//! int8 with per-row scales when this compiles; the binary classifies MNIST's test
//! split on the CPU's int8 products and says how long it took to be ready.
//!
//! ```sh
//! kiln-train --model mlp --dataset mnist --out models/weights/mlp-mnist.safetensors
//! kiln-quantize models/weights/mlp-mnist.safetensors models/weights/mlp-mnist-int8.safetensors
//! cargo run --release -p kiln-models --features embedded-weights --example mlp_int8_embedded
//! ```

use kiln_models::cli::ImageData;
use kiln_models::data::{Split, SplitName};
use kiln_models::mlp_int8::MlpInt8;

fn main() {
    let started = std::time::Instant::now();
    let run = || -> kiln::Result<()> {
        let weights = kiln::embed!(
            kiln_models::mlp::Mlp,
            "../weights/mlp-mnist-int8.safetensors",
            int8
        );
        let model = MlpInt8::from_checkpoint(&weights.checkpoint()?)?;
        let ready = started.elapsed();
        let data = ImageData::Mnist;
        let test = Split::load(
            &kiln_models::data::data_dir().join(data.folder()),
            SplitName::Test,
            data.norm(),
        )?;
        let logits = model.logits(&test.images, test.len())?;
        let correct = logits
            .chunks(10)
            .zip(&test.labels)
            .filter(|(r, &y)| (0..10).max_by(|&a, &b| r[a].total_cmp(&r[b])) == Some(y as usize))
            .count();
        println!(
            "ready in {:.2} ms; test accuracy {:.2}% on {} images ({} int8 products)",
            ready.as_secs_f64() * 1e3,
            100.0 * correct as f64 / test.len().max(1) as f64,
            test.len(),
            kiln::cpu::quant::Int8Kernel::detect().name()
        );
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
