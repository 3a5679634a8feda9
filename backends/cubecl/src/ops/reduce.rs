//! Launching reductions: the kept and reduced dims are coalesced separately; the
//! layout picks how many units share an output and which units are neighbours, and a
//! long f32 or f64 sum over few outputs runs as chunked partials and their sums.

use super::elementwise::arg;
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::fused::FusedConfig;
use crate::kernels::reduce as k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{coalesce, elementwise_meta, grid_per_item, word, Operand};
use crate::CubeBackend;
use cubecl::prelude::SequenceArg;
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::{DType, Dims, Error, ReduceOp, Result, TensorMeta, View};
use std::sync::Arc;

/// A reduction over `axes` (kept as size-1 dims in `out`).
pub fn reduce<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    x: View<'_, CubeBackend<R>>,
    axes: &[usize],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let source = Source {
        dims: x.layout.dims().to_vec(),
        strides: x.layout.strides().to_vec(),
        offset: x.layout.offset(),
        dtype: x.storage.dtype,
        stored: x.storage,
        prologue: None,
    };
    reduce_source(dev, op, &source, axes, out)
}

/// A reduction over `axes` of `prologue`'s result over `inputs` (each of `dims`),
/// computed as the reduction reads it and never stored
/// ([`kiln_tensor::Backend::reduce_with_prologue`]): sums, maxima and minima of f32
/// expressions of f32 inputs. `None` for the others (the caller stores the result
/// and reduces it).
pub fn reduce_with_prologue<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    prologue: &FusedExpr,
    inputs: &[View<'_, CubeBackend<R>>],
    dims: &Dims,
    axes: &[usize],
    out: &TensorMeta,
) -> Result<Option<CubeStorage<R>>> {
    let reads_outputs = prologue
        .steps
        .iter()
        .any(|s| matches!(s, ExprStep::Output(_)));
    let fits = matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)
        && out.dtype == DType::F32
        && prologue.results.len() == 1
        && prologue.inputs == inputs.len()
        && !reads_outputs
        && !inputs.is_empty()
        && inputs
            .iter()
            .all(|v| v.storage.dtype == DType::F32 && v.layout.dims() == dims);
    if !fits {
        return Ok(None);
    }
    let operands: Vec<Operand> = inputs.iter().map(|v| Operand::of(&v.layout)).collect();
    let (rank, words) = elementwise_meta(dims, &operands)?;
    let (config, consts) = FusedConfig::new(prologue, Vec::new(), rank, 1);
    let computed = Computed {
        config,
        consts,
        words,
        inputs: inputs.iter().map(|v| v.storage).collect(),
    };
    let mut strides = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let source = Source {
        dims: dims.to_vec(),
        strides,
        offset: 0,
        dtype: DType::F32,
        // Bound as the kernel's unread `x`.
        stored: inputs[0].storage,
        prologue: Some(&computed),
    };
    reduce_source(dev, op, &source, axes, out).map(Some)
}

/// What a reduction reads: a stored view, or a prologue computed as it is read (over
/// the contiguous `dims`).
struct Source<'a, R: KilnRuntime> {
    dims: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
    dtype: DType,
    stored: &'a CubeStorage<R>,
    prologue: Option<&'a Computed<'a, R>>,
}

/// A prologue as the reduction kernel takes it: its configuration and constants, its
/// inputs' strided metadata and buffers.
struct Computed<'a, R: KilnRuntime> {
    config: FusedConfig,
    consts: Vec<f32>,
    words: Vec<u32>,
    inputs: Vec<&'a CubeStorage<R>>,
}

/// [`reduce`] of a [`Source`].
fn reduce_source<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    x: &Source<'_, R>,
    axes: &[usize],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let (dims, strides) = (&x.dims, &x.strides);
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
    let dtype = x.dtype;
    let whole = Geometry {
        n_out,
        kept_dims: kd,
        reduced_dims: rd,
        offset: x.offset,
        kept_strides: ko[0].strides.clone(),
        reduced_strides: ro[0].strides.clone(),
    };
    // A sum of f32 or f64 may be cut into chunks: its partials keep the sum's type.
    let splits = op == ReduceOp::Sum && matches!(dtype, DType::F32 | DType::F64);
    let pass = Pass::plan(&whole, extent, splits);
    if pass.chunks == 1 {
        launch(dev, op, x.stored, x.prologue, &result, &whole, &pass)?;
        return Ok(result);
    }
    // Partials `[chunks, n_out]`, then their column sums.
    let partials = dev.alloc(op.name(), dtype, pass.chunks * n_out)?;
    launch(dev, op, x.stored, x.prologue, &partials, &whole, &pass)?;
    let columns = Geometry {
        n_out,
        kept_dims: vec![n_out],
        reduced_dims: vec![pass.chunks],
        offset: 0,
        kept_strides: vec![1],
        reduced_strides: vec![n_out],
    };
    let sum = Pass::plan(&columns, pass.chunks, false);
    launch(dev, op, &partials, None, &result, &columns, &sum)?;
    Ok(result)
}

/// Units per cube of every reduction.
pub(crate) const BLOCK: u32 = 256;

/// The units per row of [`reduce`] over `rows` contiguous rows of `width` elements, or
/// `None` where it would cut the rows into chunks: the split a row pass must keep to
/// give a reduction's bits.
pub(crate) fn row_lanes(rows: usize, width: usize) -> Option<u32> {
    let rows_of = Geometry {
        n_out: rows,
        kept_dims: vec![rows],
        reduced_dims: vec![width],
        offset: 0,
        kept_strides: vec![width],
        reduced_strides: vec![1],
    };
    let pass = Pass::plan(&rows_of, width, true);
    (pass.chunks == 1 && !pass.items_inner).then_some(pass.lanes)
}
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

/// One reduction launch of `x` (or of `prologue`'s values) into `out`: `g`'s outputs
/// (times the pass's chunks).
fn launch<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    x: &CubeStorage<R>,
    prologue: Option<&Computed<'_, R>>,
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
    let (mut inputs, mut pmeta, mut consts) =
        (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
    if let Some(p) = prologue {
        for s in &p.inputs {
            inputs.push(arg(s));
        }
        for &w in &p.words {
            pmeta.push(w);
        }
        for &v in &p.consts {
            consts.push(v);
        }
    }
    let config = prologue.map(|p| p.config.clone());
    // SAFETY (both launches): every read stays inside its buffer (the geometry's
    // offsets were checked against the view, a prologue's inputs against its dims),
    // and the kernel writes only below the item count.
    with_float_type!(dtype, F, A => unsafe {
        k::reduce_float::launch_unchecked::<F, A, R>(c, count, dim, arg(xs), arg(os), arg(ms), inputs, pmeta, consts, 0.0, code, kr, rr, block, lanes, inner, config)
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
