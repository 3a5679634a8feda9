//! The `Collective` trait: how the ranks of a data-parallel run (replicas of one model,
//! each on its own device or thread) exchange tensors. Declared here, beside
//! [`Backend`], so that a backend crate implements it for its own devices (NCCL on
//! CUDA) and the training strategy in `kiln-train` is written once against it.

use crate::backend::Backend;
use crate::error::Result;
use crate::raw::RawTensor;

/// How ranks exchange tensors: every rank calls the same operations, in the same order,
/// with tensors of the same dims and dtypes. A call waits for every rank; a rank that
/// died or fell behind makes it fail with an error, never hang forever.
pub trait Collective<B: Backend> {
    /// This rank's number, `0..world`.
    fn rank(&self) -> usize;
    /// How many ranks there are.
    fn world(&self) -> usize;
    /// Each of `tensors` averaged element-wise over the ranks, the same bits on every
    /// rank. The tensors are one bucket: an implementation may send them together.
    fn all_reduce_mean(&self, tensors: &[RawTensor<B>]) -> Result<Vec<RawTensor<B>>>;
    /// Rank `root`'s `tensors`, on every rank.
    fn broadcast(&self, tensors: &[RawTensor<B>], root: usize) -> Result<Vec<RawTensor<B>>>;
    /// Whether its exchanges are device work that a captured graph can hold and replay
    /// (NCCL's are); exchanges through the host are not.
    fn captures(&self) -> bool {
        false
    }
}
