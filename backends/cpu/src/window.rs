//! Sliding windows: unfold2d (im2col) and its adjoint fold2d (col2im), the movement
//! primitives that conv2d and pooling are built from.

use crate::storage::{with_storage, with_sum_storage, Accumulate, CpuElement, CpuStorage};
use crate::strided::gather;
use kiln_tensor::{Layout, Result, Window2d};
use rayon::prelude::*;
use std::borrow::Cow;

/// The input coordinate of output position `o` and tap `k` along one axis, if inside.
#[inline]
fn src(o: usize, k: usize, w: &Window2d, ax: usize, n: usize) -> Option<usize> {
    let p = (o * w.stride[ax] + k * w.dilation[ax]) as isize - w.padding[ax] as isize;
    (p >= 0 && (p as usize) < n).then_some(p as usize)
}

/// The output positions `lo..hi` (of `out_n`) whose tap `k` lands inside an input of
/// size `n` along axis `ax`; outside it the tap reads padding.
#[inline]
fn valid(k: usize, w: &Window2d, ax: usize, n: usize, out_n: usize) -> (usize, usize) {
    let (s, off) = (
        w.stride[ax] as isize,
        (k * w.dilation[ax]) as isize - w.padding[ax] as isize,
    );
    // Smallest o with o·s + off >= 0, and one past the largest with o·s + off < n.
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    let hi = if (n as isize) - off <= 0 {
        0
    } else {
        ((n as isize) - off + s - 1) / s
    };
    let lo = (lo as usize).min(out_n);
    (lo, (hi as usize).clamp(lo, out_n))
}

/// `[N, C, H, W] -> [C·kh·kw, N, OH·OW]`.
pub fn unfold2d(x: &CpuStorage, l: &Layout, w: &Window2d) -> Result<CpuStorage> {
    let dims = unfold_dims(l, w)?;
    // Pure data movement, so every dtype; `T::default()` is the zero of padding.
    fn go<T: CpuElement>(v: &[T], l: &Layout, w: &Window2d, dims: WindowDims) -> CpuStorage {
        let mut out = vec![T::default(); dims.columns_len()];
        unfold_planes(&Images::new(v, l), w, dims, &mut out, true);
        T::wrap(out)
    }
    Ok(with_storage!(x, v, T => go::<T>(v, l, w, dims)))
}

/// [`unfold2d`] of an f32 input written into the first elements of `out` (a planned
/// step's buffer, reused from step to step); `false` for other dtypes or an `out` too
/// short.
pub fn unfold2d_f32_into(
    x: &CpuStorage,
    l: &Layout,
    w: &Window2d,
    out: &mut [f32],
) -> Result<bool> {
    let CpuStorage::F32(v) = x else {
        return Ok(false);
    };
    let dims = unfold_dims(l, w)?;
    let Some(out) = out.get_mut(..dims.columns_len()) else {
        return Ok(false);
    };
    unfold_planes(&Images::new(v, l), w, dims, out, true);
    Ok(true)
}

/// [`unfold2d`] of the f32 images `first..first + count` of `x` (`[N, C, H, W]` seen
/// through `l`, rows contiguous) into `out` as `[C·kh·kw, count, OH·OW]`, on this
/// thread (a block of a convolution whose columns are never stored, `crate::conv`).
/// `false` when `out` is too short or the rows are not contiguous.
pub(crate) fn unfold_block_f32(
    x: &[f32],
    l: &Layout,
    w: &Window2d,
    first: usize,
    count: usize,
    out: &mut [f32],
) -> Result<bool> {
    let block = l.slice(0, first, first + count, 1)?;
    let dims = unfold_dims(&block, w)?;
    let rows_contiguous = block.strides()[3] == 1 || block.dims()[3] <= 1;
    let Some(out) = out.get_mut(..dims.columns_len()) else {
        return Ok(false);
    };
    if !rows_contiguous {
        return Ok(false);
    }
    unfold_planes(&Images::new(x, &block), w, dims, out, false);
    Ok(true)
}

/// [`fold2d`] of contiguous f32 columns `[C·kh·kw, count, OH·OW]` into `count` images
/// `[count, C, height, width]` (`out`, overwritten), on this thread (the block form of
/// [`unfold_block_f32`]'s adjoint). `false` when a slice is too short.
pub(crate) fn fold_block_f32(
    cols: &[f32],
    w: &Window2d,
    [count, channels, height, width]: [usize; 4],
    out: &mut [f32],
) -> Result<bool> {
    let dims = WindowDims {
        n: count,
        c: channels,
        h: height,
        w: width,
        oh: w.out_size(0, height)?,
        ow: w.out_size(1, width)?,
        kh: w.kernel[0],
        kw: w.kernel[1],
    };
    let (Some(cols), Some(out)) = (
        cols.get(..dims.columns_len()),
        out.get_mut(..count * channels * height * width),
    ) else {
        return Ok(false);
    };
    out.fill(0.0);
    fold_planes::<f32>(cols, w, dims, out, false);
    Ok(true)
}

/// The sizes an unfold or a fold works with: images `[N, C, H, W]`, `OH × OW` windows
/// of `kh × kw` taps.
#[derive(Clone, Copy)]
struct WindowDims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
}

impl WindowDims {
    /// Elements of the columns `[C·kh·kw, N, OH·OW]`.
    fn columns_len(&self) -> usize {
        self.c * self.kh * self.kw * self.n * self.oh * self.ow
    }

    /// Where the row of window positions of image `n`, channel `c`, tap `tap` starts
    /// in the columns.
    fn row_start(&self, n: usize, c: usize, tap: usize) -> usize {
        ((c * self.kh * self.kw + tap) * self.n + n) * self.oh * self.ow
    }
}

/// The input of an unfold read in place through its strides: a convolution's input is
/// often the previous layer's output seen as `[N, C, H, W]` through a permutation.
/// Rows whose elements are not adjacent are gathered first.
struct Images<'a, T: Clone> {
    data: Cow<'a, [T]>,
    offset: usize,
    /// Strides of N, C and H; W's is 1.
    strides: [usize; 3],
}

impl<'a, T: Copy + Send + Sync> Images<'a, T> {
    fn new(data: &'a [T], l: &Layout) -> Self {
        let s = l.strides();
        if s[3] == 1 || l.dims()[3] <= 1 {
            Images {
                data: Cow::Borrowed(data),
                offset: l.offset(),
                strides: [s[0], s[1], s[2]],
            }
        } else {
            let d = l.dims();
            Images {
                data: gather(data, l),
                offset: 0,
                strides: [d[1] * d[2] * d[3], d[2] * d[3], d[3]],
            }
        }
    }

    /// Row `i` of channel `c` of image `n`, `width` elements long.
    #[inline]
    fn row(&self, n: usize, c: usize, i: usize, width: usize) -> &[T] {
        let [sn, sc, sh] = self.strides;
        &self.data[self.offset + n * sn + c * sc + i * sh..][..width]
    }
}

/// The sizes of an unfold of `l`.
fn unfold_dims(l: &Layout, w: &Window2d) -> Result<WindowDims> {
    let d = l.dims();
    let (h, wd) = (d[2], d[3]);
    Ok(WindowDims {
        n: d[0],
        c: d[1],
        h,
        w: wd,
        oh: w.out_size(0, h)?,
        ow: w.out_size(1, wd)?,
        kh: w.kernel[0],
        kw: w.kernel[1],
    })
}

/// Writes every element of the columns of the images `x` (read through their strides)
/// into `out`: for each channel and tap (a block of `N·OH·OW`), each image's row of
/// window positions, zero where the tap reads padding. `parallel`: split large
/// columns across the pool's threads.
fn unfold_planes<T: CpuElement>(
    x: &Images<'_, T>,
    w: &Window2d,
    dims: WindowDims,
    out: &mut [T],
    parallel: bool,
) {
    let WindowDims {
        n: images,
        h,
        w: wd,
        oh,
        ow,
        kh,
        kw,
        ..
    } = dims;
    let block = images * oh * ow;
    if block == 0 || out.is_empty() {
        return;
    }
    let sw = w.stride[1];
    // One channel's tap over every image: `rows` is `[N, OH·OW]`.
    let fill = |ct: usize, rows: &mut [T]| {
        let (c, tap) = (ct / (kh * kw), ct % (kh * kw));
        let (ki, kj) = (tap / kw, tap % kw);
        // The range of output columns whose tap lands inside the image, and where the
        // first of them reads.
        let (lo, hi) = valid(kj, w, 1, wd, ow);
        let first = (lo * sw + kj * w.dilation[1]) as isize - w.padding[1] as isize;
        for (n, positions) in rows.chunks_exact_mut(oh * ow).enumerate() {
            for (oi, out_row) in positions.chunks_exact_mut(ow).enumerate() {
                let Some(si) = src(oi, ki, w, 0, h) else {
                    out_row.fill(T::default());
                    continue;
                };
                out_row[..lo].fill(T::default());
                out_row[hi..].fill(T::default());
                if lo == hi {
                    // Every tap of this row reads padding; `first` would point before
                    // the image.
                    continue;
                }
                // Input column of output position `oj` is oj·sw + kj·dil − pad.
                let src_row = &x.row(n, c, si, wd)[first as usize..];
                let dst = &mut out_row[lo..hi];
                if sw == 1 {
                    let n = dst.len();
                    dst.copy_from_slice(&src_row[..n]);
                } else {
                    for (j, o) in dst.iter_mut().enumerate() {
                        *o = src_row[j * sw];
                    }
                }
            }
        }
    };
    if parallel && out.len() >= crate::elementwise::GRAIN && out.len() > block {
        out.par_chunks_mut(block)
            .enumerate()
            .for_each(|(ct, rows)| fill(ct, rows));
    } else {
        for (ct, rows) in out.chunks_mut(block).enumerate() {
            fill(ct, rows);
        }
    }
}

/// `[C·kh·kw, N, OH·OW] -> [N, C, H, W]`, summing where windows overlap.
pub fn fold2d(
    x: &CpuStorage,
    l: &Layout,
    w: &Window2d,
    height: usize,
    width: usize,
) -> Result<CpuStorage> {
    let dims = fold_dims(l, w, height, width)?;
    fn go<T: Accumulate>(v: &[T], l: &Layout, w: &Window2d, dims: WindowDims) -> CpuStorage {
        let mut acc = vec![T::zero(); dims.n * dims.c * dims.h * dims.w];
        fold_planes::<T>(&gather(v, l), w, dims, &mut acc, true);
        T::wrap(acc.into_iter().map(T::finish).collect())
    }
    with_sum_storage!(x, v, T => Ok(go::<T>(v, l, w, dims)), Err(crate::elementwise::unsupported("fold2d", x)))
}

/// [`fold2d`] of f32 columns written into the first elements of `out` (a planned step's
/// buffer); `false` for other dtypes or an `out` too short.
pub fn fold2d_f32_into(
    x: &CpuStorage,
    l: &Layout,
    w: &Window2d,
    height: usize,
    width: usize,
    out: &mut [f32],
) -> Result<bool> {
    let CpuStorage::F32(v) = x else {
        return Ok(false);
    };
    let dims = fold_dims(l, w, height, width)?;
    let Some(out) = out.get_mut(..dims.n * dims.c * dims.h * dims.w) else {
        return Ok(false);
    };
    out.fill(0.0);
    fold_planes::<f32>(&gather(v, l), w, dims, out, true);
    Ok(true)
}

/// The sizes of a fold of the columns `l` into `height × width` images.
fn fold_dims(l: &Layout, w: &Window2d, height: usize, width: usize) -> Result<WindowDims> {
    let (kh, kw) = (w.kernel[0], w.kernel[1]);
    let d = l.dims();
    Ok(WindowDims {
        n: d[1],
        c: d[0] / (kh * kw),
        h: height,
        w: width,
        oh: w.out_size(0, height)?,
        ow: w.out_size(1, width)?,
        kh,
        kw,
    })
}

/// Adds the contiguous columns `cols` into the zeroed images `acc`, each tap's row of
/// output positions onto the image row it was read from.
fn fold_planes<T: Accumulate>(
    cols: &[T],
    w: &Window2d,
    dims: WindowDims,
    acc: &mut [T::Acc],
    parallel: bool,
) {
    let WindowDims {
        c: channels,
        h,
        w: wd,
        oh,
        ow,
        kh,
        kw,
        ..
    } = dims;
    if h * wd == 0 {
        return;
    }
    // Image `p` is channel `p % C` of batch entry `p / C`.
    let fold = |p: usize, img: &mut [T::Acc]| {
        let (n, c) = (p / channels, p % channels);
        for ki in 0..kh {
            for kj in 0..kw {
                let row = &cols[dims.row_start(n, c, ki * kw + kj)..][..oh * ow];
                let (lo, hi) = valid(kj, w, 1, wd, ow);
                let (sw, shift) = (w.stride[1], kj * w.dilation[1]);
                if lo == hi {
                    continue;
                }
                for oi in 0..oh {
                    let Some(si) = src(oi, ki, w, 0, h) else {
                        continue;
                    };
                    let first = si * wd + shift + lo * sw - w.padding[1];
                    let src_row = &row[oi * ow + lo..oi * ow + hi];
                    if sw == 1 {
                        let dst = &mut img[first..first + src_row.len()];
                        for j in 0..dst.len() {
                            dst[j] = T::add(dst[j], src_row[j]);
                        }
                    } else {
                        for (j, &v) in src_row.iter().enumerate() {
                            let at = first + j * sw;
                            img[at] = T::add(img[at], v);
                        }
                    }
                }
            }
        }
    };
    let images = acc.len() / (h * wd);
    if parallel && images * kh * kw * oh * ow >= crate::elementwise::GRAIN && images > 1 {
        acc.par_chunks_mut(h * wd)
            .enumerate()
            .for_each(|(p, img)| fold(p, img));
    } else {
        for (p, img) in acc.chunks_mut(h * wd).enumerate() {
            fold(p, img);
        }
    }
}
