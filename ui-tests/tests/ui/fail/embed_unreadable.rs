// `kiln::embed!` refuses a file that is not there or not a safetensors file, naming it.

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
    let _absent = kiln::embed!(Tiny, "../fixtures/absent.safetensors");
    let _text = kiln::embed!(Tiny, "../fixtures/not_safetensors.txt");
}
