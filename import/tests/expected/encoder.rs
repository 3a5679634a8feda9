// `Encoder`, imported from `encoder.onnx` (pytorch 2.15.0, ONNX opset 17) by kiln-import.

use kiln::prelude::*;

/// The model of `encoder.onnx`.
#[model]
pub struct Encoder {
    embed: Embedding<20, 16>,
    blocks_layers_0_self_attn: Linear<16, 48>,
    blocks_layers_0_self_attn_out_proj: Linear<16, 16>,
    blocks_layers_0_norm1: LayerNorm<16>,
    blocks_layers_0_linear1: Linear<16, 32>,
    blocks_layers_0_linear2: Linear<32, 16>,
    blocks_layers_0_norm2: LayerNorm<16>,
    blocks_layers_1_self_attn: Linear<16, 48>,
    blocks_layers_1_self_attn_out_proj: Linear<16, 16>,
    blocks_layers_1_norm1: LayerNorm<16>,
    blocks_layers_1_linear1: Linear<16, 32>,
    blocks_layers_1_linear2: Linear<32, 16>,
    blocks_layers_1_norm2: LayerNorm<16>,
    head: Linear<16, 20>,
}

#[model]
impl Encoder {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize>(
        &self,
        input: Tensor<BATCH, 8, i32>,
    ) -> Tensor<BATCH, 8, 20> {
        let embed = self.embed(input);
        let embed_2 = embed.permute::<1, 0, 2>();
        let self_attn = self.blocks_layers_0_self_attn(embed_2);
        let self_attn_2 = self_attn
            .reshape::<1, 8, BATCH, 3, 16>()
            .permute::<3, 1, 2, 0, 4>()
            .reshape::<3, 8, BATCH, 16>();
        let self_attn_3 = self_attn_2
            .narrow::<0, 1, 1>()
            .reshape::<8, Dyn, 8>()
            .permute::<1, 0, 2>();
        let self_attn_4 = self_attn_2
            .narrow::<0, 0, 1>()
            .reshape::<8, Dyn, 8>()
            .permute::<1, 0, 2>()
            .reshape::<BATCH, 2, 8, 8>();
        let self_attn_5 = self_attn_3
            .reshape::<BATCH, 2, 8, 8>()
            .permute::<0, 1, 3, 2>();
        let self_attn_6 = self_attn_4 * 0.59460354;
        let self_attn_7 = self_attn_5 * 0.59460354;
        let h = self_attn_6.matmul(self_attn_7).softmax();
        let self_attn_8 = self_attn_2
            .narrow::<0, 2, 1>()
            .reshape::<8, Dyn, 8>()
            .permute::<1, 0, 2>()
            .reshape::<BATCH, 2, 8, 8>();
        let h_2 = h
            .matmul(self_attn_8)
            .permute::<2, 0, 1, 3>()
            .reshape::<Dyn, 16>();
        let self_attn_out_proj = self.blocks_layers_0_self_attn_out_proj(h_2);
        let self_attn_out_proj_2 = self_attn_out_proj
            .reshape::<8, BATCH, 16>()
            .permute::<1, 0, 2>();
        let embed_3 = embed + self_attn_out_proj_2;
        let norm1 = self.blocks_layers_0_norm1(embed_3);
        let linear1 = self.blocks_layers_0_linear1(norm1).gelu();
        let norm1_2 = norm1 + self.blocks_layers_0_linear2(linear1);
        let norm2 = self.blocks_layers_0_norm2(norm1_2);
        let norm2_2 = norm2.permute::<1, 0, 2>();
        let self_attn_9 = self.blocks_layers_1_self_attn(norm2_2);
        let self_attn_10 = self_attn_9
            .reshape::<1, 8, BATCH, 3, 16>()
            .permute::<3, 1, 2, 0, 4>()
            .reshape::<3, 8, BATCH, 16>();
        let self_attn_11 = self_attn_10
            .narrow::<0, 1, 1>()
            .reshape::<8, Dyn, 8>()
            .permute::<1, 0, 2>();
        let self_attn_12 = self_attn_10
            .narrow::<0, 0, 1>()
            .reshape::<8, Dyn, 8>()
            .permute::<1, 0, 2>()
            .reshape::<BATCH, 2, 8, 8>();
        let self_attn_13 = self_attn_11
            .reshape::<BATCH, 2, 8, 8>()
            .permute::<0, 1, 3, 2>();
        let self_attn_14 = self_attn_12 * 0.59460354;
        let self_attn_15 = self_attn_13 * 0.59460354;
        let h_3 = self_attn_14.matmul(self_attn_15).softmax();
        let self_attn_16 = self_attn_10
            .narrow::<0, 2, 1>()
            .reshape::<8, Dyn, 8>()
            .permute::<1, 0, 2>()
            .reshape::<BATCH, 2, 8, 8>();
        let h_4 = h_3
            .matmul(self_attn_16)
            .permute::<2, 0, 1, 3>()
            .reshape::<Dyn, 16>();
        let self_attn_out_proj_3 = self.blocks_layers_1_self_attn_out_proj(h_4);
        let self_attn_out_proj_4 = self_attn_out_proj_3
            .reshape::<8, BATCH, 16>()
            .permute::<1, 0, 2>();
        let norm2_3 = norm2 + self_attn_out_proj_4;
        let norm1_3 = self.blocks_layers_1_norm1(norm2_3);
        let linear1_2 = self.blocks_layers_1_linear1(norm1_3).gelu();
        let norm1_4 = norm1_3 + self.blocks_layers_1_linear2(linear1_2);
        self.head(self.blocks_layers_1_norm2(norm1_4))
    }
}
