//! Launching row passes (`Backend::fused_rows`): checks the pass and its operands,
//! turns its phases into the row-pass kernel's configuration
//! ([`crate::kernels::rows`]) and launches it once. Passes the kernel cannot give the
//! bits of its kernels run apart for are left to the caller (`Ok(false)`): operands
//! other than f32 and one half float, rows whose starts are not evenly apart, a
//! reduction of elements that lie apart, or rows long and few enough that the
//! reduction kernel would cut them into chunks.

use super::reduce::{row_lanes, BLOCK};
use crate::device::CubeDevice;
use crate::kernels::fused::{FusedConfig, HalfEdges, Step};
use crate::kernels::rows::{self as k, MapConfig, Phase, Read, RowsConfig};
use crate::ops::elementwise::arg;
use crate::storage::CubeStorage;
use crate::strided::{coalesce, grid_per_item, word, Operand};
use crate::CubeBackend;
use cubecl::prelude::*;
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::rows::{RowPass, RowPhase, RowRead, RowTarget};
use kiln_tensor::{DType, Error, ReduceOp, Result, View};

type V<'a, R> = View<'a, CubeBackend<R>>;

/// Where an input's rows lie: its first element, the distance between row starts and
/// between the elements of a row (0 for one value per row).
struct RowsOf {
    offset: u32,
    row_stride: u32,
    elem_stride: u32,
    per_row: bool,
}

/// Runs `pass` as one launch (the `Backend::fused_rows` contract).
pub fn fused_rows<R: crate::device::KilnRuntime>(
    device: &CubeDevice<R>,
    pass: &RowPass,
    inputs: &[V<'_, R>],
    outputs: &mut [&mut CubeStorage<R>],
) -> Result<bool> {
    let (rows, width) = (pass.rows, pass.width);
    let bad = |why: String| Err(Error::invalid("row pass", why));
    if width <= 1 || rows == 0 {
        // As on the CPU: nothing to gain, or empty rows whose kernels say what is wrong.
        return Ok(false);
    }
    if outputs.len() != pass.whole_rows.len() {
        return bad(format!(
            "{} outputs for a pass that writes {}",
            outputs.len(),
            pass.whole_rows.len()
        ));
    }
    let dev = &device.state;
    let same_device = |s: &CubeStorage<R>| std::sync::Arc::ptr_eq(&s.device, dev);
    let mut placed = Vec::with_capacity(inputs.len());
    for (i, v) in inputs.iter().enumerate() {
        let per_row = pass.check_input(i, &v.layout, &inputs[0].layout)?;
        let (d, st) = (v.layout.dims(), v.layout.strides());
        let r = d.len();
        let lead = &d[..r - 1];
        if !same_device(v.storage) {
            return bad(format!("input {i} is on another device"));
        }
        crate::check_extent(v.storage, &v.layout)?;
        let lead_strides = Operand {
            offset: 0,
            strides: st[..r - 1].to_vec(),
        };
        let (kept, strides) = coalesce(lead, &[lead_strides]);
        if kept.len() > 1 {
            // Row starts not evenly apart: the kernels apart read such views.
            return Ok(false);
        }
        word(v.layout.storage_extent())?;
        placed.push(RowsOf {
            offset: word(v.layout.offset())?,
            row_stride: word(strides[0].strides.first().copied().unwrap_or(0))?,
            elem_stride: if per_row { 0 } else { word(st[r - 1])? },
            per_row,
        });
    }
    for (k, (o, &whole)) in outputs.iter().zip(&pass.whole_rows).enumerate() {
        let n = rows * if whole { width } else { 1 };
        if o.len < n {
            return bad(format!("output {k} holds {} < {n} elements", o.len));
        }
        if !same_device(o) {
            return bad(format!("output {k} is on another device"));
        }
        word(n)?;
        let reduced =
            (pass.phases.iter()).any(|p| matches!(p, RowPhase::Reduce { out, .. } if *out == k));
        if reduced && o.dtype != DType::F32 {
            return bad("a reduction writes no f32 values".to_string());
        }
    }
    // f32 operands beside at most one half float type.
    let dtypes = (inputs.iter().map(|v| v.storage.dtype)).chain(outputs.iter().map(|o| o.dtype));
    let mut half = None;
    for d in dtypes {
        match d {
            DType::F32 => {}
            DType::BF16 | DType::F16 if *half.get_or_insert(d) == d => {}
            _ => return Ok(false),
        }
    }
    let edges = HalfEdges {
        inputs: inputs
            .iter()
            .map(|v| v.storage.dtype != DType::F32)
            .collect(),
        outputs: outputs.iter().map(|o| o.dtype != DType::F32).collect(),
    };
    let per_row: Vec<bool> = placed.iter().map(|p| p.per_row).collect();
    pass.check(&per_row)?;
    let Some(lanes) = row_lanes(rows, width) else {
        return Ok(false);
    };
    let bindings = dev.client.properties().hardware.max_bindings as usize;
    if inputs.len() + outputs.len() + 4 > bindings {
        return Ok(false);
    }
    let Some((config, consts)) = configure(pass, &placed, edges, lanes) else {
        return Ok(false);
    };
    for (k, o) in outputs.iter().enumerate() {
        if !reads_output(pass, k) {
            dev.note_overwritten(o);
        }
    }
    match half {
        Some(DType::BF16) => {
            launch::<R, half::bf16>(device, pass, inputs, outputs, &placed, consts, config)
        }
        Some(DType::F16) => {
            launch::<R, half::f16>(device, pass, inputs, outputs, &placed, consts, config)
        }
        _ => launch::<R, f32>(device, pass, inputs, outputs, &placed, consts, config),
    }?;
    Ok(true)
}

/// One launch of the row-pass kernel with half floats of type `Half` (f32 where there
/// are none): each operand bound in the sequence of its type.
fn launch<R: crate::device::KilnRuntime, Half: Float>(
    device: &CubeDevice<R>,
    pass: &RowPass,
    inputs: &[V<'_, R>],
    outputs: &mut [&mut CubeStorage<R>],
    placed: &[RowsOf],
    consts: Vec<f32>,
    config: RowsConfig,
) -> Result<()> {
    let dev = &device.state;
    let (rows, width) = (pass.rows, pass.width);
    let (mut ins, mut halves) = (SequenceArg::new(), SequenceArg::new());
    for v in inputs {
        match v.storage.dtype {
            DType::F32 => ins.push(arg(v.storage)),
            _ => halves.push(arg(v.storage)),
        }
    }
    let (mut outs, mut half_outs) = (SequenceArg::new(), SequenceArg::new());
    for o in outputs.iter() {
        match o.dtype {
            DType::F32 => outs.push(arg(o)),
            _ => half_outs.push(arg(o)),
        }
    }
    let mut meta = SequenceArg::new();
    for p in placed {
        meta.push(p.offset);
        meta.push(p.row_stride);
        meta.push(p.elem_stride);
    }
    let mut values = SequenceArg::new();
    for c in consts {
        values.push(c);
    }
    let per_cube = (BLOCK / config.lanes) as usize;
    let (count, dim) = grid_per_item(rows.div_ceil(per_cube), BLOCK);
    // SAFETY: every input's rows lie inside its buffer (checked extent, rows of the
    // pass's width or one value), every output holds its rows, units past the last row
    // write nothing, and all indices fit in 32 bits (`word`).
    unsafe {
        k::row_pass::launch_unchecked::<Half, R>(
            &dev.client,
            count,
            dim,
            ins,
            halves,
            outs,
            half_outs,
            meta,
            values,
            word(rows)?,
            word(width)?,
            0.0,
            config,
        )
    }
    Ok(())
}

/// Whether the pass reads output `k`'s current value before any phase has written it
/// (an expression of a phase writing `k` that reads its target, first): then the launch
/// does not overwrite all of `k` without reading it. Output `k` read back only after a
/// phase wrote it is overwritten, as the first of its kernels apart overwrites it.
fn reads_output(pass: &RowPass, k: usize) -> bool {
    for phase in &pass.phases {
        match phase {
            RowPhase::Map { expr, target, .. } if *target == RowTarget::Output(k) => {
                return (expr.steps.iter()).any(|s| matches!(s, ExprStep::Output(_)));
            }
            RowPhase::Reduce { out, .. } if *out == k => return false,
            _ => {}
        }
    }
    // Never written: its contents stay as they were.
    true
}

/// The kernel's configuration of `pass` and every phase's constants, or `None` for a
/// pass it does not run (a scratch expression that reads its own target).
fn configure(
    pass: &RowPass,
    placed: &[RowsOf],
    edges: HalfEdges,
    lanes: u32,
) -> Option<(RowsConfig, Vec<f32>)> {
    let mut consts = Vec::new();
    let mut phases = Vec::with_capacity(pass.phases.len());
    let mut written = vec![false; pass.whole_rows.len()];
    let mut scratch: Option<MapConfig> = None;
    for phase in &pass.phases {
        let read_of = |r: &RowRead| match *r {
            RowRead::Input(k) => Read::Input(k as u32),
            RowRead::Output { k, .. } if pass.whole_rows[k] => Read::Output(k as u32),
            RowRead::Output { k, .. } => Read::RowValue(k as u32),
            RowRead::Scratch => Read::Scratch,
        };
        // The scratch values this phase may read: the previous phase's.
        let producer = scratch.take();
        match phase {
            RowPhase::Map {
                expr,
                inputs,
                target,
                per_row,
                ..
            } => {
                let map = MapConfig {
                    expr: numbered(expr, &mut consts),
                    reads: inputs.iter().map(read_of).collect(),
                };
                match (*target, *per_row) {
                    (RowTarget::Scratch, _) => {
                        if map.expr.steps.iter().any(|s| matches!(s, Step::Output(_))) {
                            return None;
                        }
                        scratch = Some(map);
                    }
                    (RowTarget::Output(out), false) => {
                        written[out] = true;
                        phases.push(Phase::Map {
                            map,
                            out: out as u32,
                            scratch: producer,
                        });
                    }
                    (RowTarget::Output(out), true) => {
                        phases.push(Phase::RowMap {
                            map,
                            out: out as u32,
                            written: written[out],
                        });
                        written[out] = true;
                    }
                }
            }
            RowPhase::Reduce { op, input, out } => {
                let code = match op {
                    ReduceOp::Sum => crate::kernels::reduce::SUM,
                    ReduceOp::Max => crate::kernels::reduce::MAX,
                    ReduceOp::Min => crate::kernels::reduce::MIN,
                    // Index reductions write no f32 values: their kernels run apart.
                    _ => return None,
                };
                if let RowRead::Input(k) = *input {
                    // The reduction kernel reads such rows with another split.
                    if placed[k].elem_stride != 1 {
                        return None;
                    }
                }
                written[*out] = true;
                phases.push(Phase::Reduce {
                    op: code,
                    input: read_of(input),
                    out: *out as u32,
                    scratch: producer,
                });
            }
        }
    }
    let config = RowsConfig {
        phases,
        edges,
        block: BLOCK,
        lanes,
    };
    Some((config, consts))
}

/// `expr` as the kernel's configuration, its constants appended to `consts` and
/// numbered there.
fn numbered(expr: &FusedExpr, consts: &mut Vec<f32>) -> FusedConfig {
    let (mut config, own) = FusedConfig::new(expr, Vec::new(), 0, 1);
    let base = consts.len() as u32;
    for step in &mut config.steps {
        if let Step::Const(c) = step {
            *c += base;
        }
    }
    consts.extend(own);
    config
}
