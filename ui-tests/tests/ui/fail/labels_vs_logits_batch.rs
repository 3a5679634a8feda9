use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<784, 10>,
}

#[model]
impl Net {
    fn loss<const B: usize, const C: usize>(&self, x: Tensor<B, 784>, y: Tensor<C, i32>) -> Tensor {
        self.fc(x).cross_entropy(y)
    }
}

fn main() {}
