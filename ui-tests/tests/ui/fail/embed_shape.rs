// `kiln::embed!` checks the file against the model at build time: a tensor that does
// not fit is a compile error naming it and both sides.

use kiln::prelude::*;

#[model]
struct Tiny {
    fc: Linear<4, 3>,
}

#[model]
impl Tiny {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 3> {
        self.fc(x)
    }
}

fn main() {
    let _weights = kiln::embed!(Tiny, "../fixtures/tiny_shape.safetensors");
}
