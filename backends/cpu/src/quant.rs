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

/// Bytes in one cache line and one AVX-512 register.
const PAD: usize = 64;

/// Weight rows (outputs) per panel: the sixteen i32 sums one AVX-512 register holds.
const PANEL: usize = 16;

/// Columns per group: the four bytes `vpdpbusd` (and `maddubs` + `madd`) sum into one
/// i32.
const GROUP: usize = 4;

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

/// An int8 matrix `[rows, cols]` laid out for the products, made once per weight (a
/// CPU buffer of i8 caches its packed form). Rows go in panels of sixteen; a panel
/// holds, for each group of four columns, its rows' four bytes in turn: one
/// 64-byte line, which one register loads. A product then keeps sixteen outputs' sums
/// in one register, each lane one output, with no horizontal sums. Rows past the last
/// and columns past the last are zeros.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedInt8 {
    rows: usize,
    cols: usize,
    /// Groups of [`GROUP`] columns (the last one padded).
    groups: usize,
    data: Lines,
    /// Σ of each row's values (zeros for the padding rows), for the VNNI kernel's
    /// unsigned activations.
    row_sums: Vec<i32>,
    /// Whether a value is −128, whose negation the AVX2 kernel's sign trick cannot hold.
    has_min: bool,
}

impl PackedInt8 {
    /// Packs `data`, `rows × cols` int8 values, row-major.
    pub fn pack(rows: usize, cols: usize, data: &[i8]) -> Result<Self> {
        check_size(rows, cols, data.len())?;
        let groups = cols.div_ceil(GROUP);
        let panels = rows.div_ceil(PANEL);
        let too_large = || Error::invalid("int8 matrix", format!("[{rows}, {cols}] is too large"));
        let len = (panels.checked_mul(groups))
            .and_then(|n| n.checked_mul(PANEL * GROUP))
            .ok_or_else(too_large)?;
        let mut packed = Lines::filled(len, 0);
        let bytes = packed.signed_mut();
        let mut row_sums = vec![0; panels * PANEL];
        for r in 0..rows {
            let row = &data[r * cols..(r + 1) * cols];
            for (c, &q) in row.iter().enumerate() {
                bytes[Self::at(groups, r, c)] = q;
            }
            row_sums[r] = row.iter().map(|&q| q as i32).sum();
        }
        Ok(PackedInt8 {
            rows,
            cols,
            groups,
            data: packed,
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

    /// Where value `[r, c]` lies in the packed bytes of a matrix of `groups` groups.
    fn at(groups: usize, r: usize, c: usize) -> usize {
        ((r / PANEL * groups + c / GROUP) * PANEL + r % PANEL) * GROUP + c % GROUP
    }

    /// Value `[r, c]`.
    fn value(&self, r: usize, c: usize) -> i8 {
        self.data.signed()[Self::at(self.groups, r, c)]
    }

    /// Panel `p`'s bytes: its groups' lines in order.
    fn panel(&self, p: usize) -> &[u8] {
        let len = self.groups * PANEL * GROUP;
        &self.data.bytes()[p * len..(p + 1) * len]
    }
}

/// A matrix `[rows, cols]` quantised per row: `data[r][c] · scales[r]` approximates the
/// f32 value it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Matrix {
    /// The values, row-major.
    values: Vec<i8>,
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
        if scales.len() != rows {
            return Err(Error::invalid(
                "int8 matrix",
                format!("{} scales for {rows} rows", scales.len()),
            ));
        }
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
        Ok(Int8Matrix {
            values: data.to_vec(),
            packed: Arc::new(PackedInt8::pack(rows, cols, data)?),
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
        let cols = self.cols();
        &self.values[r * cols..(r + 1) * cols]
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
    /// 128, each `groups · GROUP` bytes) with the [`PANEL`] weight rows of `panel`
    /// (`sums` their sums), as f32: `[i][j]` is activation row `i`'s with the panel's
    /// row `j`.
    fn panel_dots<const R: usize>(
        self,
        a: [&[i8]; R],
        a_u8: [&[u8]; R],
        panel: &[u8],
        sums: &[i32],
    ) -> [[f32; PANEL]; R] {
        let groups = panel.len() / (PANEL * GROUP);
        let vnni = self == Int8Kernel::Vnni512;
        if groups * GROUP <= CHUNK {
            // The sums, and Σ a · w, fit in i32.
            let mut dots = self.panel_chunk(a, a_u8, panel, 0..groups);
            if vnni {
                // Σ (a + 128) · w = Σ a · w + 128 · Σ w.
                for row in dots.iter_mut() {
                    for (d, s) in row.iter_mut().zip(sums) {
                        *d = d.wrapping_sub(s.wrapping_mul(128));
                    }
                }
            }
            return to_f32s(dots);
        }
        // Longer rows: at most CHUNK columns summed in i32 at a time.
        let mut dots = [[0i64; PANEL]; R];
        for start in (0..groups).step_by(CHUNK / GROUP) {
            let range = start..(start + CHUNK / GROUP).min(groups);
            let part = self.panel_chunk(a, a_u8, panel, range);
            for (o, p) in dots.iter_mut().zip(part) {
                for (o, p) in o.iter_mut().zip(p) {
                    *o += p as i64;
                }
            }
        }
        if vnni {
            for row in dots.iter_mut() {
                for (d, s) in row.iter_mut().zip(sums) {
                    *d -= 128 * *s as i64;
                }
            }
        }
        to_f32s(dots)
    }

    /// [`Int8Kernel::panel_dots`] over the column groups `groups`, whose sums fit in i32.
    #[inline(always)]
    fn panel_chunk<const R: usize>(
        self,
        a: [&[i8]; R],
        a_u8: [&[u8]; R],
        panel: &[u8],
        groups: std::ops::Range<usize>,
    ) -> [[i32; PANEL]; R] {
        debug_assert!(groups.end * PANEL * GROUP <= panel.len());
        debug_assert!(a.iter().all(|a| a.len() >= groups.end * GROUP));
        match self {
            // SAFETY: `available` was checked when the kernel was chosen (`linear_with`
            // refuses one this CPU lacks); the panel holds `groups.end` lines and each
            // row of activations `groups.end * GROUP` bytes, as `PackedInt8::pack` and
            // `linear_packed` lay them out (the debug assertions above).
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Vnni512 => unsafe {
                x86::panel_vnni512(pointers(a_u8), panel.as_ptr(), groups)
            },
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => unsafe { x86::panel_avx2(pointers(a), panel.as_ptr(), groups) },
            _ => a.map(|a| {
                let mut sums = [0i32; PANEL];
                for g in groups.clone() {
                    let line = &panel[g * PANEL * GROUP..(g + 1) * PANEL * GROUP];
                    for (j, sum) in sums.iter_mut().enumerate() {
                        for t in 0..GROUP {
                            let w = line[j * GROUP + t] as i8;
                            *sum += a[g * GROUP + t] as i32 * w as i32;
                        }
                    }
                }
                sums
            }),
        }
    }
}

/// Each integer as the nearest f32. (Loops rather than `map`, which did not inline on
/// this hot path.)
#[inline(always)]
fn to_f32s<T: Copy + ToF32, const R: usize>(dots: [[T; PANEL]; R]) -> [[f32; PANEL]; R] {
    let mut out = [[0f32; PANEL]; R];
    for (o, d) in out.iter_mut().zip(&dots) {
        for (o, &d) in o.iter_mut().zip(d) {
            *o = d.to_f32();
        }
    }
    out
}

/// An integer's nearest f32.
trait ToF32 {
    /// The nearest f32.
    fn to_f32(self) -> f32;
}

impl ToF32 for i32 {
    fn to_f32(self) -> f32 {
        self as f32
    }
}

impl ToF32 for i64 {
    fn to_f32(self) -> f32 {
        self as f32
    }
}

/// The start of each slice.
#[inline(always)]
fn pointers<T, const R: usize>(rows: [&[T]; R]) -> [*const T; R] {
    let mut out = [std::ptr::null(); R];
    for (o, r) in out.iter_mut().zip(rows) {
        *o = r.as_ptr();
    }
    out
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

    /// Outputs `first..` (`values`) through the bias and the activation, in place.
    #[inline(always)]
    fn apply_to(&self, values: &mut [f32], first: usize) {
        match self.bias {
            Some(b) => {
                for (v, &b) in values.iter_mut().zip(&b[first..]) {
                    *v = self.rule.apply(*v, b);
                }
            }
            None => {
                for v in values.iter_mut() {
                    *v = self.rule.apply(*v, 0.0);
                }
            }
        }
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
    let stride = w.groups * GROUP;
    let mut a_lines = Lines::filled(m * stride, 0);
    let mut u8_lines = Lines::filled(m * stride, 128);
    let mut a_scale = vec![0f32; m];
    let mut finite = vec![true; m];
    let products = Products {
        kernel,
        w,
        scales,
        x,
        a: Shared(a_lines.signed_mut().as_mut_ptr()),
        a_u8: Shared(u8_lines.bytes_mut().as_mut_ptr()),
        a_scale: Shared(a_scale.as_mut_ptr()),
        finite: Shared(finite.as_mut_ptr()),
        epilogue,
        out: Shared(out.as_mut_ptr()),
    };
    let tiles = m.div_ceil(TILE_ROWS);
    let width = crate::spin::width();
    let tile_rows = |tile: usize| tile * TILE_ROWS..((tile + 1) * TILE_ROWS).min(m);
    if tiles >= 2 * width {
        // Many rows (a window of tokens, a batch): a task quantises its tile of rows and
        // takes it through every weight row; the cores read the weights from their
        // caches.
        let task = |tile: usize| {
            let rows = tile_rows(tile);
            // SAFETY: task `tile` writes its rows' quantised values and outputs only.
            unsafe {
                products.quantise(rows.clone());
                products.rows(rows, 0..n);
            }
        };
        if !crate::spin::split(tiles, &task) {
            (0..tiles).for_each(task);
        }
        return Ok(());
    }
    // Few rows (batch 1): quantised here, then one block of weight rows per thread, the
    // same rows on each call: each core keeps its share of the weights in its own L2
    // (handed out in small blocks, every core would stream all of them through its
    // cache).
    // SAFETY: no task runs yet.
    unsafe { products.quantise(0..m) };
    let per_task = n.div_ceil(width).div_ceil(PANEL).max(1) * PANEL;
    let per_task = per_task.max(ROWS_PER_TASK);
    let blocks = n.div_ceil(per_task);
    let task = |t: usize| {
        let (tile, block) = (t / blocks, t % blocks);
        let cols = block * per_task..((block + 1) * per_task).min(n);
        // SAFETY: task `t` writes its rows' outputs `cols` only.
        unsafe { products.rows(tile_rows(tile), cols) };
    };
    let tasks = tiles * blocks;
    if tasks < 2 || !crate::spin::split(tasks, &task) {
        (0..tasks).for_each(task);
    }
    Ok(())
}

/// Rows of activations a task takes through each weight register together.
const TILE_ROWS: usize = 4;

/// A buffer the tasks of one product share, each writing elements of its own.
struct Shared<T>(*mut T);
// SAFETY: tasks write disjoint elements and read only what was written before the
// split or by themselves; `linear_packed` waits for all of them.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// Element `at`.
    fn at(&self, at: usize) -> *mut T {
        self.0.wrapping_add(at)
    }

    /// `len` elements from `start`.
    ///
    /// # Safety
    /// They are inside the buffer, and no one else writes them while this lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts_mut(self.at(start), len) }
    }

    /// `len` elements from `start`, to read (several tasks may read them at once).
    ///
    /// # Safety
    /// They are inside the buffer, and no one writes them while this lives.
    unsafe fn slice_ref(&self, start: usize, len: usize) -> &[T] {
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts(self.at(start), len) }
    }
}

/// One product's operands and results, which its tasks share: the weights and their
/// scales, the activations `x` and their quantised rows (`a`, and `a_u8` = `a + 128`,
/// rows `groups · GROUP` bytes apart, with their scales and whether they are finite),
/// the epilogue and the output.
struct Products<'a> {
    kernel: Int8Kernel,
    w: &'a PackedInt8,
    scales: &'a [f32],
    x: &'a [f32],
    a: Shared<i8>,
    a_u8: Shared<u8>,
    a_scale: Shared<f32>,
    finite: Shared<bool>,
    epilogue: Epilogue<'a>,
    out: Shared<f32>,
}

impl Products<'_> {
    /// Quantises rows `rows` of activations, each with its own scale (its largest
    /// magnitude over 127); a row holding inf or NaN is marked to be computed in f32
    /// instead, so that it gives what the f32 product would.
    ///
    /// # Safety
    /// No other task reads or writes these rows' quantised values at the same time.
    unsafe fn quantise(&self, rows: std::ops::Range<usize>) {
        let (k, stride) = (self.w.cols, self.w.groups * GROUP);
        for i in rows {
            let row = &self.x[i * k..(i + 1) * k];
            // SAFETY: row `i`'s entries, the caller's.
            unsafe {
                if row.iter().any(|v| !v.is_finite()) {
                    *self.finite.at(i) = false;
                    continue;
                }
                let q = self.a.slice(i * stride, k);
                *self.a_scale.at(i) = quantize_int8_row_into(row, q);
                for (u, &v) in self.a_u8.slice(i * stride, k).iter_mut().zip(&*q) {
                    *u = (v as u8) ^ 0x80; // v + 128
                }
            }
        }
    }

    /// Rows `rows` of activations (quantised) by weight rows `cols` (starting at a
    /// panel), into their outputs.
    ///
    /// # Safety
    /// The rows are quantised, and no other task writes these outputs at the same time.
    unsafe fn rows(&self, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
        let mut quantised = [0usize; TILE_ROWS];
        let mut count = 0;
        for i in rows {
            // SAFETY: written by `quantise` before.
            if unsafe { *self.finite.at(i) } {
                quantised[count] = i;
                count += 1;
            } else {
                // SAFETY: as the caller promises.
                unsafe { self.in_f32(i, cols.clone()) };
            }
        }
        // SAFETY: as the caller promises.
        unsafe {
            match quantised[..count] {
                [i] => self.tile([i], cols),
                [i, j] => self.tile([i, j], cols),
                [i, j, l] => self.tile([i, j, l], cols),
                [i, j, l, o] => self.tile([i, j, l, o], cols),
                _ => {}
            }
        }
    }

    /// [`Products::rows`] for `R` quantised rows.
    unsafe fn tile<const R: usize>(&self, rows: [usize; R], cols: std::ops::Range<usize>) {
        let (n, stride) = (self.w.rows, self.w.groups * GROUP);
        let (mut a, mut a_u8) = ([&[][..]; R], [&[][..]; R]);
        for ((a, a_u8), &i) in a.iter_mut().zip(&mut a_u8).zip(&rows) {
            // SAFETY: these rows were quantised before, and nothing writes them now.
            unsafe {
                *a = self.a.slice_ref(i * stride, stride);
                *a_u8 = self.a_u8.slice_ref(i * stride, stride);
            }
        }
        for first in cols.clone().step_by(PANEL) {
            let p = first / PANEL;
            let sums = &self.w.row_sums[first..first + PANEL];
            let dots = self.kernel.panel_dots(a, a_u8, self.w.panel(p), sums);
            let outputs = first..(first + PANEL).min(cols.end);
            for (&i, dots) in rows.iter().zip(dots) {
                // SAFETY: inside `out` and the caller's to write; the scale as above.
                let (y, a_scale) = unsafe {
                    (
                        self.out.slice(i * n + first, outputs.len()),
                        *self.a_scale.at(i),
                    )
                };
                for ((y, dot), s) in y.iter_mut().zip(dots).zip(&self.scales[outputs.clone()]) {
                    *y = dot * (a_scale * s);
                }
                self.epilogue.apply_to(y, first);
            }
        }
    }

    /// Row `i` of activations in f32 by weight rows `cols`, into its outputs.
    ///
    /// # Safety
    /// As for [`Products::rows`].
    unsafe fn in_f32(&self, i: usize, cols: std::ops::Range<usize>) {
        let (n, k) = (self.w.rows, self.w.cols);
        let x = &self.x[i * k..(i + 1) * k];
        for r in cols {
            let s = self.scales[r];
            let dot: f32 = (x.iter().enumerate())
                .map(|(c, v)| v * (self.w.value(r, c) as f32 * s))
                .sum();
            // SAFETY: as the caller promises.
            unsafe { *self.out.at(i * n + r) = self.epilogue.apply(dot, r) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{GROUP, PANEL};
    use std::arch::x86_64::*;

    /// Sixteen weight rows' dot products with each of `R` rows of activations, signed
    /// (`a`), over the column groups `groups` of `panel` (a packed panel's lines): each
    /// group's four activation bytes broadcast, `maddubs` of their magnitudes with the
    /// weights signed by them, pairs summed to i32 by `madd`; two registers of eight
    /// sums per row.
    ///
    /// # Safety
    /// The CPU runs AVX2; `panel` holds `groups.end` lines and each `a` row
    /// `groups.end * GROUP` bytes.
    #[target_feature(enable = "avx2")]
    pub unsafe fn panel_avx2<const R: usize>(
        a: [*const i8; R],
        panel: *const u8,
        groups: std::ops::Range<usize>,
    ) -> [[i32; PANEL]; R] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for g in groups {
            // SAFETY: inside the panel and the rows, as the caller promises.
            let line = unsafe { panel.add(g * PANEL * GROUP) };
            let w0 = unsafe { _mm256_loadu_si256(line.cast()) };
            let w1 = unsafe { _mm256_loadu_si256(line.add(32).cast()) };
            for i in 0..R {
                let four = unsafe { a[i].add(g * GROUP).cast::<i32>().read_unaligned() };
                let va = _mm256_set1_epi32(four);
                let abs = _mm256_abs_epi8(va);
                let p0 = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(w0, va));
                let p1 = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(w1, va));
                acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(p0, ones));
                acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(p1, ones));
            }
        }
        // Loops, not `map`: a closure does not inherit the target features, so its
        // intrinsics would not inline (a call per intrinsic, registers through memory).
        let mut out = [[0i32; PANEL]; R];
        for i in 0..R {
            // SAFETY: each row of `out` holds sixteen i32, two registers' worth.
            unsafe {
                _mm256_storeu_si256(out[i].as_mut_ptr().cast(), acc[i][0]);
                _mm256_storeu_si256(out[i].as_mut_ptr().add(8).cast(), acc[i][1]);
            }
        }
        out
    }

    /// Sixteen weight rows' dot products with each of `R` rows of activations plus 128
    /// (unsigned, `a_u8`), over the column groups `groups` of `panel`: each group's
    /// four activation bytes broadcast and `vpdpbusd` into one register of sixteen sums
    /// per row.
    ///
    /// # Safety
    /// The CPU runs AVX-512 VNNI; `panel` holds `groups.end` lines and each `a_u8` row
    /// `groups.end * GROUP` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn panel_vnni512<const R: usize>(
        a_u8: [*const u8; R],
        panel: *const u8,
        groups: std::ops::Range<usize>,
    ) -> [[i32; PANEL]; R] {
        let mut acc = [_mm512_setzero_si512(); R];
        for g in groups {
            // SAFETY: inside the panel and the rows, as the caller promises.
            let vw = unsafe { _mm512_loadu_si512(panel.add(g * PANEL * GROUP).cast()) };
            for i in 0..R {
                let four = unsafe { a_u8[i].add(g * GROUP).cast::<i32>().read_unaligned() };
                acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_set1_epi32(four), vw);
            }
        }
        let mut out = [[0i32; PANEL]; R];
        for i in 0..R {
            // SAFETY: each row of `out` holds sixteen i32, one register's worth.
            unsafe { _mm512_storeu_si512(out[i].as_mut_ptr().cast(), acc[i]) };
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
