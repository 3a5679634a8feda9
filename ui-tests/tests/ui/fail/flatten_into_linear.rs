use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<784, 10>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 3, 28, 28>) -> Tensor<B, 10> {
        self.fc(x.flatten())
    }
}

fn main() {}
