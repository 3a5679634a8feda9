// `kiln::embed!` into an int8 instance checks the file's values by the int8 format's
// rules, as every load does: a NaN scale (valid checksums) is a build error naming the
// tensor and the row, not a model that answers NaN.

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
    let _weights = kiln::embed!(TinyInt8, "../fixtures/tiny_int8_nan_scale.safetensors");
}
