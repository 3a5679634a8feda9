// A mistake inside a nested model is one error: the models holding it, their training
// entries, their instances and the Learner that trains them add none of their own
// (no missing method, no "not a model the Learner can train").

use kiln::prelude::*;
use kiln::train::learner::Learner;
use kiln::train::optim::{Sgd, SgdConfig};

// A definition whose `down` takes `D` where `up` gives `2 * D`.
#[model]
pub struct Block<const D: usize> {
    up: Linear<D, { 2 * D }>,
    down: Linear<D, D>,
}

#[model]
impl Block {
    pub fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.down(self.up(x).relu())
    }
}

#[model]
pub struct Net<const D: usize> {
    block: Block<D>,
    head: Linear<D, 4>,
}

#[model]
impl Net {
    pub fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, 4> {
        self.head(self.block(x))
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, D>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

#[model]
type Net16 = Net<16>;

// A plain nested model with a mistake, held by a plain model with a loss.
#[model]
pub struct Inner {
    fc: Linear<8, 8>,
}

#[model]
impl Inner {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        self.fc(x.narrow::<1, 0, 4>())
    }
}

#[model]
pub struct Outer {
    inner: Inner,
    head: Linear<8, 2>,
}

#[model]
impl Outer {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 2> {
        self.head(self.inner(x))
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, 8>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

fn main() {
    use kiln::cpu::{Cpu, CpuDevice};
    let net = Net16::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Tensor::<Cpu, Rank2<2, 16>>::zeros(&CpuDevice).unwrap();
    let y = Tensor::<Cpu, Rank1<2>, i32>::zeros(&CpuDevice).unwrap();
    let _ = net.forward(&x);
    let _ = net.loss_and_grad(&x, &y);
    let sgd = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let _learner = Learner::new(net, sgd, CpuDevice);

    let outer = Outer::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Tensor::<Cpu, Rank2<2, 8>>::zeros(&CpuDevice).unwrap();
    let _ = outer.forward(&x);
    let _ = outer.loss_and_grad(&x, &y);
    let sgd = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let _learner = Learner::new(outer, sgd, CpuDevice);
}
