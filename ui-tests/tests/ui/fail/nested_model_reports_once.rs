use kiln::prelude::*;

#[model]
pub struct Block {
    up: Linear<32, 64>,
    down: Linear<64, 32>,
}

#[model]
impl Block {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        x + self.down(x)
    }
}

#[model]
pub struct Broken {
    fc: Linaer<32, 32>,
}

#[model]
struct Net {
    block: Block,
    broken: Broken,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        let h = self.block(x);
        self.broken(h)
    }
}

fn main() {}
