use kiln::prelude::*;

#[model]
struct Net {
    conv: Conv2d<1, 8, 3>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 8, 26, 26> {
        self.conv(x)
    }
}

fn main() {}
