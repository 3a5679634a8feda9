use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<8, 4>,
}

#[model]
impl Net {
    fn act<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 4> {
        self.fc(x).relu::<7>()
    }

    fn probs<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 4> {
        self.fc(x).softmax::<0>()
    }
}

fn main() {}
