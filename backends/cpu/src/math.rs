//! Scalar math in the compute types (f32, f64): the op table's `Real` trait, which the
//! float kernels are generic over (so they evaluate the op table's formulas).

pub use kiln_tensor::real::Real;

/// erf in f32 (shared with fused kernels, so that fused and unfused agree bit for bit).
pub use kiln_tensor::op::erf_f32;
