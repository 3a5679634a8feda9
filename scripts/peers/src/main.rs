//! Batch-1 latency of the W1 MLP (784-1024-1024-10, ReLU, logits read back to the
//! host) in candle and Burn (Flex backend), printed in kiln-bench's line format so
//! scripts/bench_latency.py can set them beside Kiln and PyTorch from the same run.
//!
//! Usage: kiln-peers candle|burn [REPS]

use std::time::Instant;

/// The median of `reps` timed calls of `f`, after one untimed call, in milliseconds.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn candle(reps: usize) -> f64 {
    use candle_core::{DType, Device, Module, Tensor};
    use candle_nn::{linear, VarBuilder, VarMap};
    let dev = Device::Cpu;
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &dev);
    let fc1 = linear(784, 1024, vb.pp("fc1")).unwrap();
    let fc2 = linear(1024, 1024, vb.pp("fc2")).unwrap();
    let fc3 = linear(1024, 10, vb.pp("fc3")).unwrap();
    let x = Tensor::randn(0f32, 1.0, (1, 784), &dev).unwrap();
    median_ms(reps, || {
        let h = fc1.forward(&x).unwrap().relu().unwrap();
        let h = fc2.forward(&h).unwrap().relu().unwrap();
        let logits: Vec<Vec<f32>> = fc3.forward(&h).unwrap().to_vec2().unwrap();
        std::hint::black_box(logits);
    })
}

fn burn(reps: usize) -> f64 {
    use burn::nn::{Linear, LinearConfig};
    use burn::prelude::*;
    use burn::tensor::Distribution;
    let dev = Device::flex();
    let fc1: Linear = LinearConfig::new(784, 1024).init(&dev);
    let fc2: Linear = LinearConfig::new(1024, 1024).init(&dev);
    let fc3: Linear = LinearConfig::new(1024, 10).init(&dev);
    let x = Tensor::<2>::random([1, 784], Distribution::Normal(0.0, 1.0), &dev);
    median_ms(reps, || {
        let h = burn::tensor::activation::relu(fc1.forward(x.clone()));
        let h = burn::tensor::activation::relu(fc2.forward(h));
        let logits = fc3.forward(h).into_data().try_to_vec::<f32>().unwrap();
        std::hint::black_box(logits);
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let reps = args.get(2).map_or(200, |r| r.parse().expect("REPS is a count"));
    let (name, ms) = match args.get(1).map(String::as_str) {
        Some("candle") => ("candle", candle(reps)),
        Some("burn") => ("burn", burn(reps)),
        _ => {
            eprintln!("usage: kiln-peers candle|burn [REPS]");
            std::process::exit(2);
        }
    };
    println!("bench=W1 impl={name} backend=cpu variant=static task=infer batch=1 ms={ms:.4}");
}
