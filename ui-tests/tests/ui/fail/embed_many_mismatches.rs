// A checkpoint of another model: every tensor that does not fit is named in one error.

use kiln::prelude::*;

#[model]
struct Other {
    fc: Linear<5, 3>,
    head: Linear<3, 2>,
}

#[model]
impl Other {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 5>) -> Tensor<B, 2> {
        self.head(self.fc(x))
    }
}

fn main() {
    let _weights = kiln::embed!(Other, "../fixtures/tiny.safetensors");
}
