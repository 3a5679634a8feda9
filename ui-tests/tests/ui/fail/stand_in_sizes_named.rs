// A definition is checked where it is written at stand-in sizes; its messages name
// the sizes as written (`D`, `4 * D + 1`), never a stand-in's number that the user
// could read as their own.

use kiln::prelude::*;

// `down` takes `4 * D + 1` features where `up` gives `4 * D`.
#[model]
pub struct Mlp<const D: usize> {
    up: Linear<D, { 4 * D }>,
    down: Linear<{ 4 * D + 1 }, D>,
}

#[model]
impl Mlp {
    pub fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.down(self.up(x).relu())
    }
}

#[model]
type Mlp128 = Mlp<128>;

// A width of 64 written as a number beside a size: the stand-ins avoid 64, so the
// message's 64 is the user's and the heads are `H` (`[B, 64]` holds no `H` rows of 64).
#[model]
pub struct Heads<const H: usize> {
    proj: Linear<64, 64>,
}

#[model]
impl Heads {
    pub fn split<const B: usize>(&self, x: Tensor<B, 64>) -> Tensor<B, H, 64> {
        self.proj(x).reshape::<B, H, 64>()
    }
}

fn main() {}
