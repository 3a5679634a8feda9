// `kiln::embed!`'s path is a string literal or `concat!` of literals and `env!`
// (a checkpoint a build script wrote to `OUT_DIR`): an unset variable or another
// macro is refused, saying what it takes.

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
    let _unset = kiln::embed!(Tiny, concat!(env!("KILN_UI_UNSET"), "/tiny.safetensors"));
    let _other = kiln::embed!(Tiny, format!("tiny.safetensors"));
}
