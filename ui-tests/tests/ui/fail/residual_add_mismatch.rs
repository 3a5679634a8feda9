use kiln::prelude::*;

#[model]
struct Block {
    fc1: Linear<64, 32>,
    fc2: Linear<32, 32>,
}

#[model]
impl Block {
    fn forward<const B: usize>(&self, x: Tensor<B, 64>) -> Tensor<B, 32> {
        let h = self.fc2(self.fc1(x).relu());
        h + x
    }
}

fn main() {}
