// Two nested models of one name are refused once: the holder keeps its fields and
// methods, so code reading them (and the Learner) adds no error of its own.

use kiln::prelude::*;
use kiln::train::learner::Learner;
use kiln::train::optim::{Sgd, SgdConfig};

mod encoder {
    use kiln::prelude::*;

    #[model]
    pub struct Block {
        fc: Linear<16, 16>,
    }

    #[model]
    impl Block {
        pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 16> {
            self.fc(x).relu()
        }
    }
}

mod decoder {
    use kiln::prelude::*;

    #[model]
    pub struct Block {
        fc: Linear<16, 8>,
    }

    #[model]
    impl Block {
        pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 8> {
            self.fc(x)
        }
    }
}

#[model]
struct Net {
    enc: encoder::Block,
    dec: decoder::Block,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 8> {
        self.dec(self.enc(x))
    }

    fn loss<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

fn main() {
    use kiln::cpu::{Cpu, CpuDevice};
    let net = Net::<Cpu>::init(&CpuDevice, 0).unwrap();
    let _encoder = &net.enc;
    let _decoder = &net.dec;
    let x = Tensor::<Cpu, Rank2<2, 16>>::zeros(&CpuDevice).unwrap();
    let y = Tensor::<Cpu, Rank1<2>, i32>::zeros(&CpuDevice).unwrap();
    let _ = net.forward(&x);
    let _ = net.loss_and_grad(&x, &y);
    let sgd = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let _learner = Learner::new(net, sgd, CpuDevice);
}
