// `kiln::embed!` takes one option, `foreign`: anything else is refused by name.

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
    let _weights = kiln::embed!(Tiny, "../fixtures/tiny.safetensors", frobnicate);
}
