//! Microkernels: each computes one tile of C (up to MR x NR) from a packed A
//! panel (MR lanes x kc) and a packed B panel (kc x NR lanes), keeping the whole
//! tile in registers for the full kc loop. Also the per-ISA blocking parameters.

use super::{Elem, Isa};

/// `c[i*rs_c + j] (+)= sum_p a[p*MR + i] * b[p*rs_b + j]` for `i < rows`, `j < cols`.
///
/// `rs_b` is NR for a packed B panel, or the source row stride when the kernel
/// reads an f32 B matrix in place (then it prefetches rows ahead itself).
///
/// # Safety
/// `kc >= 1`, `1 <= rows <= MR`, `1 <= cols <= NR`; `a` is valid for
/// `MR*kc` reads, `b` for reads of `NR` elements at each `p*rs_b`, `p < kc`, and
/// `c` for reads (when `load_c`) and writes of
/// `rows` rows of `cols` contiguous elements spaced `rs_c` apart; the CPU
/// supports the kernel's instruction set. Nothing else of C is touched.
pub(crate) type KernelFn<T> = unsafe fn(
    kc: usize,
    a: *const T,
    b: *const T,
    rs_b: usize,
    c: *mut T,
    rs_c: usize,
    rows: usize,
    cols: usize,
    load_c: bool,
);

/// A microkernel and the cache blocking tuned for it.
#[derive(Clone, Copy)]
pub(crate) struct KernelSpec<T> {
    /// Instruction set of the kernel (also used for packing).
    pub isa: Isa,
    /// Rows of the register tile (lanes of a packed A panel).
    pub mr: usize,
    /// Columns of the register tile (lanes of a packed B panel).
    pub nr: usize,
    /// Reduction block: one A micro-panel (MR x kc) stays in L1 while B streams past it.
    pub kc: usize,
    /// Row block: the packed A block (mc x kc), shared by all threads.
    pub mc: usize,
    /// Column block: one thread's packed B block (kc x nc), which should stay in its L2.
    pub nc: usize,
    /// The tile routine.
    pub func: KernelFn<T>,
    /// Whether the kernel reads bf16 pairs ([`super::pack::pack_bf16_pairs`]: two
    /// reduction steps per 32-bit slot) instead of panels widened to `T`.
    pub pairs: bool,
}

/// Largest MR*NR of any kernel, for edge-tile buffers.
pub(crate) const MAX_TILE: usize = 16 * 32;

/// Applies the `KILN_GEMM_{KC,MC,NC}` overrides (read once; a tuning aid for benchmarks).
fn tuned<T>(mut s: KernelSpec<T>) -> KernelSpec<T> {
    use std::sync::OnceLock;
    static OVERRIDES: OnceLock<[Option<usize>; 3]> = OnceLock::new();
    let o = OVERRIDES.get_or_init(|| {
        let env = |name: &str| {
            std::env::var(name)
                .ok()?
                .parse()
                .ok()
                .filter(|&v: &usize| v > 0)
        };
        [
            env("KILN_GEMM_KC"),
            env("KILN_GEMM_MC"),
            env("KILN_GEMM_NC"),
        ]
    });
    if let Some(v) = o[0] {
        s.kc = v;
    }
    if let Some(v) = o[1] {
        s.mc = v.next_multiple_of(s.mr);
    }
    if let Some(v) = o[2] {
        s.nc = v.next_multiple_of(s.nr);
    }
    s
}

/// The f32 kernel for `isa` (already clamped to what the CPU supports).
///
/// AVX-512 blocking for a Sapphire Rapids core (48 KiB L1d, 2 MiB L2): the A
/// micro-panel is 14 x 384 x 4 B = 21 KiB of L1, a thread's B block
/// 384 x 512 x 4 B = 768 KiB of L2, and the shared A block up to 1008 rows
/// (1.5 MiB) sits in L2/L3.
pub(crate) fn f32_kernel(isa: Isa) -> KernelSpec<f32> {
    let spec = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => KernelSpec {
            isa,
            mr: 14,
            nr: 32,
            kc: 512,
            mc: 2016,
            nc: 384,
            func: x86::sgemm_avx512_14x32,
            pairs: false,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => KernelSpec {
            isa,
            mr: 6,
            nr: 16,
            kc: 256,
            mc: 600,
            nc: 512,
            func: x86::sgemm_avx2_6x16,
            pairs: false,
        },
        _ => KernelSpec {
            isa: Isa::Portable,
            mr: 4,
            nr: 8,
            kc: 256,
            mc: 512,
            nc: 512,
            func: portable_f32,
            pairs: false,
        },
    };
    tuned(spec)
}

/// The bf16 dot-product kernel (AVX512-BF16's `vdpbf16ps`: 32 multiply-adds of bf16
/// pairs per instruction, twice the f32 kernel's), when the CPU has it and `isa`
/// allows AVX-512.
///
/// Blocking as for the f32 kernel, in steps: a slot holds two, so kc = 1024 keeps
/// the A micro-panel at 14 x 512 x 4 B = 28 KiB of L1 and a thread's B block at
/// 1024 x 384 x 2 B = 768 KiB of L2.
pub(crate) fn bf16_dot_kernel(isa: Isa) -> Option<KernelSpec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512_packing() && bf16_dot_supported() {
        return Some(tuned(KernelSpec {
            isa,
            mr: 14,
            nr: 32,
            kc: 1024,
            mc: 2016,
            nc: 384,
            func: x86::bf16_avx512_14x32,
            pairs: true,
        }));
    }
    let _ = isa;
    None
}

/// Whether this CPU has AVX512-BF16 (detected once).
pub(crate) fn bf16_dot_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            std::env::var_os("KILN_GEMM_NO_BF16_DOT").is_none()
                && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The f64 kernel for `isa` (already clamped to what the CPU supports).
pub(crate) fn f64_kernel(isa: Isa) -> KernelSpec<f64> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => KernelSpec {
            isa,
            mr: 14,
            nr: 16,
            kc: 256,
            mc: 504,
            nc: 512,
            func: x86::dgemm_avx512_14x16,
            pairs: false,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => KernelSpec {
            isa,
            mr: 6,
            nr: 8,
            kc: 256,
            mc: 504,
            nc: 512,
            func: x86::dgemm_avx2_6x8,
            pairs: false,
        },
        _ => KernelSpec {
            isa: Isa::Portable,
            mr: 4,
            nr: 4,
            kc: 256,
            mc: 512,
            nc: 512,
            func: portable_f64,
            pairs: false,
        },
    }
}

/// Plain-Rust tile loop; with constant MR/NR the compiler unrolls it and keeps the
/// tile in vector registers for whatever SIMD the enclosing function enables.
/// Partial tiles are computed in full and only their valid part is written.
///
/// # Safety
/// As for [`KernelFn`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn generic_kernel<T: Elem, const MR: usize, const NR: usize, const FMA: bool>(
    kc: usize,
    a: *const T,
    b: *const T,
    rs_b: usize,
    c: *mut T,
    rs_c: usize,
    rows: usize,
    cols: usize,
    load_c: bool,
) {
    // SAFETY: the caller guarantees `a` covers MR*kc elements.
    let a = unsafe { std::slice::from_raw_parts(a, MR * kc) };
    let (a, _) = a.as_chunks::<MR>();
    let mut acc = [[T::ZERO; NR]; MR];
    for (p, ap) in a.iter().enumerate() {
        // SAFETY: the caller guarantees NR readable elements at b + p*rs_b.
        let bp = unsafe { &*b.add(p * rs_b).cast::<[T; NR]>() };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = if FMA {
                    T::fma(ap[i], bp[j], acc[i][j])
                } else {
                    acc[i][j] + ap[i] * bp[j]
                };
            }
        }
    }
    for (i, acc) in acc.iter().enumerate().take(rows) {
        // SAFETY: the caller guarantees `cols` elements at c + i*rs_c for i < rows.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * rs_c), cols) };
        for (d, &v) in row.iter_mut().zip(acc) {
            *d = if load_c { *d + v } else { v };
        }
    }
}

/// Portable f32 kernel (4x8).
///
/// # Safety
/// As for [`KernelFn`].
#[allow(clippy::too_many_arguments)]
unsafe fn portable_f32(
    kc: usize,
    a: *const f32,
    b: *const f32,
    rs_b: usize,
    c: *mut f32,
    rs_c: usize,
    r: usize,
    n: usize,
    l: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { generic_kernel::<f32, 4, 8, false>(kc, a, b, rs_b, c, rs_c, r, n, l) }
}

/// Portable f64 kernel (4x4).
///
/// # Safety
/// As for [`KernelFn`].
#[allow(clippy::too_many_arguments)]
unsafe fn portable_f64(
    kc: usize,
    a: *const f64,
    b: *const f64,
    rs_b: usize,
    c: *mut f64,
    rs_c: usize,
    r: usize,
    n: usize,
    l: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { generic_kernel::<f64, 4, 4, false>(kc, a, b, rs_b, c, rs_c, r, n, l) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::generic_kernel;
    use std::arch::x86_64::*;

    /// Runs `$body` with the const `$R` set to `$rows` (which the kernels' contract
    /// keeps within 1..=14): the 14-row kernels' dispatch on an edge panel's valid rows.
    macro_rules! rows_1_to_14 {
        ($rows:expr, $R:ident => $body:expr) => {
            rows_1_to_14!(@arms $rows, $R, $body, [14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2])
        };
        (@arms $rows:expr, $R:ident, $body:expr, [$($n:literal),*]) => {
            match $rows {
                $($n => { const $R: usize = $n; $body })*
                _ => { const $R: usize = 1; $body }
            }
        };
    }

    /// AVX2+FMA f32 kernel (6x16: 12 ymm accumulators).
    ///
    /// # Safety
    /// As for [`super::KernelFn`]; the CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sgemm_avx2_6x16(
        kc: usize,
        a: *const f32,
        b: *const f32,
        rs_b: usize,
        c: *mut f32,
        rs_c: usize,
        rows: usize,
        cols: usize,
        load_c: bool,
    ) {
        // SAFETY: forwarded contract; FMA is enabled here, so `mul_add` is one instruction.
        unsafe { generic_kernel::<f32, 6, 16, true>(kc, a, b, rs_b, c, rs_c, rows, cols, load_c) }
    }

    /// AVX2+FMA f64 kernel (6x8: 12 ymm accumulators).
    ///
    /// # Safety
    /// As for [`super::KernelFn`]; the CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn dgemm_avx2_6x8(
        kc: usize,
        a: *const f64,
        b: *const f64,
        rs_b: usize,
        c: *mut f64,
        rs_c: usize,
        rows: usize,
        cols: usize,
        load_c: bool,
    ) {
        // SAFETY: forwarded contract.
        unsafe { generic_kernel::<f64, 6, 8, true>(kc, a, b, rs_b, c, rs_c, rows, cols, load_c) }
    }

    /// Lane masks selecting the first `cols` of two 16-lane (f32) vectors.
    #[inline(always)]
    fn masks16(cols: usize) -> (u16, u16) {
        let m = if cols >= 32 {
            u32::MAX
        } else {
            (1u32 << cols) - 1
        };
        (m as u16, (m >> 16) as u16)
    }

    /// Lane masks selecting the first `cols` of two 8-lane (f64) vectors.
    #[inline(always)]
    fn masks8(cols: usize) -> (u8, u8) {
        let m = if cols >= 16 {
            u16::MAX
        } else {
            (1u16 << cols) - 1
        };
        (m as u8, (m >> 8) as u8)
    }

    /// AVX-512 f32 kernel, 14 x 32: dispatches on the number of valid rows so an
    /// edge panel of A costs only its real rows (no wasted FMAs, no temp tile).
    ///
    /// # Safety
    /// As for [`super::KernelFn`]; the CPU must support AVX-512F.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sgemm_avx512_14x32(
        kc: usize,
        a: *const f32,
        b: *const f32,
        rs_b: usize,
        c: *mut f32,
        rs_c: usize,
        rows: usize,
        cols: usize,
        load_c: bool,
    ) {
        // SAFETY (all arms): forwarded contract; R == rows <= 14.
        unsafe {
            if rs_b == 32 {
                rows_1_to_14!(rows, R => s_rows::<R, false>(kc, a, b, rs_b, c, rs_c, cols, load_c))
            } else {
                rows_1_to_14!(rows, R => s_rows::<R, true>(kc, a, b, rs_b, c, rs_c, cols, load_c))
            }
        }
    }

    /// The 14x32 kernel restricted to its first `R` rows. With R = 14 it holds
    /// 28 zmm accumulators plus two for the B row and one for the broadcast A
    /// element (31 of 32 registers). Each k step issues 2R FMAs against 2 vector
    /// loads and R broadcasts, so the two FMA ports are the bottleneck.
    /// `DIRECT`: B is read in place (software-prefetch its rows).
    ///
    /// # Safety
    /// As for [`super::KernelFn`] with `rows == R`; the CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn s_rows<const R: usize, const DIRECT: bool>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        rs_b: usize,
        c: *mut f32,
        rs_c: usize,
        cols: usize,
        load_c: bool,
    ) {
        // A panel lane stride (the packing width), independent of R.
        const MR: usize = 14;
        const PF_ROWS: usize = 8;
        if load_c {
            // C is touched once per kc steps; start its fetch early so the
            // update at the end does not stall on a cold line.
            for i in 0..R {
                // Prefetch is a hint and never faults, so wrapping arithmetic suffices.
                let row = c.wrapping_add(i * rs_c) as *const i8;
                // 128 bytes span three lines unless the row is 64-byte aligned.
                _mm_prefetch::<_MM_HINT_T0>(row);
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(127));
            }
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            // SAFETY: fewer than kc steps taken, so the 32 floats at b and the
            // first R of the 14 at a are inside the panels.
            unsafe {
                if DIRECT {
                    // In-place B rows are usually a page or more apart, beyond
                    // the hardware prefetchers: fetch a few rows ahead.
                    let ahead = b.wrapping_add(PF_ROWS * rs_b) as *const i8;
                    _mm_prefetch::<_MM_HINT_T0>(ahead);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(127));
                }
                let b0 = _mm512_loadu_ps(b);
                let b1 = _mm512_loadu_ps(b.add(16));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(*a.add(i));
                    acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
                }
                a = a.add(MR);
                b = b.wrapping_add(rs_b);
            }
        }
        // SAFETY: forwarded contract.
        unsafe { store_tile(&acc, c, rs_c, cols, load_c) }
    }

    /// Writes (or, with `load_c`, adds) a tile of R rows of 32 accumulators into the
    /// first `cols` columns of C's rows.
    ///
    /// # Safety
    /// Row i < R of C has `cols` valid elements at c + i*rs_c; the CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store_tile<const R: usize>(
        acc: &[[__m512; 2]; R],
        c: *mut f32,
        rs_c: usize,
        cols: usize,
        load_c: bool,
    ) {
        let (m0, m1) = masks16(cols);
        for (i, acc) in acc.iter().enumerate() {
            // SAFETY: row i < R of the tile has `cols` valid elements at c + i*rs_c;
            // masked loads/stores touch only those (masked-off lanes never fault).
            unsafe {
                let row = c.add(i * rs_c);
                let (mut r0, mut r1) = (acc[0], acc[1]);
                if cols == 32 {
                    if load_c {
                        r0 = _mm512_add_ps(r0, _mm512_loadu_ps(row));
                        r1 = _mm512_add_ps(r1, _mm512_loadu_ps(row.add(16)));
                    }
                    _mm512_storeu_ps(row, r0);
                    _mm512_storeu_ps(row.add(16), r1);
                } else {
                    if load_c {
                        r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(m0, row));
                        r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(m1, row.wrapping_add(16)));
                    }
                    _mm512_mask_storeu_ps(row, m0, r0);
                    _mm512_mask_storeu_ps(row.wrapping_add(16), m1, r1);
                }
            }
        }
    }

    /// AVX512-BF16 kernel, 14 x 32 over bf16 pairs (panels from
    /// [`super::super::pack::pack_bf16_pairs`]), dispatching on the number of valid rows.
    ///
    /// # Safety
    /// As for [`super::KernelFn`], with `a` valid for `14 * kc.div_ceil(2)` slots and
    /// `b` for 32 at each `q * rs_b`, `q < kc.div_ceil(2)`; the CPU must support
    /// AVX-512F and AVX512-BF16.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn bf16_avx512_14x32(
        kc: usize,
        a: *const f32,
        b: *const f32,
        rs_b: usize,
        c: *mut f32,
        rs_c: usize,
        rows: usize,
        cols: usize,
        load_c: bool,
    ) {
        let pairs = kc.div_ceil(2);
        // SAFETY (all arms): forwarded contract; R == rows <= 14.
        unsafe {
            rows_1_to_14!(rows, R => bf16_rows::<R>(pairs, a, b, rs_b, c, rs_c, cols, load_c))
        }
    }

    /// The bf16 14x32 kernel restricted to its first `R` rows: per pair of steps, two
    /// vector loads of B pairs, R broadcasts of an A pair and 2R `vdpbf16ps`, each
    /// adding two exact bf16 products to an f32 accumulator.
    ///
    /// # Safety
    /// As for [`bf16_avx512_14x32`] with `rows == R` and `pairs == kc.div_ceil(2)`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn bf16_rows<const R: usize>(
        pairs: usize,
        a: *const f32,
        b: *const f32,
        rs_b: usize,
        c: *mut f32,
        rs_c: usize,
        cols: usize,
        load_c: bool,
    ) {
        const MR: usize = 14;
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let (mut a, mut b) = (a.cast::<i32>(), b);
        for _ in 0..pairs {
            // SAFETY: fewer than `pairs` slot rows taken, so the 32 slots at b and the
            // first R of the 14 at a are inside the panels; the casts between
            // 512-bit vector types only relabel lanes.
            unsafe {
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_ps(b));
                let b1: __m512bh = std::mem::transmute(_mm512_loadu_ps(b.add(16)));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i)));
                    acc[0] = _mm512_dpbf16_ps(acc[0], ai, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], ai, b1);
                }
                a = a.add(MR);
                b = b.add(rs_b);
            }
        }
        // SAFETY: forwarded contract.
        unsafe { store_tile(&acc, c, rs_c, cols, load_c) }
    }

    /// AVX-512 f64 kernel, 14 x 16 (28 zmm accumulators), dispatching on valid rows.
    ///
    /// # Safety
    /// As for [`super::KernelFn`]; the CPU must support AVX-512F.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn dgemm_avx512_14x16(
        kc: usize,
        a: *const f64,
        b: *const f64,
        rs_b: usize,
        c: *mut f64,
        rs_c: usize,
        rows: usize,
        cols: usize,
        load_c: bool,
    ) {
        // SAFETY (all arms): forwarded contract; R == rows <= 14.
        unsafe { rows_1_to_14!(rows, R => d_rows::<R>(kc, a, b, rs_b, c, rs_c, cols, load_c)) }
    }

    /// The 14x16 f64 kernel restricted to its first `R` rows.
    ///
    /// # Safety
    /// As for [`super::KernelFn`] with `rows == R`; the CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn d_rows<const R: usize>(
        kc: usize,
        a: *const f64,
        b: *const f64,
        rs_b: usize,
        c: *mut f64,
        rs_c: usize,
        cols: usize,
        load_c: bool,
    ) {
        const MR: usize = 14;
        let mut acc = [[_mm512_setzero_pd(); 2]; R];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            // SAFETY: fewer than kc steps taken, so the 16 doubles at b and the
            // first R of the 14 at a are inside the panels.
            unsafe {
                let b0 = _mm512_loadu_pd(b);
                let b1 = _mm512_loadu_pd(b.add(8));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_pd(*a.add(i));
                    acc[0] = _mm512_fmadd_pd(ai, b0, acc[0]);
                    acc[1] = _mm512_fmadd_pd(ai, b1, acc[1]);
                }
                a = a.add(MR);
                b = b.wrapping_add(rs_b);
            }
        }
        let (m0, m1) = masks8(cols);
        for (i, acc) in acc.iter().enumerate() {
            // SAFETY: row i < R has `cols` valid elements; masked-off lanes never fault.
            unsafe {
                let row = c.add(i * rs_c);
                let (mut r0, mut r1) = (acc[0], acc[1]);
                if load_c {
                    r0 = _mm512_add_pd(r0, _mm512_maskz_loadu_pd(m0, row));
                    r1 = _mm512_add_pd(r1, _mm512_maskz_loadu_pd(m1, row.wrapping_add(8)));
                }
                _mm512_mask_storeu_pd(row, m0, r0);
                _mm512_mask_storeu_pd(row.wrapping_add(8), m1, r1);
            }
        }
    }
}
