// `kiln::embed!(.., int8)` checks the file against the model's weights as int8 with
// per-row scales: an f32 checkpoint is not one, and says so tensor by tensor.

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
    let _weights = kiln::embed!(Tiny, "../fixtures/tiny.safetensors", int8);
}
