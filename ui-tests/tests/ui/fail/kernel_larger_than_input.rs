use kiln::prelude::*;

#[model]
struct Net {
    conv: Conv2d<1, 8, 7>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 1, 5, 5>) -> Tensor<B, 8, 1, 1> {
        self.conv(x)
    }
}

fn main() {}
