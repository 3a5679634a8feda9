//! im2col (`unfold2d`) and its adjoint col2im (`fold2d`), one unit per output element;
//! fold sums its taps in a fixed order, so it needs no atomics.
//!
//! Window metadata: `[n, N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, offset,
//! four strides]`.

use super::common::linear_pos;
use cubecl::prelude::*;

/// `[N, C, H, W] -> [C·kh·kw, N, oh·ow]`, zeros where a window reaches into padding.
#[cube(launch_unchecked)]
pub fn unfold2d<T: CubePrimitive>(
    x: &Array<T>,
    out: &mut Array<T>,
    meta: &Array<u32>,
    zero: &Array<T>,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let (images, h, w) = (meta[1], meta[3], meta[4]);
        let (kh, kw) = (meta[5], meta[6]);
        let (sh, sw, ph, pw, dh, dw) = (meta[7], meta[8], meta[9], meta[10], meta[11], meta[12]);
        let (oh, ow) = (meta[13], meta[14]);
        let cols = oh * ow;
        let col = pos % cols;
        let n = (pos / cols) % images;
        let row = pos / (cols * images);
        let c = row / (kh * kw);
        let tap = row % (kh * kw);
        let (ki, kj) = (tap / kw, tap % kw);
        let (oi, oj) = (col / ow, col % ow);
        let yi = oi * sh + ki * dh;
        let xj = oj * sw + kj * dw;
        if yi >= ph && yi - ph < h && xj >= pw && xj - pw < w {
            let off = meta[15]
                + n * meta[16]
                + c * meta[17]
                + (yi - ph) * meta[18]
                + (xj - pw) * meta[19];
            out[pos as usize] = x[off as usize];
        } else {
            out[pos as usize] = zero[0];
        }
    }
}

/// `[C·kh·kw, N, L] -> [N, C, H, W]`, summing every column entry that was read from a
/// position (accumulated in `A`).
// CubeCL's kernel language has `%` but not `is_multiple_of`.
#[allow(clippy::manual_is_multiple_of)]
#[cube(launch_unchecked)]
pub fn fold2d<T: Numeric, A: Numeric>(cols: &Array<T>, out: &mut Array<T>, meta: &Array<u32>) {
    let pos = linear_pos();
    if pos < meta[0] {
        let (c_out, h, w) = (meta[2], meta[3], meta[4]);
        let (kh, kw) = (meta[5], meta[6]);
        let (sh, sw, ph, pw, dh, dw) = (meta[7], meta[8], meta[9], meta[10], meta[11], meta[12]);
        let (oh, ow) = (meta[13], meta[14]);
        let xj = pos % w;
        let yi = (pos / w) % h;
        let c = (pos / (w * h)) % c_out;
        let n = pos / (w * h * c_out);
        let mut acc = A::from_int(0);
        for ki in 0..kh {
            // The window row oi that reads input row yi through tap ki, if any.
            let ty = yi + ph;
            if ty >= ki * dh && (ty - ki * dh) % sh == 0 && (ty - ki * dh) / sh < oh {
                let oi = (ty - ki * dh) / sh;
                for kj in 0..kw {
                    let tx = xj + pw;
                    if tx >= kj * dw && (tx - kj * dw) % sw == 0 && (tx - kj * dw) / sw < ow {
                        let oj = (tx - kj * dw) / sw;
                        let row = c * kh * kw + ki * kw + kj;
                        let off =
                            meta[15] + row * meta[16] + n * meta[17] + (oi * ow + oj) * meta[18];
                        acc += A::cast_from(cols[off as usize]);
                    }
                }
            }
        }
        out[pos as usize] = T::cast_from(acc);
    }
}
