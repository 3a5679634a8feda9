//! Dense matrix multiplication for the CPU backend.
//!
//! This module owns the f32 and f64 GEMM behind [`sgemm`] and [`dgemm`]:
//! - `driver`: the BLIS-style blocked loop nest and its rayon parallelism over
//!   blocks of C (plus the choice between computing C or Cᵀ for skinny shapes);
//! - `pack`: copying strided f32/f16/bf16 (or f64) operands into contiguous,
//!   zero-padded panels, SIMD-accelerated on AVX-512;
//! - `kernels`: the register-tile microkernels (AVX-512 14x32, AVX2+FMA 6x16,
//!   portable 4x8; f64 variants) and their cache-blocking parameters, picked at
//!   run time from the CPU's features;
//! - `gemv`: in-place paths for skinny products (m or n of 1, or up to 16:
//!   small-batch inference, 10-class output layers), where packing would cost
//!   more than the product itself;
//! - `scratch`: the thread-local packing buffers reused across calls.

mod driver;
pub(crate) use driver::{FinalBlock, Finish};
mod gemv;
mod kernels;
mod pack;
mod scratch;
#[cfg(test)]
mod tests;

use half::{bf16, f16};

/// A strided matrix view: element (i, j) is data[offset + i*row_stride + j*col_stride].
/// Strides may be 0 (broadcast) or anything else (transposed views).
#[derive(Clone, Copy)]
pub struct MatRef<'a, T> {
    /// Backing storage; every addressed element must lie inside it.
    pub data: &'a [T],
    /// Index of element (0, 0) in `data`.
    pub offset: usize,
    /// Distance in elements between (i, j) and (i + 1, j).
    pub row_stride: usize,
    /// Distance in elements between (i, j) and (i, j + 1).
    pub col_stride: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A row-major contiguous `rows x cols` view of `data` (only `cols` is needed to derive the strides).
    pub fn row_major(data: &'a [T], cols: usize) -> Self {
        MatRef {
            data,
            offset: 0,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transposed view (swaps the strides; no data moves).
    pub fn t(self) -> Self {
        MatRef {
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Element (i, j); panics if it lies outside `data`.
    #[inline]
    pub fn at(&self, i: usize, j: usize) -> T
    where
        T: Copy,
    {
        self.data[self.offset + i * self.row_stride + j * self.col_stride]
    }

    /// Panics unless every element of a `rows x cols` view lies inside `data`.
    ///
    /// The kernels read through raw pointers; this check is what makes that sound.
    fn check_bounds(&self, rows: usize, cols: usize, name: &str) {
        if rows == 0 || cols == 0 {
            return;
        }
        let last = (rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|r| {
                (cols - 1)
                    .checked_mul(self.col_stride)
                    .and_then(|c| r.checked_add(c))
            })
            .and_then(|rc| rc.checked_add(self.offset));
        match last {
            Some(last) if last < self.data.len() => {}
            _ => panic!(
                "gemm: {name} view ({rows}x{cols}, offset {}, strides {}x{}) exceeds its buffer of {} elements",
                self.offset,
                self.row_stride,
                self.col_stride,
                self.data.len()
            ),
        }
    }
}

/// Element types the f32 GEMM reads (converted to f32 while packing).
pub trait GemmInput: Copy + Send + Sync + 'static {
    /// Widens one element to f32 (exactly, for all implementors).
    fn to_f32(self) -> f32;

    /// The slice's raw representation, for the copy-free and SIMD-converting fast paths.
    #[doc(hidden)]
    #[inline]
    fn bits(_s: &[Self]) -> SrcBits<'_> {
        SrcBits::Other
    }

    /// Reinterprets a slice as f32 when `Self` is f32.
    #[doc(hidden)]
    #[inline]
    fn as_f32_slice(s: &[Self]) -> Option<&[f32]> {
        match Self::bits(s) {
            SrcBits::F32(s) => Some(s),
            _ => None,
        }
    }
}

/// Raw view of an input slice (internal).
#[doc(hidden)]
#[derive(Clone, Copy)]
pub enum SrcBits<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// IEEE binary16 bit patterns.
    F16(&'a [u16]),
    /// bfloat16 bit patterns.
    Bf16(&'a [u16]),
    /// Anything else (converted element by element).
    Other,
}

impl GemmInput for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn bits(s: &[Self]) -> SrcBits<'_> {
        SrcBits::F32(s)
    }
}

impl GemmInput for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn bits(s: &[Self]) -> SrcBits<'_> {
        use half::slice::HalfFloatSliceExt;
        SrcBits::F16(s.reinterpret_cast())
    }
}

impl GemmInput for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn bits(s: &[Self]) -> SrcBits<'_> {
        use half::slice::HalfFloatSliceExt;
        SrcBits::Bf16(s.reinterpret_cast())
    }
}

/// The accumulation types the driver and kernels work in (sealed: only f32 and f64,
/// which the scratch buffers rely on being plain old data).
pub(crate) trait Elem:
    Copy
    + Send
    + Sync
    + 'static
    + PartialEq
    + core::fmt::Debug
    + core::ops::Add<Output = Self>
    + core::ops::Mul<Output = Self>
    + core::ops::AddAssign
{
    const ZERO: Self;
    /// The slice as f32 when `Self` is f32 (enables the SIMD packing routines).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;
    /// Fused multiply-add `a * b + c`; only used where the caller's target features make it a single instruction.
    fn fma(a: Self, b: Self, c: Self) -> Self;
}

impl Elem for f32 {
    const ZERO: Self = 0.0;
    #[inline]
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
    #[inline(always)]
    fn fma(a: Self, b: Self, c: Self) -> Self {
        a.mul_add(b, c)
    }
}

impl Elem for f64 {
    const ZERO: Self = 0.0;
    #[inline]
    fn as_f32_mut(_s: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    #[inline(always)]
    fn fma(a: Self, b: Self, c: Self) -> Self {
        a.mul_add(b, c)
    }
}

/// Conversion of an input element into the accumulation type `T` during packing.
pub(crate) trait Load<T: Elem>: Copy + Send + Sync + 'static {
    fn load(self) -> T;
    /// Raw view of the slice (only meaningful when `T` is f32; `Other` for f64).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn bits(s: &[Self]) -> SrcBits<'_>;
    /// The slice itself when `Self` is `T` (enables reading B in place).
    fn as_native(s: &[Self]) -> Option<&[T]>;
}

impl<X: GemmInput> Load<f32> for X {
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn bits(s: &[Self]) -> SrcBits<'_> {
        X::bits(s)
    }
    #[inline]
    fn as_native(s: &[Self]) -> Option<&[f32]> {
        X::as_f32_slice(s)
    }
}

impl Load<f64> for f64 {
    #[inline(always)]
    fn load(self) -> f64 {
        self
    }
    #[inline]
    fn bits(_s: &[Self]) -> SrcBits<'_> {
        SrcBits::Other
    }
    #[inline]
    fn as_native(s: &[Self]) -> Option<&[f64]> {
        Some(s)
    }
}

/// Instruction-set level of the kernels (internal; exposed so tests and benches can force one).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, auto-vectorized for the compile-time target only.
    Portable,
    /// AVX2 + FMA (x86-64 only).
    Avx2,
    /// AVX-512F (x86-64 only).
    Avx512,
}

impl Isa {
    /// The best level this CPU supports (detected once).
    pub fn detect() -> Isa {
        use std::sync::atomic::{AtomicU8, Ordering};
        static CACHE: AtomicU8 = AtomicU8::new(u8::MAX);
        let v = CACHE.load(Ordering::Relaxed);
        if v != u8::MAX {
            return match v {
                2 => Isa::Avx512,
                1 => Isa::Avx2,
                _ => Isa::Portable,
            };
        }
        let isa = Self::detect_uncached();
        CACHE.store(isa as u8, Ordering::Relaxed);
        isa
    }

    fn detect_uncached() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var_os("KILN_GEMM_PORTABLE").is_some() {
                return Isa::Portable;
            }
            if is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Whether the AVX-512 packing routines (which also need BW and VL for
    /// 16-bit masked loads) can run; every AVX-512 CPU but Xeon Phi has them.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn avx512_packing(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::sync::OnceLock;
            static OK: OnceLock<bool> = OnceLock::new();
            self == Isa::Avx512
                && *OK.get_or_init(|| {
                    is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl")
                })
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// `self`, lowered to what the CPU actually supports.
    fn clamp(self) -> Isa {
        self.min(Isa::detect())
    }
}

/// Knobs for tests and benchmarks (internal).
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct GemmOptions {
    /// Kernel level to use (lowered to what the CPU supports).
    pub isa: Isa,
    /// Thread count; `None` picks from the problem size and the rayon pool.
    pub threads: Option<usize>,
    /// Allow the in-place shortcuts for skinny shapes (m or n of 1, or up to 16).
    pub allow_gemv: bool,
    /// Multiply two bf16 operands with the CPU's bf16 dot-product instructions where it
    /// has them (AVX512-BF16), instead of widening them to f32 while packing.
    pub bf16_dot: bool,
}

impl Default for GemmOptions {
    fn default() -> Self {
        GemmOptions {
            isa: Isa::detect(),
            threads: None,
            allow_gemv: true,
            bf16_dot: true,
        }
    }
}

/// Below this many multiply-adds a single thread wins over rayon's fork/join cost.
const PARALLEL_MIN_WORK: usize = 1 << 20;

fn pick_threads(opts: &GemmOptions, m: usize, n: usize, k: usize) -> usize {
    match opts.threads {
        Some(t) => t.max(1),
        None => {
            let work = m.saturating_mul(n).saturating_mul(k);
            if work < PARALLEL_MIN_WORK {
                1
            } else {
                rayon::current_num_threads().max(1)
            }
        }
    }
}

/// c (row-major, m x n, contiguous, len m*n) = a (m x k) · b (k x n), computed in f32;
/// if `accumulate` then c += a·b instead. Multi-threaded with rayon (uses the global
/// pool) when the problem is big enough to benefit; single-threaded for tiny ones.
pub fn sgemm<A: GemmInput, B: GemmInput>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [f32],
    accumulate: bool,
) {
    sgemm_with(&GemmOptions::default(), m, n, k, a, b, c, accumulate)
}

/// The same in f64 (used by gradient checks; correctness first, reasonable speed).
pub fn dgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<f64>,
    b: MatRef<f64>,
    c: &mut [f64],
    accumulate: bool,
) {
    dgemm_with(&GemmOptions::default(), m, n, k, a, b, c, accumulate)
}

/// [`sgemm`] with explicit options (internal: tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with<A: GemmInput, B: GemmInput>(
    opts: &GemmOptions,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [f32],
    accumulate: bool,
) {
    sgemm_finishing(opts, m, n, k, a, b, c, accumulate, None)
}

/// [`sgemm_with`], handing C to `finish` in blocks that cover it once, each as soon as
/// its values are final (in a parallel product, from the thread that computed it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_finishing<A: GemmInput, B: GemmInput>(
    opts: &GemmOptions,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [f32],
    accumulate: bool,
    finish: Option<driver::Finish<'_>>,
) {
    let whole = |c: &mut [f32]| {
        if let (Some(f), false) = (finish, c.is_empty()) {
            f(&driver::FinalBlock::whole(c, m, n));
        }
    };
    if !prologue(m, n, k, &a, &b, c, accumulate) {
        return whole(c);
    }
    let isa = opts.isa.clamp();
    let threads = pick_threads(opts, m, n, k);
    if opts.allow_gemv && gemv::try_skinny(isa, threads, m, n, k, a, b, c, accumulate) {
        return whole(c);
    }
    let both_bf16 = matches!(
        (A::bits(a.data), B::bits(b.data)),
        (SrcBits::Bf16(_), SrcBits::Bf16(_))
    );
    let spec = match kernels::bf16_dot_kernel(isa) {
        Some(spec) if both_bf16 && opts.bf16_dot => spec,
        _ => kernels::f32_kernel(isa),
    };
    let parts = reduction_parts(m, n, k);
    if parts > 1 {
        split_reduction(&spec, parts, m, n, k, a, b, c, accumulate, threads);
        return whole(c);
    }
    driver::gemm_oriented(&spec, m, n, k, a, b, c, accumulate, threads, finish);
}

/// Into how many parts a product's reduction is split: a long reduction into a small C
/// (a weight's gradient over a batch of tokens: `[128, 4096] · [4096, 512]`) splits
/// into parts of at least 1,024 steps, each a one-thread product over its own steps,
/// summed after in a fixed order. Parallel over C alone, such a product
/// synchronises its threads once per reduction block and shares A's panels between
/// them; parts need neither. The split depends on the shape only, never on the
/// threads, so the result is the same on any machine.
fn reduction_parts(m: usize, n: usize, k: usize) -> usize {
    const MIN_STEPS: usize = 1024;
    const MAX_PARTS: usize = 8;
    // C small enough that the parts' copies stay in cache (256 KiB each).
    if k >= 2 * MIN_STEPS && k >= 8 * m.max(n) && m * n <= 1 << 16 {
        (k / MIN_STEPS).min(MAX_PARTS)
    } else {
        1
    }
}

/// `c (+)= a·b` as `parts` products over consecutive runs of the reduction (each a
/// multiple of two steps, so bf16 pairs stay whole), run side by side on one thread
/// each: the first into `c`, the others into this thread's buffers, then added to
/// `c` in order.
#[allow(clippy::too_many_arguments)]
fn split_reduction<A: Load<f32>, B: Load<f32>>(
    spec: &kernels::KernelSpec<f32>,
    parts: usize,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    use rayon::prelude::*;
    let per = k.div_ceil(parts).next_multiple_of(2);
    let parts = k.div_ceil(per);
    let mn = m * n;
    scratch::with_scratch(&scratch::PARTS_SCRATCH, |buf| {
        let rest = buf.slice::<f32>((parts - 1) * mn);
        let mut outs: [&mut [f32]; 8] = Default::default();
        outs[0] = &mut *c;
        for (out, part) in outs[1..].iter_mut().zip(rest.chunks_exact_mut(mn)) {
            *out = part;
        }
        let part = |p: usize, out: &mut [f32]| {
            let k0 = p * per;
            let kp = per.min(k - k0);
            let ap = MatRef {
                offset: a.offset + k0 * a.col_stride,
                ..a
            };
            let bp = MatRef {
                offset: b.offset + k0 * b.row_stride,
                ..b
            };
            driver::gemm_oriented(spec, m, n, kp, ap, bp, out, accumulate && p == 0, 1, None);
        };
        let outs = &mut outs[..parts];
        if threads > 1 {
            outs.par_iter_mut()
                .with_max_len(1)
                .enumerate()
                .for_each(|(p, out)| part(p, out));
        } else {
            outs.iter_mut()
                .enumerate()
                .for_each(|(p, out)| part(p, out));
        }
        let (first, others) = outs.split_at_mut(1);
        for other in others.iter() {
            kiln_tensor::simd::wide(
                #[inline(always)]
                || {
                    for (c, v) in first[0].iter_mut().zip(other.iter()) {
                        *c += *v;
                    }
                },
            );
        }
    });
}

/// The kernel an f32 product runs on this CPU, named by its instruction set and tile:
/// `"avx512-14x32"`, `"avx2-6x16"` or `"portable-4x8"` (what benchmark lines report).
pub fn f32_kernel() -> String {
    let spec = kernels::f32_kernel(Isa::detect());
    let isa = match spec.isa {
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2",
        Isa::Portable => "portable",
    };
    format!("{isa}-{}x{}", spec.mr, spec.nr)
}

/// The kernel a product of two bf16 operands runs on this CPU: `"avx512-bf16"` (bf16
/// pairs, f32 accumulation) or `"widened"` (the f32 kernel on operands widened while
/// packing). Skinny products take the in-place paths, which widen, either way.
pub fn bf16_kernel() -> &'static str {
    match kernels::bf16_dot_kernel(Isa::detect()) {
        Some(_) => "avx512-bf16",
        None => "widened",
    }
}

/// [`dgemm`] with explicit options (internal: tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn dgemm_with(
    opts: &GemmOptions,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<f64>,
    b: MatRef<f64>,
    c: &mut [f64],
    accumulate: bool,
) {
    if !prologue(m, n, k, &a, &b, c, accumulate) {
        return;
    }
    let isa = opts.isa.clamp();
    let threads = pick_threads(opts, m, n, k);
    let spec = kernels::f64_kernel(isa);
    driver::gemm_oriented(&spec, m, n, k, a, b, c, accumulate, threads, None);
}

/// Validates the contract and settles the degenerate shapes; returns whether a product remains to compute.
fn prologue<T: Elem, A, B>(
    m: usize,
    n: usize,
    k: usize,
    a: &MatRef<A>,
    b: &MatRef<B>,
    c: &mut [T],
    accumulate: bool,
) -> bool {
    let mn = m.checked_mul(n).expect("gemm: m*n overflows usize");
    assert!(
        c.len() == mn,
        "gemm: c has {} elements, expected m*n = {mn}",
        c.len()
    );
    if mn == 0 {
        return false;
    }
    if k == 0 {
        if !accumulate {
            c.fill(T::ZERO);
        }
        return false;
    }
    a.check_bounds(m, k, "a");
    b.check_bounds(k, n, "b");
    true
}
