use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<784, 10>,
}

#[model]
impl Net {
    fn loss<const B: usize>(&self, x: Tensor<B, 784>, y: Tensor<B, f32>) -> Tensor {
        self.fc(x).cross_entropy(y)
    }

    fn mix<const B: usize>(&self, x: Tensor<B, 784>, ids: Tensor<B, 784, i32>) -> Tensor<B, 784> {
        x + ids
    }
}

fn main() {}
