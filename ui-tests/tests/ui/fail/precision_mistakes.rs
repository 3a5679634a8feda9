use kiln::prelude::*;

#[model]
struct Mlp {
    fc: Linear<4, 2>,
}

#[model]
impl Mlp {
    fn forward<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.fc(x)
    }
}

// Not a precision.
#[model(precision = fp8)]
type MlpFp8 = Mlp;

// Not an argument.
#[model(dtype = bf16)]
type MlpDtype = Mlp;

// A precision belongs to an instance, not to the definition.
#[model(precision = bf16)]
struct Other {
    fc: Linear<4, 2>,
}

fn main() {}
