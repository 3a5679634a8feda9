use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 1>,
    q: Linear<4, 16>,
}

#[model]
impl Net {
    // `[B, 1]` against `[B]` would average over `[B, B]`.
    fn loss<const B: usize>(&self, x: Tensor<B, 4>, y: Tensor<B>) -> Tensor {
        self.fc(x).mse(y)
    }

    // Scores that are not queries × keys of one sequence.
    fn masked<const B: usize>(&self, x: Tensor<B, 8, 4>) -> Tensor<B, 8, 16> {
        self.q(x).causal_mask()
    }

    // Two open sizes cannot both be solved from the element count.
    fn heads<const B: usize>(&self, x: Tensor<B, 8, 4>) -> Tensor<B, 8, 4, 4> {
        self.q(x).reshape::<Dyn, Dyn, 4, 4>()
    }

    // The axis of a reduction goes in the turbofish.
    fn average<const B: usize>(&self, x: Tensor<B, 8, 4>) -> Tensor<B, 4> {
        x.mean(1)
    }

    // Elements 4..12 of an axis of 8.
    fn window<const B: usize>(&self, x: Tensor<B, 8, 4>) -> Tensor<B, 8, 4> {
        x.narrow::<1, 4, 8>()
    }

    // `narrow` takes the axis, the start and the count.
    fn head<const B: usize>(&self, x: Tensor<B, 8, 4>) -> Tensor<B, 4, 4> {
        x.narrow::<1, 4>()
    }

    // `argmax` has no `_all` form to suggest.
    fn best<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, i32> {
        x.argmax()
    }
}

fn main() {}
