//! Gather and scatter-add along one axis. Scatter-add is computed per output element
//! (each one sums, in index order, the source elements whose index points at it), so
//! it needs no float atomics (which WGSL lacks) and is deterministic. Out-of-range
//! indices set the launch's error flag: `[code, the index's bits]`.

use super::common::linear_pos;
use crate::device::flag;
use cubecl::prelude::*;

/// Whether an index value is inside `0..size`, for signed or unsigned index types.
#[cube]
fn in_range<I: Int>(v: I, size: u32) -> bool {
    let mut ok = false;
    if v >= I::from_int(0) {
        ok = u32::cast_from(v) < size;
    }
    ok
}

/// Element `i`'s index along an axis whose elements lie `stride` apart and which
/// holds `size` of them.
#[cube(launch_unchecked)]
pub fn iota(out: &mut Array<i32>, n: u32, stride: u32, size: u32) {
    let i = linear_pos();
    if i < n {
        out[i as usize] = i32::cast_from((i / stride) % size);
    }
}

/// `out[c] = data[c with c[axis] = index[c]]` over the index's dims.
///
/// Metadata: `[n, dims (rank), axis size, data offset, data strides (rank), index
/// offset, index strides (rank)]`.
#[cube(launch_unchecked)]
pub fn gather<T: CubePrimitive, I: Int>(
    data: &Array<T>,
    index: &Array<I>,
    out: &mut Array<T>,
    meta: &Array<u32>,
    flags: &mut Array<u32>,
    zero: &Array<T>,
    #[comptime] rank: u32,
    #[comptime] axis: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let size = meta[(1 + rank) as usize];
        let data_at = 2 + rank;
        let index_at = data_at + 1 + rank;
        let mut d_off = meta[data_at as usize];
        let mut i_off = meta[index_at as usize];
        let mut rem = pos;
        #[unroll]
        for i in 0..rank {
            let d = rank - 1 - i;
            let c = rem % meta[(1 + d) as usize];
            rem /= meta[(1 + d) as usize];
            i_off += c * meta[(index_at + 1 + d) as usize];
            if comptime!(d != axis) {
                d_off += c * meta[(data_at + 1 + d) as usize];
            }
        }
        let v = index[i_off as usize];
        if in_range::<I>(v, size) {
            d_off += u32::cast_from(v) * meta[(data_at + 1 + axis) as usize];
            out[pos as usize] = data[d_off as usize];
        } else {
            flags[0] = flag::GATHER;
            flags[1] = u32::cast_from(v);
            out[pos as usize] = zero[0];
        }
    }
}

/// Zeros of the output dims with `src[c]` added at `c with c[axis] = index[c]`.
///
/// Metadata: `[n, out dims (rank), src dims (rank), index offset, index strides
/// (rank), src offset, src strides (rank)]`.
#[cube(launch_unchecked)]
pub fn scatter_add<T: Numeric, A: Numeric, I: Int>(
    index: &Array<I>,
    src: &Array<T>,
    out: &mut Array<T>,
    meta: &Array<u32>,
    flags: &mut Array<u32>,
    #[comptime] rank: u32,
    #[comptime] axis: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let src_dims_at = 1 + rank;
        let index_at = 1 + 2 * rank;
        let src_at = index_at + 1 + rank;
        let mut i_off = meta[index_at as usize];
        let mut s_off = meta[src_at as usize];
        let mut inside = true;
        let mut target = 0u32;
        let mut rem = pos;
        #[unroll]
        for i in 0..rank {
            let d = rank - 1 - i;
            let c = rem % meta[(1 + d) as usize];
            rem /= meta[(1 + d) as usize];
            if comptime!(d == axis) {
                target = c;
            } else {
                inside = inside && c < meta[(src_dims_at + d) as usize];
                i_off += c * meta[(index_at + 1 + d) as usize];
                s_off += c * meta[(src_at + 1 + d) as usize];
            }
        }
        let mut acc = A::from_int(0);
        if inside {
            let along = meta[(src_dims_at + axis) as usize];
            let out_size = meta[(1 + axis) as usize];
            let i_step = meta[(index_at + 1 + axis) as usize];
            let s_step = meta[(src_at + 1 + axis) as usize];
            for k in 0..along {
                let v = index[(i_off + k * i_step) as usize];
                if in_range::<I>(v, out_size) {
                    if u32::cast_from(v) == target {
                        acc += A::cast_from(src[(s_off + k * s_step) as usize]);
                    }
                } else if target == 0 {
                    // Each source element is range-checked once, by the target-0 unit.
                    flags[0] = flag::SCATTER;
                    flags[1] = u32::cast_from(v);
                }
            }
        }
        out[pos as usize] = T::cast_from(acc);
    }
}
