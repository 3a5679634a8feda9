//! The elementwise chain of workload W2, written with `#[model]` so that it is planned
//! at build time into one fused kernel (the benchmarks time it against the same chain
//! run op by op).

use kiln::prelude::*;

/// W2's chain: no parameters, one fused elementwise kernel.
#[model]
pub struct Chain {}

#[model]
impl Chain {
    /// relu(x·1.5 + 0.5) · sigmoid(x).
    pub fn forward<const N: usize>(&self, x: Tensor<N>) -> Tensor<N> {
        (x * 1.5 + 0.5).relu() * x.sigmoid()
    }
}
