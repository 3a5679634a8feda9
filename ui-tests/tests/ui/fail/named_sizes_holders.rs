use kiln::prelude::*;

#[model]
struct Block<const D: usize> {
    fc: Linear<D, D>,
}

#[model]
impl Block {
    // A method's size named like the model's.
    fn forward<const D: usize>(&self, x: Tensor<D, 8>) -> Tensor<D, 8> {
        x
    }
}

// A model without sizes holds a model with sizes directly.
#[model]
struct Holder {
    block: Block<64>,
}

// A model without sizes holds a model with sizes without giving them.
#[model]
struct Bare {
    block: Block,
}

#[model]
impl Bare {
    fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        x
    }
}

// A const item is not a size the macro can read.
const HIDDEN: usize = 128;

#[model]
struct Net<const D: usize> {
    fc: Linear<D, HIDDEN>,
}

#[model]
impl Net {}

#[model]
type Net32 = Net<32>;

// A size that is not a number.
#[model]
type NotANumber = Block<HIDDEN>;

fn main() {}
