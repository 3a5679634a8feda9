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

// f16 needs loss scaling, which Kiln lacks.
#[model(precision = f16)]
type MlpF16 = Mlp;

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
