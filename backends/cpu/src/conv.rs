//! Convolution products whose columns are never stored (`kiln_fusion::windows`): a
//! product that reads an unfold's columns (a convolution's forward product `W · cols`
//! and its weight gradient `dY · colsᵀ`) and a product whose result is folded (its input
//! gradient `fold(Wᵀ · dY)`).
//!
//! Each runs over blocks of whole images. A block's columns are written to a buffer of
//! the thread's, small enough to stay in the core's L2 cache, multiplied there, and
//! dropped: the columns, `k·k` times the activations, never go through memory. Blocks
//! are independent: the forward product writes its own columns of the result, the fold
//! its own images, and the weight gradient's per-block sums are added in block order,
//! so the result does not depend on how many threads ran.

use crate::gemm::{sgemm_with, GemmOptions, MatRef};
use crate::storage::CpuStorage;
use crate::window::{fold_block_f32, unfold_block_f32};
use kiln_tensor::{Dims, Layout, Result, Window2d};
use rayon::prelude::*;
use std::cell::RefCell;

/// How large a block of images is: its columns take at most `bytes` where one image's
/// fit, and span at least `min_columns` window positions where there are enough images
/// (narrower blocks pack the weights again for too few columns).
#[derive(Clone, Copy, Debug)]
pub struct Blocking {
    /// Bytes of columns per block.
    pub bytes: usize,
    /// Window positions a block spans at least, even past `bytes`.
    pub min_columns: usize,
}

impl Blocking {
    /// What the backend runs with: half of a 1 MiB L2 for the columns (leaving room for
    /// the operands streamed past them), and at least 512 positions (LeNet's second
    /// convolution has 100 per image; at 512 its step was fastest, on a Zen 4).
    pub const CACHE: Blocking = Blocking {
        bytes: 512 << 10,
        min_columns: 512,
    };
}

/// Blocks per thread below which the whole-batch product (parallel inside) is left to
/// the caller: too few blocks would leave threads idle.
const MIN_BLOCKS_PER_THREAD: usize = 2;

thread_local! {
    /// A block's columns, kept between calls (a steady-state step allocates nothing).
    static BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The weight gradient's per-block sums, on the calling thread.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's block buffer grown to `len` (taken out while `f` runs, so
/// a nested call would get a buffer of its own).
fn with_buffer<R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let mut buf = key.with(|b| std::mem::take(&mut *b.borrow_mut()));
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let r = f(&mut buf[..len]);
    key.with(|b| *b.borrow_mut() = buf);
    r
}

/// One thread per block's product: the blocks are the parallelism.
fn one_thread() -> GemmOptions {
    GemmOptions {
        threads: Some(1),
        ..GemmOptions::default()
    }
}

/// The images per block (at least one; see [`Blocking`]) for columns of `rows` rows
/// and `positions` window positions per image, and the block count for `images`;
/// `None` when there would be too few blocks to keep the pool's threads busy.
fn blocks(rows: usize, positions: usize, images: usize, b: Blocking) -> Option<(usize, usize)> {
    let per_image = rows * positions * std::mem::size_of::<f32>();
    let wide_enough = b.min_columns.div_ceil(positions.max(1));
    let per_block = (b.bytes / per_image.max(1))
        .max(wide_enough)
        .clamp(1, images.max(1));
    let count = images.div_ceil(per_block);
    let threads = rayon::current_num_threads();
    (count >= threads * MIN_BLOCKS_PER_THREAD).then_some((per_block, count))
}

/// Matrix `batch` of a rank-3 view.
fn matrix<'a>(data: &'a [f32], l: &Layout, batch: usize) -> MatRef<'a, f32> {
    let s = l.strides();
    MatRef {
        data,
        offset: l.offset() + batch * s[0],
        row_stride: s[1],
        col_stride: s[2],
    }
}

/// The f32 elements of a storage.
fn f32s(s: &CpuStorage) -> Option<&[f32]> {
    match s {
        CpuStorage::F32(v) => Some(v),
        _ => None,
    }
}

/// Whether `l` has dims `dims` and, on every axis longer than one, `strides`, from
/// offset 0.
fn laid_out(l: &Layout, dims: &[usize], strides: &[usize]) -> bool {
    let same = |(i, &d): (usize, &usize)| d == dims[i] && (d <= 1 || l.strides()[i] == strides[i]);
    l.offset() == 0 && l.rank() == dims.len() && l.dims().as_slice().iter().enumerate().all(same)
}

/// Whether `l` is `dims` (three of them) laid out contiguously from offset 0.
fn contiguous(l: &Layout, dims: [usize; 3]) -> bool {
    laid_out(l, &dims, &[dims[1] * dims[2], dims[2], 1])
}

/// An unfold's columns seen by a product (`kiln_tensor::WindowView`, on the CPU).
pub struct Columns<'a> {
    /// The images `[N, C, H, W]`.
    pub image: (&'a CpuStorage, &'a Layout),
    /// The unfold's window.
    pub window: &'a Window2d,
    /// `[C·kh·kw, N, L]`.
    pub dims: &'a Dims,
    /// How the product reads them.
    pub layout: &'a Layout,
}

/// A result written from many threads at disjoint places (a product's blocks of
/// columns, a bf16 product's rounded blocks): its first element and its length.
pub(crate) struct DisjointOut<T>(pub(crate) *mut T, pub(crate) usize);

// SAFETY: the threads write disjoint elements (see `slice`'s callers).
unsafe impl<T: Send> Sync for DisjointOut<T> {}

impl<T> DisjointOut<T> {
    /// Elements `at..at + len`.
    ///
    /// # Safety
    /// No other live slice overlaps them.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, at: usize, len: usize) -> &mut [T] {
        assert!(at + len <= self.1, "a block inside the result");
        // SAFETY: in bounds (checked), not aliased (per the caller).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// `lhs · columns` (a convolution's forward product, the columns `[g, C·kh·kw / g,
/// N·L]`) or `lhs · columnsᵀ` (its weight gradient, `[g, N·L, C·kh·kw / g]`), f32,
/// into the first elements of `out`, by blocks of images as `blocking` says. `false` for any other form, other dtypes,
/// or too few blocks: the caller computes it otherwise.
pub fn windowed_product_f32(
    lhs: (&CpuStorage, &Layout),
    cols: Columns<'_>,
    out: &mut [f32],
    blocking: Blocking,
) -> Result<bool> {
    let (Some(a), Some(x)) = (f32s(lhs.0), f32s(cols.image.0)) else {
        return Ok(false);
    };
    let (la, lc, cd) = (lhs.1, cols.layout, cols.dims.as_slice());
    if la.rank() != 3 || lc.rank() != 3 || cd.len() != 3 || cols.image.1.rank() != 4 {
        return Ok(false);
    }
    let ([rows, images, positions], [g, m]) = ([cd[0], cd[1], cd[2]], [la.dims()[0], la.dims()[1]]);
    let wide = images * positions;
    if g == 0 || rows % g != 0 || lc.dims()[0] != g {
        return Ok(false);
    }
    let per_group = rows / g;
    let forward = contiguous(lc, [g, per_group, wide]);
    let weight_grad = laid_out(lc, &[g, wide, per_group], &[per_group * wide, 1, wide]);
    let k = if forward { per_group } else { wide };
    if !(forward || weight_grad) || la.dims()[2] != k {
        return Ok(false);
    }
    let image = cols.image.1;
    let rows_contiguous = image.strides()[3] == 1 || image.dims()[3] <= 1;
    let Some((per_block, count)) =
        blocks(rows, positions, images, blocking).filter(|_| rows_contiguous)
    else {
        return Ok(false);
    };
    let n_out = if forward { wide } else { per_group };
    let Some(out) = out.get_mut(..g * m * n_out) else {
        return Ok(false);
    };
    let window = cols.window;
    // The columns of block `b` into `buf`, then `f` on them (images `first..`, `n` of them).
    let columns = |b: usize, buf: &mut [f32], f: &mut dyn FnMut(&[f32], usize, usize)| {
        let first = b * per_block;
        let n = per_block.min(images - first);
        match unfold_block_f32(x, image, window, first, n, buf) {
            Ok(true) => {
                f(buf, first, n);
                Ok(true)
            }
            other => other,
        }
    };
    let block_len = rows * per_block * positions;
    if forward {
        let shared = DisjointOut(out.as_mut_ptr(), out.len());
        let done = (0..count).into_par_iter().map(|b| {
            with_buffer(&BLOCK, block_len + m * per_block * positions, |buf| {
                let (buf, tmp) = buf.split_at_mut(block_len);
                columns(b, buf, &mut |c, first, n| {
                    let cols_n = n * positions;
                    for gi in 0..g {
                        let b_mat = MatRef {
                            data: c,
                            offset: gi * per_group * cols_n,
                            row_stride: cols_n,
                            col_stride: 1,
                        };
                        let tmp = &mut tmp[..m * cols_n];
                        sgemm_with(
                            &one_thread(),
                            m,
                            cols_n,
                            per_group,
                            matrix(a, la, gi),
                            b_mat,
                            tmp,
                            false,
                        );
                        for (r, row) in tmp.chunks_exact(cols_n).enumerate() {
                            let at = (gi * m + r) * wide + first * positions;
                            // SAFETY: block `b` alone writes columns `first·L..(first + n)·L`
                            // of each row of the result.
                            unsafe { shared.slice(at, cols_n) }.copy_from_slice(row);
                        }
                    }
                })
            })
        });
        return done.try_reduce(|| true, |x, y| Ok(x && y));
    }
    // The weight gradient: each block's sums into its own part, added in block order.
    let part = g * m * per_group;
    with_buffer(&PARTIALS, count * part, |partials| {
        let done = partials.par_chunks_mut(part).enumerate().map(|(b, sums)| {
            with_buffer(&BLOCK, block_len, |buf| {
                columns(b, buf, &mut |c, first, n| {
                    let cols_n = n * positions;
                    for gi in 0..g {
                        let mut a_mat = matrix(a, la, gi);
                        a_mat.offset += first * positions * a_mat.col_stride;
                        let b_mat = MatRef {
                            data: c,
                            offset: gi * per_group * cols_n,
                            row_stride: cols_n,
                            col_stride: 1,
                        }
                        .t();
                        let sums = &mut sums[gi * m * per_group..][..m * per_group];
                        sgemm_with(
                            &one_thread(),
                            m,
                            per_group,
                            cols_n,
                            a_mat,
                            b_mat,
                            sums,
                            false,
                        );
                    }
                })
            })
        });
        if !done.try_reduce(|| true, |x, y| Ok(x && y))? {
            return Ok(false);
        }
        let mut parts = partials.chunks_exact(part);
        out.copy_from_slice(parts.next().expect("at least one block"));
        for p in parts {
            out.iter_mut().zip(p).for_each(|(o, v)| *o += v);
        }
        Ok(true)
    })
}

/// `fold(lhs · rhs)`: a convolution's input gradient, the product `[g, C·kh·kw / g, k]
/// · [g, k, N·L]` seen as the columns `[C·kh·kw, N, L]` (contiguous) and folded by
/// `window` into `[N, C, height, width]`, f32, into the first elements of `out`, by
/// blocks of images (as [`windowed_product_f32`]'s). `false` for any other form, other
/// dtypes, or too few blocks: the caller computes it otherwise.
#[allow(clippy::too_many_arguments)]
pub fn folded_product_f32(
    lhs: (&CpuStorage, &Layout),
    rhs: (&CpuStorage, &Layout),
    columns: &Layout,
    window: &Window2d,
    [height, width]: [usize; 2],
    out: &mut [f32],
    blocking: Blocking,
) -> Result<bool> {
    let (Some(a), Some(d)) = (f32s(lhs.0), f32s(rhs.0)) else {
        return Ok(false);
    };
    let (la, lb) = (lhs.1, rhs.1);
    if la.rank() != 3 || lb.rank() != 3 || columns.rank() != 3 {
        return Ok(false);
    }
    let cd = columns.dims().as_slice();
    let ([rows, images, positions], [g, per_group, k]) = (
        [cd[0], cd[1], cd[2]],
        [la.dims()[0], la.dims()[1], la.dims()[2]],
    );
    let taps = window.kernel[0] * window.kernel[1];
    let product_ok = lb.dims()[0] == g && lb.dims()[1] == k && lb.dims()[2] == images * positions;
    if !product_ok || g * per_group != rows || taps == 0 || rows % taps != 0 {
        return Ok(false);
    }
    // The fold reads the product's contiguous result as `[C·kh·kw, N, L]`.
    if !contiguous(columns, [rows, images, positions]) {
        return Ok(false);
    }
    let channels = rows / taps;
    if window.out_size(0, height)? * window.out_size(1, width)? != positions {
        return Ok(false);
    }
    let Some((per_block, _)) = blocks(rows, positions, images, blocking) else {
        return Ok(false);
    };
    let image_len = channels * height * width;
    let Some(out) = out.get_mut(..images * image_len) else {
        return Ok(false);
    };
    let done = out
        .par_chunks_mut(per_block * image_len)
        .enumerate()
        .map(|(b, dx)| {
            let (first, n) = (b * per_block, dx.len() / image_len.max(1));
            let cols_n = n * positions;
            with_buffer(&BLOCK, rows * cols_n, |buf| {
                for gi in 0..g {
                    let mut b_mat = matrix(d, lb, gi);
                    b_mat.offset += first * positions * b_mat.col_stride;
                    let c = &mut buf[gi * per_group * cols_n..][..per_group * cols_n];
                    sgemm_with(
                        &one_thread(),
                        per_group,
                        cols_n,
                        k,
                        matrix(a, la, gi),
                        b_mat,
                        c,
                        false,
                    );
                }
                fold_block_f32(buf, window, [n, channels, height, width], dx)
            })
        });
    done.try_reduce(|| true, |x, y| Ok(x && y))
}
