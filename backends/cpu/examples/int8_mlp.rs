//! Batch-1 latency of W1's MLP (784-1024-1024-10, ReLU between) through the int8
//! products alone: three `kiln_cpu::quant::linear` calls on weights quantised per row,
//! ReLU fused into the first two. What the int8 inference path's products cost,
//! without the model around them; the f32 model's figure is `kiln-bench --workloads w1
//! --variants infer`. Prints one line per kernel this CPU runs:
//! `bench=W1 task=infer-int8-products kernel=avx512-vnni ms=0.0312`.
//!
//!   cargo run --release -p kiln-cpu --example int8_mlp [-- --reps 2000 --rounds 5]

use kiln_cpu::quant::{linear_with, Int8Kernel, Int8Matrix};
use kiln_tensor::UnaryOp;
use std::time::Instant;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.1
        })
        .collect()
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) if v > 0 => v,
            _ => {
                eprintln!("error: {name} takes a positive whole number");
                std::process::exit(2);
            }
        },
    }
}

fn main() {
    let (reps, rounds) = (arg("--reps", 2000), arg("--rounds", 5));
    let sizes = [(784, 1024), (1024, 1024), (1024, 10)];
    let layers: Vec<(Int8Matrix, Vec<f32>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &(k, n))| {
            let w = Int8Matrix::quantize(&values(n * k, i as u64), n, k).expect("weights");
            (w, values(n, 10 + i as u64))
        })
        .collect();
    let x = values(784, 99);
    let mut h1 = vec![0.0; 1024];
    let mut h2 = vec![0.0; 1024];
    let mut logits = vec![0.0; 10];
    for kernel in Int8Kernel::ALL.into_iter().filter(|k| k.available()) {
        let mut call = || {
            let run = |x: &[f32], (w, b): &(Int8Matrix, Vec<f32>), act, out: &mut [f32]| {
                linear_with(kernel, x, 1, w, Some(b), act, out).expect("the product")
            };
            run(&x, &layers[0], Some(UnaryOp::Relu), &mut h1);
            run(&h1, &layers[1], Some(UnaryOp::Relu), &mut h2);
            run(&h2, &layers[2], None, &mut logits);
            logits[0]
        };
        for _ in 0..reps / 10 {
            std::hint::black_box(call());
        }
        let mut medians = Vec::new();
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..reps {
                std::hint::black_box(call());
            }
            medians.push(start.elapsed().as_secs_f64() * 1e3 / reps as f64);
        }
        medians.sort_by(f64::total_cmp);
        println!(
            "bench=W1 task=infer-int8-products kernel={} ms={:.4}",
            kernel.name(),
            medians[rounds / 2]
        );
    }
}
