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
                        for oi in 0..oh {
                            let Some(si) = src(oi, ki, w, 0, h) else {
                                row[oi * ow..(oi + 1) * ow].fill(T::default());
                                continue;
                            };
                            for oj in 0..ow {
                                row[oi * ow + oj] = match src(oj, kj, w, 1, wd) {
                                    Some(sj) => img[si * wd + sj],
                                    None => T::default(),
                                };
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
                        for oi in 0..oh {
                            let Some(si) = src(oi, ki, w, 0, h) else {
                                continue;
                            };
                            for oj in 0..ow {
                                if let Some(sj) = src(oj, kj, w, 1, wd) {
                                    img[si * wd + sj] =
                                        T::add(img[si * wd + sj], row[oi * ow + oj]);
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
