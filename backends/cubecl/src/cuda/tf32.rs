//! The TF32 switch: whether f32 matrix products may run on TF32 tensor cores (off by
//! default, as PyTorch's `allow_tf32`). The cuBLASLt matmul ([`super::cublaslt`]) reads
//! it when it picks a product's compute type and names the product's problem.

use std::sync::atomic::{AtomicBool, Ordering};

static TF32: AtomicBool = AtomicBool::new(false);

/// Lets f32 products use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation),
/// as PyTorch's `allow_tf32`. Off by default: f32 products are then exact f32 GEMMs.
pub fn set_allow_tf32(allow: bool) {
    TF32.store(allow, Ordering::SeqCst);
}

/// Whether f32 products may use TF32.
pub fn allow_tf32() -> bool {
    TF32.load(Ordering::SeqCst)
}
