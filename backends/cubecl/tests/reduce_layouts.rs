//! Reductions on the GPU backends (wgpu in CI; CUDA where a GPU is) over the layouts a
//! training step reduces, each against an f64 reference: rows of a softmax (a
//! contiguous reduced axis, several outputs per cube), columns of a bias gradient (the
//! kept axis contiguous, neighbouring units on neighbouring outputs, long sums cut into
//! chunked partials and summed again), a middle axis, transposed views, whole-tensor
//! sums, and max, min, argmax and integer sums over the same layouts.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_tensor::{Backend, RawTensor, Result};

/// The checks below for one backend, as tests named after it.
macro_rules! reduce_tests {
    ($module:ident, $B:ty, $device:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn float_reductions_match_the_reference_on_every_layout() -> Result<()> {
                super::float_reductions_match_the_reference::<$B>(&$device)
            }
            #[test]
            fn integer_and_index_reductions_match_the_reference() -> Result<()> {
                super::integer_and_index_reductions_match_the_reference::<$B>(&$device)
            }
        }
    };
}

#[cfg(feature = "wgpu")]
reduce_tests!(
    wgpu,
    kiln_cubecl::Wgpu,
    kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the reduction tests: {e}"))
);

#[cfg(feature = "cuda")]
reduce_tests!(
    cuda,
    kiln_cubecl::Cuda,
    kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the reduction tests: {e}"))
);

/// Deterministic values in [-1, 1) (positive only with `positive`: rounding errors
/// of a sum then add up instead of cancelling).
fn values(n: usize, seed: u64, positive: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            if positive {
                u
            } else {
                2.0 * u - 1.0
            }
        })
        .collect()
}

/// The row-major index of `coords` in `dims`.
fn index(dims: &[usize], coords: &[usize]) -> usize {
    coords.iter().zip(dims).fold(0, |i, (&c, &d)| i * d + c)
}

/// `fold` over `axes` of the row-major `data` of `dims`, in f64; outputs in row-major
/// order of the kept dims.
fn reference(
    data: &[f32],
    dims: &[usize],
    axes: &[usize],
    init: f64,
    fold: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let out_dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
    let mut out = vec![init; out_dims.iter().product()];
    let mut coords = vec![0; dims.len()];
    for &v in data {
        let k: Vec<usize> = kept.iter().map(|&a| coords[a]).collect();
        let o = index(&out_dims, &k);
        out[o] = fold(out[o], v as f64);
        for a in (0..dims.len()).rev() {
            coords[a] += 1;
            if coords[a] < dims[a] {
                break;
            }
            coords[a] = 0;
        }
    }
    out
}

/// One layout: the stored dims, a permutation viewing them (identity: contiguous),
/// the axes of the view to reduce.
struct Layout {
    stored: Vec<usize>,
    perm: Vec<usize>,
    axes: Vec<usize>,
}

fn layouts() -> Vec<Layout> {
    let l = |stored: &[usize], perm: &[usize], axes: &[usize]| Layout {
        stored: stored.to_vec(),
        perm: perm.to_vec(),
        axes: axes.to_vec(),
    };
    vec![
        // A softmax's rows: 2,048 rows of 256.
        l(&[8, 16, 16, 256], &[0, 1, 2, 3], &[3]),
        // Layer-norm rows of 512, and short rows of 3.
        l(&[300, 512], &[0, 1], &[1]),
        l(&[1000, 3], &[0, 1], &[1]),
        // A bias gradient's columns: 8,192 rows of 96 (chunked), 9,000 of 1 and 777 of 40.
        l(&[8192, 96], &[0, 1], &[0]),
        l(&[9000, 1], &[0, 1], &[0]),
        l(&[777, 40], &[0, 1], &[0]),
        // The batch and row axes of [B, T, D] at once.
        l(&[16, 512, 48], &[0, 1, 2], &[0, 1]),
        // A middle axis, and a transposed view's rows (its columns in memory).
        l(&[7, 333, 50], &[0, 1, 2], &[1]),
        l(&[600, 70], &[1, 0], &[1]),
        // Everything: 1,000 x 999 into one value.
        l(&[1000, 999], &[0, 1], &[0, 1]),
    ]
}

/// `x` viewed through `layout`, and the view's dims and row-major values.
fn view<B: Backend>(
    layout: &Layout,
    data: &[f32],
    dev: &B::Device,
) -> Result<(RawTensor<B>, Vec<usize>, Vec<f32>)> {
    let x = RawTensor::<B>::from_vec(data.to_vec(), &layout.stored, dev)?.permute(&layout.perm)?;
    let dims: Vec<usize> = layout.perm.iter().map(|&p| layout.stored[p]).collect();
    let logical = x.contiguous()?.to_vec::<f32>()?;
    Ok((x, dims, logical))
}

/// Whether every output is within `tol` (relative to `scale`) of the reference.
fn check(what: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * s.max(1.0),
            "{what}: output {i} is {g}, the reference {w} (error {err:e})"
        );
    }
}

fn float_reductions_match_the_reference<B: Backend>(dev: &B::Device) -> Result<()> {
    for (n, layout) in layouts().iter().enumerate() {
        for positive in [false, true] {
            let count: usize = layout.stored.iter().product();
            let data = values(count, n as u64 * 2 + positive as u64, positive);
            let (x, dims, logical) = view::<B>(layout, &data, dev)?;
            let what = format!(
                "{:?} as {:?} over {:?}",
                layout.stored, layout.perm, layout.axes
            );
            let sum = reference(&logical, &dims, &layout.axes, 0.0, |a, v| a + v);
            let abs = reference(&logical, &dims, &layout.axes, 0.0, |a, v| a + v.abs());
            let got = x.sum(&layout.axes, false)?.to_vec::<f32>()?;
            // A compensated sum is exact to f32 rounding of its result, whatever the length.
            check(&format!("sum of {what}"), &got, &sum, &abs, 4e-7);
            let max = reference(&logical, &dims, &layout.axes, f64::MIN, f64::max);
            let got = x.max(&layout.axes, false)?.to_vec::<f32>()?;
            check(
                &format!("max of {what}"),
                &got,
                &max,
                &vec![1.0; max.len()],
                0.0,
            );
            let min = reference(&logical, &dims, &layout.axes, f64::MAX, f64::min);
            let got = x.min(&layout.axes, false)?.to_vec::<f32>()?;
            check(
                &format!("min of {what}"),
                &got,
                &min,
                &vec![1.0; min.len()],
                0.0,
            );
        }
    }
    Ok(())
}

fn integer_and_index_reductions_match_the_reference<B: Backend>(dev: &B::Device) -> Result<()> {
    for (n, layout) in layouts().iter().enumerate() {
        let count: usize = layout.stored.iter().product();
        let data = values(count, 100 + n as u64, false);
        let what = format!(
            "{:?} as {:?} over {:?}",
            layout.stored, layout.perm, layout.axes
        );
        let ints: Vec<i32> = data.iter().map(|v| (v * 1000.0) as i32).collect();
        let xi =
            RawTensor::<B>::from_vec(ints.clone(), &layout.stored, dev)?.permute(&layout.perm)?;
        let logical: Vec<f32> = xi
            .contiguous()?
            .to_vec::<i32>()?
            .iter()
            .map(|&v| v as f32)
            .collect();
        let dims: Vec<usize> = layout.perm.iter().map(|&p| layout.stored[p]).collect();
        let want = reference(&logical, &dims, &layout.axes, 0.0, |a, v| a + v);
        let got: Vec<f32> = xi
            .sum(&layout.axes, false)?
            .to_vec::<i32>()?
            .iter()
            .map(|&v| v as f32)
            .collect();
        check(
            &format!("i32 sum of {what}"),
            &got,
            &want,
            &vec![1.0; want.len()],
            0.0,
        );
        if layout.axes.len() == 1 {
            // The first index of the largest value along the axis.
            let (x, dims, logical) = view::<B>(layout, &data, dev)?;
            let axis = layout.axes[0];
            let mut best = reference(&logical, &dims, &[axis], f64::MIN, f64::max);
            let mut first = vec![f64::NAN; best.len()];
            let kept: Vec<usize> = (0..dims.len()).filter(|&a| a != axis).collect();
            let out_dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
            let mut coords = vec![0; dims.len()];
            for &v in &logical {
                let o = index(
                    &out_dims,
                    &kept.iter().map(|&a| coords[a]).collect::<Vec<_>>(),
                );
                if first[o].is_nan() && v as f64 == best[o] {
                    first[o] = coords[axis] as f64;
                }
                for a in (0..dims.len()).rev() {
                    coords[a] += 1;
                    if coords[a] < dims[a] {
                        break;
                    }
                    coords[a] = 0;
                }
            }
            best.clone_from(&first);
            let got: Vec<f32> = x
                .argmax(axis, false)?
                .to_vec::<i32>()?
                .iter()
                .map(|&v| v as f32)
                .collect();
            check(
                &format!("argmax of {what}"),
                &got,
                &best,
                &vec![1.0; best.len()],
                0.0,
            );
        }
    }
    Ok(())
}
