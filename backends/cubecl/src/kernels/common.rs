//! Helpers shared by every kernel: the linear position of a unit in a 2-D grid and the
//! strided offset of an element described by a metadata buffer.
//!
//! Grids are 2-D because a grid dimension holds at most 65,535 cubes on wgpu (and on
//! CUDA's y and z): a 2^26-element launch needs 262,144 cubes of 256 units, so the
//! host splits the cube count over x and y and every kernel recomputes its linear
//! position from both, checking it against the element count.

use cubecl::prelude::*;

/// The linear index of this unit across a 2-D grid of 1-D cubes.
#[cube]
pub fn linear_pos() -> u32 {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) * CUBE_DIM_X + UNIT_POS_X
}

/// The linear index of this cube in a 2-D grid (for kernels with one cube per output).
#[cube]
pub fn cube_index() -> u32 {
    CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X
}

/// The storage offset of element `pos` (row-major over `rank` dims) of operand `operand`.
///
/// Metadata layout (all u32): `[n, dims[0..rank], then per operand: offset,
/// strides[0..rank]]`.
#[cube]
pub fn strided_offset(
    meta: &Array<u32>,
    pos: u32,
    #[comptime] rank: u32,
    #[comptime] operand: u32,
) -> u32 {
    let base = 1 + rank + operand * (rank + 1);
    let mut off = meta[base as usize];
    let mut rem = pos;
    #[unroll]
    for i in 0..rank {
        let d = rank - 1 - i;
        let size = meta[(1 + d) as usize];
        let coord = rem % size;
        rem /= size;
        off += coord * meta[(base + 1 + d) as usize];
    }
    off
}

/// The offset of linear index `pos` over `rank` dims read from `meta[dims_at..]`, with
/// strides read from `meta[strides_at..]` (no base offset).
#[cube]
pub fn offset_of(
    meta: &Array<u32>,
    pos: u32,
    dims_at: u32,
    strides_at: u32,
    #[comptime] rank: u32,
) -> u32 {
    let mut off = 0u32;
    let mut rem = pos;
    #[unroll]
    for i in 0..rank {
        let d = rank - 1 - i;
        let size = meta[(dims_at + d) as usize];
        off += (rem % size) * meta[(strides_at + d) as usize];
        rem /= size;
    }
    off
}

/// Whether a float is NaN, as a scalar bool (CubeCL's `is_nan` is typed per vector).
#[cube]
pub fn nan<A: Float>(x: A) -> bool {
    bool::cast_from(x.is_nan())
}

/// Whether a float is NaN, read from its bits as an f32 (exponent all ones, mantissa not
/// zero): an integer test, which a driver that assumes floats are never NaN cannot fold
/// away as it may [`nan()`] (NVIDIA's Vulkan driver does, where WGSL allows it).
#[cube]
pub fn nan_bits<A: Float>(x: A) -> bool {
    let bits = u32::reinterpret(f32::cast_from(x));
    (bits & 0x7fff_ffffu32) > 0x7f80_0000u32
}

/// Whether a float is ±infinity, as a scalar bool.
#[cube]
pub fn inf<A: Float>(x: A) -> bool {
    bool::cast_from(x.is_inf())
}
