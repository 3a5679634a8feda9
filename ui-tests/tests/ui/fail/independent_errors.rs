use kiln::prelude::*;

#[model]
struct Net {
    fc1: Linear<8, 16>,
    fc2: Linear<32, 4>,
}

#[model]
impl Net {
    // Three independent mistakes: each is reported, and nothing that follows from them.
    fn forward<const B: usize>(&self, x: Tensor<B, 8>, m: Tensor<B, 4, 3>) -> Tensor<B, 4> {
        let h = self.fc1(x).relu();
        let y = self.fc2(h);
        let z = m.matmul(m);
        let w = x.sum::<2>();
        y + z + w
    }
}

fn main() {}
