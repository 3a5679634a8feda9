// `Attention`, imported from `attention.onnx` (pytorch 2.15.0, ONNX opset 17) by kiln-import.

use kiln::prelude::*;

/// The model of `attention.onnx`.
#[model]
pub struct Attention {
    embed: Embedding<20, 16>,
    ln1: LayerNorm<16>,
    q: Linear<16, 16>,
    k: Linear<16, 16>,
    v: Linear<16, 16>,
    proj: Linear<16, 16>,
    ln2: LayerNorm<16>,
    up: Linear<16, 32>,
    down: Linear<32, 16>,
    head: Linear<16, 20>,
}

#[model]
impl Attention {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize, const SEQUENCE: usize>(
        &self,
        input: Tensor<BATCH, SEQUENCE, i32>,
    ) -> Tensor<BATCH, SEQUENCE, 20> {
        let embed = self.embed(input);
        let ln1 = self.ln1(embed);
        let q = self
            .q(ln1)
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 1, 3>();
        let k = self
            .k(ln1)
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 3, 1>();
        let h = (q.matmul(k) / 2.828427).softmax();
        let v = self
            .v(ln1)
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 1, 3>();
        let h_2 = h
            .matmul(v)
            .permute::<0, 2, 1, 3>()
            .reshape::<BATCH, SEQUENCE, 16>();
        let embed_2 = embed + self.proj(h_2);
        let up = self.up(self.ln2(embed_2)).gelu();
        let embed_3 = embed_2 + self.down(up);
        self.head(embed_3)
    }
}
