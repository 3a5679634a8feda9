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

/// erf in f32: Numerical Recipes' Chebyshev fit of erfc (fractional error under
/// 1.2e-7), so the absolute error of erf stays near f32 rounding everywhere.
#[inline]
pub fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.5 * a);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204
                                + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * (-a * a + poly).exp();
    let r = 1.0 - erfc;
    if x < 0.0 {
        -r
    } else {
        r
    }
}
