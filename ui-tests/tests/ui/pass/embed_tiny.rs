// `kiln::embed!` builds a checkpoint into the program, checked against the model when
// the program compiles; the embedded weights load and compute.

use kiln::cpu::{Cpu, CpuDevice};
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
    let weights = kiln::embed!(Tiny, "../fixtures/tiny.safetensors");
    let model = weights.load::<Cpu>(&CpuDevice).unwrap();
    let x = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[1, 4], &CpuDevice).unwrap();
    let y = model.forward::<1>(&x).unwrap().to_vec().unwrap();
    // Row i of the weight times x, plus the bias: columns 0 and 3 of [3, 4].
    assert_eq!(y, vec![0.5 + 0.25 + 0.1, 1.5 + 1.0 - 0.2, -2.0 - 0.25 + 0.3]);
}
