use kiln::prelude::*;

// A learned tensor's dims are fixed when the model is built, and it is stored in f32.
#[model]
struct Shapes {
    open: Param<Dyn, 8>,
    typed: Param<4, bf16>,
    empty: Param<0>,
}

#[model]
struct Tokens {
    embed: Linear<4, 8>,
    cls: Param<1, 8>,
}

#[model]
impl Tokens {
    // A learned tensor is a value, not a layer.
    fn called<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 8> {
        self.cls(self.embed(x))
    }

    // Its shape is checked like any tensor's.
    fn added<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 8> {
        x + self.cls
    }
}

fn main() {}
