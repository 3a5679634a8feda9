use kiln::prelude::*;

mod blocks {
    use kiln::prelude::*;

    #[model]
    pub struct Block {
        up: Linear<32, 64>,
        down: Linear<64, 32>,
    }

    #[model]
    impl Block {
        pub fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
            x + self.down(self.up(x).relu())
        }
    }
}

#[model]
struct Net {
    embed: Linear<16, 24>,
    blocks: [blocks::Block; 2],
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 32> {
        let h = self.embed(x);
        self.blocks[0](h)
    }

    fn other<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.blocks[1].attend(x)
    }
}

fn main() {}
