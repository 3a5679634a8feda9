//! Launching reductions: the kept and reduced dims are coalesced separately; the
//! layout picks how many units share an output and which units are neighbours, and a
//! long f32 or f64 sum over few outputs runs as chunked partials and their sums.

use super::elementwise::arg;
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::reduce as k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{coalesce, grid_per_item, word, Operand};
use crate::CubeBackend;
use kiln_tensor::{DType, Error, ReduceOp, Result, TensorMeta, View};
use std::sync::Arc;

/// A reduction over `axes` (kept as size-1 dims in `out`).
pub fn reduce<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    x: View<'_, CubeBackend<R>>,
    axes: &[usize],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let dims = x.layout.dims().to_vec();
    let strides = x.layout.strides().to_vec();
    let extent: usize = axes.iter().map(|&a| dims[a]).product();
    let n_out: usize = out.dims.iter().product();
    if op != ReduceOp::Sum && extent == 0 {
        return Err(Error::invalid(op.name(), "cannot reduce an empty axis"));
    }
    let result = dev.alloc(op.name(), out.dtype, n_out)?;
    if n_out == 0 {
        return Ok(result);
    }
    let split = |keep: bool| {
        let idx: Vec<usize> = (0..dims.len())
            .filter(|i| axes.contains(i) != keep)
            .collect();
        let d: Vec<usize> = idx.iter().map(|&i| dims[i]).collect();
        let s: Vec<usize> = idx.iter().map(|&i| strides[i]).collect();
        coalesce(
            &d,
            &[Operand {
                offset: 0,
                strides: s,
            }],
        )
    };
    let (kd, ko) = split(true);
    let (rd, ro) = split(false);
    let dtype = x.storage.dtype;
    let whole = Geometry {
        n_out,
        kept_dims: kd,
        reduced_dims: rd,
        offset: x.layout.offset(),
        kept_strides: ko[0].strides.clone(),
        reduced_strides: ro[0].strides.clone(),
    };
    // A sum of f32 or f64 may be cut into chunks: its partials keep the sum's type.
    let splits = op == ReduceOp::Sum && matches!(dtype, DType::F32 | DType::F64);
    let pass = Pass::plan(&whole, extent, splits);
    if pass.chunks == 1 {
        launch(dev, op, x.storage, &result, &whole, &pass)?;
        return Ok(result);
    }
    // Partials `[chunks, n_out]`, then their column sums.
    let partials = dev.alloc(op.name(), dtype, pass.chunks * n_out)?;
    launch(dev, op, x.storage, &partials, &whole, &pass)?;
    let columns = Geometry {
        n_out,
        kept_dims: vec![n_out],
        reduced_dims: vec![pass.chunks],
        offset: 0,
        kept_strides: vec![1],
        reduced_strides: vec![n_out],
    };
    let sum = Pass::plan(&columns, pass.chunks, false);
    launch(dev, op, &partials, &result, &columns, &sum)?;
    Ok(result)
}

/// Units per cube of every reduction.
const BLOCK: u32 = 256;
/// Cubes a reduction should give the device before its sums are cut into chunks.
const FILL_CUBES: usize = 256;
/// The fewest elements each lane of a chunk folds.
const CHUNK_PER_LANE: usize = 32;

/// What one launch reduces: outputs over coalesced kept dims, each the fold of its
/// elements over coalesced reduced dims.
struct Geometry {
    n_out: usize,
    kept_dims: Vec<usize>,
    reduced_dims: Vec<usize>,
    offset: usize,
    kept_strides: Vec<usize>,
    reduced_strides: Vec<usize>,
}

impl Geometry {
    /// The kernel's metadata words for items of `chunk` elements (layout in [`k`]'s
    /// module docs).
    fn words(&self, extent: usize, pass: &Pass) -> Result<Vec<u32>> {
        let mut w = vec![
            word(self.n_out * pass.chunks)?,
            word(extent)?,
            word(pass.chunk)?,
            word(self.n_out)?,
        ];
        for &d in self.kept_dims.iter().chain(&self.reduced_dims) {
            w.push(word(d)?);
        }
        w.push(word(self.offset)?);
        for &s in self.kept_strides.iter().chain(&self.reduced_strides) {
            w.push(word(s)?);
        }
        Ok(w)
    }
}

/// How one reduction launch spreads its work (module docs of [`k`]).
struct Pass {
    /// Units per item (a power of two up to [`BLOCK`]).
    lanes: u32,
    /// Whether neighbouring units take neighbouring items (the kept axis is contiguous).
    items_inner: bool,
    /// Chunks each output's elements are cut into (1: none).
    chunks: usize,
    /// Reduced elements per chunk.
    chunk: usize,
}

impl Pass {
    /// The launch for `g`'s outputs of `extent` elements; `splits`: whether a sum may
    /// be cut into chunks.
    fn plan(g: &Geometry, extent: usize, splits: bool) -> Pass {
        let rows = g.reduced_strides == [1];
        let items_inner = !rows && g.kept_strides.last() == Some(&1) && g.n_out > 1;
        let lanes = if items_inner {
            BLOCK / (g.n_out.next_power_of_two() as u32).min(32)
        } else {
            (extent.next_power_of_two() as u32 / 8).clamp(1, BLOCK)
        };
        let cubes = g.n_out.div_ceil((BLOCK / lanes) as usize);
        let per_lane = extent / lanes as usize;
        let wanted = if splits && cubes < FILL_CUBES && per_lane >= 2 * CHUNK_PER_LANE {
            (FILL_CUBES / cubes).min(per_lane / CHUNK_PER_LANE)
        } else {
            1
        };
        let chunk = extent.div_ceil(wanted);
        // Rounding up the chunk can leave fewer chunks than wanted.
        let chunks = if wanted == 1 {
            1
        } else {
            extent.div_ceil(chunk)
        };
        Pass {
            lanes,
            items_inner,
            chunks,
            chunk: if chunks == 1 { extent } else { chunk },
        }
    }
}

/// One reduction launch of `x` into `out`: `g`'s outputs (times the pass's chunks).
fn launch<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    x: &CubeStorage<R>,
    out: &CubeStorage<R>,
    g: &Geometry,
    pass: &Pass,
) -> Result<()> {
    let extent: usize = g.reduced_dims.iter().product();
    let m = dev.metadata(&g.words(extent, pass)?)?;
    let (kr, rr) = (g.kept_dims.len() as u32, g.reduced_dims.len() as u32);
    let per_cube = (BLOCK / pass.lanes) as usize;
    let (count, dim) = grid_per_item((g.n_out * pass.chunks).div_ceil(per_cube), BLOCK);
    let (block, lanes, inner) = (BLOCK, pass.lanes, pass.items_inner);
    let c = &dev.client;
    let code = op as u32;
    let dtype = x.dtype;
    let (xs, os, ms) = (x, out, &m);
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        with_float_type!(dtype, F, A => unsafe {
            k::reduce_arg::launch_unchecked::<F, A, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block, lanes, inner)
        }, match dtype {
            DType::I32 => unsafe {
                k::reduce_arg::launch_unchecked::<i32, i32, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block, lanes, inner)
            },
            _ => unsafe {
                k::reduce_arg::launch_unchecked::<u32, u32, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block, lanes, inner)
            },
        });
        return Ok(());
    }
    with_float_type!(dtype, F, A => unsafe {
        k::reduce_float::launch_unchecked::<F, A, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block, lanes, inner)
    }, match dtype {
        DType::I32 => unsafe {
            k::reduce_int::launch_unchecked::<i32, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block, lanes, inner)
        },
        _ => unsafe {
            k::reduce_int::launch_unchecked::<u32, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block, lanes, inner)
        },
    });
    Ok(())
}
