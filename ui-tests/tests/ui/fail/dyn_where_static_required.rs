use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<784, 10>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<Dyn, 784>) -> Tensor<B, 10> {
        self.fc(x)
    }
}

fn main() {}
