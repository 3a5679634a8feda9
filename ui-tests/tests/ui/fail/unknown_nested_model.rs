use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<784, 10>,
    flat: Flaten,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 784>) -> Tensor<B, 10> {
        self.fc(x)
    }
}

fn main() {}
