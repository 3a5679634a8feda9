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
