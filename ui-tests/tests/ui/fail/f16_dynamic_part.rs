// An f16 instance's loss scaling does not reach a dynamic part's own backward pass:
// training one under f16 is refused where the loss is, not left to scale its
// gradients silently.
use kiln::dynamic::{DynamicModule, Layer, LazyTensor};
use kiln::prelude::*;
use kiln::tensor::nn::Mode;
use kiln::Module;

#[derive(Module)]
#[module(init = Part::init_named)]
struct Part<Be: Backend> {
    fc: Layer<Be>,
}

impl<Be: Backend> Part<Be> {
    fn init_named(dev: &Be::Device, seed: u64, prefix: &str) -> kiln::tensor::Result<Self> {
        Ok(Part {
            fc: Layer::linear(8, 8, dev, seed, &kiln::tensor::nn::join(prefix, "fc"))?,
        })
    }
}

impl<Be: Backend> DynamicModule<Be> for Part<Be> {
    fn forward(&self, x: &LazyTensor<Be>, mode: Mode) -> kiln::tensor::Result<LazyTensor<Be>> {
        self.fc.forward(x, mode)
    }
}

#[model]
struct Net {
    #[dynamic]
    part: Part,
}

#[model]
impl Net {
    fn loss<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor {
        self.part.forward::<B, 8>(x).square().mean_all()
    }
}

#[model(precision = f16)]
type NetF16 = Net;

fn main() {}
