use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<8, 8>,
}

impl<Be: Backend> Net<Be> {
    fn helper(&self) -> usize {
        1
    }
}

#[model]
impl Net {
    // An early return says what it is, once.
    fn early<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        return self.fc(x);
    }

    // A method of a plain `impl` cannot be called from a model body.
    fn helped<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        self.helper(x)
    }
}

#[model]
struct Wide<const D: usize> {
    fc: Linear<D, D>,
}

#[model]
impl Wide {
    // A branch on a size is an `if`, not a size expression.
    fn pick<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        if D > 64 {
            self.fc(x)
        } else {
            x
        }
    }
}

#[model]
type Wide128 = Wide<128>;

fn main() {}
