use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 4>,
}

#[model]
impl Net {
    fn scores<const B: usize>(&self, q: Tensor<B, 8, 16>, k: Tensor<B, 8, 32>) -> Tensor<B, 8, 8> {
        q.matmul(k.permute::<0, 2, 1>())
    }
}

fn main() {}
