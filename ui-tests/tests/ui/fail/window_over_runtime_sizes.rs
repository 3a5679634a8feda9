use kiln::prelude::*;

#[model]
struct Net {
    conv: Conv2d<1, 4, 3>,
    pool: MaxPool2d<2>,
}

#[model]
impl Net {
    fn forward(&self, x: Tensor<Dyn, 1, Dyn, 28>) -> Tensor<Dyn, 4, Dyn, 13> {
        self.conv(x)
    }

    fn pooled<const H: usize>(&self, x: Tensor<Dyn, 4, H, H>) -> Tensor<Dyn, 4, Dyn, Dyn> {
        self.pool(x)
    }
}

fn main() {}
