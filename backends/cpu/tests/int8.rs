//! Weight-only int8 products against an f64 reference, on every kernel this CPU runs:
//! the i32 dot products are exact, so each kernel gives the reference's
//! `Σ qa·qw · sa·sw` (then bias and activation) to f32 rounding; and the quantised
//! product stays within the quantisation's error of the f32 product. Sizes cross the
//! kernels' steps (panels of 16 weight rows, groups of 4 columns, tiles of 4 activation
//! rows, 64-row tasks, tasks of their own tiles for many rows, the 65,536-column i32
//! chunk); bad sizes, bad scales and a kernel the CPU lacks are errors.

use kiln_cpu::quant::{linear_with, Int8Kernel, Int8Matrix};
use kiln_tensor::UnaryOp;
use proptest::prelude::*;

/// The reference: activations quantised per row as the product does, dot products in
/// f64 of exactly those integers, the epilogue in f64.
fn reference(x: &[f32], m: usize, w: &Int8Matrix, bias: Option<&[f32]>, relu: bool) -> Vec<f64> {
    let (k, n) = (w.cols(), w.rows());
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        let max = row.iter().fold(0f32, |a, v| a.max(v.abs()));
        let sa = if max == 0.0 { 0.0 } else { max / 127.0 };
        let qa: Vec<f64> = row
            .iter()
            .map(|v| {
                if sa == 0.0 {
                    0.0
                } else {
                    (v / sa).round().clamp(-127.0, 127.0) as f64
                }
            })
            .collect();
        for r in 0..n {
            let dot: f64 = qa.iter().zip(w.row(r)).map(|(a, &q)| a * q as f64).sum();
            let v = dot * sa as f64 * w.scales()[r] as f64 + bias.map_or(0.0, |b| b[r] as f64);
            out.push(if relu { v.max(0.0) } else { v });
        }
    }
    out
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    // A small deterministic generator, spread over magnitudes.
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn kernels() -> Vec<Int8Kernel> {
    Int8Kernel::ALL
        .into_iter()
        .filter(|k| k.available())
        .collect()
}

fn check(m: usize, k: usize, n: usize, seed: u64, with_bias: bool, relu: bool) {
    let x = values(m * k, seed);
    let w = Int8Matrix::quantize(&values(n * k, seed + 1), n, k).unwrap();
    let bias = with_bias.then(|| values(n, seed + 2));
    let want = reference(&x, m, &w, bias.as_deref(), relu);
    let act = relu.then_some(UnaryOp::Relu);
    for kernel in kernels() {
        let mut out = vec![f32::NAN; m * n];
        linear_with(kernel, &x, m, &w, bias.as_deref(), act, &mut out).unwrap();
        for (j, (got, want)) in out.iter().zip(&want).enumerate() {
            assert!(
                (*got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{} m={m} k={k} n={n}: output {j} is {got}, the reference {want}",
                kernel.name()
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_kernel_gives_the_exact_integer_products(
        m in 1usize..40,
        k in 1usize..300,
        n in 1usize..140,
        seed in 0u64..1000,
        with_bias: bool,
        relu: bool,
    ) {
        check(m, k, n, seed, with_bias, relu);
    }
}

#[test]
fn the_layers_of_w1_and_a_row_longer_than_an_i32_chunk() {
    check(1, 784, 1024, 1, true, true);
    check(3, 1024, 10, 2, true, false);
    check(1, 70_000, 5, 3, false, false);
    // Tiles of four rows and a tail, through 64-row tasks and across i32 chunks.
    check(9, 300, 130, 4, true, true);
    check(6, 70_000, 5, 5, true, false);
    // Enough rows that each task quantises a tile of its own and takes every weight row.
    check(17, 300, 70, 6, true, true);
    check(14, 70_000, 3, 7, false, true);
}

#[test]
fn the_quantised_product_is_near_the_f32_product() {
    // Per-row scales: each product's error is within a few hundredths of a percent of
    // its operands' magnitudes.
    let (m, k, n) = (2, 512, 64);
    let (x, wf) = (values(m * k, 7), values(n * k, 8));
    let w = Int8Matrix::quantize(&wf, n, k).unwrap();
    let mut out = vec![0.0; m * n];
    linear_with(Int8Kernel::detect(), &x, m, &w, None, None, &mut out).unwrap();
    for i in 0..m {
        for r in 0..n {
            let exact: f64 = (0..k)
                .map(|c| x[i * k + c] as f64 * wf[r * k + c] as f64)
                .sum();
            let scale: f64 = (0..k)
                .map(|c| (x[i * k + c] * wf[r * k + c]).abs() as f64)
                .sum();
            let got = out[i * n + r] as f64;
            assert!(
                (got - exact).abs() <= 0.01 * scale,
                "[{i}, {r}]: {got} against {exact}"
            );
        }
    }
}

#[test]
fn quantising_and_dequantising_keeps_each_row_within_half_a_step() {
    let wf = values(37 * 91, 3);
    let w = Int8Matrix::quantize(&wf, 37, 91).unwrap();
    let back = w.dequantize();
    for (r, (row, back)) in wf.chunks(91).zip(back.chunks(91)).enumerate() {
        let step = w.scales()[r];
        assert!(row
            .iter()
            .zip(back)
            .all(|(a, b)| (a - b).abs() <= step / 2.0 + 1e-6));
    }
    let zeros = Int8Matrix::quantize(&[0.0; 6], 2, 3).unwrap();
    assert_eq!(zeros.scales(), [0.0, 0.0]);
}

#[test]
fn rows_holding_inf_or_nan_give_what_f32_gives() {
    let w = Int8Matrix::quantize(&values(4 * 8, 1), 4, 8).unwrap();
    let mut x = values(2 * 8, 2);
    x[3] = f32::INFINITY;
    x[8 + 5] = f32::NAN;
    for kernel in kernels() {
        let mut out = vec![0.0; 8];
        linear_with(kernel, &x, 2, &w, None, None, &mut out).unwrap();
        for r in 0..4 {
            let q = w.row(r)[3];
            assert!(
                if q == 0 {
                    out[r].is_nan()
                } else {
                    out[r].is_infinite()
                },
                "{}: {}",
                kernel.name(),
                out[r]
            );
            assert!(out[4 + r].is_nan());
        }
    }
}

#[test]
fn bad_sizes_scales_and_values_are_errors() {
    let e = |r: kiln_tensor::Result<Int8Matrix>| r.unwrap_err().to_string();
    assert!(e(Int8Matrix::quantize(&[1.0; 5], 2, 3)).contains("5 values for [2, 3]"));
    assert!(e(Int8Matrix::quantize(&[1.0, f32::NAN], 1, 2)).contains("weight [0, 1] is NaN"));
    assert!(e(Int8Matrix::from_parts(1, 2, &[1, 2], &[1.0, 2.0])).contains("2 scales for 1 rows"));
    assert!(e(Int8Matrix::from_parts(1, 2, &[1, 2], &[-1.0])).contains("row 0's scale is -1"));
    assert!(e(Int8Matrix::from_parts(1, 2, &[1, -128], &[1.0])).contains("[0, 1] is -128"));
    assert!(e(Int8Matrix::from_parts(usize::MAX, 2, &[], &[])).contains("for ["));
    let w = Int8Matrix::quantize(&[1.0; 6], 2, 3).unwrap();
    let mut out = vec![0.0; 2];
    let k = Int8Kernel::Portable;
    let err = linear_with(k, &[1.0; 4], 1, &w, None, None, &mut out).unwrap_err();
    assert!(
        err.to_string()
            .contains("4 inputs and 2 outputs for 1 rows"),
        "{err}"
    );
    let err = linear_with(k, &[1.0; 3], 1, &w, Some(&[0.0; 3]), None, &mut out).unwrap_err();
    assert!(
        err.to_string().contains("a bias of 3 for 2 outputs"),
        "{err}"
    );
    for kernel in Int8Kernel::ALL.into_iter().filter(|k| !k.available()) {
        let err = linear_with(kernel, &[1.0; 3], 1, &w, None, None, &mut out).unwrap_err();
        assert!(err.to_string().contains("this CPU has no"), "{err}");
    }
}
