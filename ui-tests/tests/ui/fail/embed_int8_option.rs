// An int8 checkpoint goes into the model's int8 instance: the option `int8` of
// `embed!` says what to write instead.

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
