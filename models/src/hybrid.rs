//! A `#[model]` with a part on the dynamic path (the escape hatch): [`HybridMlp`]'s
//! forward pass is planned at build time around a call to [`Refiner`], a module whose
//! depth is a run-time setting, written in plain Rust over lazy tensors. The plan calls
//! out to it, checks the shape it returns against the shape the call declares, and
//! runs its backward pass where the build-time backward pass reaches it. The tests
//! hold it equal to the same network all `#[model]` (the refiner at depth one), which
//! lives with them (models/tests/support/dynamic_equal.rs).

use crate::dynamic::DynamicResidualMlp;
use kiln::dynamic::{DynamicModule, LazyTensor};
use kiln::prelude::*;
use kiln::tensor::nn::{join, Mode};
use kiln::tensor::Result;
use kiln::Module;

/// The residual block of `parts::ResidualMlp` (width 32) applied `depth` times with
/// shared weights: how many is decided at run time, per call if need be.
#[derive(Module)]
#[module(init = Refiner::init_named)]
pub struct Refiner<Be: Backend> {
    block: DynamicResidualMlp<Be>,
    #[module(skip)]
    depth: usize,
}

impl<Be: Backend> Refiner<Be> {
    /// Depth one, its block named `<prefix>.block` and initialised from `seed` as
    /// `parts::ResidualMlp` is under that name.
    pub fn init_named(dev: &Be::Device, seed: u64, prefix: &str) -> Result<Self> {
        Ok(Refiner {
            block: DynamicResidualMlp::new(32, dev, seed, &join(prefix, "block"))?,
            depth: 1,
        })
    }

    /// How many times the block is applied.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Sets how many times the block is applied.
    pub fn set_depth(&mut self, depth: usize) {
        self.depth = depth;
    }
}

impl<Be: Backend> DynamicModule<Be> for Refiner<Be> {
    fn forward(&self, x: &LazyTensor<Be>, _mode: Mode) -> Result<LazyTensor<Be>> {
        let mut h = x.clone();
        for _ in 0..self.depth {
            h = self.block.forward(&h)?;
        }
        Ok(h)
    }
}

/// A regression MLP `16 -> 32 -> refine -> 4` whose middle is the dynamic [`Refiner`].
#[model]
pub struct HybridMlp {
    input: Linear<16, 32>,
    #[dynamic]
    refine: Refiner,
    head: Linear<32, 4>,
}

#[model]
impl HybridMlp {
    /// The prediction for a batch of rows.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let h = self.input(x).relu();
        let h = self.refine.forward::<B, 32>(h);
        self.head(h)
    }

    /// Mean squared error against `y`.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, 4>) -> Tensor {
        (self.forward(x) - y).square().mean_all()
    }

    /// The refiner called twice, the second time on the first call's output plus the
    /// input layer's (two call sites of one part: their gradients add up).
    pub fn forward_twice<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let h = self.input(x).relu();
        let r = self.refine.forward::<B, 32>(h);
        self.head(self.refine.forward::<B, 32>(r + h))
    }

    /// Mean squared error of `forward_twice` against `y`.
    pub fn loss_twice<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, 4>) -> Tensor {
        (self.forward_twice(x) - y).square().mean_all()
    }
}

impl<Be: Backend> HybridMlp<Be> {
    /// The dynamic part, to change its depth.
    pub fn refiner_mut(&mut self) -> &mut Refiner<Be> {
        &mut self.refine
    }
}
