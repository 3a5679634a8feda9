//! Shortcuts for skinny products, which read the big f32 operand in place
//! instead of packing it (packing would double the memory traffic of a product
//! that uses each of its elements only a few times):
//!
//! - axpy form, `y += x[p] * row_p`, for m == 1 (or n == 1) when the output
//!   direction of the matrix is contiguous (batch-1 inference with a `k x n`
//!   weight);
//! - dot form, `C[i][j] = dot(A row i, B column j)`, when one side has at most
//!   16 rows/columns and the other side's vectors are contiguous along k (batch
//!   of a few with a torch-style `n x k` weight, or a 10-class output layer).
//!   The small side is first copied into contiguous f32 rows, then 4 x 4 blocks
//!   of dot products are accumulated in vector registers.
//!
//! Anything else (other strides, f16/bf16 big operands) goes to the packed driver.

use super::{GemmInput, Isa, MatRef};
use rayon::prelude::*;

/// Below this many multiply-adds the split across threads costs more than it saves.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Parallel skinny products are cut into this many tasks per thread.
const TASKS_PER_THREAD: usize = 4;

/// The dot form is used when m (or n) is at most this.
const DOT_MAX_SMALL: usize = 16;

/// Handles the skinny shapes described in the module doc; returns false (having
/// done nothing) for any other. Bounds were checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn try_skinny<A: GemmInput, B: GemmInput>(
    isa: Isa,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [f32],
    accumulate: bool,
) -> bool {
    let threads = if m * n * k < PARALLEL_MIN_WORK {
        1
    } else {
        threads
    };
    if m == 1 && b.col_stride == 1 {
        if let Some(mat) = B::as_f32_slice(b.data) {
            let x: Vec<f32> = (0..k).map(|p| a.at(0, p).to_f32()).collect();
            axpy_split(isa, threads, mat, b.offset, b.row_stride, &x, c, accumulate);
            return true;
        }
    }
    if n == 1 && a.row_stride == 1 {
        if let Some(mat) = A::as_f32_slice(a.data) {
            let x: Vec<f32> = (0..k).map(|p| b.at(p, 0).to_f32()).collect();
            axpy_split(isa, threads, mat, a.offset, a.col_stride, &x, c, accumulate);
            return true;
        }
    }
    if m <= DOT_MAX_SMALL && b.row_stride == 1 {
        if let Some(w) = B::as_f32_slice(b.data) {
            // W rows = columns of B; X rows = rows of A; C[i][j] = Y[j][i].
            let mut x = take_rows_buffer();
            gather_rows(&mut x, a.data, a.offset, a.row_stride, a.col_stride, m, k);
            let dot = Dot {
                w,
                w_off: b.offset,
                ldw: b.col_stride,
                nw: n,
                x: &x,
                x_off: 0,
                ldx: k,
                nx: m,
                k,
            };
            let y = YOut {
                ptr: c.as_mut_ptr(),
                ys_w: 1,
                ys_x: n,
            };
            dot.run(isa, threads, y, accumulate);
            give_rows_buffer(x);
            return true;
        }
    }
    if n <= DOT_MAX_SMALL && a.col_stride == 1 {
        if let Some(w) = A::as_f32_slice(a.data) {
            // W rows = rows of A; X rows = columns of B; C[i][j] = Y[i][j].
            let mut x = take_rows_buffer();
            gather_rows(&mut x, b.data, b.offset, b.col_stride, b.row_stride, n, k);
            let dot = Dot {
                w,
                w_off: a.offset,
                ldw: a.row_stride,
                nw: m,
                x: &x,
                x_off: 0,
                ldx: k,
                nx: n,
                k,
            };
            let y = YOut {
                ptr: c.as_mut_ptr(),
                ys_w: n,
                ys_x: 1,
            };
            dot.run(isa, threads, y, accumulate);
            give_rows_buffer(x);
            return true;
        }
    }
    false
}

/// The small operand as `rows` contiguous f32 rows of `k`:
/// `out[r*k + p] = f32(data[off + r*rs + p*ps])`.
fn gather_rows<X: GemmInput>(
    out: &mut Vec<f32>,
    data: &[X],
    off: usize,
    rs: usize,
    ps: usize,
    rows: usize,
    k: usize,
) {
    out.clear();
    out.resize(rows * k, 0.0);
    if ps == 1 || rs != 1 {
        for (r, row) in out.chunks_exact_mut(k.max(1)).enumerate() {
            let base = off + r * rs;
            for (p, v) in row.iter_mut().enumerate() {
                *v = data[base + p * ps].to_f32();
            }
        }
    } else {
        // Rows interleaved in memory (e.g. the columns of a row-major B): walk
        // the source in order and scatter into the rows.
        for p in 0..k {
            let src = &data[off + p * ps..][..rows];
            for (r, &v) in src.iter().enumerate() {
                out[r * k + p] = v.to_f32();
            }
        }
    }
}

thread_local! {
    /// The gathered small operand, kept between calls so that steady-state products
    /// allocate nothing.
    static ROWS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// This thread's gather buffer (a nested call on the same thread gets an empty one).
fn take_rows_buffer() -> Vec<f32> {
    ROWS.with(|r| r.take())
}

/// Returns the gather buffer for the next call.
fn give_rows_buffer(v: Vec<f32>) {
    ROWS.with(|r| r.set(v));
}

/// y (+)= sum_p x[p] * mat[off + p*ks ..][..y.len()], split across threads by columns.
#[allow(clippy::too_many_arguments)]
fn axpy_split(
    isa: Isa,
    threads: usize,
    mat: &[f32],
    off: usize,
    ks: usize,
    x: &[f32],
    y: &mut [f32],
    acc: bool,
) {
    let len = y.len();
    if threads > 1 && len >= 32 {
        let per = len
            .div_ceil(threads * TASKS_PER_THREAD)
            .next_multiple_of(16);
        let tasks = len.div_ceil(per);
        let out = YOut {
            ptr: y.as_mut_ptr(),
            ys_w: 1,
            ys_x: 0,
        };
        let task = |t: usize| {
            let start = t * per;
            let n = per.min(len - start);
            // SAFETY: tasks cover disjoint ranges start..start+n of y, which is
            // exclusively borrowed for this call.
            let y = unsafe { std::slice::from_raw_parts_mut(out.at(start), n) };
            axpy_form(isa, mat, off + start, ks, x, y, acc);
        };
        if !crate::spin::split(tasks, &task) {
            (0..tasks).into_par_iter().for_each(task);
        }
    } else {
        axpy_form(isa, mat, off, ks, x, y, acc);
    }
}

/// y[j] (+)= sum_p x[p] * mat[off + p*ks + j]: rows of the matrix are contiguous.
fn axpy_form(
    isa: Isa,
    mat: &[f32],
    off: usize,
    ks: usize,
    x: &[f32],
    y: &mut [f32],
    accumulate: bool,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` was clamped to what the CPU supports.
        Isa::Avx512 => unsafe { x86::axpy_avx512(mat, off, ks, x, y, accumulate) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` was clamped to what the CPU supports.
        Isa::Avx2 => unsafe { x86::axpy_avx2(mat, off, ks, x, y, accumulate) },
        _ => axpy_generic::<false>(mat, off, ks, x, y, accumulate),
    }
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Four rows per sweep of y: four sequential streams keep the hardware prefetchers
/// busy, and y (which stays in L1) is loaded and stored once per four rows.
#[inline(always)]
fn axpy_generic<const FMA: bool>(
    mat: &[f32],
    off: usize,
    ks: usize,
    x: &[f32],
    y: &mut [f32],
    accumulate: bool,
) {
    let len = y.len();
    if !accumulate {
        y.fill(0.0);
    }
    let row = |p: usize| &mat[off + p * ks..off + p * ks + len];
    let mut p = 0;
    while p + 4 <= x.len() {
        let (r0, r1, r2, r3) = (row(p), row(p + 1), row(p + 2), row(p + 3));
        let (x0, x1, x2, x3) = (x[p], x[p + 1], x[p + 2], x[p + 3]);
        for ((((y, &a0), &a1), &a2), &a3) in y.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
            let acc = madd::<FMA>(x0, a0, *y);
            let acc = madd::<FMA>(x1, a1, acc);
            let acc = madd::<FMA>(x2, a2, acc);
            *y = madd::<FMA>(x3, a3, acc);
        }
        p += 4;
    }
    while p < x.len() {
        let (r0, x0) = (row(p), x[p]);
        for (y, &r) in y.iter_mut().zip(r0) {
            *y = madd::<FMA>(x0, r, *y);
        }
        p += 1;
    }
}

/// Output of a [`Dot`] problem: Y[r][s] at `ptr[r * ys_w + s * ys_x]`.
#[derive(Clone, Copy)]
struct YOut {
    ptr: *mut f32,
    ys_w: usize,
    ys_x: usize,
}

impl YOut {
    /// The address of element `i` (a method, so closures capture the whole `YOut`,
    /// which is `Sync`, rather than its pointer field).
    ///
    /// # Safety
    /// `i` lies inside the output.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: per the caller.
        unsafe { self.ptr.add(i) }
    }
}

// SAFETY: YOut points into the caller's exclusively borrowed C; parallel tasks
// write disjoint W-row ranges of Y, i.e. disjoint elements of C.
unsafe impl Send for YOut {}
// SAFETY: see the Send impl.
unsafe impl Sync for YOut {}

/// Y[r][s] (+)= dot(W row r, X row s) for r < nw, s < nx, where W row r is
/// `w[w_off + r*ldw ..][..k]` and X row s is `x[x_off + s*ldx ..][..k]`.
#[derive(Clone, Copy)]
struct Dot<'a> {
    w: &'a [f32],
    w_off: usize,
    ldw: usize,
    nw: usize,
    x: &'a [f32],
    x_off: usize,
    ldx: usize,
    nx: usize,
    k: usize,
}

/// The X rows of a dot product are read in blocks of this many elements along k when
/// all of them together would not stay in the core's L2 cache (a convolution's weight
/// gradient sums over every position of the batch: k is tens of thousands).
const DOT_K_BLOCK: usize = 4096;

/// X rows taking more bytes than this together are read by blocks of k (half of a
/// 1 MiB L2, leaving room for the W rows streamed past them).
const DOT_X_CACHED_BYTES: usize = 512 << 10;

impl Dot<'_> {
    /// W row r as a checked slice.
    fn w_row(&self, r: usize) -> &[f32] {
        &self.w[self.w_off + r * self.ldw..][..self.k]
    }

    /// X row s as a checked slice.
    fn x_row(&self, s: usize) -> &[f32] {
        &self.x[self.x_off + s * self.ldx..][..self.k]
    }

    /// The same products over k's elements `k0..k0 + len` only.
    fn k_block(&self, k0: usize, len: usize) -> Self {
        Dot {
            w_off: self.w_off + k0,
            x_off: self.x_off + k0,
            k: len,
            ..*self
        }
    }

    /// Stores one result, adding to what is there when accumulating.
    ///
    /// # Safety
    /// r < nw and s < nx, and no other thread writes W row r's outputs.
    #[inline(always)]
    unsafe fn put(y: YOut, r: usize, s: usize, v: f32, accumulate: bool) {
        // SAFETY: in bounds of C per the caller; exclusive per the caller.
        unsafe {
            let d = y.ptr.add(r * y.ys_w + s * y.ys_x);
            *d = if accumulate { *d + v } else { v };
        }
    }

    /// Computes all of Y, splitting the W rows across threads.
    fn run(&self, isa: Isa, threads: usize, y: YOut, accumulate: bool) {
        if self.nw == 0 || self.nx == 0 {
            return;
        }
        let rows = |d: &Dot<'_>, r0: usize, r1: usize, accumulate: bool| match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `isa` was clamped to what the CPU supports; rows r0..r1 are
            // this task's own.
            Isa::Avx512 => unsafe { x86::dot_rows_avx512(d, r0, r1, y, accumulate) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { x86::dot_rows_avx2(d, r0, r1, y, accumulate) },
            // SAFETY: rows r0..r1 are this task's own.
            _ => unsafe { dot_rows_generic::<false>(d, r0, r1, y, accumulate) },
        };
        // Long rows go by blocks of k, each block's X rows kept in cache across the
        // W rows; the first block stores (or adds, when asked) and the rest add.
        let block = if self.nx * self.k * 4 > DOT_X_CACHED_BYTES {
            DOT_K_BLOCK
        } else {
            self.k.max(1)
        };
        let range = |r0: usize, r1: usize| {
            for k0 in (0..self.k.max(1)).step_by(block) {
                let d = self.k_block(k0, block.min(self.k - k0));
                rows(&d, r0, r1, accumulate || k0 > 0);
            }
        };
        if threads > 1 && self.nw >= 8 {
            // A few tasks per thread, handed out as threads come free: a core slowed
            // by other work takes fewer.
            let per = self
                .nw
                .div_ceil(threads * TASKS_PER_THREAD)
                .next_multiple_of(4);
            let task = |t: usize| range(t * per, ((t + 1) * per).min(self.nw));
            let tasks = self.nw.div_ceil(per);
            if !crate::spin::split(tasks, &task) {
                (0..tasks).into_par_iter().for_each(task);
            }
        } else {
            range(0, self.nw);
        }
    }
}

/// Plain-Rust dot products, 16 independent partial sums each so the adds are not
/// serialized on latency.
///
/// # Safety
/// No other thread writes the outputs of W rows r0..r1.
#[inline(always)]
unsafe fn dot_rows_generic<const FMA: bool>(
    d: &Dot<'_>,
    r0: usize,
    r1: usize,
    y: YOut,
    accumulate: bool,
) {
    const L: usize = 16;
    for r in r0..r1 {
        let w = d.w_row(r);
        let (wc, wt) = w.as_chunks::<L>();
        for s in 0..d.nx {
            let x = d.x_row(s);
            let (xc, xt) = x.as_chunks::<L>();
            let mut acc = [0.0f32; L];
            for (wv, xv) in wc.iter().zip(xc) {
                for l in 0..L {
                    acc[l] = madd::<FMA>(wv[l], xv[l], acc[l]);
                }
            }
            let mut v = acc.iter().sum::<f32>();
            for (&a, &b) in wt.iter().zip(xt) {
                v = madd::<FMA>(a, b, v);
            }
            // SAFETY: r < nw, s < nx; exclusive per the caller.
            unsafe { Dot::put(y, r, s, v, accumulate) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Hand-vectorized AVX-512 loops (the compiler does not keep the 4 x 4 dot
    //! block in registers on its own), and the generic loops compiled with
    //! AVX2+FMA.

    use super::{axpy_generic, dot_rows_generic, Dot, YOut};
    use std::arch::x86_64::*;

    /// Mask of the first `n < 16` lanes.
    #[inline(always)]
    fn tail_mask(n: usize) -> u16 {
        ((1u32 << n) - 1) as u16
    }

    /// y[j] (+)= sum_p x[p] * mat[off + p*ks + j], eight rows per sweep of y.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy_avx512(
        mat: &[f32],
        off: usize,
        ks: usize,
        x: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) {
        const ROWS: usize = 8;
        let len = y.len();
        if !accumulate {
            y.fill(0.0);
        }
        if len == 0 {
            return;
        }
        let (full, rem) = (len / 16, len % 16);
        let tm = tail_mask(rem);
        let yp = y.as_mut_ptr();
        let mut p = 0;
        while p < x.len() {
            let nrows = ROWS.min(x.len() - p);
            // Bounds-checked row slices; the loads below stay inside them.
            let rows: [&[f32]; ROWS] = std::array::from_fn(|r| {
                if r < nrows {
                    &mat[off + (p + r) * ks..][..len]
                } else {
                    &[][..]
                }
            });
            let xs: [__m512; ROWS] =
                std::array::from_fn(|r| _mm512_set1_ps(if r < nrows { x[p + r] } else { 0.0 }));
            let mut blk = 0;
            if nrows == ROWS {
                // Four blocks of y at a time: four independent chains of eight FMAs
                // rather than one, so the adds overlap instead of waiting on each other.
                while blk + 4 <= full {
                    let j = blk * 16;
                    // SAFETY: lanes j..j+64 lie inside y and inside every row slice
                    // (each of length len >= (blk + 4)·16).
                    unsafe {
                        let (mut a0, mut a1, mut a2, mut a3) = (
                            _mm512_loadu_ps(yp.add(j)),
                            _mm512_loadu_ps(yp.add(j + 16)),
                            _mm512_loadu_ps(yp.add(j + 32)),
                            _mm512_loadu_ps(yp.add(j + 48)),
                        );
                        for r in 0..ROWS {
                            let (row, xr) = (rows[r].as_ptr().add(j), xs[r]);
                            a0 = _mm512_fmadd_ps(xr, _mm512_loadu_ps(row), a0);
                            a1 = _mm512_fmadd_ps(xr, _mm512_loadu_ps(row.add(16)), a1);
                            a2 = _mm512_fmadd_ps(xr, _mm512_loadu_ps(row.add(32)), a2);
                            a3 = _mm512_fmadd_ps(xr, _mm512_loadu_ps(row.add(48)), a3);
                        }
                        _mm512_storeu_ps(yp.add(j), a0);
                        _mm512_storeu_ps(yp.add(j + 16), a1);
                        _mm512_storeu_ps(yp.add(j + 32), a2);
                        _mm512_storeu_ps(yp.add(j + 48), a3);
                    }
                    blk += 4;
                }
            }
            for blk in blk..full + (rem > 0) as usize {
                let j = blk * 16;
                let m = if blk < full { 0xffff } else { tm };
                // SAFETY: lanes j..j+16 masked to < len lie inside y and inside every
                // row slice (each of length len); masked-off lanes never fault.
                unsafe {
                    let mut acc = _mm512_maskz_loadu_ps(m, yp.add(j));
                    for r in 0..nrows {
                        acc = _mm512_fmadd_ps(
                            xs[r],
                            _mm512_maskz_loadu_ps(m, rows[r].as_ptr().add(j)),
                            acc,
                        );
                    }
                    _mm512_mask_storeu_ps(yp.add(j), m, acc);
                }
            }
            p += nrows;
        }
    }

    /// Dot products of W rows r0..r1 with all X rows, in 4 x 4 blocks of
    /// 16-lane accumulators (16 zmm): per 16 steps, 8 loads feed 16 FMAs.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; no other thread writes the outputs of W
    /// rows r0..r1.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_rows_avx512(
        d: &Dot<'_>,
        r0: usize,
        r1: usize,
        y: YOut,
        accumulate: bool,
    ) {
        let k = d.k;
        let (full, rem) = (k / 16, k % 16);
        let tm = tail_mask(rem);
        if d.nx == 1 {
            // SAFETY: forwarded contract.
            return unsafe { dot_rows_one_avx512(d, r0, r1, y, accumulate) };
        }
        let mut r = r0;
        while r < r1 {
            let wr = 4.min(r1 - r);
            // Rows past the end repeat the last real one: computed, never stored.
            let w = [0, 1, 2, 3].map(|i| d.w_row(r + i.min(wr - 1)).as_ptr());
            let mut s = 0;
            while s < d.nx {
                let xr = 4.min(d.nx - s);
                let x = [0, 1, 2, 3].map(|j| d.x_row(s + j.min(xr - 1)).as_ptr());
                let mut acc = [[_mm512_setzero_ps(); 4]; 4];
                // One loop over the full blocks and the masked tail, its body written
                // once so that the sixteen sums stay in registers.
                for blk in 0..full + (rem > 0) as usize {
                    let (p, m) = (blk * 16, if blk < full { 0xffff } else { tm });
                    // SAFETY: lanes p..p+16 masked to < k lie inside every row (each
                    // of length k); masked-off lanes are not read.
                    unsafe {
                        let (w0, w1, w2, w3) = (
                            _mm512_maskz_loadu_ps(m, w[0].add(p)),
                            _mm512_maskz_loadu_ps(m, w[1].add(p)),
                            _mm512_maskz_loadu_ps(m, w[2].add(p)),
                            _mm512_maskz_loadu_ps(m, w[3].add(p)),
                        );
                        // Indexed, not iterated: see `dot_rows_one_avx512`.
                        for j in 0..4 {
                            let xv = _mm512_maskz_loadu_ps(m, x[j].add(p));
                            acc[0][j] = _mm512_fmadd_ps(w0, xv, acc[0][j]);
                            acc[1][j] = _mm512_fmadd_ps(w1, xv, acc[1][j]);
                            acc[2][j] = _mm512_fmadd_ps(w2, xv, acc[2][j]);
                            acc[3][j] = _mm512_fmadd_ps(w3, xv, acc[3][j]);
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate().take(wr) {
                    for (j, acc) in acc.iter().enumerate().take(xr) {
                        // SAFETY: r + i < r1 <= nw and s + j < nx; rows are this task's.
                        unsafe {
                            Dot::put(y, r + i, s + j, _mm512_reduce_add_ps(*acc), accumulate)
                        };
                    }
                }
                s += 4;
            }
            r += 4;
        }
    }

    /// [`dot_rows_avx512`] against one X row (batch-1 inference): eight W rows per
    /// sweep, so eight streams of the matrix are in flight, and no work on copies of X.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; no other thread writes the outputs of W rows
    /// r0..r1.
    #[target_feature(enable = "avx512f")]
    unsafe fn dot_rows_one_avx512(d: &Dot<'_>, r0: usize, r1: usize, y: YOut, accumulate: bool) {
        const ROWS: usize = 8;
        let k = d.k;
        let (full, rem) = (k / 16, k % 16);
        let tm = tail_mask(rem);
        let x = d.x_row(0);
        let mut r = r0;
        while r < r1 {
            let wr = ROWS.min(r1 - r);
            // Rows past the end repeat the last real one: computed, never stored.
            let w: [*const f32; ROWS] =
                std::array::from_fn(|i| d.w_row(r + i.min(wr - 1)).as_ptr());
            let mut acc = [_mm512_setzero_ps(); ROWS];
            // One loop over the full blocks and the masked tail, its body written once
            // so that the sums stay in registers.
            for blk in 0..full + (rem > 0) as usize {
                let (p, m) = (blk * 16, if blk < full { 0xffff } else { tm });
                // SAFETY: lanes p..p+16 masked to < k lie inside every row (each of
                // length k); masked-off lanes are not read.
                unsafe {
                    let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(p));
                    // Indexed, not zipped: an iterator's helpers are not inlined into
                    // this AVX-512 function and would take the sums out of registers.
                    for i in 0..ROWS {
                        acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w[i].add(p)), xv, acc[i]);
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate().take(wr) {
                // SAFETY: r + i < r1 <= nw; rows are this task's.
                unsafe { Dot::put(y, r + i, 0, _mm512_reduce_add_ps(*acc), accumulate) };
            }
            r += ROWS;
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn axpy_avx2(
        mat: &[f32],
        off: usize,
        ks: usize,
        x: &[f32],
        y: &mut [f32],
        acc: bool,
    ) {
        axpy_generic::<true>(mat, off, ks, x, y, acc)
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; no other thread writes the outputs of
    /// W rows r0..r1.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rows_avx2(
        d: &Dot<'_>,
        r0: usize,
        r1: usize,
        y: YOut,
        accumulate: bool,
    ) {
        // SAFETY: forwarded contract.
        unsafe { dot_rows_generic::<true>(d, r0, r1, y, accumulate) }
    }
}
