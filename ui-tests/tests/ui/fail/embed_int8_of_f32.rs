// `kiln::embed!` into an int8 instance checks the file against the int8 weights and
// per-row scales the instance holds: an f32 checkpoint is not one, and says so tensor
// by tensor.

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

#[model(precision = int8)]
type TinyInt8 = Tiny;

fn main() {
    let _weights = kiln::embed!(TinyInt8, "../fixtures/tiny.safetensors");
}
