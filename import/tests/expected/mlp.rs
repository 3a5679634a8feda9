// `Mlp`, imported from `mlp.onnx` (pytorch 2.15.0, ONNX opset 17) by kiln-import.

use kiln::prelude::*;

/// The model of `mlp.onnx`.
#[model]
pub struct Mlp {
    fc1: Linear<20, 16>,
    fc2: Linear<16, 16>,
    fc3: Linear<16, 4>,
}

#[model]
impl Mlp {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize>(&self, input: Tensor<BATCH, 20>) -> Tensor<BATCH, 4> {
        let fc1 = self.fc1(input).relu();
        let fc2 = self.fc2(fc1).relu();
        self.fc3(fc2)
    }
}
