use kiln::prelude::*;

#[model]
struct Wide<const D: usize, const C: usize> {
    fc: Linear<D, C>,
}

#[model]
impl<const D: usize, const C: usize> Wide<D, C> {
    fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, C> {
        self.fc(x)
    }
}

// Sizes are given in order: Rust reads `D = 64` as an associated-const binding.
#[model]
type Named = Wide<C = 10, D = 64>;

fn main() {}
