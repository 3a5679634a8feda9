//! Each of Kiln's own wgpu product kernels, pinned in turn, against an f64 reference:
//! the direct kernel, the tiled one unsplit, and the tiled one with K cut into ranges
//! whose partial sums a second pass adds. CI's lavapipe would otherwise only run the
//! direct kernel (a CPU adapter's choice), and a GPU only the tiled ones. The shapes
//! are the ones a split handles differently: a batch-1 row, a 10-column classifier, K
//! shorter than the splits asked for, ragged K and tile edges, transposed and
//! batch-broadcast operands, and more batches than one launch's grid holds per split.
//!
//! The kernel is pinned for the whole process, so this file is its own test binary and
//! one test walks the kernels in order.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{set_product_kernel, ProductKernel, Wgpu, WgpuDevice};
use kiln_tensor::{DType, RawTensor, Result};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            2.0 * ((s >> 40) as f32 / (1u64 << 24) as f32) - 1.0
        })
        .collect()
}

/// One product: `[batch.., m, k] × [batch.., k, n]`, each operand stored transposed
/// (its last two dims swapped in memory) or not, `b` stored once and broadcast over the
/// batch or not.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a_transposed: bool,
    b_transposed: bool,
    b_broadcast: bool,
}

fn cases() -> Vec<Case> {
    let c = |batch, m, n, k, at, bt, bb| Case {
        batch,
        m,
        n,
        k,
        a_transposed: at,
        b_transposed: bt,
        b_broadcast: bb,
    };
    vec![
        // Batch-1 inference's row, and a weight stored [out, in] (a transposed view).
        c(1, 1, 70, 300, false, false, false),
        c(1, 2, 130, 97, false, true, false),
        // A 10-column classifier over a long K, and its input transposed.
        c(1, 65, 10, 200, true, false, false),
        // K of one step, of one element, and just past a step.
        c(1, 3, 9, 16, false, false, false),
        c(1, 4, 5, 1, false, false, false),
        c(1, 4, 5, 17, false, false, false),
        // Batched, b broadcast over the batch (attention against shared weights).
        c(3, 5, 33, 48, false, false, true),
        c(2, 66, 3, 40, true, true, false),
        // More batches than fit one launch's grid once K is cut into 16 ranges:
        // 65,535 / 16 = 4,095 per launch.
        c(4_100, 1, 2, 256, false, false, false),
    ]
}

/// The operands of `case` (as views over their stored layouts), and their row-major
/// logical values per batch.
#[allow(clippy::type_complexity)]
fn operands(
    case: Case,
    dtype: DType,
    dev: &WgpuDevice,
) -> Result<(RawTensor<Wgpu>, RawTensor<Wgpu>, Vec<f32>, Vec<f32>)> {
    let stored = |batch: usize, rows: usize, cols: usize, transposed: bool, seed: u64| {
        let (r, c) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let data = values(batch * r * c, seed);
        let t = RawTensor::<Wgpu>::from_vec(data, &[batch, r, c], dev)?.cast(dtype)?;
        let t = if transposed {
            t.permute(&[0, 2, 1])?
        } else {
            t
        };
        // The logical values as the device holds them (rounded to `dtype`).
        let logical = t.cast(DType::F32)?.contiguous()?.to_vec::<f32>()?;
        Ok::<_, kiln_tensor::Error>((t, logical))
    };
    let (a, av) = stored(case.batch, case.m, case.k, case.a_transposed, 1)?;
    let b_batch = if case.b_broadcast { 1 } else { case.batch };
    let (b, mut bv) = stored(b_batch, case.k, case.n, case.b_transposed, 2)?;
    let b = if case.b_broadcast {
        bv = bv.repeat(case.batch);
        b.broadcast_to(&[case.batch, case.k, case.n])?
    } else {
        b
    };
    Ok((a, b, av, bv))
}

/// `got` against the f64 product of `a` and `b`, each element within the rounding a
/// K-term sum in `dtype`'s accumulation and one final rounding to `dtype` can make.
fn check(case: Case, dtype: DType, got: &[f32], a: &[f32], b: &[f32], what: &str) {
    let Case { batch, m, n, k, .. } = case;
    assert_eq!(got.len(), batch * m * n, "{what}: result length");
    let final_rounding = if dtype == DType::F16 { 1e-3 } else { 0.0 };
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut magnitude) = (0f64, 0f64);
                for kk in 0..k {
                    let p = a[(bi * m + i) * k + kk] as f64 * b[(bi * k + kk) * n + j] as f64;
                    exact += p;
                    magnitude += p.abs();
                }
                let g = got[(bi * m + i) * n + j] as f64;
                let bound =
                    (k as f64 + 2.0) * 1.2e-7 * magnitude + final_rounding * exact.abs() + 1e-30;
                assert!(
                    (g - exact).abs() <= bound,
                    "{what}: [{bi}, {i}, {j}] is {g}, the reference {exact} (bound {bound:e})"
                );
            }
        }
    }
}

#[test]
fn every_product_kernel_matches_the_reference_and_a_split_one_is_repeatable() -> Result<()> {
    // One test, because the kernel is pinned for the whole process.
    let dev = WgpuDevice::first()?;
    every_kernel_matches_the_reference(&dev)?;
    a_split_product_is_the_same_every_run(&dev)
}

fn every_kernel_matches_the_reference(dev: &WgpuDevice) -> Result<()> {
    let mut dtypes = vec![DType::F32];
    if dev.dtypes().contains(&DType::F16) {
        dtypes.push(DType::F16);
    }
    let kernels = [
        ProductKernel::Direct,
        ProductKernel::Tiled { splits: 1 },
        ProductKernel::Tiled { splits: 3 },
        ProductKernel::Tiled { splits: 16 },
        ProductKernel::Auto,
    ];
    for kernel in kernels {
        set_product_kernel(kernel);
        for &dtype in &dtypes {
            for case in cases() {
                // The widest batch only where K is split: it is there for the grid.
                if case.batch > 100 && kernel != (ProductKernel::Tiled { splits: 16 }) {
                    continue;
                }
                let (a, b, av, bv) = operands(case, dtype, dev)?;
                let got = a.matmul(&b)?.cast(DType::F32)?.to_vec::<f32>()?;
                check(
                    case,
                    dtype,
                    &got,
                    &av,
                    &bv,
                    &format!("{kernel:?} {dtype} {case:?}"),
                );
            }
        }
    }
    set_product_kernel(ProductKernel::Auto);
    Ok(())
}

/// The ranges' partial sums are added in order of the range, so a split product does
/// not depend on which cube finishes first.
fn a_split_product_is_the_same_every_run(dev: &WgpuDevice) -> Result<()> {
    let case = cases()[0];
    let (a, b, _, _) = operands(case, DType::F32, dev)?;
    let product = |kernel| {
        set_product_kernel(kernel);
        let r = a.matmul(&b)?.to_vec::<f32>();
        set_product_kernel(ProductKernel::Auto);
        r
    };
    let first = product(ProductKernel::Tiled { splits: 16 })?;
    for _ in 0..3 {
        let again = product(ProductKernel::Tiled { splits: 16 })?;
        assert!(
            first
                .iter()
                .zip(&again)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "a split product changed between runs"
        );
    }
    Ok(())
}
