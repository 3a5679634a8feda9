//! Seeded batches of Shakespeare windows for the GPT tests, on the CPU.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln_models::text::windows;

/// Windows per batch.
pub const BATCH: usize = 8;
/// Bytes per window.
pub const LEN: usize = 32;
/// A batch of windows (or of their next bytes).
pub type Ids = Tensor<Cpu, (Const<BATCH>, Const<LEN>), i32>;

/// `BATCH` windows of `text` seeded by `seed`, and their next bytes.
pub fn batch(text: &[u8], seed: u64) -> (Ids, Ids) {
    let (ids, next) = windows(text, BATCH, LEN, seed).unwrap();
    (
        Tensor::from_vec(ids, &[BATCH, LEN], &CpuDevice).unwrap(),
        Tensor::from_vec(next, &[BATCH, LEN], &CpuDevice).unwrap(),
    )
}

/// A scalar tensor's value.
pub fn scalar(t: &Tensor<Cpu, ()>) -> f32 {
    t.raw().to_vec::<f32>().unwrap()[0]
}

/// Checks that a mixed-precision run's losses (`mixed`, `label` its precision) follow
/// the f32 run's (`exact`) over the same steps: the mean of each window of ten steps
/// within 5%, so single noisy steps do not decide, and the last window at least one
/// nat below the first.
#[allow(dead_code)]
pub fn assert_curves_agree(exact: &[f32], mixed: &[f32], label: &str) {
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    for (i, (a, b)) in exact.chunks(10).zip(mixed.chunks(10)).enumerate() {
        let (a, b) = (mean(a), mean(b));
        let steps = format!("steps {}..{}", i * 10, i * 10 + 10);
        println!("{steps}: f32 {a:.4}, {label} {b:.4}");
        assert!(
            (a - b).abs() <= 0.05 * a,
            "{steps}: {label} {b} strays from f32 {a} by more than 5%"
        );
    }
    let (first, last) = (&mixed[..10], &mixed[mixed.len() - 10..]);
    assert!(mean(last) < mean(first) - 1.0, "{label} did not learn");
}

/// The losses of `$steps` AdamW steps (learning rate 0.01) of a fresh `$model` (seed 1)
/// on the CPU, one seeded batch of `$corpus`'s training text per step, and the model.
#[allow(unused_macros)]
macro_rules! train_curve {
    ($model:ty, $corpus:expr, $steps:expr) => {{
        let cfg = kiln::train::optim::AdamWConfig {
            lr: 1e-2,
            ..kiln::train::optim::AdamWConfig::default()
        };
        let mut opt = kiln::train::optim::AdamW::<Cpu>::new(cfg).unwrap();
        let mut model = <$model>::init(&CpuDevice, 1).unwrap();
        let mut losses = Vec::new();
        for step in 0..$steps {
            let (x, y) = batch(&$corpus.train, step);
            let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
            losses.push(scalar(&loss));
            kiln::train::optim::Optimizer::step(&mut opt, &mut model, &grads).unwrap();
        }
        (losses, model)
    }};
}
#[allow(unused_imports)]
pub(crate) use train_curve;
