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
    let d = l.dims();
    let (h, wd) = (d[2], d[3]);
    let (oh, ow) = (w.out_size(0, h)?, w.out_size(1, wd)?);
    let (kh, kw) = (w.kernel[0], w.kernel[1]);
    // Pure data movement, so every dtype; `T::default()` is the zero of padding.
    fn go<T: CpuElement>(v: &[T], l: &Layout, w: &Window2d, dims: [usize; 7]) -> CpuStorage {
        let [images, h, wd, oh, ow, kh, kw] = dims;
        let x = gather(v, l);
        let plane = kh * kw * oh * ow;
        let mut out = vec![T::default(); images * plane];
        if plane == 0 {
            return T::wrap(out);
        }
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(nc, cols)| {
                let img = &x[nc * h * wd..(nc + 1) * h * wd];
                for ki in 0..kh {
                    for kj in 0..kw {
                        let row = &mut cols[(ki * kw + kj) * oh * ow..][..oh * ow];
                        let (lo, hi) = valid(kj, w, 1, wd, ow);
                        let (sw, shift) = (w.stride[1], kj * w.dilation[1]);
                        for oi in 0..oh {
                            let out_row = &mut row[oi * ow..(oi + 1) * ow];
                            let Some(si) = src(oi, ki, w, 0, h) else {
                                out_row.fill(T::default());
                                continue;
                            };
                            out_row[..lo].fill(T::default());
                            out_row[hi..].fill(T::default());
                            if lo == hi {
                                // Every tap of this row reads padding; `first` below
                                // would point before the image.
                                continue;
                            }
                            // Input column of output position `oj` is oj·sw + shift − pad.
                            let base = si * wd + shift;
                            let first = base + lo * sw - w.padding[1];
                            if sw == 1 {
                                out_row[lo..hi].copy_from_slice(&img[first..first + (hi - lo)]);
                            } else {
                                for (j, o) in out_row[lo..hi].iter_mut().enumerate() {
                                    *o = img[first + j * sw];
                                }
                            }
                        }
                    }
                }
            });
        T::wrap(out)
    }
    let dims = [d[0] * d[1], h, wd, oh, ow, kh, kw];
    Ok(with_storage!(x, v, T => go::<T>(v, l, w, dims)))
}

/// `[N, C·kh·kw, OH·OW] -> [N, C, H, W]`, summing where windows overlap.
pub fn fold2d(
    x: &CpuStorage,
    l: &Layout,
    w: &Window2d,
    height: usize,
    width: usize,
) -> Result<CpuStorage> {
    let (oh, ow) = (w.out_size(0, height)?, w.out_size(1, width)?);
    let (kh, kw) = (w.kernel[0], w.kernel[1]);
    let d = l.dims();
    let nc = d[0] * d[1] / (kh * kw);
    fn go<T: Accumulate>(v: &[T], l: &Layout, w: &Window2d, dims: [usize; 7]) -> CpuStorage {
        let [nc, h, wd, oh, ow, kh, kw] = dims;
        let cols = gather(v, l);
        let plane = kh * kw * oh * ow;
        let mut acc = vec![T::zero(); nc * h * wd];
        if h * wd > 0 {
            acc.par_chunks_mut(h * wd).enumerate().for_each(|(p, img)| {
                let cols = &cols[p * plane..(p + 1) * plane];
                for ki in 0..kh {
                    for kj in 0..kw {
                        let row = &cols[(ki * kw + kj) * oh * ow..][..oh * ow];
                        let (lo, hi) = valid(kj, w, 1, wd, ow);
                        let (sw, shift) = (w.stride[1], kj * w.dilation[1]);
                        for oi in 0..oh {
                            let Some(si) = src(oi, ki, w, 0, h) else {
                                continue;
                            };
                            if lo == hi {
                                continue;
                            }
                            let first = si * wd + shift + lo * sw - w.padding[1];
                            let src_row = &row[oi * ow + lo..oi * ow + hi];
                            if sw == 1 {
                                for (dst, &v) in
                                    img[first..first + (hi - lo)].iter_mut().zip(src_row)
                                {
                                    *dst = T::add(*dst, v);
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
            });
        }
        T::wrap(acc.into_iter().map(T::finish).collect())
    }
    let dims = [nc, height, width, oh, ow, kh, kw];
    with_sum_storage!(x, v, T => Ok(go::<T>(v, l, w, dims)), Err(crate::elementwise::unsupported("fold2d", x)))
}
