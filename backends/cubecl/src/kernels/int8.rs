//! Kernels over int8 buffers, which every CubeCL device holds as bytes read four to a
//! u32 word (little-endian): the int8 product with its weight dequantised in registers
//! (a cube per output column for a few rows; the weight dequantised once for many, a
//! matrix product after), and the widening to i32 and narrowing back that let the
//! generic kernels (copies, gathers, casts) serve i8 buffers.

use super::common::{cube_index, linear_pos};
use cubecl::prelude::*;

/// Element `i` of int8 values packed four to a word, sign-extended.
#[cube]
pub fn int8_at(words: &Array<u32>, i: u32) -> i32 {
    let byte = (words[(i / 4) as usize] >> ((i % 4) * 8)) & 0xff;
    i32::cast_from(byte) - select(byte >= 128, 256i32, 0i32)
}

/// Units of a cube of [`matvec_int8()`].
pub const MATVEC_BLOCK: u32 = 64;

/// `out[r, c] = scale[c] · Σ_k x[r, k] · w[c, k]`: the int8 product
/// (`Op::MatMulInt8`) of contiguous `x [rows, depth]` (f32), `w [cols, depth]` (int8,
/// packed) and `scale [cols]`, for few rows (a matrix-vector product each). One cube
/// per column `c`: its units split K, neighbours reading neighbouring bytes of the
/// row, and sum their parts in shared memory, row after row. Cubes past the last
/// column compute a clamped copy and write nothing, so every barrier is reached by all.
#[cube(launch_unchecked)]
pub fn matvec_int8(
    x: &Array<f32>,
    w: &Array<u32>,
    scale: &Array<f32>,
    out: &mut Array<f32>,
    rows: u32,
    cols: u32,
    depth: u32,
) {
    let c = cube_index();
    let real = c < cols;
    let col = select(real, c, cols - 1);
    let unit = UNIT_POS_X;
    let mut shared = SharedMemory::<f32>::new(MATVEC_BLOCK as usize);
    let w_at = col * depth;
    for r in 0..rows {
        let x_at = r * depth;
        let mut acc = 0.0f32;
        let mut k = unit;
        while k < depth {
            acc += x[(x_at + k) as usize] * f32::cast_from(int8_at(w, w_at + k));
            k += MATVEC_BLOCK;
        }
        shared[unit as usize] = acc;
        sync_cube();
        let mut s = comptime!(MATVEC_BLOCK / 2).runtime();
        while s > 0 {
            if unit < s {
                let b = shared[(unit + s) as usize];
                shared[unit as usize] += b;
            }
            sync_cube();
            s /= 2;
        }
        if unit == 0 && real {
            out[(r * cols + col) as usize] = shared[0] * scale[col as usize];
        }
        sync_cube();
    }
}

/// `out[k, c] = w[c, k] · scale[c]`: the int8 weight `[cols, depth]` dequantised and
/// transposed to `[depth, cols]`, the right operand of a float product over many rows.
#[cube(launch_unchecked)]
pub fn dequantize_int8(
    w: &Array<u32>,
    scale: &Array<f32>,
    out: &mut Array<f32>,
    cols: u32,
    depth: u32,
) {
    let pos = linear_pos();
    if pos < cols * depth {
        let (k, c) = (pos / cols, pos % cols);
        out[pos as usize] = f32::cast_from(int8_at(w, c * depth + k)) * scale[c as usize];
    }
}

/// `out[i] = w[i]` for `i < n`: packed int8 widened to i32.
#[cube(launch_unchecked)]
pub fn widen_int8(words: &Array<u32>, out: &mut Array<i32>, n: u32) {
    let pos = linear_pos();
    if pos < n {
        out[pos as usize] = int8_at(words, pos);
    }
}

/// Word `j` of `n` int8 values narrowed from i32 (each in −128..=127) and packed.
#[cube(launch_unchecked)]
pub fn narrow_int8(values: &Array<i32>, out: &mut Array<u32>, n: u32) {
    let word = linear_pos();
    if word * 4 < n {
        let mut packed = 0u32;
        for j in 0..4u32 {
            let i = word * 4 + j;
            if i < n {
                packed |= (u32::cast_from(values[i as usize]) & 0xff) << (j * 8);
            }
        }
        out[word as usize] = packed;
    }
}
