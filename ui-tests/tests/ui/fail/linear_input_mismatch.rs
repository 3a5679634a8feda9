use kiln::prelude::*;

#[model]
struct Net {
    fc1: Linear<784, 128>,
    fc2: Linear<64, 10>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 10> {
        let h = self.fc1(x).relu();
        self.fc2(h)
    }
}

fn main() {}
