// `MlpMatmul`, imported from `mlp_matmul.onnx` (pytorch 2.15.0, ONNX opset 17) by kiln-import.

use kiln::prelude::*;

/// The model of `mlp_matmul.onnx`.
#[model]
pub struct MlpMatmul {
    w1: Linear<12, 8>,
    w2: Linear<8, 5>,
}

#[model]
impl MlpMatmul {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize>(&self, input: Tensor<BATCH, 12>) -> Tensor<BATCH, 5> {
        let w1 = self.w1(input).tanh();
        self.w2(w1).sigmoid()
    }
}
