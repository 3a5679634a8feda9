//! The host side of strided kernels: merging dims that every operand walks
//! contiguously (so a contiguous or simply broadcast tensor becomes rank 1 or 2 and
//! its kernel does the least index arithmetic), the u32 metadata buffers the kernels
//! read, and the 2-D launch grid.

use cubecl::prelude::*;
use kiln_tensor::{Error, Layout, Result};

/// Units per cube of the 1-D kernels.
pub const BLOCK: u32 = 256;
/// The most cubes along one grid dimension (wgpu's limit, and CUDA's for y and z).
pub const MAX_GRID: u32 = 65_535;

/// A grid of 1-D cubes of `block` units covering `n` units: x up to 65,535 cubes, the
/// rest along y (kernels recompute the linear position from both).
pub fn grid(n: usize, block: u32) -> (CubeCount, CubeDim) {
    let cubes = n.div_ceil(block as usize).max(1) as u32;
    let x = cubes.min(MAX_GRID);
    let y = cubes.div_ceil(x);
    (CubeCount::Static(x, y, 1), CubeDim::new_1d(block))
}

/// A grid with one cube of `block` units per item, for `items` items.
pub fn grid_per_item(items: usize, block: u32) -> (CubeCount, CubeDim) {
    let items = items.max(1) as u32;
    let x = items.min(MAX_GRID);
    let y = items.div_ceil(x);
    (CubeCount::Static(x, y, 1), CubeDim::new_1d(block))
}

/// One operand of a strided kernel: where its first element is and its strides, one
/// per dim of the shared logical dims.
#[derive(Clone, Debug)]
pub struct Operand {
    /// Offset of the first element, in elements.
    pub offset: usize,
    /// Strides in elements.
    pub strides: Vec<usize>,
}

impl Operand {
    /// The operand a layout describes.
    pub fn of(layout: &Layout) -> Self {
        Operand {
            offset: layout.offset(),
            strides: layout.strides().to_vec(),
        }
    }

    /// A contiguous operand of `dims` starting at `offset`.
    pub fn contiguous(dims: &[usize], offset: usize) -> Self {
        let mut strides = vec![0; dims.len()];
        let mut s = 1;
        for i in (0..dims.len()).rev() {
            strides[i] = s;
            s *= dims[i];
        }
        Operand { offset, strides }
    }
}

/// Drops size-1 dims and merges neighbours that every operand walks as one dim, so
/// that the kernel's rank (a comptime parameter) is as small as possible.
pub fn coalesce(dims: &[usize], ops: &[Operand]) -> (Vec<usize>, Vec<Operand>) {
    let mut out_dims: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    // Walk from the innermost dim outwards, merging into the last kept dim.
    for i in (0..dims.len()).rev() {
        let d = dims[i];
        if d == 1 {
            continue;
        }
        let merge = !out_dims.is_empty()
            && ops.iter().enumerate().all(|(k, op)| {
                let inner = *out_strides[k].last().expect("same length as out_dims");
                op.strides[i] == inner * out_dims.last().expect("non-empty")
            });
        if merge {
            *out_dims.last_mut().expect("non-empty") *= d;
        } else {
            out_dims.push(d);
            for (k, op) in ops.iter().enumerate() {
                out_strides[k].push(op.strides[i]);
            }
        }
    }
    out_dims.reverse();
    let ops = ops
        .iter()
        .zip(out_strides)
        .map(|(op, mut s)| {
            s.reverse();
            Operand {
                offset: op.offset,
                strides: s,
            }
        })
        .collect();
    (out_dims, ops)
}

/// A value as a u32 kernel argument (every index a kernel computes fits in 32 bits).
pub fn word(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::invalid(
            "launch",
            format!("{v} exceeds the 32-bit indices of the GPU kernels"),
        )
    })
}

/// The metadata of an elementwise-style kernel over `n` elements of `dims`:
/// `[n, dims, (offset, strides) per operand]`, with its rank.
pub fn elementwise_meta(dims: &[usize], ops: &[Operand]) -> Result<(u32, Vec<u32>)> {
    let n: usize = dims.iter().product();
    let (dims, ops) = coalesce(dims, ops);
    let mut w = Vec::with_capacity(1 + dims.len() * (1 + ops.len()) + ops.len());
    w.push(word(n)?);
    for &d in &dims {
        w.push(word(d)?);
    }
    for op in &ops {
        w.push(word(op.offset)?);
        for &s in &op.strides {
            w.push(word(s)?);
        }
    }
    Ok((dims.len() as u32, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_operands_become_rank_one() {
        let dims = [2, 3, 4];
        let a = Operand::contiguous(&dims, 5);
        let (d, ops) = coalesce(&dims, &[a.clone(), a]);
        assert_eq!(d, vec![24]);
        assert_eq!(ops[0].strides, vec![1]);
        assert_eq!(ops[1].offset, 5);
    }

    #[test]
    fn broadcast_keeps_the_dims_it_must() {
        // [4, 3] plus a row [1, 3] broadcast with stride 0.
        let a = Operand::contiguous(&[4, 3], 0);
        let b = Operand {
            offset: 0,
            strides: vec![0, 1],
        };
        let (d, ops) = coalesce(
            &[4, 1, 3],
            &[
                Operand {
                    offset: 0,
                    strides: vec![3, 3, 1],
                },
                Operand {
                    offset: 0,
                    strides: vec![0, 0, 1],
                },
            ],
        );
        assert_eq!(d, vec![4, 3]);
        assert_eq!(ops[1].strides, vec![0, 1]);
        let (d2, _) = coalesce(&[4, 3], &[a, b]);
        assert_eq!(d2, vec![4, 3]);
    }

    #[test]
    fn grids_stay_within_limits() {
        let (count, _) = grid(1 << 26, BLOCK);
        match count {
            CubeCount::Static(x, y, z) => {
                assert!(x <= MAX_GRID && y <= MAX_GRID && z == 1);
                assert!(x as usize * y as usize * BLOCK as usize >= 1 << 26);
            }
            _ => panic!("static grid expected"),
        }
    }
}
