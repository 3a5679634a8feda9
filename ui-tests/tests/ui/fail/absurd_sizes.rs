use kiln::prelude::*;

#[model]
struct TooLarge {
    huge: Linear<99999999999999999999999, 2>,
}

#[model]
struct TooManyWeights {
    fc: Linear<4294967296, 4294967296>,
}

#[model]
struct Fine {
    fc: Linear<2, 2>,
}

#[model]
impl Fine {
    fn flat<const B: usize>(&self, x: Tensor<B, 1048576, 1048576, 1048576>) -> Tensor<B> {
        x.flatten().sum::<1>()
    }
}

fn main() {}
