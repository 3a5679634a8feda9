//! An inference binary with the Fashion-MNIST CNN's weights built in: `kiln::embed!` checks
//! `models/weights/cnn-fashion.safetensors` against `LeNet` when this compiles, so a
//! checkpoint that does not fit is a compile error, not a run-time surprise.
//!
//! ```sh
//! kiln-train --model cnn --dataset fashion --out models/weights/cnn-fashion.safetensors
//! cargo run --release -p kiln-models --features embedded-weights --example classify_fashion_embedded -- shoe.png
//! ```

use kiln::cpu::{Cpu, CpuDevice};
use kiln_models::classify::classify_command_line;
use kiln_models::cli::ImageData;
use kiln_models::lenet::LeNet;

fn main() {
    let started = std::time::Instant::now();
    let weights = kiln::embed!(LeNet, "../weights/cnn-fashion.safetensors");
    let model = weights.load::<Cpu>(&CpuDevice);
    std::process::exit(classify_command_line(
        model,
        ImageData::Fashion,
        &CpuDevice,
        started,
    ));
}
