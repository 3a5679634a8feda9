//! Checks every path (each ISA the CPU has plus the portable one, one and two
//! threads, gemv shortcuts on and off) against a naive f64 triple loop.

use super::*;
use proptest::prelude::*;

/// Memory layouts a test matrix can have.
#[derive(Clone, Copy, Debug)]
enum Layout {
    RowMajor,
    Transposed,
    PaddedRows,
    PaddedTransposed,
    /// Every row is the same (row stride 0).
    BroadcastRows,
    /// Every column is the same (column stride 0).
    BroadcastCols,
    /// Both strides > 1.
    Scattered,
}

const LAYOUTS: [Layout; 7] = [
    Layout::RowMajor,
    Layout::Transposed,
    Layout::PaddedRows,
    Layout::PaddedTransposed,
    Layout::BroadcastRows,
    Layout::BroadcastCols,
    Layout::Scattered,
];

/// Offset and strides for a `rows x cols` matrix in `layout`, and the exact buffer
/// length it needs (so any out-of-bounds read would hit the end of the buffer).
fn geometry(layout: Layout, rows: usize, cols: usize) -> (usize, usize, usize, usize) {
    let (off, rs, cs) = match layout {
        Layout::RowMajor => (0, cols, 1),
        Layout::Transposed => (0, 1, rows),
        Layout::PaddedRows => (2, cols + 3, 1),
        Layout::PaddedTransposed => (1, 1, rows + 5),
        Layout::BroadcastRows => (3, 0, 1),
        Layout::BroadcastCols => (1, 1, 0),
        Layout::Scattered => (1, 2 * cols + 1, 2),
    };
    let len = if rows == 0 || cols == 0 {
        off
    } else {
        off + (rows - 1) * rs + (cols - 1) * cs + 1
    };
    (off, rs, cs, len)
}

struct Rng(u64);
impl Rng {
    /// Multiples of 1/64 in [-2, 2): exact in f16, bf16, f32 and f64.
    fn val(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % 256) as f32 / 64.0 - 2.0
    }
}

struct Mat<X> {
    buf: Vec<X>,
    off: usize,
    rs: usize,
    cs: usize,
}

impl<X: Copy> Mat<X> {
    fn new(
        layout: Layout,
        rows: usize,
        cols: usize,
        rng: &mut Rng,
        conv: impl Fn(f32) -> X,
    ) -> Self {
        let (off, rs, cs, len) = geometry(layout, rows, cols);
        Mat {
            buf: (0..len).map(|_| conv(rng.val())).collect(),
            off,
            rs,
            cs,
        }
    }
    fn view(&self) -> MatRef<'_, X> {
        MatRef {
            data: &self.buf,
            offset: self.off,
            row_stride: self.rs,
            col_stride: self.cs,
        }
    }
    fn get(&self, i: usize, j: usize, to: impl Fn(X) -> f64) -> f64 {
        to(self.buf[self.off + i * self.rs + j * self.cs])
    }
}

/// Every kernel level this CPU can run.
fn isas() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| i <= Isa::detect())
        .collect()
}

fn option_sets() -> Vec<GemmOptions> {
    let mut v = Vec::new();
    for isa in isas() {
        for threads in [Some(1), Some(2), Some(3)] {
            for allow_gemv in [true, false] {
                v.push(GemmOptions {
                    isa,
                    threads,
                    allow_gemv,
                    bf16_dot: true,
                });
            }
        }
    }
    v
}

/// Checks `got` against the f64 reference with a tolerance of ~1e-5*sqrt(k) (f32)
/// relative to the magnitude sum_p |a_ip b_pj| + |c0_ij|.
#[allow(clippy::too_many_arguments)]
fn compare(
    what: &str,
    m: usize,
    n: usize,
    k: usize,
    a: impl Fn(usize, usize) -> f64,
    b: impl Fn(usize, usize) -> f64,
    c0: &[f64],
    accumulate: bool,
    got: &[f64],
    eps: f64,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            let mut mag = 0.0;
            for p in 0..k {
                let t = a(i, p) * b(p, j);
                s += t;
                mag += t.abs();
            }
            if accumulate {
                s += c0[i * n + j];
                mag += c0[i * n + j].abs();
            }
            let tol = eps * (k.max(1) as f64).sqrt() * mag + 1e-30;
            let g = got[i * n + j];
            assert!(
                (g - s).abs() <= tol,
                "{what}: m={m} n={n} k={k} acc={accumulate}: c[{i},{j}] = {g}, expected {s} (tol {tol})"
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_sgemm_typed<A: GemmInput, B: GemmInput>(
    opts: &GemmOptions,
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    accumulate: bool,
    seed: u64,
    ca: impl Fn(f32) -> A,
    cb: impl Fn(f32) -> B,
) {
    let mut rng = Rng(seed);
    let a = Mat::new(la, m, k, &mut rng, ca);
    let b = Mat::new(lb, k, n, &mut rng, cb);
    let c0: Vec<f32> = (0..m * n).map(|_| rng.val()).collect();
    let mut c = c0.clone();
    sgemm_with(opts, m, n, k, a.view(), b.view(), &mut c, accumulate);
    let what = format!(
        "sgemm {opts:?} {la:?}x{lb:?} {}",
        std::any::type_name::<A>()
    );
    let c0: Vec<f64> = c0.iter().map(|&v| v as f64).collect();
    let got: Vec<f64> = c.iter().map(|&v| v as f64).collect();
    let fa = |i, p| a.get(i, p, |x: A| x.to_f32() as f64);
    let fb = |p, j| b.get(p, j, |x: B| x.to_f32() as f64);
    compare(&what, m, n, k, fa, fb, &c0, accumulate, &got, 1e-5);
}

#[allow(clippy::too_many_arguments)]
fn check_sgemm(
    opts: &GemmOptions,
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    accumulate: bool,
    seed: u64,
) {
    check_sgemm_typed(opts, m, n, k, la, lb, accumulate, seed, |v| v, |v| v);
}

#[allow(clippy::too_many_arguments)]
fn check_dgemm(
    opts: &GemmOptions,
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    accumulate: bool,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let a = Mat::new(la, m, k, &mut rng, f64::from);
    let b = Mat::new(lb, k, n, &mut rng, f64::from);
    let c0: Vec<f64> = (0..m * n).map(|_| rng.val() as f64).collect();
    let mut c = c0.clone();
    dgemm_with(opts, m, n, k, a.view(), b.view(), &mut c, accumulate);
    let what = format!("dgemm {opts:?} {la:?}x{lb:?}");
    compare(
        &what,
        m,
        n,
        k,
        |i, p| a.get(i, p, |x| x),
        |p, j| b.get(p, j, |x| x),
        &c0,
        accumulate,
        &c,
        1e-13,
    );
}

/// Shapes covering empty, unit, odd, tile-boundary +-1, skinny and multi-block cases.
const SHAPES: &[(usize, usize, usize)] = &[
    (0, 0, 0),
    (0, 7, 5),
    (7, 0, 5),
    (7, 5, 0),
    (1, 1, 1),
    (1, 1, 17),
    (1, 37, 19),
    (1, 64, 33),
    (29, 1, 19),
    (2, 3, 4),
    (13, 31, 7),
    (14, 32, 16),
    (15, 33, 17),
    (28, 64, 3),
    (6, 16, 9),
    (7, 17, 9),
    (4, 8, 5),
    (5, 9, 3),
    (40, 10, 50),
    (10, 40, 50),
    (71, 67, 130),
];

#[test]
fn sgemm_all_layouts_all_paths() {
    let mut seed = 1;
    for opts in option_sets() {
        for &(m, n, k) in SHAPES {
            for la in LAYOUTS {
                for lb in [
                    Layout::RowMajor,
                    Layout::Transposed,
                    Layout::Scattered,
                    Layout::BroadcastRows,
                ] {
                    for acc in [false, true] {
                        seed += 1;
                        check_sgemm(&opts, m, n, k, la, lb, acc, seed);
                    }
                }
            }
            for lb in LAYOUTS {
                seed += 1;
                check_sgemm(&opts, m, n, k, Layout::RowMajor, lb, seed % 2 == 0, seed);
            }
        }
    }
}

/// Shapes big enough for several KC/MC/NC blocks, the thread partition, and
/// the transposed orientation (small n).
/// bf16 products over several blocks of each dimension, with reduction blocks of odd
/// length (k = 2049 splits into three of 683), so pairs start at odd steps.
#[test]
fn bf16_dot_multi_block() {
    let shapes = [
        (2100, 40, 30),
        (40, 900, 70),
        (30, 50, 2049),
        (300, 70, 1031),
        // B packed once for the slices of A panels of each of two column blocks.
        (300, 260, 100),
    ];
    for threads in [Some(1), Some(2)] {
        let opts = GemmOptions {
            threads,
            allow_gemv: false,
            ..GemmOptions::default()
        };
        for (s, &(m, n, k)) in shapes.iter().enumerate() {
            for (la, lb) in [
                (Layout::RowMajor, Layout::RowMajor),
                (Layout::Transposed, Layout::Transposed),
                (Layout::Scattered, Layout::RowMajor),
            ] {
                let (x, y) = (bf16::from_f32, bf16::from_f32);
                check_sgemm_typed(&opts, m, n, k, la, lb, s % 2 == 0, s as u64, x, y);
            }
        }
    }
}

#[test]
fn sgemm_multi_block() {
    let shapes = [
        (300, 530, 600),
        (257, 10, 1030),
        (3, 700, 520),
        (1, 3000, 300),
        (2100, 33, 9),
        (150, 2100, 40),
        // Long reductions into a small C, split into parts (an odd length; four parts).
        (40, 70, 3001),
        (64, 300, 4100),
        // All of A in one block: two column blocks sharing its panels; two k blocks.
        (4100, 420, 130),
        // One reduction block, two column blocks each multiplied by several slices of
        // A panels: B packed once for all of them.
        (200, 300, 64),
        (5000, 40, 600),
    ];
    for isa in isas() {
        for threads in [None, Some(1), Some(2)] {
            let opts = GemmOptions {
                isa,
                threads,
                allow_gemv: true,
                bf16_dot: true,
            };
            for (s, &(m, n, k)) in shapes.iter().enumerate() {
                check_sgemm(
                    &opts,
                    m,
                    n,
                    k,
                    Layout::RowMajor,
                    Layout::RowMajor,
                    s % 2 == 1,
                    s as u64,
                );
                check_sgemm(
                    &opts,
                    m,
                    n,
                    k,
                    Layout::Transposed,
                    Layout::Transposed,
                    s % 2 == 0,
                    s as u64 + 10,
                );
            }
        }
    }
}

#[test]
fn busy_shared_panels_fall_back_to_private_packing() {
    use std::sync::atomic::Ordering;
    super::driver::tests::FORCE_BUSY.store(true, Ordering::Relaxed);
    for isa in isas() {
        for threads in [Some(1), Some(2)] {
            let opts = GemmOptions {
                isa,
                threads,
                allow_gemv: true,
                bf16_dot: true,
            };
            check_sgemm(
                &opts,
                300,
                530,
                600,
                Layout::RowMajor,
                Layout::Transposed,
                true,
                1,
            );
            check_sgemm(
                &opts,
                20,
                300,
                70,
                Layout::Transposed,
                Layout::RowMajor,
                false,
                2,
            );
            check_dgemm(
                &opts,
                100,
                70,
                300,
                Layout::RowMajor,
                Layout::RowMajor,
                false,
                3,
            );
        }
    }
    super::driver::tests::FORCE_BUSY.store(false, Ordering::Relaxed);
}

#[test]
fn sgemm_huge_k() {
    for isa in isas() {
        let opts = GemmOptions {
            isa,
            threads: None,
            allow_gemv: true,
            bf16_dot: true,
        };
        check_sgemm(
            &opts,
            3,
            5,
            100_003,
            Layout::RowMajor,
            Layout::RowMajor,
            false,
            1,
        );
        check_sgemm(
            &opts,
            1,
            17,
            50_001,
            Layout::RowMajor,
            Layout::Transposed,
            true,
            2,
        );
        check_sgemm(
            &opts,
            20,
            1,
            50_001,
            Layout::RowMajor,
            Layout::RowMajor,
            false,
            3,
        );
        // The dot form by blocks of k (its small side too big for the cache whole), a
        // tail block and partial blocks of four rows on both sides, storing and adding.
        for accumulate in [false, true] {
            check_sgemm(
                &opts,
                15,
                18,
                12_325,
                Layout::RowMajor,
                Layout::Transposed,
                accumulate,
                4,
            );
            check_sgemm(
                &opts,
                19,
                9,
                20_011,
                Layout::RowMajor,
                Layout::Transposed,
                accumulate,
                5,
            );
        }
    }
}

#[test]
fn sgemm_half_inputs() {
    for opts in option_sets() {
        for &(m, n, k) in &[(1, 33, 20), (17, 1, 9), (15, 33, 17), (40, 10, 50)] {
            for (la, lb) in [
                (Layout::RowMajor, Layout::RowMajor),
                (Layout::Transposed, Layout::Scattered),
            ] {
                check_sgemm_typed(
                    &opts,
                    m,
                    n,
                    k,
                    la,
                    lb,
                    false,
                    5,
                    f16::from_f32,
                    bf16::from_f32,
                );
                check_sgemm_typed(&opts, m, n, k, la, lb, true, 6, bf16::from_f32, |v| v);
                check_sgemm_typed(&opts, m, n, k, la, lb, false, 7, |v| v, f16::from_f32);
            }
        }
    }
}

#[test]
fn k_zero_clears_or_keeps() {
    let a: [f32; 0] = [];
    let mut c = vec![5.0f32; 6];
    sgemm(
        2,
        3,
        0,
        MatRef::row_major(&a, 0),
        MatRef::row_major(&a, 3),
        &mut c,
        true,
    );
    assert!(c.iter().all(|&v| v == 5.0));
    sgemm(
        2,
        3,
        0,
        MatRef::row_major(&a, 0),
        MatRef::row_major(&a, 3),
        &mut c,
        false,
    );
    assert!(c.iter().all(|&v| v == 0.0));
    let mut d = vec![5.0f64; 6];
    dgemm(
        3,
        2,
        0,
        MatRef::row_major(&[], 0),
        MatRef::row_major(&[], 2),
        &mut d,
        false,
    );
    assert!(d.iter().all(|&v| v == 0.0));
}

#[test]
fn overwrite_ignores_nan_in_c() {
    // Without `accumulate`, stale contents of c (even NaN) must not leak in.
    let a = [1.0f32, 2.0, 3.0, 4.0];
    for opts in option_sets() {
        let mut c = vec![f32::NAN; 4];
        sgemm_with(
            &opts,
            2,
            2,
            2,
            MatRef::row_major(&a, 2),
            MatRef::row_major(&a, 2),
            &mut c,
            false,
        );
        assert_eq!(c, [7.0, 10.0, 15.0, 22.0]);
    }
}

#[test]
#[should_panic(expected = "expected m*n")]
fn wrong_c_len_panics() {
    let a = [0.0f32; 4];
    let mut c = vec![0.0f32; 3];
    sgemm(
        2,
        2,
        2,
        MatRef::row_major(&a, 2),
        MatRef::row_major(&a, 2),
        &mut c,
        false,
    );
}

#[test]
#[should_panic(expected = "exceeds its buffer")]
fn view_out_of_bounds_panics() {
    let a = [0.0f32; 4];
    let mut c = vec![0.0f32; 4];
    sgemm(
        2,
        2,
        3,
        MatRef::row_major(&a, 3),
        MatRef::row_major(&a, 2),
        &mut c,
        false,
    );
}

#[test]
fn dgemm_layouts_and_blocks() {
    let mut seed = 100;
    for isa in isas() {
        for threads in [Some(1), Some(2)] {
            let opts = GemmOptions {
                isa,
                threads,
                allow_gemv: true,
                bf16_dot: true,
            };
            for &(m, n, k) in SHAPES.iter().chain(&[(130, 70, 600), (5, 300, 270)]) {
                for la in [
                    Layout::RowMajor,
                    Layout::Transposed,
                    Layout::Scattered,
                    Layout::BroadcastCols,
                ] {
                    for lb in [
                        Layout::RowMajor,
                        Layout::PaddedTransposed,
                        Layout::BroadcastRows,
                    ] {
                        seed += 1;
                        check_dgemm(&opts, m, n, k, la, lb, seed % 2 == 0, seed);
                    }
                }
            }
        }
    }
}

#[test]
fn concurrent_calls_from_many_threads() {
    // Scratch buffers are thread-local and rayon may nest calls; hammer that.
    use rayon::prelude::*;
    (0..16u64).into_par_iter().for_each(|s| {
        let opts = GemmOptions::default();
        check_sgemm(
            &opts,
            120 + s as usize,
            90,
            300,
            Layout::RowMajor,
            Layout::Transposed,
            s % 2 == 0,
            s,
        );
    });
}

fn layout_strategy() -> impl Strategy<Value = Layout> {
    (0..LAYOUTS.len()).prop_map(|i| LAYOUTS[i])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn prop_sgemm_matches_reference(
        m in 0usize..70, n in 0usize..70, k in 0usize..70,
        la in layout_strategy(), lb in layout_strategy(),
        accumulate: bool, seed: u64, isa_idx in 0usize..3, threads in 1usize..3, allow_gemv: bool,
    ) {
        let all = isas();
        let opts = GemmOptions { isa: all[isa_idx % all.len()], threads: Some(threads), allow_gemv, bf16_dot: true };
        check_sgemm(&opts, m, n, k, la, lb, accumulate, seed);
    }

    #[test]
    fn prop_bf16_dot_matches_reference(
        m in 0usize..70, n in 0usize..70, k in 0usize..70,
        la in layout_strategy(), lb in layout_strategy(),
        accumulate: bool, seed: u64, threads in 1usize..3, bf16_dot: bool,
    ) {
        let opts = GemmOptions { isa: Isa::detect(), threads: Some(threads), allow_gemv: false, bf16_dot };
        check_sgemm_typed(&opts, m, n, k, la, lb, accumulate, seed, bf16::from_f32, bf16::from_f32);
    }

    #[test]
    fn prop_dgemm_matches_reference(
        m in 0usize..40, n in 0usize..40, k in 0usize..40,
        la in layout_strategy(), lb in layout_strategy(),
        accumulate: bool, seed: u64, isa_idx in 0usize..3,
    ) {
        let all = isas();
        let opts = GemmOptions { isa: all[isa_idx % all.len()], threads: None, allow_gemv: true, bf16_dot: true };
        check_dgemm(&opts, m, n, k, la, lb, accumulate, seed);
    }
}

/// Where the CPU has AVX512-BF16, bf16 products run on it: its dot products treat
/// subnormal bf16 inputs as zero (the instruction's rule), which the widened path does
/// not, so the two paths tell themselves apart on them.
#[test]
fn bf16_products_run_on_the_dot_kernel_where_the_cpu_has_it() {
    let (m, n, k) = (32, 64, 6);
    let tiny = bf16::from_bits(0x0001); // the smallest subnormal, about 9.2e-41
    let a = vec![tiny; m * k];
    let b = vec![bf16::from_f32(1.0); k * n];
    let run = |bf16_dot| {
        let opts = GemmOptions {
            bf16_dot,
            allow_gemv: false,
            ..GemmOptions::default()
        };
        let mut c = vec![0f32; m * n];
        let (a, b) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
        sgemm_with(&opts, m, n, k, a, b, &mut c, false);
        c
    };
    let exact = k as f32 * tiny.to_f32();
    assert!(run(false).iter().all(|&v| v == exact));
    let dot = run(true);
    if super::bf16_kernel() == "avx512-bf16" {
        assert!(dot.iter().all(|&v| v == 0.0), "the dot kernel did not run");
    } else {
        assert!(dot.iter().all(|&v| v == exact));
    }
}

/// A product whose reduction splits into parts gives the same bits whatever the
/// threads (the split depends on the shape alone), and the parts cover every step.
#[test]
fn split_reductions_do_not_depend_on_the_threads() {
    let (m, n, k) = (48, 96, 5000);
    assert!(super::reduction_parts(m, n, k) > 1);
    let mut rng = Rng(3);
    let a: Vec<f32> = (0..m * k).map(|_| rng.val()).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.val()).collect();
    let c0: Vec<f32> = (0..m * n).map(|_| rng.val()).collect();
    let run = |threads| {
        let opts = GemmOptions {
            threads: Some(threads),
            ..GemmOptions::default()
        };
        let mut c = c0.clone();
        let (a, b) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
        sgemm_with(&opts, m, n, k, a, b, &mut c, true);
        c
    };
    let one = run(1);
    for threads in [2, 3] {
        let got = run(threads);
        assert!(one
            .iter()
            .zip(&got)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    // Exact: products of multiples of 1/64 are multiples of 1/4096, and these partial
    // sums stay far below 2^24 / 4096 in magnitude, so f32 adds them without rounding.
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum::<f64>()
                + f64::from(c0[i * n + j]);
            assert_eq!(f64::from(one[i * n + j]), want, "c[{i},{j}]");
        }
    }
}

/// `sgemm_finishing` hands C over in blocks that cover it exactly once, each already
/// holding its final values when handed over: tall products (blocks per task), the
/// reduction in two blocks (handed over after the second), the transposed
/// orientation and skinny and split-reduction products (C whole at the end),
/// on one thread and two, over f32 and bf16.
#[test]
fn finish_sees_every_element_once_and_final() {
    use std::sync::Mutex;
    let shapes = [
        (2100, 40, 30),
        (40, 900, 70),
        (300, 10, 50),
        (30, 50, 2049),
        (1, 300, 40),
        (300, 70, 1031),
        (5, 7, 0),
    ];
    for threads in [Some(1), Some(2)] {
        for allow_gemv in [false, true] {
            let opts = GemmOptions {
                threads,
                allow_gemv,
                ..GemmOptions::default()
            };
            for (s, &(m, n, k)) in shapes.iter().enumerate() {
                let mut rng = Rng(s as u64 + 7);
                let a = Mat::new(Layout::RowMajor, m, k, &mut rng, bf16::from_f32);
                let b = Mat::new(Layout::Transposed, k, n, &mut rng, bf16::from_f32);
                let mut want = vec![0f32; m * n];
                sgemm_with(&opts, m, n, k, a.view(), b.view(), &mut want, false);
                let seen = Mutex::new((vec![f32::NAN; m * n], vec![0u8; m * n]));
                let finish = |block: &FinalBlock<'_, f32>| {
                    let mut seen = seen.lock().unwrap();
                    for r in 0..block.rows {
                        let row = block.row(r);
                        assert_eq!(row.len(), block.cols);
                        for (j, &v) in row.iter().enumerate() {
                            let at = (block.first_row + r) * n + block.first_col + j;
                            seen.0[at] = v;
                            seen.1[at] += 1;
                        }
                    }
                };
                let mut c = vec![f32::NAN; m * n];
                sgemm_finishing(
                    &opts,
                    m,
                    n,
                    k,
                    a.view(),
                    b.view(),
                    &mut c,
                    false,
                    Some(&finish),
                );
                let (values, counts) = seen.into_inner().unwrap();
                let what = format!("{opts:?} {m}x{n}x{k}");
                assert!(counts.iter().all(|&c| c == 1), "{what}: covered {counts:?}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&values),
                    bits(&want),
                    "{what}: values when handed over"
                );
                assert_eq!(bits(&c), bits(&want), "{what}");
            }
        }
    }
}
