//! A LeNet-style convolutional network for 28×28 grey images, written with `#[model]`:
//! two convolution + batch-norm + ReLU + max-pool stages, then two linear layers with
//! dropout between them.

use kiln::prelude::*;

/// Conv(1→32, 5×5, pad 2) → BN → ReLU → pool → Conv(32→64, 5×5) → BN → ReLU → pool →
/// Linear(1600→128) → ReLU → Dropout → Linear(128→10).
#[model]
pub struct LeNet {
    conv1: Conv2d<1, 32, 5, 1, 2>,
    bn1: BatchNorm2d<32>,
    pool1: MaxPool2d<2>,
    conv2: Conv2d<32, 64, 5>,
    bn2: BatchNorm2d<64>,
    pool2: MaxPool2d<2>,
    fc1: Linear<1600, 128>,
    drop: Dropout<25>,
    fc2: Linear<128, 10>,
}

#[model]
impl LeNet {
    /// Class logits of a batch of images.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 1, 28, 28>) -> Tensor<B, 10> {
        let h = self.pool1(self.bn1(self.conv1(x)).relu());
        let h = self.pool2(self.bn2(self.conv2(h)).relu());
        let h = self.fc1(h.flatten()).relu();
        self.fc2(self.drop(h))
    }

    /// Mean cross-entropy of the logits against integer labels.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 1, 28, 28>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// The CNN with its linear layers' weights in int8 (the convolutions stay f32), for
/// inference: what `kiln-quantize` makes of a [`LeNet`] checkpoint loads into it.
#[model(precision = int8)]
pub type LeNetInt8 = LeNet;
