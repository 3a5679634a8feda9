//! Sliding windows: unfold2d (im2col) and its adjoint fold2d (col2im), the movement
//! primitives that conv2d and pooling are built from.

use crate::storage::{with_storage, with_sum_storage, Accumulate, CpuElement, CpuStorage};
use crate::strided::gather;
use kiln_tensor::{Layout, Result, Window2d};
use rayon::prelude::*;

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

/// `[N, C, H, W] -> [N, C·kh·kw, OH·OW]`.
pub fn unfold2d(x: &CpuStorage, l: &Layout, w: &Window2d) -> Result<CpuStorage> {
    let dims = unfold_dims(l, w)?;
    // Pure data movement, so every dtype; `T::default()` is the zero of padding.
    fn go<T: CpuElement>(v: &[T], l: &Layout, w: &Window2d, dims: [usize; 7]) -> CpuStorage {
        let [images, _, _, oh, ow, kh, kw] = dims;
        let mut out = vec![T::default(); images * kh * kw * oh * ow];
        unfold_planes(&gather(v, l), w, dims, &mut out);
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
    let [images, _, _, oh, ow, kh, kw] = dims;
    let len = images * kh * kw * oh * ow;
    if out.len() < len {
        return Ok(false);
    }
    unfold_planes(&gather(v, l), w, dims, &mut out[..len]);
    Ok(true)
}

/// `[images, H, W, OH, OW, kh, kw]` of an unfold of `l` (images = N·C).
fn unfold_dims(l: &Layout, w: &Window2d) -> Result<[usize; 7]> {
    let d = l.dims();
    let (h, wd) = (d[2], d[3]);
    let (oh, ow) = (w.out_size(0, h)?, w.out_size(1, wd)?);
    Ok([d[0] * d[1], h, wd, oh, ow, w.kernel[0], w.kernel[1]])
}

/// Writes every element of the unfolded planes of the contiguous images `x` into
/// `out`: each tap's row of output positions, zero where the tap reads padding.
fn unfold_planes<T: CpuElement>(x: &[T], w: &Window2d, dims: [usize; 7], out: &mut [T]) {
    let [_, h, wd, oh, ow, kh, kw] = dims;
    let plane = kh * kw * oh * ow;
    if plane == 0 {
        return;
    }
    // Each kj's range of output columns whose tap lands inside the image, and where
    // the first of them reads (computed per tap, not per row; no list, so a planned
    // step allocates nothing here).
    let columns = |kj: usize| {
        let (lo, hi) = valid(kj, w, 1, wd, ow);
        let first = (lo * w.stride[1] + kj * w.dilation[1]) as isize - w.padding[1] as isize;
        (lo, hi, first)
    };
    let sw = w.stride[1];
    let fill = |cols: &mut [T], img: &[T]| {
        for ki in 0..kh {
            for kj in 0..kw {
                let (lo, hi, first) = columns(kj);
                let tap = &mut cols[(ki * kw + kj) * oh * ow..][..oh * ow];
                for (oi, out_row) in tap.chunks_exact_mut(ow).enumerate() {
                    let Some(si) = src(oi, ki, w, 0, h) else {
                        out_row.fill(T::default());
                        continue;
                    };
                    out_row[..lo].fill(T::default());
                    out_row[hi..].fill(T::default());
                    if lo == hi {
                        // Every tap of this row reads padding; `first` would point
                        // before the image.
                        continue;
                    }
                    // Input column of output position `oj` is oj·sw + kj·dil − pad.
                    let start = si * wd + first as usize;
                    let dst = &mut out_row[lo..hi];
                    if sw == 1 {
                        let n = dst.len();
                        dst.copy_from_slice(&img[start..start + n]);
                    } else {
                        for (j, o) in dst.iter_mut().enumerate() {
                            *o = img[start + j * sw];
                        }
                    }
                }
            }
        }
    };
    let images = out.len() / plane;
    if images * plane >= crate::elementwise::GRAIN && images > 1 {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(nc, cols)| fill(cols, &x[nc * h * wd..(nc + 1) * h * wd]));
    } else {
        for (nc, cols) in out.chunks_mut(plane).enumerate() {
            fill(cols, &x[nc * h * wd..(nc + 1) * h * wd]);
        }
    }
}

/// `[N, C·kh·kw, OH·OW] -> [N, C, H, W]`, summing where windows overlap.
pub fn fold2d(
    x: &CpuStorage,
    l: &Layout,
    w: &Window2d,
    height: usize,
    width: usize,
) -> Result<CpuStorage> {
    let dims = fold_dims(l, w, height, width)?;
    fn go<T: Accumulate>(v: &[T], l: &Layout, w: &Window2d, dims: [usize; 7]) -> CpuStorage {
        let [nc, h, wd, ..] = dims;
        let mut acc = vec![T::zero(); nc * h * wd];
        fold_planes::<T>(&gather(v, l), w, dims, &mut acc);
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
    let [nc, h, wd, ..] = dims;
    let Some(out) = out.get_mut(..nc * h * wd) else {
        return Ok(false);
    };
    out.fill(0.0);
    fold_planes::<f32>(&gather(v, l), w, dims, out);
    Ok(true)
}

/// `[images, H, W, OH, OW, kh, kw]` of a fold of `l` into `height × width` images.
fn fold_dims(l: &Layout, w: &Window2d, height: usize, width: usize) -> Result<[usize; 7]> {
    let (oh, ow) = (w.out_size(0, height)?, w.out_size(1, width)?);
    let (kh, kw) = (w.kernel[0], w.kernel[1]);
    let d = l.dims();
    let nc = d[0] * d[1] / (kh * kw);
    Ok([nc, height, width, oh, ow, kh, kw])
}

/// Adds the contiguous columns `cols` into the zeroed images `acc`, each tap's row of
/// output positions onto the image row it was read from.
fn fold_planes<T: Accumulate>(cols: &[T], w: &Window2d, dims: [usize; 7], acc: &mut [T::Acc]) {
    let [_, h, wd, oh, ow, kh, kw] = dims;
    let plane = kh * kw * oh * ow;
    if h * wd == 0 {
        return;
    }
    let fold = |p: usize, img: &mut [T::Acc]| {
        let cols = &cols[p * plane..(p + 1) * plane];
        for ki in 0..kh {
            for kj in 0..kw {
                let row = &cols[(ki * kw + kj) * oh * ow..][..oh * ow];
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
    if images * plane >= crate::elementwise::GRAIN && images > 1 {
        acc.par_chunks_mut(h * wd)
            .enumerate()
            .for_each(|(p, img)| fold(p, img));
    } else {
        for (p, img) in acc.chunks_mut(h * wd).enumerate() {
            fold(p, img);
        }
    }
}
