// A model with a shape error is still one the Learner takes: the error is the macro's
// one message, not also "not a model the Learner can train" at each use.

use kiln::prelude::*;
use kiln::train::learner::{Learner, Supervised};
use kiln::train::optim::{Sgd, SgdConfig};

#[model]
struct Cnn {
    conv: Conv2d<1, 4, 3>,
    fc: Linear<3136, 10>,
}

#[model]
impl Cnn {
    fn forward<const B: usize>(&self, x: Tensor<B, 1, 28, 28>) -> Tensor<B, 10> {
        self.fc(self.conv(x).relu().flatten())
    }

    fn loss<const B: usize>(&self, x: Tensor<B, 1, 28, 28>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

fn trains<M: Supervised<kiln::cpu::Cpu>>(_: &M) {}

fn main() {
    use kiln::cpu::{Cpu, CpuDevice};
    let cnn = Cnn::<Cpu>::init(&CpuDevice, 0).unwrap();
    trains(&cnn);
    let sgd = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let _learner = Learner::new(cnn, sgd, CpuDevice);
}
