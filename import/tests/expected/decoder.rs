// `Decoder`, imported from `decoder.onnx` (pytorch 2.15.0, ONNX opset 17) by kiln-import.

use kiln::prelude::*;

/// The model of `decoder.onnx`.
#[model]
pub struct Decoder {
    tok: Embedding<20, 16>,
    pos: Embedding<8, 16>,
    ln1_0: LayerNorm<16>,
    qkv_0: Linear<16, 48>,
    proj_0: Linear<16, 16>,
    ln2_0: LayerNorm<16>,
    up_0: Linear<16, 64>,
    down_0: Linear<64, 16>,
    ln1_1: LayerNorm<16>,
    qkv_1: Linear<16, 48>,
    proj_1: Linear<16, 16>,
    ln2_1: LayerNorm<16>,
    up_1: Linear<16, 64>,
    down_1: Linear<64, 16>,
    ln_f: LayerNorm<16>,
    head: Linear<16, 20>,
}

#[model]
impl Decoder {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize, const SEQUENCE: usize>(
        &self,
        input: Tensor<BATCH, SEQUENCE, i32>,
    ) -> Tensor<BATCH, SEQUENCE, 20> {
        let tok = self.tok(input) + self.pos.positions(input);
        let qkv_0 = self.qkv_0(self.ln1_0(tok));
        let qkv_0_2 = qkv_0
            .narrow::<2, 0, 16>()
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 1, 3>();
        let qkv_0_3 = qkv_0
            .narrow::<2, 16, 16>()
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 3, 1>();
        let h = (qkv_0_2.matmul(qkv_0_3) / 2.828427).causal_mask().softmax();
        let qkv_0_4 = qkv_0
            .narrow::<2, 32, 16>()
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 1, 3>();
        let h_2 = h
            .matmul(qkv_0_4)
            .permute::<0, 2, 1, 3>()
            .reshape::<BATCH, SEQUENCE, 16>();
        let tok_2 = tok + self.proj_0(h_2);
        let up_0 = self.up_0(self.ln2_0(tok_2)).gelu();
        let tok_3 = tok_2 + self.down_0(up_0);
        let qkv_1 = self.qkv_1(self.ln1_1(tok_3));
        let qkv_1_2 = qkv_1
            .narrow::<2, 0, 16>()
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 1, 3>();
        let qkv_1_3 = qkv_1
            .narrow::<2, 16, 16>()
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 3, 1>();
        let h_3 = (qkv_1_2.matmul(qkv_1_3) / 2.828427).causal_mask().softmax();
        let qkv_1_4 = qkv_1
            .narrow::<2, 32, 16>()
            .reshape::<BATCH, SEQUENCE, 2, 8>()
            .permute::<0, 2, 1, 3>();
        let h_4 = h_3
            .matmul(qkv_1_4)
            .permute::<0, 2, 1, 3>()
            .reshape::<BATCH, SEQUENCE, 16>();
        let tok_4 = tok_3 + self.proj_1(h_4);
        let up_1 = self.up_1(self.ln2_1(tok_4)).gelu();
        let tok_5 = tok_4 + self.down_1(up_1);
        self.head(self.ln_f(tok_5))
    }
}
