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
            fc: Layer::linear(32, 32, dev, seed, &kiln::tensor::nn::join(prefix, "fc"))?,
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
    fn undeclared<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.part(x)
    }

    fn no_shape<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.part.forward(x)
    }

    fn run_time_dim<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.part.forward::<B, Dyn>(x)
    }

    fn other_method<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.part.run::<B, 32>(x)
    }

    fn dtype_first<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.part.forward::<f64, B, 32>(x)
    }

    fn declared_shape_misused<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.part.forward::<B, 16>(x) + x
    }
}

fn main() {}
