//! How close a backend's result must be to the reference: tolerances per dtype, the
//! element comparison (NaN matches NaN, infinities match exactly) and the report that
//! names the first mismatching elements by multi-index.

use super::reference::{indices, RefTensor};
use crate::dtype::DType;
use crate::op::fmt_dims;

/// An allowed error: element `i` passes when `|got - want| <= atol + rtol·(|want| +
/// mag[i])`, where `mag[i]` is the magnitude of the terms that produced it (`Σ|x|` for a
/// sum, `Σ|a||b|` for a matrix product, 0 for a single correctly computed value), so
/// cancellation in long reductions is judged against the size of what cancelled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Relative error allowed, per unit of `|want| + mag`.
    pub rtol: f64,
    /// Absolute floor, for results near zero of functions computed to absolute accuracy.
    pub atol: f64,
}

impl Tol {
    /// Bit-exact equality (NaN still matches NaN).
    pub const EXACT: Tol = Tol {
        rtol: 0.0,
        atol: 0.0,
    };

    /// The tolerance of one operation's rounding in `dtype`: a few ulps of f64 and f32
    /// (libm functions differ by an ulp or two), one ulp of f16 and bf16 (the CPU
    /// computes them in f32 and rounds once), exact for integers and bools.
    pub fn for_dtype(dtype: DType) -> Tol {
        match dtype {
            DType::F64 => Tol {
                rtol: 1e-12,
                atol: 1e-13,
            },
            DType::F32 => Tol {
                rtol: 1e-5,
                atol: 1e-6,
            },
            DType::F16 => Tol {
                rtol: 1e-3,
                atol: 1e-5,
            },
            DType::BF16 => Tol {
                rtol: 1e-2,
                atol: 1e-5,
            },
            DType::I32 | DType::U32 | DType::Bool | DType::I8 => Tol::EXACT,
        }
    }

    /// This tolerance widened `k` times (for composites, which round at every step).
    pub fn times(self, k: f64) -> Tol {
        Tol {
            rtol: self.rtol * k,
            atol: self.atol * k,
        }
    }
}

/// Whether one element passes.
fn close(got: f64, want: f64, tol: Tol, mag: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got == want {
        return true;
    }
    if got.is_infinite() || want.is_infinite() {
        return false;
    }
    (got - want).abs() <= tol.atol + tol.rtol * (want.abs() + mag)
}

/// Compares a backend result with the reference: same dims, same dtype, every element
/// within `tol` (with per-element magnitudes `mag`, or none). The error lists the first
/// mismatches with their multi-indices.
pub fn compare(
    got: &RefTensor,
    want: &RefTensor,
    tol: Tol,
    mag: Option<&[f64]>,
) -> Result<(), String> {
    if got.dims != want.dims || got.dtype != want.dtype {
        return Err(format!(
            "the result is {}{} but the reference is {}{}",
            got.dtype,
            fmt_dims(&got.dims),
            want.dtype,
            fmt_dims(&want.dims)
        ));
    }
    const SHOWN: usize = 8;
    let mut bad = Vec::new();
    let mut count = 0;
    for (k, idx) in indices(&want.dims).enumerate() {
        let m = mag.map_or(0.0, |m| m[k]);
        let (g, w) = (got.data[k], want.data[k]);
        if !close(g, w, tol, m) {
            count += 1;
            if bad.len() < SHOWN {
                let allowed = tol.atol + tol.rtol * (w.abs() + m);
                bad.push(format!(
                    "  at {idx:?}: got {g}, want {w} (allowed ±{allowed:.3e})"
                ));
            }
        }
    }
    if count == 0 {
        return Ok(());
    }
    Err(format!(
        "{count} of {} elements of the {}{} result differ from the reference (rtol {:e}, atol {:e}):\n{}",
        want.numel(),
        want.dtype,
        fmt_dims(&want.dims),
        tol.rtol,
        tol.atol,
        bad.join("\n")
    ))
}

/// Whether `r`, a value of the float `dtype`, is `x` rounded to nearest with ties to
/// even: judged from the bit patterns of `r`'s two neighbours, so it shares no code
/// with any conversion routine.
pub fn is_nearest(dtype: DType, x: f64, r: f64) -> bool {
    if x.is_nan() || r.is_nan() {
        return x.is_nan() && r.is_nan();
    }
    // (bits of r, its neighbours, the first power of two past the largest finite value:
    // where rounding to infinity starts, halfway past the largest finite value).
    let (bits, up, down, overflow): (u64, f64, f64, f64) = match dtype {
        DType::F32 => {
            let b = (r as f32).to_bits();
            let n = |b: u32| f32::from_bits(b) as f64;
            (
                b as u64,
                n(b.wrapping_add(1)),
                n(b.wrapping_sub(1)),
                2f64.powi(128),
            )
        }
        DType::F16 => {
            let b = half::f16::from_f64(r).to_bits();
            let n = |b: u16| half::f16::from_bits(b).to_f64();
            (
                b as u64,
                n(b.wrapping_add(1)),
                n(b.wrapping_sub(1)),
                2f64.powi(16),
            )
        }
        DType::BF16 => {
            let b = half::bf16::from_f64(r).to_bits();
            let n = |b: u16| half::bf16::from_bits(b).to_f64();
            (
                b as u64,
                n(b.wrapping_add(1)),
                n(b.wrapping_sub(1)),
                2f64.powi(128),
            )
        }
        _ => return x == r,
    };
    if r.is_infinite() {
        // One below infinity's pattern is the largest finite value, whatever the sign.
        return x.signum() == r.signum() && x.abs() >= (down.abs() + overflow) / 2.0;
    }
    if r == 0.0 {
        // One neighbour is the smallest subnormal, the other a NaN or -0 pattern.
        let tiny = if up.abs() > 0.0 && up.is_finite() {
            up.abs()
        } else {
            down.abs()
        };
        return x.abs() <= tiny / 2.0;
    }
    let fix = |n: f64| {
        if n.is_nan() || n.is_infinite() {
            overflow.copysign(r)
        } else {
            n
        }
    };
    let (up, down) = (fix(up), fix(down));
    let even = bits & 1 == 0;
    [up, down].iter().all(|&n| {
        let (dr, dn) = ((x - r).abs(), (x - n).abs());
        dr < dn || (dr == dn && even)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_matches_nan_and_reports_indices() {
        let w = RefTensor::new(vec![2, 2], vec![1.0, f64::NAN, 3.0, 4.0], DType::F32);
        assert!(compare(&w, &w, Tol::EXACT, None).is_ok());
        let mut g = w.clone();
        g.data[2] = 3.5;
        let e = compare(&g, &w, Tol::for_dtype(DType::F32), None).unwrap_err();
        assert!(e.contains("at [1, 0]: got 3.5, want 3"), "{e}");
        g.data[2] = 3.0 + 1e-6;
        assert!(compare(&g, &w, Tol::for_dtype(DType::F32), None).is_ok());
        // A large magnitude widens the allowed error of a cancelled sum.
        g.data[2] = 3.01;
        assert!(compare(
            &g,
            &w,
            Tol::for_dtype(DType::F32),
            Some(&[0.0, 0.0, 1e4, 0.0])
        )
        .is_ok());
    }

    #[test]
    fn nearest_rounding_is_recognised() {
        let up = 1.0 + 2f64.powi(-10);
        // Just above the tie between 1 and 1 + 2^-10 in f16.
        assert!(is_nearest(DType::F16, 1.0 + 2f64.powi(-11) + 1e-9, up));
        assert!(!is_nearest(DType::F16, 1.0 + 2f64.powi(-11) + 1e-9, 1.0));
        // An exact tie goes to the even one.
        assert!(is_nearest(DType::F16, 1.0 + 2f64.powi(-11), 1.0));
        assert!(!is_nearest(DType::F16, 1.0 + 2f64.powi(-11), up));
        assert!(is_nearest(DType::F16, 1e6, f64::INFINITY));
        assert!(is_nearest(DType::F16, 65519.0, 65504.0));
        assert!(!is_nearest(DType::F16, 65519.0, f64::INFINITY));
        assert!(is_nearest(DType::BF16, -1e-50, -0.0));
        assert!(is_nearest(DType::F32, 0.1, 0.1f32 as f64));
    }
}
