use kiln::prelude::*;

#[model]
struct Mine {
    blocks: [kiln_example_model::Residual; 2],
}

#[model]
impl Mine {
    fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        let h = self.blocks[0].attend(x);
        self.blocks[2](h)
    }
}

fn main() {}
