//! Weight-only int8 products. A weight matrix `[N, K]` (a linear layer's, one row per
//! output) is quantised per row with a symmetric scale (`w ≈ q · s`, `q` in
//! −127..=127); a product keeps it in int8: each row of activations is quantised to
//! int8 with a scale of its own, the dot products accumulate exactly in i32 (AVX-512
//! VNNI, AVX2 `maddubs`, or portable code: [`Int8Kernel`], detected at run time), and
//! the epilogue scales each result, adds the bias and applies the activation in f32.
//!
//! The weights are a quarter of their f32 size, so a model whose f32 weights stream
//! from L3 on every call (W1's MLP: 7.5 MB) fits in L2 (1.9 MB).

use crate::storage::CpuStorage;
use crate::strided::gather;
use kiln_tensor::fused::ProductEpilogue;
use kiln_tensor::precision::{quantize_int8_row, quantize_int8_row_into};
use kiln_tensor::{Error, Layout, Result, UnaryOp};
use std::sync::Arc;

/// Rows are stored padded to a multiple of this many columns (one AVX-512 register of
/// int8), the padding zeros, so the kernels read whole registers.
const PAD: usize = 64;

/// The most columns whose products are summed in one i32: 127 · 127 · 65,536 < 2³¹.
const CHUNK: usize = 65_536;

/// One 64-byte line, aligned to its size.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(64))]
struct Line([u8; PAD]);

/// Bytes in whole lines starting on a 64-byte boundary, so that no register the
/// kernels load straddles two cache lines (an unaligned 64-byte load always does).
#[derive(Clone, Debug, PartialEq)]
struct Lines(Vec<Line>);

impl Lines {
    /// At least `len` bytes, each `byte`.
    fn filled(len: usize, byte: u8) -> Self {
        Lines(vec![Line([byte; PAD]); len.div_ceil(PAD)])
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is `repr(C)` over `PAD` bytes (its size is its alignment, so
        // there is no padding): the vector holds `len * PAD` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * PAD) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.0.len() * PAD) }
    }

    fn signed(&self) -> &[i8] {
        // SAFETY: i8 and u8 have the same size and alignment, every bit pattern valid.
        unsafe { std::slice::from_raw_parts(self.bytes().as_ptr().cast(), self.0.len() * PAD) }
    }

    fn signed_mut(&mut self) -> &mut [i8] {
        let len = self.0.len() * PAD;
        // SAFETY: as in `signed`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.bytes_mut().as_mut_ptr().cast(), len) }
    }
}

/// An int8 matrix `[rows, cols]` laid out for the products: rows padded to whole
/// 64-byte lines, with each row's sum. Made once per weight and shared
/// ([`Int8Matrix::from_packed`]): a CPU buffer of i8 caches its packed form.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedInt8 {
    rows: usize,
    cols: usize,
    stride: usize,
    data: Lines,
    /// Σ of each row's values, for the VNNI kernel's unsigned activations.
    row_sums: Vec<i32>,
    /// Whether a value is −128, whose negation the AVX2 kernel's sign trick cannot hold.
    has_min: bool,
}

impl PackedInt8 {
    /// Packs `data`, `rows × cols` int8 values, row-major.
    pub fn pack(rows: usize, cols: usize, data: &[i8]) -> Result<Self> {
        check_size(rows, cols, data.len())?;
        let stride = cols.div_ceil(PAD).max(1) * PAD;
        let len = rows.checked_mul(stride).ok_or_else(|| {
            Error::invalid("int8 matrix", format!("[{rows}, {cols}] is too large"))
        })?;
        let mut padded = Lines::filled(len, 0);
        let mut row_sums = Vec::with_capacity(rows);
        for r in 0..rows {
            let row = &data[r * cols..(r + 1) * cols];
            padded.signed_mut()[r * stride..r * stride + cols].copy_from_slice(row);
            row_sums.push(row.iter().map(|&q| q as i32).sum());
        }
        Ok(PackedInt8 {
            rows,
            cols,
            stride,
            data: padded,
            row_sums,
            has_min: data.contains(&i8::MIN),
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The padded row `r`.
    fn padded(&self, r: usize) -> &[i8] {
        &self.data.signed()[r * self.stride..(r + 1) * self.stride]
    }
}

/// A matrix `[rows, cols]` quantised per row: `data[r][c] · scales[r]` approximates the
/// f32 value it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Matrix {
    packed: Arc<PackedInt8>,
    scales: Vec<f32>,
}

impl Int8Matrix {
    /// Quantises `w` (`rows × cols`, row-major) per row: each row's scale is its largest
    /// magnitude over 127 (a row of zeros has scale 0). Non-finite values are refused.
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Result<Self> {
        check_size(rows, cols, w.len())?;
        let mut data = Vec::with_capacity(rows * cols);
        let mut scales = Vec::with_capacity(rows);
        for (r, row) in w.chunks(cols.max(1)).take(rows).enumerate() {
            if let Some(c) = row.iter().position(|v| !v.is_finite()) {
                return Err(Error::invalid(
                    "quantize",
                    format!("weight [{r}, {c}] is {}, which has no int8 value", row[c]),
                ));
            }
            let (q, s) = quantize_int8_row(row);
            data.extend_from_slice(&q);
            scales.push(s);
        }
        Self::from_parts(rows, cols, &data, &scales)
    }

    /// The matrix of `data` (`rows × cols` int8, row-major) and one scale per row, as a
    /// quantised checkpoint holds them; scales must be finite and not negative, and
    /// values in −127..=127 (−128 has no positive twin under a symmetric scale).
    pub fn from_parts(rows: usize, cols: usize, data: &[i8], scales: &[f32]) -> Result<Self> {
        check_size(rows, cols, data.len())?;
        if let Some(r) = scales.iter().position(|s| !s.is_finite() || *s < 0.0) {
            return Err(Error::invalid(
                "int8 matrix",
                format!("row {r}'s scale is {}", scales[r]),
            ));
        }
        if let Some(i) = data.iter().position(|&q| q == i8::MIN) {
            return Err(Error::invalid(
                "int8 matrix",
                format!(
                    "value [{}, {}] is -128, outside a symmetric scale's -127..=127",
                    i / cols,
                    i % cols
                ),
            ));
        }
        Self::from_packed(Arc::new(PackedInt8::pack(rows, cols, data)?), scales)
    }

    /// The matrix of packed values and one scale per row, any scales (the product op's
    /// operands, which a checkpoint's rules do not constrain).
    pub fn from_packed(packed: Arc<PackedInt8>, scales: &[f32]) -> Result<Self> {
        if scales.len() != packed.rows {
            return Err(Error::invalid(
                "int8 matrix",
                format!("{} scales for {} rows", scales.len(), packed.rows),
            ));
        }
        Ok(Int8Matrix {
            packed,
            scales: scales.to_vec(),
        })
    }

    /// Rows (outputs of a layer).
    pub fn rows(&self) -> usize {
        self.packed.rows
    }

    /// Columns (inputs of a layer).
    pub fn cols(&self) -> usize {
        self.packed.cols
    }

    /// Each row's scale.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Row `r`'s int8 values.
    pub fn row(&self, r: usize) -> &[i8] {
        let p = &self.packed;
        &p.data.signed()[r * p.stride..r * p.stride + p.cols]
    }

    /// The values it stands for, `q · s`, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.rows())
            .flat_map(|r| {
                let s = self.scales[r];
                self.row(r).iter().map(move |&q| q as f32 * s)
            })
            .collect()
    }
}

fn check_size(rows: usize, cols: usize, len: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(n) if n == len => Ok(()),
        _ => Err(Error::invalid(
            "int8 matrix",
            format!("{len} values for [{rows}, {cols}]"),
        )),
    }
}

/// The dot-product kernel of an int8 product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Kernel {
    /// AVX-512 VNNI `vpdpbusd`: 64 products of unsigned and signed bytes per
    /// instruction (the activations offset by 128, the offset's sum taken back out).
    Vnni512,
    /// AVX2 `vpmaddubsw` on the activations' magnitudes and the weights signed by them.
    Avx2,
    /// Plain Rust, for any CPU.
    Portable,
}

impl Int8Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Int8Kernel; 3] = [Int8Kernel::Vnni512, Int8Kernel::Avx2, Int8Kernel::Portable];

    /// The fastest kernel this CPU runs.
    pub fn detect() -> Self {
        Self::ALL
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Int8Kernel::Portable)
    }

    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Vnni512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(not(target_arch = "x86_64"))]
            Int8Kernel::Vnni512 | Int8Kernel::Avx2 => false,
            Int8Kernel::Portable => true,
        }
    }

    /// Its name, as benchmarks report it.
    pub fn name(self) -> &'static str {
        match self {
            Int8Kernel::Vnni512 => "avx512-vnni",
            Int8Kernel::Avx2 => "avx2",
            Int8Kernel::Portable => "portable",
        }
    }

    /// The dot products of `R` rows of activations (`a` signed, `a_u8` the same plus
    /// 128) with four weight rows (`sums` their sums), over whole padded registers:
    /// `[i][j]` is activation row `i`'s with weight row `j`.
    fn dots<const R: usize>(
        self,
        a: [&[i8]; R],
        a_u8: [&[u8]; R],
        w: [&[i8]; 4],
        sums: [i32; 4],
    ) -> [[i64; 4]; R] {
        let len = w[0].len();
        let mut out = [[0i64; 4]; R];
        let mut add = |part: [[i32; 4]; R]| {
            for (o, p) in out.iter_mut().zip(part) {
                for (o, p) in o.iter_mut().zip(p) {
                    *o += p as i64;
                }
            }
        };
        if len <= CHUNK {
            add(self.chunk(a, a_u8, w));
        } else {
            for start in (0..len).step_by(CHUNK) {
                let end = (start + CHUNK).min(len);
                add(self.chunk(
                    a.map(|x| &x[start..end]),
                    a_u8.map(|x| &x[start..end]),
                    w.map(|r| &r[start..end]),
                ));
            }
        }
        if self == Int8Kernel::Vnni512 {
            // Σ (a + 128) · w = Σ a · w + 128 · Σ w.
            for o in out.iter_mut() {
                for (o, s) in o.iter_mut().zip(sums) {
                    *o -= 128 * s as i64;
                }
            }
        }
        out
    }

    /// [`Int8Kernel::dots`] over at most `CHUNK` columns, whose sums fit in i32.
    #[inline(always)]
    fn chunk<const R: usize>(
        self,
        a: [&[i8]; R],
        a_u8: [&[u8]; R],
        w: [&[i8]; 4],
    ) -> [[i32; 4]; R] {
        match self {
            // SAFETY: `available` was checked when the kernel was chosen (`linear_with`
            // refuses one this CPU lacks); lengths are equal multiples of `PAD`.
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Vnni512 => unsafe { x86::dots_vnni512(a_u8, w) },
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => a.map(|x| unsafe { x86::dot4_avx2(x, w) }),
            _ => a.map(|x| {
                w.map(|r| {
                    (x.iter().zip(r))
                        .map(|(&x, &y)| x as i32 * y as i32)
                        .sum::<i32>()
                })
            }),
        }
    }
}

/// `activation(x · Wᵀ + bias)` for `x` of `m` rows of `w.cols()` values, into `out`
/// (`m` rows of `w.rows()`), on the fastest kernel this CPU runs.
pub fn linear(
    x: &[f32],
    m: usize,
    w: &Int8Matrix,
    bias: Option<&[f32]>,
    activation: Option<UnaryOp>,
    out: &mut [f32],
) -> Result<()> {
    linear_with(Int8Kernel::detect(), x, m, w, bias, activation, out)
}

/// Output rows computed by one task.
const ROWS_PER_TASK: usize = 64;

/// A pointer to the output shared by the tasks, each writing rows of its own.
struct Out(*mut f32);
// SAFETY: tasks write disjoint elements, and `linear_with` waits for all of them.
unsafe impl Sync for Out {}

impl Out {
    /// The output's element `at`.
    fn at(&self, at: usize) -> *mut f32 {
        self.0.wrapping_add(at)
    }
}

/// [`linear`] on a given kernel; an error if this CPU lacks it or the sizes disagree.
pub fn linear_with(
    kernel: Int8Kernel,
    x: &[f32],
    m: usize,
    w: &Int8Matrix,
    bias: Option<&[f32]>,
    activation: Option<UnaryOp>,
    out: &mut [f32],
) -> Result<()> {
    linear_packed(
        kernel,
        x,
        m,
        &w.packed,
        &w.scales,
        Epilogue::new(bias, activation),
        out,
    )
}

/// What follows each scaled dot product: a bias (one per output) and an activation,
/// computed as [`ProductEpilogue::apply`] does.
#[derive(Clone, Copy)]
struct Epilogue<'a> {
    bias: Option<&'a [f32]>,
    rule: ProductEpilogue,
}

impl<'a> Epilogue<'a> {
    fn new(bias: Option<&'a [f32]>, activation: Option<UnaryOp>) -> Self {
        let rule = ProductEpilogue {
            bias: bias.map(|_| 0),
            activation,
        };
        Epilogue { bias, rule }
    }

    /// Output `r`'s value `v` through the bias and the activation.
    #[inline(always)]
    fn apply(&self, v: f32, r: usize) -> f32 {
        self.rule.apply(v, self.bias.map_or(0.0, |b| b[r]))
    }
}

/// [`linear_with`] over a packed weight and its scales (`scales[r]` row `r`'s).
fn linear_packed(
    kernel: Int8Kernel,
    x: &[f32],
    m: usize,
    w: &PackedInt8,
    scales: &[f32],
    epilogue: Epilogue<'_>,
    out: &mut [f32],
) -> Result<()> {
    if !kernel.available() {
        return Err(Error::invalid(
            "int8 linear",
            format!("this CPU has no {} instructions", kernel.name()),
        ));
    }
    let (k, n) = (w.cols, w.rows);
    // The AVX2 kernel negates weights by the activations' signs, which −128 survives
    // only in wider lanes: such a matrix takes the next kernel this CPU runs.
    let kernel = match kernel {
        Int8Kernel::Avx2 if w.has_min => Int8Kernel::Portable,
        k => k,
    };
    if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(out.len()) {
        return Err(Error::shape(
            "int8 linear",
            format!(
                "{} inputs and {} outputs for {m} rows through a [{n}, {k}] weight",
                x.len(),
                out.len()
            ),
        ));
    }
    if scales.len() != n {
        return Err(Error::invalid(
            "int8 matrix",
            format!("{} scales for {n} rows", scales.len()),
        ));
    }
    if let Some(b) = epilogue.bias.filter(|b| b.len() != n) {
        return Err(Error::shape(
            "int8 linear",
            format!("a bias of {} for {n} outputs", b.len()),
        ));
    }
    // Each row of activations quantised with its own scale (its largest magnitude
    // over 127); a row holding inf or NaN is computed in f32 instead, so that it
    // gives what the f32 product would.
    let stride = w.stride;
    let mut a_lines = Lines::filled(m * stride, 0);
    let mut u8_lines = Lines::filled(m * stride, 128);
    let (a, a_u8) = (a_lines.signed_mut(), u8_lines.bytes_mut());
    let mut a_scale = vec![0f32; m];
    let mut finite = vec![true; m];
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        if row.iter().any(|v| !v.is_finite()) {
            finite[i] = false;
            continue;
        }
        let q = &mut a[i * stride..i * stride + k];
        a_scale[i] = quantize_int8_row_into(row, q);
        for (u, &v) in a_u8[i * stride..i * stride + k].iter_mut().zip(&*q) {
            *u = (v as u8) ^ 0x80; // v + 128
        }
    }
    // One block of weight rows per thread, the same rows on each call: each core keeps
    // its share of the weights in its own L2 (handed out in small blocks, every core
    // would stream all of them through its cache). A task takes up to `TILE_ROWS` rows
    // of activations through its block, each weight register loaded once for them.
    let per_task = n.div_ceil(crate::spin::width()).div_ceil(4).max(1) * 4;
    let per_task = per_task.max(ROWS_PER_TASK);
    let blocks = n.div_ceil(per_task);
    let tiles = m.div_ceil(TILE_ROWS);
    let products = Products {
        kernel,
        w,
        scales,
        a: &*a,
        a_u8: &*a_u8,
        a_scale: &a_scale,
        epilogue,
        out: Out(out.as_mut_ptr()),
    };
    let task = |t: usize| {
        let (tile, block) = (t / blocks, t % blocks);
        let cols = block * per_task..((block + 1) * per_task).min(n);
        let rows = tile * TILE_ROWS..((tile + 1) * TILE_ROWS).min(m);
        // A row holding inf or NaN is computed in f32 instead, so that it gives what
        // the f32 product would.
        let mut quantised = [0usize; TILE_ROWS];
        let mut count = 0;
        for i in rows {
            if finite[i] {
                quantised[count] = i;
                count += 1;
            } else {
                // SAFETY: task `t` writes its rows' outputs `cols` only, inside `out`.
                unsafe { products.in_f32(&x[i * k..(i + 1) * k], i, cols.clone()) };
            }
        }
        // SAFETY: as above.
        unsafe {
            match quantised[..count] {
                [i] => products.tile([i], cols),
                [i, j] => products.tile([i, j], cols),
                [i, j, l] => products.tile([i, j, l], cols),
                [i, j, l, o] => products.tile([i, j, l, o], cols),
                _ => {}
            }
        }
    };
    let tasks = tiles * blocks;
    if tasks < 2 || !crate::spin::split(tasks, &task) {
        (0..tasks).for_each(task);
    }
    Ok(())
}

/// Rows of activations one task takes through its block of weight rows together.
const TILE_ROWS: usize = 4;

/// What the tasks of one product share: the weights, the quantised activations (rows
/// `stride` apart) with their scales, the epilogue and the output.
struct Products<'a> {
    kernel: Int8Kernel,
    w: &'a PackedInt8,
    scales: &'a [f32],
    a: &'a [i8],
    a_u8: &'a [u8],
    a_scale: &'a [f32],
    epilogue: Epilogue<'a>,
    out: Out,
}

impl Products<'_> {
    /// Rows `rows` of activations (quantised) by weight rows `cols`, into their outputs.
    ///
    /// # Safety
    /// No other task writes those outputs at the same time.
    unsafe fn tile<const R: usize>(&self, rows: [usize; R], cols: std::ops::Range<usize>) {
        let (n, stride) = (self.w.rows, self.w.stride);
        let a = rows.map(|i| &self.a[i * stride..(i + 1) * stride]);
        let a_u8 = rows.map(|i| &self.a_u8[i * stride..(i + 1) * stride]);
        for r in cols.clone().step_by(4) {
            let four = [
                r,
                (r + 1).min(n - 1),
                (r + 2).min(n - 1),
                (r + 3).min(n - 1),
            ];
            let (w, sums) = (self.w, &self.w.row_sums);
            let dots = self.kernel.dots(
                a,
                a_u8,
                [
                    w.padded(four[0]),
                    w.padded(four[1]),
                    w.padded(four[2]),
                    w.padded(four[3]),
                ],
                [sums[four[0]], sums[four[1]], sums[four[2]], sums[four[3]]],
            );
            for (&i, dots) in rows.iter().zip(dots) {
                for (&q, dot) in four.iter().zip(dots).take(cols.end - r) {
                    let v = dot as f32 * (self.a_scale[i] * self.scales[q]);
                    // SAFETY: `(i, q)` is inside `out`, and the caller's to write.
                    unsafe { *self.out.at(i * n + q) = self.epilogue.apply(v, q) };
                }
            }
        }
    }

    /// Row `i` of activations, `x` in f32, by weight rows `cols`, into its outputs.
    ///
    /// # Safety
    /// As for [`Products::tile`].
    unsafe fn in_f32(&self, x: &[f32], i: usize, cols: std::ops::Range<usize>) {
        let (n, k) = (self.w.rows, self.w.cols);
        for r in cols {
            let s = self.scales[r];
            let dot: f32 = (x.iter().zip(&self.w.padded(r)[..k]))
                .map(|(v, &q)| v * (q as f32 * s))
                .sum();
            // SAFETY: as in `tile`.
            unsafe { *self.out.at(i * n + r) = self.epilogue.apply(dot, r) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Four dot products of signed `a` with signed weight rows: `maddubs` of `|a|`
    /// (unsigned) and each row signed by `a`, pairs summed to i32 by `madd`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot4_avx2(a: &[i8], w: [&[i8]; 4]) -> [i32; 4] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_si256(); 4];
        for c in (0..a.len()).step_by(32) {
            // SAFETY: `c + 32 <= len` for lengths that are multiples of 64.
            let va = unsafe { _mm256_loadu_si256(a.as_ptr().add(c).cast()) };
            let abs = _mm256_abs_epi8(va);
            for (acc, row) in acc.iter_mut().zip(w) {
                let vw = unsafe { _mm256_loadu_si256(row.as_ptr().add(c).cast()) };
                let p = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(vw, va));
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, ones));
            }
        }
        // A loop, not `acc.map`: a closure does not inherit the target features, so its
        // intrinsics would not inline (a call per intrinsic, registers through memory).
        let mut out = [0i32; 4];
        for (o, v) in out.iter_mut().zip(acc) {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            *o = _mm_cvtsi128_si32(s);
        }
        out
    }

    /// The dot products of `R` rows of `a + 128` (unsigned) with four signed weight
    /// rows by `vpdpbusd`, each weight register loaded once for all `R` rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dots_vnni512<const R: usize>(a: [&[u8]; R], w: [&[i8]; 4]) -> [[i32; 4]; R] {
        let mut acc = [[_mm512_setzero_si512(); 4]; R];
        for c in (0..w[0].len()).step_by(64) {
            // SAFETY: `c + 64 <= len` for lengths that are equal multiples of 64.
            let mut vw = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                vw[j] = unsafe { _mm512_loadu_si512(w[j].as_ptr().add(c).cast()) };
            }
            for i in 0..R {
                let va = unsafe { _mm512_loadu_si512(a[i].as_ptr().add(c).cast()) };
                for j in 0..4 {
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], va, vw[j]);
                }
            }
        }
        // Loops, not `map`: a closure does not inherit the target features, so its
        // intrinsics would not inline (a call per intrinsic, registers through memory).
        let mut out = [[0i32; 4]; R];
        for i in 0..R {
            for j in 0..4 {
                out[i][j] = _mm512_reduce_add_epi32(acc[i][j]);
            }
        }
        out
    }
}

/// Runs `Op::MatMulInt8`: `x [.., K]` f32 by the i8 weight `w [N, K]` scaled by
/// `scale [N]`, each view as the backend receives it (the op's rule checked dtypes and
/// sizes), then `bias` (`N` values) and `activation` over each result, as the
/// product's epilogue would compute them. A weight that is a whole buffer is packed
/// once and kept with it.
pub fn matmul_int8(
    (x, lx): (&CpuStorage, &Layout),
    (w, lw): (&CpuStorage, &Layout),
    (scale, ls): (&CpuStorage, &Layout),
    bias: Option<&[f32]>,
    activation: Option<UnaryOp>,
) -> Result<CpuStorage> {
    let unexpected = |what: &str, s: &CpuStorage| {
        Error::dtype("matmul_int8", format!("its {what} is {}", s.dtype()))
    };
    let (CpuStorage::F32(xv), CpuStorage::I8(wv), CpuStorage::F32(sv)) = (x, w, scale) else {
        return Err(match (x, w) {
            (CpuStorage::F32(_), CpuStorage::I8(_)) => unexpected("scale", scale),
            (CpuStorage::F32(_), _) => unexpected("weight", w),
            _ => unexpected("input", x),
        });
    };
    let (n, k) = (lw.dims()[0], lw.dims()[1]);
    let whole = lw.is_contiguous() && lw.offset() == 0 && wv.len() == n * k;
    let packed = if whole {
        wv.packed(n, k)?
    } else {
        Arc::new(PackedInt8::pack(n, k, &gather(wv, lw))?)
    };
    let xs = gather(xv, lx);
    let m: usize = lx.dims()[..lx.rank() - 1].iter().product();
    let mut out = vec![0f32; m * n];
    let epilogue = Epilogue::new(bias, activation);
    let kernel = Int8Kernel::detect();
    linear_packed(kernel, &xs, m, &packed, &gather(sv, ls), epilogue, &mut out)?;
    Ok(CpuStorage::F32(out.into()))
}
