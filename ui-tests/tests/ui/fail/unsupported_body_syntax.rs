use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<8, 8>,
}

fn helper<T>(x: T) -> T {
    x
}

#[model]
impl Net {
    fn branch<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        if true {
            self.fc(x)
        } else {
            x
        }
    }

    fn fallible<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        self.fc(x)?
    }

    fn helped<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        helper(self.fc(x))
    }
}

fn main() {}
