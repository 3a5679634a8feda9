use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 4>,
}

#[model]
impl Net {
    fn scale<const B: usize>(&self, x: Tensor<B, 10>, w: Tensor<3>) -> Tensor<B, 10> {
        x * w
    }
}

fn main() {}
