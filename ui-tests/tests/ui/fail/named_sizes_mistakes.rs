use kiln::prelude::*;

#[model]
struct Attention<const D: usize, const H: usize> {
    q: Linear<D, D>,
}

#[model]
impl Attention {
    fn heads<const B: usize>(&self, x: Tensor<B, 8, D>) -> Tensor<B, H, 8, { D / H }> {
        self.q(x).reshape::<B, 8, H, { D / H }>().permute::<0, 2, 1, 3>()
    }
}

// Three heads do not divide a width of 16.
#[model]
type Uneven = Attention<16, 3>;

// Two sizes given where the model has two, but only one here.
#[model]
type OneSize = Attention<16>;

#[model]
struct Mlp<const D: usize> {
    up: Linear<D, { 4 * D }>,
    down: Linear<{ 4 * D }, { D - 32 }>,
}

#[model]
impl Mlp {
    // A residual over the hidden width: `4 * D` is not `D`.
    fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        x + self.up(x)
    }
}

// `D - 32` is no size at D = 32.
#[model]
type Narrow = Mlp<32>;

// At D = 64 only the residual is wrong.
#[model]
type Wide = Mlp<64>;

fn main() {}
