use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 4>,
}

#[model]
impl Net {
    fn join<const B: usize>(&self, a: Tensor<B, 3, 4>, b: Tensor<B, 5, 6>) -> Tensor<B, 8, 4> {
        a.concat::<1>(b)
    }
}

fn main() {}
