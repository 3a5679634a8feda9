//! Gather and scatter-add along one axis. Scatter-add is computed per output element
//! (each one sums, in index order, the source elements whose index points at it), so
//! it needs no float atomics (which WGSL lacks) and is deterministic. Where the index
//! is one value per position along the axis (an embedding's gradient: the index
//! broadcast over the rows' columns), [`scatter_add_rows()`] reads each index once per
//! cube instead of once per output element. Out-of-range indices set the launch's
//! error flag: `[code, the index's bits]`.

use super::common::{cube_index, linear_pos};
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

/// [`scatter_add()`] where the index does not vary off `axis` (its strides there are 0)
/// and the source has elements: one cube per output position along `axis` (a target)
/// and `block` of the other positions (columns). Each `block` of source positions
/// along the axis, the cube's units read one index each, and a prefix sum over the
/// cube lists the positions pointing at the target in order; then every unit adds its
/// column of the listed sources, in index order, as [`scatter_add()`] does: the same
/// sums, bit for bit, with each unit's loop as long as the target's share of the
/// sources rather than all of them.
///
/// Metadata as [`scatter_add()`]'s.
#[cube(launch_unchecked)]
pub fn scatter_add_rows<T: Numeric, A: Numeric, I: Int>(
    index: &Array<I>,
    src: &Array<T>,
    out: &mut Array<T>,
    meta: &Array<u32>,
    flags: &mut Array<u32>,
    #[comptime] rank: u32,
    #[comptime] axis: u32,
    #[comptime] block: u32,
) {
    let src_dims_at = 1 + rank;
    let index_at = 1 + 2 * rank;
    let src_at = index_at + 1 + rank;
    let out_size = meta[(1 + axis) as usize];
    let columns = meta[0] / out_size;
    // Kernel code rounds up by hand: `u32::div_ceil` has no cube expansion.
    #[allow(clippy::manual_div_ceil)]
    let tiles = (columns + block - 1) / block;
    let cube = cube_index();
    // Whole cubes past the last target leave together, before any barrier.
    if cube < out_size * tiles {
        let target = cube / tiles;
        let column = (cube % tiles) * block + UNIT_POS_X;
        let mut inside = column < columns;
        let mut pos = 0u32;
        let mut s_off = meta[src_at as usize];
        let mut below = 1u32;
        let mut rem = column;
        #[unroll]
        for i in 0..rank {
            let d = rank - 1 - i;
            let size = meta[(1 + d) as usize];
            if comptime!(d == axis) {
                pos += target * below;
            } else {
                let c = rem % size;
                rem /= size;
                pos += c * below;
                inside = inside && c < meta[(src_dims_at + d) as usize];
                s_off += c * meta[(src_at + 1 + d) as usize];
            }
            below *= size;
        }
        let along = meta[(src_dims_at + axis) as usize];
        let i_off = meta[index_at as usize];
        let i_step = meta[(index_at + 1 + axis) as usize];
        let s_step = meta[(src_at + 1 + axis) as usize];
        // Per block of sources: the running count of hits up to each unit, then the
        // hits' positions in order.
        let mut count = SharedMemory::<u32>::new(block as usize);
        let mut listed = SharedMemory::<u32>::new(block as usize);
        let mut acc = A::from_int(0);
        let mut k0 = 0u32;
        while k0 < along {
            let k = k0 + UNIT_POS_X;
            let mut hit = 0u32;
            if k < along {
                let v = index[(i_off + k * i_step) as usize];
                if in_range::<I>(v, out_size) {
                    if u32::cast_from(v) == target {
                        hit = 1u32;
                    }
                } else if cube == 0 {
                    // Each index is range-checked once, by the first cube.
                    flags[0] = flag::SCATTER;
                    flags[1] = u32::cast_from(v);
                }
            }
            count[UNIT_POS_X as usize] = hit;
            sync_cube();
            // An inclusive prefix sum (Hillis and Steele): log2(block) rounds.
            let mut step = 1u32;
            while step < block {
                let mut before = 0u32;
                if UNIT_POS_X >= step {
                    before = count[(UNIT_POS_X - step) as usize];
                }
                sync_cube();
                count[UNIT_POS_X as usize] += before;
                sync_cube();
                step *= 2;
            }
            if hit == 1u32 {
                listed[(count[UNIT_POS_X as usize] - 1) as usize] = k;
            }
            sync_cube();
            if inside {
                let hits = count[(block - 1) as usize];
                for j in 0..hits {
                    let at = listed[j as usize];
                    acc += A::cast_from(src[(s_off + at * s_step) as usize]);
                }
            }
            sync_cube();
            k0 += block;
        }
        if column < columns {
            out[pos as usize] = T::cast_from(acc);
        }
    }
}
