//! The row-pass kernel ([`kiln_tensor::rows`]): a chain of a plan's kernels over the
//! same rows (a layer norm's statistics and normalisation, its gradient's row sums and
//! input gradient, a softmax) as one launch, so that each row is read from memory
//! once and its statistics never leave the cube.
//!
//! The work is spread as the reduction kernel spreads a row reduction: a cube of
//! `block` units takes `block / lanes` rows, `lanes` units per row, and lane `l` of a
//! row owns its elements `l, l + lanes, …`. Every phase keeps that split, so a unit
//! reads back only the elements of a whole-row output that it wrote itself; values
//! of one per row (a reduction's result, its epilogue) go through shared memory
//! behind a barrier. A reduction folds and combines its lanes through the reduction
//! kernel's own functions ([`super::reduce`]), and a map evaluates the fused kernel's
//! steps ([`super::fused`]), so a pass gives the bits of its kernels run apart. The
//! scratch block of whole rows is never stored: the phase that reads it computes the
//! producing expression where it needs a value.
//!
//! Operands are f32 or one half float `Half` (bf16 or f16, where mixed precision casts at
//! the pass's edges): a half input is widened as it is read and a half output rounded
//! once as it is stored, and a later phase reads the rounded value back, as the
//! mixed-precision kernels run apart do.
//!
//! Rows past the last (in the last cube) compute a clamped copy of the last row and
//! write nothing, so that every barrier stays in uniform control flow.

use super::common::cube_index;
use super::fused::{eval_step, slot, FusedConfig, HalfEdges, Step};
use super::reduce::{combine_lanes, fold_start, fold_value};
use cubecl::prelude::*;

/// Where a phase reads one operand.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Read {
    /// Input `k` of the pass at this element (one value per row: elements share it).
    Input(u32),
    /// Whole-row output `k` at this element, written earlier by this same unit.
    Output(u32),
    /// Output `k` of one value per row, from the cube's shared copy.
    RowValue(u32),
    /// The scratch value at this element: the phase's `scratch` expression.
    Scratch,
}

/// One fused expression of a pass and where its operands come from.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct MapConfig {
    /// The expression (one result; its constants numbered within the launch's).
    pub expr: FusedConfig,
    /// For each of its inputs, where it is read.
    pub reads: Vec<Read>,
}

/// One phase of the pass as the kernel runs it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    /// `map` over whole rows into output `out` (whole rows).
    Map {
        /// The expression.
        map: MapConfig,
        /// Its output.
        out: u32,
        /// The producer of the scratch values it reads, if it reads them.
        scratch: Option<MapConfig>,
    },
    /// `map` once per row into output `out` (one value per row); `written`: whether
    /// an earlier phase wrote `out` (its current value is then the shared copy).
    RowMap {
        /// The expression.
        map: MapConfig,
        /// Its output.
        out: u32,
        /// Whether an earlier phase wrote the output.
        written: bool,
    },
    /// Each row of `input` folded by the reduction `op` into output `out`.
    Reduce {
        /// The reduction's code (`kernels::reduce::SUM`, `MAX` or `MIN`).
        op: u32,
        /// What it reduces.
        input: Read,
        /// Its output (one value per row).
        out: u32,
        /// The producer of the scratch values it reads, if it reads them.
        scratch: Option<MapConfig>,
    },
}

impl Phase {
    fn is_map(&self) -> bool {
        matches!(self, Phase::Map { .. })
    }

    fn is_row_map(&self) -> bool {
        matches!(self, Phase::RowMap { .. })
    }

    fn map(&self) -> MapConfig {
        match self {
            Phase::Map { map, .. } | Phase::RowMap { map, .. } => map.clone(),
            Phase::Reduce { .. } => unreachable!("a reduction has no expression"),
        }
    }

    fn out(&self) -> u32 {
        match self {
            Phase::Map { out, .. } | Phase::RowMap { out, .. } | Phase::Reduce { out, .. } => *out,
        }
    }

    fn scratch(&self) -> Option<MapConfig> {
        match self {
            Phase::Map { scratch, .. } | Phase::Reduce { scratch, .. } => scratch.clone(),
            Phase::RowMap { .. } => None,
        }
    }

    fn written(&self) -> bool {
        matches!(self, Phase::RowMap { written: true, .. })
    }

    fn reduce_op(&self) -> u32 {
        match self {
            Phase::Reduce { op, .. } => *op,
            _ => unreachable!("only a reduction has an op"),
        }
    }

    fn reduce_input(&self) -> Read {
        match self {
            Phase::Reduce { input, .. } => *input,
            _ => unreachable!("only a reduction reduces an input"),
        }
    }
}

/// A pass as the kernel's comptime configuration.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RowsConfig {
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Which inputs and outputs are half floats (each bound in the sequence of its
    /// type, in order).
    pub edges: HalfEdges,
    /// Units per cube.
    pub block: u32,
    /// Units per row (a power of two: the reduction kernel's for rows of this width).
    pub lanes: u32,
}

/// Whether `map`'s expression reads its target's current value.
fn reads_target(map: &MapConfig) -> bool {
    map.expr.steps.iter().any(|s| matches!(s, Step::Output(_)))
}

/// Element `at` of output `k`, widened to f32 where it is a half float.
#[allow(unused_assignments)]
#[cube]
fn load_output<Half: Float>(
    outputs: &Sequence<Array<f32>>,
    half_outputs: &Sequence<Array<Half>>,
    at: u32,
    #[comptime] k: u32,
    #[comptime] edges: HalfEdges,
) -> f32 {
    let bound = comptime!(slot(&edges.outputs, k as usize));
    let mut v = f32::new(0.0);
    if comptime!(edges.outputs[k as usize]) {
        v = f32::cast_from(half_outputs.index(bound)[at as usize]);
    } else {
        v = outputs.index(bound)[at as usize];
    }
    v
}

/// Stores `v` at element `at` of output `k`, rounded once where it is a half float;
/// returns the value stored, as a later phase reads it back.
#[allow(unused_assignments)]
#[cube]
fn store_output<Half: Float>(
    outputs: &mut Sequence<Array<f32>>,
    half_outputs: &mut Sequence<Array<Half>>,
    at: u32,
    v: f32,
    write: bool,
    #[comptime] k: u32,
    #[comptime] edges: HalfEdges,
) -> f32 {
    let bound = comptime!(slot(&edges.outputs, k as usize));
    let mut stored = v;
    if comptime!(edges.outputs[k as usize]) {
        let h = Half::cast_from(v);
        stored = f32::cast_from(h);
        if write {
            let o = half_outputs.index_mut(bound);
            o[at as usize] = h;
        }
    } else if write {
        let o = outputs.index_mut(bound);
        o[at as usize] = v;
    }
    stored
}

/// Operand `read` at element `r` of row `row` (shared slot `slot`), where it is
/// stored: metadata per input `[offset, row stride, element stride]` from word 0.
#[allow(unused_assignments, clippy::too_many_arguments)]
#[cube]
fn load_stored<Half: Float>(
    inputs: &Sequence<Array<f32>>,
    halves: &Sequence<Array<Half>>,
    outputs: &Sequence<Array<f32>>,
    half_outputs: &Sequence<Array<Half>>,
    meta: &Sequence<u32>,
    values: &SharedMemory<f32>,
    row: u32,
    slot: u32,
    r: u32,
    width: u32,
    zero: f32,
    #[comptime] read: Read,
    #[comptime] edges: HalfEdges,
) -> f32 {
    let outs = comptime!(edges.outputs.len() as u32);
    let mut v = zero;
    match read {
        Read::Input(k) => {
            let offset = *meta.index(comptime!(3 * k as usize));
            let row_stride = *meta.index(comptime!(3 * k as usize + 1));
            let elem_stride = *meta.index(comptime!(3 * k as usize + 2));
            let at = offset + row * row_stride + r * elem_stride;
            let bound = comptime!(crate::kernels::fused::slot(&edges.inputs, k as usize));
            if comptime!(edges.inputs[k as usize]) {
                v = f32::cast_from(halves.index(bound)[at as usize]);
            } else {
                v = inputs.index(bound)[at as usize];
            }
        }
        Read::Output(k) => {
            v = load_output::<Half>(outputs, half_outputs, row * width + r, k, edges);
        }
        Read::RowValue(k) => {
            v = values[(slot * outs + k) as usize];
        }
        Read::Scratch => {}
    }
    v
}

/// `map`'s value at element `r` of row `row`; `current` is its target's current value,
/// `scratch` the producer of the scratch values it reads.
#[allow(clippy::too_many_arguments)]
#[cube]
fn eval_map<Half: Float>(
    inputs: &Sequence<Array<f32>>,
    halves: &Sequence<Array<Half>>,
    outputs: &Sequence<Array<f32>>,
    half_outputs: &Sequence<Array<Half>>,
    meta: &Sequence<u32>,
    values: &SharedMemory<f32>,
    consts: &Sequence<f32>,
    row: u32,
    slot: u32,
    r: u32,
    width: u32,
    zero: f32,
    current: f32,
    #[comptime] map: MapConfig,
    #[comptime] scratch: Option<MapConfig>,
    #[comptime] edges: HalfEdges,
) -> f32 {
    let mut regs = Sequence::<f32>::new();
    #[unroll]
    for i in 0..map.expr.steps.len() {
        let step = comptime!(map.expr.steps[i]);
        let mut operand = zero;
        match step {
            Step::Input(k) => {
                let read = comptime!(map.reads[k as usize]);
                operand = load::<Half>(
                    inputs,
                    halves,
                    outputs,
                    half_outputs,
                    meta,
                    values,
                    consts,
                    row,
                    slot,
                    r,
                    width,
                    zero,
                    read,
                    comptime!(scratch.clone()),
                    comptime!(edges.clone()),
                );
            }
            Step::Output(_) => {
                operand = current;
            }
            _ => {}
        }
        let v = eval_step(&regs, consts, operand, step);
        regs.push(v);
    }
    *regs.index(comptime!(map.expr.results[0] as usize))
}

/// Operand `read` at element `r` of row `row`, computing a scratch value with
/// `scratch` (which reads no scratch itself).
#[allow(unused_assignments, clippy::too_many_arguments)]
#[cube]
fn load<Half: Float>(
    inputs: &Sequence<Array<f32>>,
    halves: &Sequence<Array<Half>>,
    outputs: &Sequence<Array<f32>>,
    half_outputs: &Sequence<Array<Half>>,
    meta: &Sequence<u32>,
    values: &SharedMemory<f32>,
    consts: &Sequence<f32>,
    row: u32,
    slot: u32,
    r: u32,
    width: u32,
    zero: f32,
    #[comptime] read: Read,
    #[comptime] scratch: Option<MapConfig>,
    #[comptime] edges: HalfEdges,
) -> f32 {
    let mut v = zero;
    if comptime!(read == Read::Scratch) {
        let producer = comptime!(scratch.clone().expect("a producer for scratch reads"));
        v = eval_map::<Half>(
            inputs,
            halves,
            outputs,
            half_outputs,
            meta,
            values,
            consts,
            row,
            slot,
            r,
            width,
            zero,
            zero,
            producer,
            None,
            edges,
        );
    } else {
        v = load_stored::<Half>(
            inputs,
            halves,
            outputs,
            half_outputs,
            meta,
            values,
            row,
            slot,
            r,
            width,
            zero,
            read,
            edges,
        );
    }
    v
}

/// The row pass over `rows` rows of `width` elements: `inputs` and `halves` the pass's
/// f32 and half inputs in its order (metadata in `meta`, three words each),
/// `outputs` and `half_outputs` its outputs (contiguous: whole rows, or one value per
/// row), `consts` every phase's constants, `zero` a run-time 0.0.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn row_pass<Half: Float>(
    inputs: &Sequence<Array<f32>>,
    halves: &Sequence<Array<Half>>,
    outputs: &mut Sequence<Array<f32>>,
    half_outputs: &mut Sequence<Array<Half>>,
    meta: &Sequence<u32>,
    consts: &Sequence<f32>,
    rows: u32,
    width: u32,
    zero: f32,
    #[comptime] config: RowsConfig,
) {
    let lanes = comptime!(config.lanes);
    let block = comptime!(config.block);
    let edges = comptime!(config.edges.clone());
    let outs = comptime!(edges.outputs.len() as u32);
    let slot = UNIT_POS_X / lanes;
    let lane = UNIT_POS_X % lanes;
    let wanted = cube_index() * comptime!(block / lanes) + slot;
    let real = wanted < rows;
    let row = select(real, wanted, rows - 1);
    let mut values = SharedMemory::<f32>::new(comptime!((block / lanes * outs.max(1)) as usize));
    let mut shared = SharedMemory::<f32>::new(block as usize);
    let mut has = SharedMemory::<u32>::new(block as usize);
    #[unroll]
    for p in 0..config.phases.len() {
        let phase = comptime!(config.phases[p].clone());
        let out = comptime!(phase.out());
        if comptime!(phase.is_map()) {
            let map = comptime!(phase.map());
            let scratch = comptime!(phase.scratch());
            let mut r = lane;
            while r < width {
                let at = row * width + r;
                let mut current = zero;
                if comptime!(reads_target(&map)) {
                    current = load_output::<Half>(outputs, half_outputs, at, out, edges.clone());
                }
                let v = eval_map::<Half>(
                    inputs,
                    halves,
                    outputs,
                    half_outputs,
                    meta,
                    &values,
                    consts,
                    row,
                    slot,
                    r,
                    width,
                    zero,
                    current,
                    comptime!(map.clone()),
                    comptime!(scratch.clone()),
                    comptime!(edges.clone()),
                );
                store_output::<Half>(outputs, half_outputs, at, v, real, out, edges.clone());
                r += lanes;
            }
        } else if comptime!(phase.is_row_map()) {
            let map = comptime!(phase.map());
            if lane == 0 {
                let mut current = zero;
                if comptime!(reads_target(&map)) {
                    if comptime!(phase.written()) {
                        current = values[(slot * outs + out) as usize];
                    } else {
                        current =
                            load_output::<Half>(outputs, half_outputs, row, out, edges.clone());
                    }
                }
                let v = eval_map::<Half>(
                    inputs,
                    halves,
                    outputs,
                    half_outputs,
                    meta,
                    &values,
                    consts,
                    row,
                    slot,
                    0u32,
                    width,
                    zero,
                    current,
                    map,
                    None,
                    comptime!(edges.clone()),
                );
                let stored =
                    store_output::<Half>(outputs, half_outputs, row, v, real, out, edges.clone());
                values[(slot * outs + out) as usize] = stored;
            }
            sync_cube();
        } else {
            let op = comptime!(phase.reduce_op());
            let input = comptime!(phase.reduce_input());
            let scratch = comptime!(phase.scratch());
            let mut fold = fold_start::<f32>();
            let mut r = lane;
            while r < width {
                let v = load::<Half>(
                    inputs,
                    halves,
                    outputs,
                    half_outputs,
                    meta,
                    &values,
                    consts,
                    row,
                    slot,
                    r,
                    width,
                    zero,
                    input,
                    comptime!(scratch.clone()),
                    comptime!(edges.clone()),
                );
                fold_value::<f32>(&mut fold, v, op);
                r += lanes;
            }
            combine_lanes::<f32>(&mut shared, &mut has, fold, UNIT_POS_X, lane, lanes, op);
            if lane == 0 {
                // Reductions write f32 outputs (the launcher checks).
                let v = shared[UNIT_POS_X as usize];
                values[(slot * outs + out) as usize] = v;
                store_output::<Half>(outputs, half_outputs, row, v, real, out, edges.clone());
            }
            // The shared partials are free again, and the row value is visible.
            sync_cube();
        }
    }
}
