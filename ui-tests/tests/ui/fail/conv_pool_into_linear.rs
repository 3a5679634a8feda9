use kiln::prelude::*;

#[model]
struct Net {
    conv: Conv2d<1, 16, 5>,
    pool: MaxPool2d<2>,
    fc: Linear<3136, 10>,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 1, 28, 28>) -> Tensor<B, 10> {
        let h = self.pool(self.conv(x).relu());
        self.fc(h.flatten())
    }
}

fn main() {}
