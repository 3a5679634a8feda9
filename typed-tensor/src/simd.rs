//! Run-time choice of vector instructions for CPU loops. Builds target the x86-64
//! baseline (SSE2: four f32 lanes, so binaries run on any x86-64 machine); a loop run
//! through [`wide`] is compiled a second time with AVX2 and FMA (eight lanes) and that
//! copy runs where the CPU has them (every Intel and AMD x86-64 CPU since about 2015).
//!
//! Results do not change with the choice: Rust never contracts `a * b + c` into a fused
//! multiply-add or reorders float arithmetic, so the wider copy computes lane by lane
//! what the baseline copy computes, to the bit.

/// Runs `f`, compiled with AVX2 and FMA where the CPU has them. `f` and what it calls
/// inline into the wider copy only where they are inlined (closures and
/// `#[inline(always)]` helpers are): call it around a whole loop, not per element.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return unsafe { with_avx2_fma(f) };
        }
    }
    f()
}

/// Whether the CPU has AVX2 and FMA (std caches the answer).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// `f` compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}
