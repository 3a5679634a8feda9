//! `Real`: the compute types (f32, f64) that op formulas are written over, with the
//! functions `num-traits` lacks (erf, a stable sigmoid). One formula per op, evaluated
//! in f64 it is the reference, in f32 the fused loops and CPU kernels.

use num_traits::Float;

/// A compute type of the op formulas.
pub trait Real: Float + Send + Sync + Default + std::iter::Sum + 'static {
    /// The error function.
    fn erf(self) -> Self;
    /// Converts from f64.
    fn from_f64_(v: f64) -> Self;
    /// e^x: the platform's in f64 (the reference), in f32 a branch-free polynomial
    /// ([`crate::op::exp_f32`]) that the fused loops vectorise.
    fn exp_(self) -> Self;
    /// 1 / (1 + e^-x), without overflow for large |x|.
    #[inline(always)]
    fn sigmoid(self) -> Self {
        let one = Self::one();
        if self >= Self::zero() {
            one / (one + (-self).exp_())
        } else {
            let e = self.exp_();
            e / (one + e)
        }
    }
}

impl Real for f64 {
    fn erf(self) -> Self {
        crate::op::erf_f64(self)
    }
    #[inline(always)]
    fn from_f64_(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn exp_(self) -> Self {
        self.exp()
    }
}

impl Real for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        crate::op::erf_f32(self)
    }
    #[inline(always)]
    fn from_f64_(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn exp_(self) -> Self {
        crate::op::exp_f32(self)
    }
}
