use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 1>,
}

#[model]
impl Net {
    // A hand-written L1 loss: the prediction is [B, 1] and the target [B], so the
    // difference would be the outer [B, B].
    fn l1<const B: usize>(&self, x: Tensor<B, 4>, y: Tensor<B>) -> Tensor {
        (self.fc(x) - y).abs().mean_all()
    }

    // Centring rows: the mean over axis 1 removed that axis, so it lines up with the
    // wrong one.
    fn centred<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        x - x.mean::<1>()
    }

    // The same on a `Dyn` batch, which may be square at run time.
    fn centred_dyn(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x - x.mean::<1>()
    }

    // Written with the axis kept, or the outer product written out: accepted.
    fn centred_kept<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        x - x.mean::<1>().reshape::<B, 1>()
    }
    fn outer<const B: usize>(&self, p: Tensor<B, 1>, y: Tensor<B>) -> Tensor<B, B> {
        p.broadcast_to::<B, B>() - y
    }
}

fn main() {}
