// `kiln::embed!` reads a relative path from the folder of the file that calls it, as
// `include_bytes!` does; a path written from the crate's root is not there, and the
// error says where it looked.

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
    let _weights = kiln::embed!(Tiny, "tests/ui/fixtures/tiny.safetensors");
}
