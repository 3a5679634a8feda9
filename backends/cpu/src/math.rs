//! Scalar math in the compute types (f32, f64): the functions `num-traits` lacks (erf,
//! sigmoid) and the `Real` trait the float kernels are generic over.

use num_traits::Float;

/// A compute type of the float kernels.
pub trait Real: Float + Send + Sync + Default + std::iter::Sum + 'static {
    /// The error function.
    fn erf(self) -> Self;
    /// Converts from f64.
    fn from_f64_(v: f64) -> Self;
    /// 1 / (1 + e^-x), without overflow for large |x|.
    #[inline(always)]
    fn sigmoid(self) -> Self {
        let one = Self::one();
        if self >= Self::zero() {
            one / (one + (-self).exp())
        } else {
            let e = self.exp();
            e / (one + e)
        }
    }
}

impl Real for f64 {
    fn erf(self) -> Self {
        kiln_tensor::op::erf_f64(self)
    }
    #[inline(always)]
    fn from_f64_(v: f64) -> Self {
        v
    }
}

impl Real for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        erf_f32(self)
    }
    #[inline(always)]
    fn from_f64_(v: f64) -> Self {
        v as f32
    }
}

/// erf in f32 (shared with fused kernels, so that fused and unfused agree bit for bit).
pub use kiln_tensor::op::erf_f32;
