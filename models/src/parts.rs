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

/// Causal self-attention of width `D` in `H` heads of `D / H`: queries, keys and
/// values projected, heads split (`reshape` + `permute`), scores scaled by
/// 1/√(D / H), masked (`causal_mask`) and normalised, heads merged and projected.
#[model]
pub struct CausalSelfAttention<const D: usize, const H: usize> {
    q: Linear<D, D>,
    k: Linear<D, D>,
    v: Linear<D, D>,
    proj: Linear<D, D>,
}

#[model]
impl CausalSelfAttention {
    /// Each position attends to itself and the positions before it.
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, D> {
        let q = self
            .q(x)
            .reshape::<B, T, H, { D / H }>()
            .permute::<0, 2, 1, 3>();
        let k = self
            .k(x)
            .reshape::<B, T, H, { D / H }>()
            .permute::<0, 2, 1, 3>();
        let v = self
            .v(x)
            .reshape::<B, T, H, { D / H }>()
            .permute::<0, 2, 1, 3>();
        let weights = (q.matmul(k.t()) / ((D / H) as f32).sqrt())
            .causal_mask()
            .softmax();
        let y = weights
            .matmul(v)
            .permute::<0, 2, 1, 3>()
            .reshape::<B, T, D>();
        self.proj(y)
    }

    /// Mean squared error of the attention's output against `target`.
    pub fn loss<const B: usize, const T: usize>(
        &self,
        x: Tensor<B, T, D>,
        target: Tensor<B, T, D>,
    ) -> Tensor {
        self.forward(x).mse(target)
    }
}

/// Causal self-attention of width `D` in `H` heads with dropout on its weights: a
/// quarter of them dropped in training (PyTorch's `attn_drop`), none in evaluation. The
/// hand-written `drop(softmax(..))` becomes the fused attention op's own dropout. No
/// output projection.
#[model]
pub struct DroppedSelfAttention<const D: usize, const H: usize> {
    q: Linear<D, D>,
    k: Linear<D, D>,
    v: Linear<D, D>,
    drop: Dropout<25>,
}

#[model]
impl DroppedSelfAttention {
    /// Each position attends to itself and the positions before it, through the
    /// weights dropout kept.
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, D> {
        let q = self
            .q(x)
            .reshape::<B, T, H, { D / H }>()
            .permute::<0, 2, 1, 3>();
        let k = self
            .k(x)
            .reshape::<B, T, H, { D / H }>()
            .permute::<0, 2, 1, 3>();
        let v = self
            .v(x)
            .reshape::<B, T, H, { D / H }>()
            .permute::<0, 2, 1, 3>();
        let weights = self.drop(
            (q.matmul(k.t()) / ((D / H) as f32).sqrt())
                .causal_mask()
                .softmax(),
        );
        weights
            .matmul(v)
            .permute::<0, 2, 1, 3>()
            .reshape::<B, T, D>()
    }

    /// Mean squared error of the attention's output against `target`.
    pub fn loss<const B: usize, const T: usize>(
        &self,
        x: Tensor<B, T, D>,
        target: Tensor<B, T, D>,
    ) -> Tensor {
        self.forward(x).mse(target)
    }
}
