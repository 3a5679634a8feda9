//! Reusable parts for composed models: `#[model]`s meant to be fields of other
//! models, in this crate or another.

use kiln::prelude::*;

/// A pre-norm residual MLP block of width 32 and hidden width 128 (GELU):
/// `x + down(gelu(up(norm(x))))`.
#[model]
pub struct ResidualMlp {
    norm: LayerNorm<32>,
    up: Linear<32, 128>,
    down: Linear<128, 32>,
}

#[model]
impl ResidualMlp {
    /// The block applied to a batch of rows.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        x + self.delta(x)
    }

    /// What the block adds to its input.
    pub fn delta<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.down(self.up(self.norm(x)).gelu())
    }
}
