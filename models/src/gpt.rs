//! A small GPT, composed of `#[model]` parts: token and position embeddings, two
//! pre-norm transformer blocks (causal self-attention and a GELU MLP, each residual),
//! a final norm and a head over the 256 byte values. Width 16 in two heads, context up
//! to 32 bytes: the shape of W3 at a size the CPU test suite trains in seconds (named
//! sizes and configurations come with issue 10's next items).

use crate::parts::CausalSelfAttention;
use kiln::prelude::*;

/// One pre-norm transformer block of width 16.
#[model]
pub struct GptBlock {
    ln1: LayerNorm<16>,
    attn: CausalSelfAttention,
    ln2: LayerNorm<16>,
    up: Linear<16, 64>,
    down: Linear<64, 16>,
}

#[model]
impl GptBlock {
    /// `x + attn(ln1(x))`, then the same with the MLP.
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, 16>) -> Tensor<B, T, 16> {
        let h = x + self.attn(self.ln1(x));
        h + self.down(self.up(self.ln2(h)).gelu())
    }
}

/// A byte-level GPT: two blocks of width 16, context up to 32.
#[model]
pub struct TinyGpt {
    tok: Embedding<256, 16>,
    pos: Embedding<32, 16>,
    blocks: [GptBlock; 2],
    norm: LayerNorm<16>,
    head: Linear<16, 256>,
}

#[model]
impl TinyGpt {
    /// The next-byte logits at every position of a batch of byte windows.
    pub fn logits<const B: usize, const T: usize>(
        &self,
        ids: Tensor<B, T, i32>,
    ) -> Tensor<B, T, 256> {
        let mut h = self.tok(ids) + self.pos.positions(ids);
        for block in &self.blocks {
            h = block(h);
        }
        self.head(self.norm(h))
    }

    /// The next-byte logits of a batch of windows of any length up to 32 (generation
    /// grows its context one byte at a time).
    pub fn logits_any(&self, ids: Tensor<Dyn, Dyn, i32>) -> Tensor<Dyn, Dyn, 256> {
        let mut h = self.tok(ids) + self.pos.positions(ids);
        for block in &self.blocks {
            h = block(h);
        }
        self.head(self.norm(h))
    }

    /// Mean cross-entropy (nats per byte) of the logits against the next bytes.
    pub fn loss<const B: usize, const T: usize>(
        &self,
        ids: Tensor<B, T, i32>,
        next: Tensor<B, T, i32>,
    ) -> Tensor {
        self.logits(ids)
            .reshape::<Dyn, 256>()
            .cross_entropy(next.reshape::<Dyn>())
    }
}
