//! # kiln-example-model
//!
//! A model crate as a Kiln user writes one: a reusable part (`Residual`, a pre-norm
//! residual MLP block of width 32), a model composed of parts (`Tabular`: an input
//! layer, three blocks in an array, a head), and tests of its own — a short training
//! run, and trybuild cases pinning the errors a user of these parts meets when a size
//! does not fit (tests/ui). Other crates compose `Residual` the same way:
//! `block: kiln_example_model::Residual` as a field of their own `#[model]`.

use kiln::prelude::*;

/// A pre-norm residual MLP block of width 32: `x + down(gelu(up(norm(x))))`.
#[model]
pub struct Residual {
    norm: LayerNorm<32>,
    up: Linear<32, 64>,
    down: Linear<64, 32>,
}

#[model]
impl Residual {
    /// The block on a batch of rows of width 32.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        x + self.down(self.up(self.norm(x)).gelu())
    }
}

/// A classifier of rows of 8 features into 3 classes: 8 → 32, three residual
/// blocks, 32 → 3.
#[model]
pub struct Tabular {
    input: Linear<8, 32>,
    blocks: [Residual; 3],
    head: Linear<32, 3>,
}

#[model]
impl Tabular {
    /// Class logits.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 3> {
        let mut h = self.input(x);
        for block in &self.blocks {
            h = block(h);
        }
        self.head(h)
    }

    /// Mean cross-entropy against integer labels.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 8>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}
