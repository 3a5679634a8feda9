//! A text generator with the small GPT's weights built in: `kiln::embed!` checks
//! `models/weights/gpt-shakespeare.safetensors` against `SmallGpt` when this compiles.
//! It continues the prompt given as its argument (default `ROMEO:`) with 300 bytes,
//! sampled as `kiln-generate` samples by default (temperature 0.8, top 40, seed 1).
//!
//! ```sh
//! kiln-train --model gpt --out models/weights/gpt-shakespeare.safetensors
//! cargo run --release -p kiln-models --features embedded-weights --example generate_embedded -- "JULIET:"
//! ```

#[path = "../src/gpt_instances.rs"]
mod gpt_instances;

use gpt_instances::SmallGpt;
use kiln::cpu::{Cpu, CpuDevice};
use kiln_models::gpt::{generate, Sampling};

fn main() {
    let started = std::time::Instant::now();
    let weights = kiln::embed!(SmallGpt, "../weights/gpt-shakespeare.safetensors");
    let prompt = std::env::args().nth(1).unwrap_or_else(|| "ROMEO:".into());
    if prompt == "-h" || prompt == "--help" {
        println!("Continue a prompt with 300 bytes from the small GPT whose weights are built into this program.\nusage: <this program> [PROMPT] (default ROMEO:)");
        return;
    }
    let sampling = Sampling {
        bytes: 300,
        temperature: 0.8,
        top_k: 40,
        seed: 1,
    };
    let result = weights.load::<Cpu>(&CpuDevice).and_then(|model| {
        eprintln!(
            "ready in {:.2} ms (weights built in)",
            started.elapsed().as_secs_f64() * 1e3
        );
        generate(
            &model,
            prompt.as_bytes(),
            &sampling,
            &CpuDevice,
            &mut std::io::stdout().lock(),
        )
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
