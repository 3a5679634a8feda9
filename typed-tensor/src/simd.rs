//! Run-time choice of vector instructions for CPU loops. Builds target the x86-64
//! baseline (SSE2: four f32 lanes, so binaries run on any x86-64 machine); a loop run
//! through [`wide`] is compiled a second time with AVX2 and FMA (eight lanes) and that
//! copy runs where the CPU has them (every Intel and AMD x86-64 CPU since about 2015).
//!
//! Results do not change with the choice: Rust never contracts `a * b + c` into a fused
//! multiply-add or reorders float arithmetic, so the wider copy computes lane by lane
//! what the baseline copy computes, to the bit.

/// Runs `f`, compiled with AVX2 and FMA where the CPU has them. `f` and what it calls
/// are compiled into the wider copy only where they are inlined into it: pass an
/// `#[inline(always)]` closure (`wide(#[inline(always)] || ..)`; a large closure left
/// to the optimiser stays a baseline function) that calls `#[inline(always)]` helpers,
/// around a whole loop, not per element.
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

#[cfg(test)]
mod tests {
    use super::wide;
    use crate::fused::{binary_f32, unary_f32};
    use crate::{BinaryOp, UnaryOp};

    /// Values over every range the formulas branch on: tiny, ordinary, huge, the
    /// exponential's limits, zeros, infinities and NaN.
    fn values() -> Vec<f32> {
        let mut v: Vec<f32> = (0..4096)
            .map(|i| {
                let t = (i as f32 * 0.618_034).fract();
                let magnitude = 10f32.powf(t * 16.0 - 8.0);
                if i % 2 == 0 {
                    magnitude
                } else {
                    -magnitude
                }
            })
            .collect();
        v.extend([0.0, -0.0, 1.0, -1.0, 88.7, 89.0, -87.5, -104.0]);
        v.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
        ]);
        v
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn the_wide_copy_computes_every_op_to_the_bit() {
        let xs = values();
        let ys: Vec<f32> = xs.iter().rev().copied().collect();
        for &op in UnaryOp::ALL {
            let plain: Vec<f32> = xs.iter().map(|&x| unary_f32(op, x)).collect();
            let mut vector = vec![0.0; xs.len()];
            wide(
                #[inline(always)]
                || {
                    for (o, &x) in vector.iter_mut().zip(&xs) {
                        *o = unary_f32(op, x);
                    }
                },
            );
            assert_eq!(bits(&plain), bits(&vector), "{op:?}");
        }
        for &op in BinaryOp::ALL {
            let plain: Vec<f32> = xs
                .iter()
                .zip(&ys)
                .map(|(&x, &y)| binary_f32(op, x, y))
                .collect();
            let mut vector = vec![0.0; xs.len()];
            wide(
                #[inline(always)]
                || {
                    for ((o, &x), &y) in vector.iter_mut().zip(&xs).zip(&ys) {
                        *o = binary_f32(op, x, y);
                    }
                },
            );
            assert_eq!(bits(&plain), bits(&vector), "{op:?}");
        }
    }
}
