//! Run-time choice of vector instructions for CPU loops. Builds target the x86-64
//! baseline (SSE2: four f32 lanes, so binaries run on any x86-64 machine); a loop run
//! through [`wide`] is compiled twice more, with AVX2 and FMA (eight lanes; every Intel
//! and AMD x86-64 CPU since about 2015) and with AVX-512 (sixteen lanes; Intel server
//! CPUs since Skylake, AMD since Zen 4), and the widest copy the CPU runs is the one
//! that runs.
//!
//! Results do not change with the choice: Rust never contracts `a * b + c` into a fused
//! multiply-add or reorders float arithmetic, so a wider copy computes lane by lane
//! what the baseline copy computes, to the bit.

/// Runs `f`, compiled with AVX-512, or AVX2 and FMA, where the CPU has them. `f` and
/// what it calls are compiled into the wider copies only where they are inlined into
/// them: pass an `#[inline(always)]` closure (`wide(#[inline(always)] || ..)`; a large
/// closure left to the optimiser stays a baseline function) that calls
/// `#[inline(always)]` helpers, around a whole loop, not per element.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512() {
            // SAFETY: the CPU has AVX-512 F/BW/DQ/VL, AVX2 and FMA (checked above).
            return unsafe { with_avx512(f) };
        }
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

/// Whether the CPU has the AVX-512 subsets [`with_avx512`] is compiled for, besides
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && avx2_fma()
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

/// `f` compiled with AVX-512 (F, BW, DQ, VL), AVX2 and FMA.
///
/// # Safety
/// The CPU must have them all (see [`avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
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

    /// `body`'s result from every copy this CPU runs: baseline, AVX2 and AVX-512.
    fn every_copy(body: impl Fn() -> Vec<u32> + Copy) -> Vec<(&'static str, Vec<u32>)> {
        let mut v = vec![("baseline", body())];
        #[cfg(target_arch = "x86_64")]
        {
            if super::avx2_fma() {
                // SAFETY: checked just above.
                v.push(("avx2", unsafe { super::with_avx2_fma(body) }));
            }
            if super::avx512() {
                // SAFETY: checked just above.
                v.push(("avx512", unsafe { super::with_avx512(body) }));
            }
        }
        v.push(("wide", wide(body)));
        v
    }

    #[test]
    fn every_copy_computes_every_op_to_the_bit() {
        let xs = values();
        let ys: Vec<f32> = xs.iter().rev().copied().collect();
        let check = |what: String, copies: Vec<(&str, Vec<u32>)>| {
            let (_, plain) = &copies[0];
            for (name, got) in &copies[1..] {
                assert_eq!(
                    plain, got,
                    "{what}: the {name} copy differs from the baseline"
                );
            }
        };
        for &op in UnaryOp::ALL {
            let copies = every_copy(
                #[inline(always)]
                || bits(&xs.iter().map(|&x| unary_f32(op, x)).collect::<Vec<_>>()),
            );
            check(format!("{op:?}"), copies);
        }
        for &op in BinaryOp::ALL {
            let copies = every_copy(
                #[inline(always)]
                || {
                    let v: Vec<f32> = xs
                        .iter()
                        .zip(&ys)
                        .map(|(&x, &y)| binary_f32(op, x, y))
                        .collect();
                    bits(&v)
                },
            );
            check(format!("{op:?}"), copies);
        }
    }
}
