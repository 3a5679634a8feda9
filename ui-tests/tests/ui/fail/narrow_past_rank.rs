// `narrow` on an axis the tensor does not have names the axis and the tensor's rank.

use kiln::prelude::*;

#[model]
struct Crop {
    fc: Linear<16, 8>,
}

#[model]
impl Crop {
    fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 8> {
        self.fc(x).narrow::<2, 0, 8>()
    }
}

fn main() {}
