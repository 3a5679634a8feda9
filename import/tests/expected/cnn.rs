// `Cnn`, imported from `cnn.onnx` (pytorch 2.15.0, ONNX opset 17) by kiln-import.

use kiln::prelude::*;

/// The model of `cnn.onnx`.
#[model]
pub struct Cnn {
    conv1: Conv2d<1, 4, 3, 1, 1>,
    bn1: BatchNorm2d<4>,
    max_pool1: MaxPool2d<2, 2>,
    conv2: Conv2d<4, 8, 3>,
    avg_pool1: AvgPool2d<2, 2>,
    fc: Linear<8, 3>,
}

#[model]
impl Cnn {
    /// The graph's output `output` of its input `input`.
    pub fn forward<const BATCH: usize>(&self, input: Tensor<BATCH, 1, 8, 8>) -> Tensor<BATCH, 3> {
        let bn1 = self.bn1(self.conv1(input)).relu();
        let conv2 = self.conv2(self.max_pool1(bn1)).relu();
        let avg_pool1 = self.avg_pool1(conv2).flatten();
        self.fc(avg_pool1)
    }
}
