use kiln::prelude::*;

#[model]
struct Net {
    fc1: Linear<784, 10>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 10> {
        self.fc2(x)
    }

    fn probs<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 10> {
        self.fc1(x).softmaxx()
    }
}

fn main() {}
