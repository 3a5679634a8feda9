//! The MLP of workload W1: 784-1024-1024-10 with ReLU, written with `#[model]`.

use kiln::prelude::*;

/// A three-layer perceptron for 28×28 images.
#[model]
pub struct Mlp {
    fc1: Linear<784, 1024>,
    fc2: Linear<1024, 1024>,
    fc3: Linear<1024, 10>,
}

#[model]
impl Mlp {
    /// Class logits of a batch of flattened images.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 10> {
        let h = self.fc1(x).relu();
        let h = self.fc2(h).relu();
        self.fc3(h)
    }

    /// Mean cross-entropy of the logits against integer labels.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 784>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// The MLP with int8 weights (one scale per output row), for inference: what
/// `kiln-quantize` makes of an [`Mlp`] checkpoint loads into it.
#[model(precision = int8)]
pub type MlpInt8 = Mlp;
