use kiln::prelude::*;
use kiln_example_model::Residual;

#[model]
struct Mine {
    input: Linear<8, 24>,
    block: Residual,
}

#[model]
impl Mine {
    fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 32> {
        self.block(self.input(x))
    }
}

fn main() {}
