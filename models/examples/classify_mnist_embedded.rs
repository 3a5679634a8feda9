//! An inference binary with the MNIST MLP's weights built in: `kiln::embed!` checks
//! `models/weights/mlp-mnist.safetensors` against `Mlp` when this compiles, so a
//! checkpoint that does not fit is a compile error, not a run-time surprise.
//!
//! ```sh
//! kiln-train --model mlp --dataset mnist --out models/weights/mlp-mnist.safetensors
//! cargo run --release -p kiln-models --features embedded-weights --example classify_mnist_embedded -- digit.png
//! ```

use kiln::cpu::{Cpu, CpuDevice};
use kiln_models::classify::classify_command_line;
use kiln_models::cli::ImageData;
use kiln_models::mlp::Mlp;

fn main() {
    let started = std::time::Instant::now();
    let weights = kiln::embed!(Mlp, "../weights/mlp-mnist.safetensors");
    let model = weights.load::<Cpu>(&CpuDevice);
    std::process::exit(classify_command_line(
        model,
        ImageData::Mnist,
        &CpuDevice,
        started,
    ));
}
