// `Ops`, imported from `ops.onnx` (pytorch 2.15.0, ONNX opset 21) by kiln-import.

use kiln::prelude::*;

/// The model of `ops.onnx`.
#[model]
pub struct Ops {
    conv: Conv2d<1, 4, 3, 1, 1>,
    pool: AvgPool2d<2, 2>,
    fc: Linear<16, 5>,
}

#[model]
impl Ops {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize>(&self, input: Tensor<BATCH, 1, 8, 8>) -> Tensor<BATCH, 5> {
        let conv = self.conv(input).gelu_tanh();
        let pool = self.pool(conv).mean::<3>();
        let pool_2 = (pool.square().mean::<2>().reshape::<BATCH, 4, 1>() + 0.001).sqrt();
        let pool_3 = (pool / pool_2).flatten();
        self.fc(pool_3).log_softmax()
    }
}
