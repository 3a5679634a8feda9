//! The fused elementwise kernel: one generic `#[cube]` kernel that takes the structure
//! of a fused expression (a build-time plan's elementwise group, prologue or epilogue)
//! as comptime data and unrolls it into straight-line code over f32 registers; the
//! expression's constants are run-time scalars. CubeCL keys its kernel cache on the
//! comptime data, so each expression of a plan compiles once per device and is then
//! only launched, whatever its constants.
//!
//! Two variants: a vectorised one for the common case (the element count a multiple of
//! the vector size, every input contiguous from the start of its buffer, a single
//! broadcast value, a block of trailing dims repeated over the leading ones, or values
//! each held over a run of trailing elements: [`InputKind`]), which moves 16-byte
//! vectors and needs no metadata buffer; and a strided one for other views, which
//! reads each input through strided metadata passed as scalar arguments.

use super::common::linear_pos;
use super::elementwise::{compare_values, float_binary, float_unary};
use cubecl::prelude::*;
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::UnaryOp;

/// One step of a fused kernel, as hashable comptime data (operands index earlier steps).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Step {
    /// Input `k`'s element.
    Input(u32),
    /// Output `k`'s current element (in-place updates).
    Output(u32),
    /// Constant `k` of the launch's constants (run-time values: a kernel is compiled
    /// per expression shape, not per value, so an optimizer whose learning rate changes
    /// every step reuses one kernel; and ±∞ and NaN, which CUDA C++ and WGSL cannot
    /// spell as literals, need no special case).
    Const(u32),
    /// A unary op (its op-table code) of a step.
    Unary(u32, u32),
    /// A binary op of two steps.
    Binary(u32, u32, u32),
    /// A comparison of two steps, as 1.0 or 0.0.
    Compare(u32, u32, u32),
    /// `cond != 0 ? a : b`.
    Select(u32, u32, u32),
    /// 1.0 where the step is non-zero (NaN included), else 0.0.
    ToBool(u32),
}

/// How the vectorised variants read one input (the launch's `shape` argument gives the
/// period or the span).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum InputKind {
    /// Contiguous from the start of its buffer: vector `pos` is the unit's.
    Vector,
    /// One value broadcast to every element (element 0).
    Scalar,
    /// A contiguous block of `period` vectors repeated (a bias of the trailing dims
    /// broadcast over the leading ones): vector `pos % period`.
    Rows,
    /// Each value held over `span` consecutive vectors (a per-row statistic broadcast
    /// over the trailing dims): value `pos / span`.
    Columns,
}

impl InputKind {
    /// Whether the input is bound as an array of vectors (else of single values).
    pub fn vectors(self) -> bool {
        matches!(self, InputKind::Vector | InputKind::Rows)
    }
}

/// A fused expression as the kernel's comptime configuration.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct FusedConfig {
    /// The program, in order.
    pub steps: Vec<Step>,
    /// For each output, the step it stores.
    pub results: Vec<u32>,
    /// Vectorised variants: how each input is read.
    pub kinds: Vec<InputKind>,
    /// Strided variant: the rank of the (coalesced) dims.
    pub rank: u32,
    /// Vectorised variant: vectors per unit.
    pub per_unit: u32,
}

impl FusedConfig {
    /// The configuration of `expr` and its constants in order; `kinds`, `rank` and
    /// `per_unit` are the launch's.
    pub fn new(
        expr: &FusedExpr,
        kinds: Vec<InputKind>,
        rank: u32,
        per_unit: u32,
    ) -> (Self, Vec<f32>) {
        let w = |i: usize| i as u32;
        let mut consts = Vec::new();
        let steps = expr
            .steps
            .iter()
            .map(|s| match *s {
                ExprStep::Input(k) => Step::Input(w(k)),
                ExprStep::Output(k) => Step::Output(w(k)),
                ExprStep::Const(c) => {
                    consts.push(c);
                    Step::Const(w(consts.len() - 1))
                }
                ExprStep::Unary(op, a) => Step::Unary(op as u32, w(a)),
                ExprStep::Binary(op, a, b) => Step::Binary(op as u32, w(a), w(b)),
                ExprStep::Compare(op, a, b) => Step::Compare(op as u32, w(a), w(b)),
                ExprStep::Select(c, a, b) => Step::Select(w(c), w(a), w(b)),
                ExprStep::ToBool(a) => Step::ToBool(w(a)),
            })
            .collect();
        let config = FusedConfig {
            steps,
            results: expr.results.iter().map(|&r| r as u32).collect(),
            kinds,
            rank,
            per_unit,
        };
        (config, consts)
    }
}

/// The value of one step, given the registers of the earlier steps and the launch's
/// constants; `operand` is the step's value when it reads an input or an output (the
/// caller loads it, each variant its own way).
#[cube]
pub(crate) fn eval_step(
    regs: &Sequence<f32>,
    consts: &Sequence<f32>,
    operand: f32,
    #[comptime] step: Step,
) -> f32 {
    let mut r = operand;
    match step {
        Step::Input(_) | Step::Output(_) => {}
        Step::Const(k) => {
            r = *consts.index(comptime!(k as usize));
        }
        Step::Unary(op, a) => {
            let v = *regs.index(comptime!(a as usize));
            if comptime!(op == UnaryOp::Not as u32) {
                // Bools live in f32 registers: not(x) is 1.0 where x is 0.0.
                r = f32::cast_from(v == 0.0);
            } else {
                r = float_unary::<f32>(v, op);
            }
        }
        Step::Binary(op, a, b) => {
            r = float_binary::<f32>(
                *regs.index(comptime!(a as usize)),
                *regs.index(comptime!(b as usize)),
                op,
            );
        }
        Step::Compare(op, a, b) => {
            r = f32::cast_from(compare_values::<f32>(
                *regs.index(comptime!(a as usize)),
                *regs.index(comptime!(b as usize)),
                op,
            ));
        }
        Step::Select(c, a, b) => {
            // `!(c == 0)`, so that a NaN condition selects `a`, as on the CPU.
            if !(*regs.index(comptime!(c as usize)) == 0.0) {
                r = *regs.index(comptime!(a as usize));
            } else {
                r = *regs.index(comptime!(b as usize));
            }
        }
        Step::ToBool(a) => {
            r = f32::cast_from(!(*regs.index(comptime!(a as usize)) == 0.0));
        }
    }
    r
}

/// Input `k`'s vector at `pos` (of kind `kind`), widened to f32: from `vectors` (the
/// vector kinds) or `values` (the single-value kinds), at index `at` of its sequence.
#[allow(unused_assignments)]
#[cube]
fn load_input<E: Float, N: Size>(
    vectors: &Sequence<Array<Vector<E, N>>>,
    values: &Sequence<Array<f32>>,
    shape: &Sequence<u32>,
    pos: u32,
    #[comptime] k: usize,
    #[comptime] at: usize,
    #[comptime] kind: InputKind,
) -> Vector<f32, N> {
    let mut v = Vector::<f32, N>::new(0.0);
    match kind {
        InputKind::Vector => {
            v = Vector::<f32, N>::cast_from(vectors.index(at)[pos as usize]);
        }
        InputKind::Rows => {
            let period = *shape.index(k);
            v = Vector::<f32, N>::cast_from(vectors.index(at)[(pos % period) as usize]);
        }
        InputKind::Scalar => {
            v = Vector::<f32, N>::new(values.index(at)[0]);
        }
        InputKind::Columns => {
            let span = *shape.index(k);
            v = Vector::<f32, N>::new(values.index(at)[(pos / span) as usize]);
        }
    }
    v
}

/// The fused kernel over contiguous inputs, `N` elements per vector and
/// `config.per_unit` vectors per unit (spaced a grid apart, all loaded before any is
/// stored, so that each unit keeps several loads in flight): `vectors` holds the
/// inputs read as vectors and `scalars` those read as single values ([`InputKind`]),
/// each in input order; `shape` each input's period or span; `units` is the element
/// count in vectors, `zero` a run-time 0.0, `consts` the expression's constants.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fused_vectorized<N: Size>(
    vectors: &Sequence<Array<Vector<f32, N>>>,
    scalars: &Sequence<Array<f32>>,
    outputs: &mut Sequence<Array<Vector<f32, N>>>,
    shape: &Sequence<u32>,
    units: u32,
    zero: f32,
    consts: &Sequence<f32>,
    #[comptime] config: FusedConfig,
) {
    let first = linear_pos();
    let grid = CUBE_COUNT_X * CUBE_COUNT_Y * CUBE_DIM_X;
    let inputs = comptime!(config.kinds.len());
    let outs = comptime!(config.results.len());
    // Loads first: vector `j`'s input `k` at `j * inputs + k`, its output `o`'s current
    // value at `j * outs + o`. Positions past the end read the last vector (never stored).
    let mut loaded = Sequence::<Vector<f32, N>>::new();
    let mut current = Sequence::<Vector<f32, N>>::new();
    #[unroll]
    for j in 0..config.per_unit {
        let pos = min(first + j * grid, units - 1);
        #[unroll]
        for k in 0..inputs {
            let kind = comptime!(config.kinds[k]);
            let at = comptime!(kind_slot(&config.kinds, &[], k));
            loaded.push(load_input::<f32, N>(
                vectors, scalars, shape, pos, k, at, kind,
            ));
        }
        #[unroll]
        for o in 0..outs {
            if comptime!(reads_output(&config.steps, o)) {
                current.push(outputs.index(o)[pos as usize]);
            } else {
                current.push(Vector::<f32, N>::new(zero));
            }
        }
    }
    #[unroll]
    for j in 0..config.per_unit {
        let mut lane_results = Sequence::<f32>::new();
        eval_lanes::<N>(
            &loaded,
            &current,
            consts,
            zero,
            &mut lane_results,
            comptime!(j as usize * inputs),
            comptime!(j as usize * outs),
            config.clone(),
        );
        let pos = first + j * grid;
        if pos < units {
            #[unroll]
            for o in 0..outs {
                let out = outputs.index_mut(o);
                out[pos as usize] = vector_of::<N>(&lane_results, zero, o, outs);
            }
        }
    }
}

/// The expression at every lane of one vector, pushed lane-major onto `lane_results`
/// (lane `l`'s value of output `o` at `l · outs + o`): input `k`'s vector is
/// `loaded[at_in + k]`, output `o`'s current one `current[at_out + o]`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn eval_lanes<N: Size>(
    loaded: &Sequence<Vector<f32, N>>,
    current: &Sequence<Vector<f32, N>>,
    consts: &Sequence<f32>,
    zero: f32,
    lane_results: &mut Sequence<f32>,
    #[comptime] at_in: usize,
    #[comptime] at_out: usize,
    #[comptime] config: FusedConfig,
) {
    #[unroll]
    for lane in 0..N::value() {
        let mut regs = Sequence::<f32>::new();
        #[unroll]
        for i in 0..config.steps.len() {
            let step = comptime!(config.steps[i]);
            let mut operand = zero;
            match step {
                Step::Input(k) => {
                    operand = loaded.index(comptime!(at_in + k as usize))[lane];
                }
                Step::Output(k) => {
                    operand = current.index(comptime!(at_out + k as usize))[lane];
                }
                _ => {}
            }
            let v = eval_step(&regs, consts, operand, step);
            regs.push(v);
        }
        #[unroll]
        for o in 0..config.results.len() {
            lane_results.push(*regs.index(comptime!(config.results[o] as usize)));
        }
    }
}

/// Output `o`'s vector (of `outs`) from lane-major results ([`eval_lanes`]).
#[cube]
fn vector_of<N: Size>(
    lane_results: &Sequence<f32>,
    zero: f32,
    #[comptime] o: usize,
    #[comptime] outs: usize,
) -> Vector<f32, N> {
    let mut line = Vector::<f32, N>::new(zero);
    #[unroll]
    for lane in 0..N::value() {
        line[lane] = *lane_results.index(comptime!(lane * outs + o));
    }
    line
}

/// The fused kernel over many groups of contiguous operands in one launch (a
/// multi-tensor update: each parameter with its gradient and state one group), one
/// vector per unit. Group `g` covers the units `starts[g]..starts[g + 1]` and binds its
/// inputs read as vectors at `vectors[g · v ..]`, those read as one value at
/// `scalars[g · s ..]` and its outputs at `outputs[g · o ..]` (`v`, `s` and `o` per
/// group, in input order; `config.kinds` holds only [`InputKind::Vector`] and
/// [`InputKind::Scalar`]). Sequences are indexed at compile time, so the expression
/// is unrolled once per group and a launch takes a bounded number of groups.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fused_groups_vectorized<N: Size>(
    vectors: &Sequence<Array<Vector<f32, N>>>,
    scalars: &Sequence<Array<f32>>,
    outputs: &mut Sequence<Array<Vector<f32, N>>>,
    starts: &Sequence<u32>,
    zero: f32,
    consts: &Sequence<f32>,
    #[comptime] config: FusedConfig,
    #[comptime] groups: u32,
) {
    let pos = linear_pos();
    let inputs = comptime!(config.kinds.len());
    let outs = comptime!(config.results.len());
    let per_vectors = comptime!(config.kinds.iter().filter(|k| k.vectors()).count());
    let per_scalars = comptime!(inputs - per_vectors);
    #[unroll]
    for g in 0..groups {
        let start = *starts.index(comptime!(g as usize));
        let end = *starts.index(comptime!(g as usize + 1));
        if pos >= start && pos < end {
            let at = pos - start;
            let mut loaded = Sequence::<Vector<f32, N>>::new();
            #[unroll]
            for k in 0..inputs {
                let slot = comptime!(kind_slot(&config.kinds, &[], k));
                if comptime!(config.kinds[k].vectors()) {
                    let seq = vectors.index(comptime!(g as usize * per_vectors + slot));
                    loaded.push(seq[at as usize]);
                } else {
                    let seq = scalars.index(comptime!(g as usize * per_scalars + slot));
                    loaded.push(Vector::<f32, N>::new(seq[0]));
                }
            }
            let mut current = Sequence::<Vector<f32, N>>::new();
            #[unroll]
            for o in 0..outs {
                if comptime!(reads_output(&config.steps, o)) {
                    current.push(outputs.index(comptime!(g as usize * outs + o))[at as usize]);
                } else {
                    current.push(Vector::<f32, N>::new(zero));
                }
            }
            let mut lane_results = Sequence::<f32>::new();
            eval_lanes::<N>(
                &loaded,
                &current,
                consts,
                zero,
                &mut lane_results,
                0usize,
                0usize,
                config.clone(),
            );
            #[unroll]
            for o in 0..outs {
                let out = outputs.index_mut(comptime!(g as usize * outs + o));
                out[at as usize] = vector_of::<N>(&lane_results, zero, o, outs);
            }
        }
    }
}

/// The fused kernel over strided inputs (metadata as in `strided_offset`, one operand
/// per input, as scalar arguments; outputs are contiguous). `zero` is a run-time 0.0, `consts` the
/// expression's constants.
#[cube(launch_unchecked)]
pub fn fused_strided(
    inputs: &Sequence<Array<f32>>,
    outputs: &mut Sequence<Array<f32>>,
    meta: &Sequence<u32>,
    zero: f32,
    consts: &Sequence<f32>,
    #[comptime] config: FusedConfig,
) {
    let pos = linear_pos();
    if pos < *meta.index(comptime!(0usize)) {
        let mut regs = Sequence::<f32>::new();
        #[unroll]
        for i in 0..config.steps.len() {
            let step = comptime!(config.steps[i]);
            let mut operand = zero;
            match step {
                Step::Input(k) => {
                    let src = inputs.index(comptime!(k as usize));
                    operand = src[offset_in(meta, pos, config.rank, k) as usize];
                }
                Step::Output(k) => {
                    operand = outputs.index(comptime!(k as usize))[pos as usize];
                }
                _ => {}
            }
            let v = eval_step(&regs, consts, operand, step);
            regs.push(v);
        }
        #[unroll]
        for o in 0..config.results.len() {
            let out = outputs.index_mut(o);
            out[pos as usize] = *regs.index(comptime!(config.results[o] as usize));
        }
    }
}

/// The result of an expression with one result and no outputs (a plan's prologue) at
/// element `pos` of its dims, each input read through strided metadata laid out as
/// [`fused_strided()`]'s: what a reduction reads in place of the prologue's stored value.
#[cube]
pub fn prologue_value(
    inputs: &Sequence<Array<f32>>,
    meta: &Sequence<u32>,
    consts: &Sequence<f32>,
    zero: f32,
    pos: u32,
    #[comptime] config: FusedConfig,
) -> f32 {
    let mut regs = Sequence::<f32>::new();
    #[unroll]
    for i in 0..config.steps.len() {
        let step = comptime!(config.steps[i]);
        let mut operand = zero;
        if let Step::Input(k) = step {
            let src = inputs.index(comptime!(k as usize));
            operand = src[offset_in(meta, pos, config.rank, k) as usize];
        }
        let v = eval_step(&regs, consts, operand, step);
        regs.push(v);
    }
    *regs.index(comptime!(config.results[0] as usize))
}

/// Which inputs and outputs of [`fused_mixed()`] are half floats, all of one type `Half`
/// (the others are f32).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct HalfEdges {
    /// For each input, whether it is a half float.
    pub inputs: Vec<bool>,
    /// For each output, whether it is a half float.
    pub outputs: Vec<bool>,
}

/// [`fused_strided()`] for a group at whose edges mixed precision casts: each input and
/// output is f32 or the half float `Half`, bf16 or f16 (`halves` says which; each kind is
/// numbered in its own sequence). Half values widen as they load and round to nearest
/// even as they store, as the unfused casts do; everything between is f32.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fused_mixed<Half: Float>(
    inputs: &Sequence<Array<f32>>,
    half_inputs: &Sequence<Array<Half>>,
    outputs: &mut Sequence<Array<f32>>,
    half_outputs: &mut Sequence<Array<Half>>,
    meta: &Sequence<u32>,
    zero: f32,
    consts: &Sequence<f32>,
    #[comptime] config: FusedConfig,
    #[comptime] halves: HalfEdges,
) {
    let pos = linear_pos();
    if pos < *meta.index(comptime!(0usize)) {
        let mut regs = Sequence::<f32>::new();
        #[unroll]
        for i in 0..config.steps.len() {
            let step = comptime!(config.steps[i]);
            let mut operand = zero;
            match step {
                Step::Input(k) => {
                    let off = offset_in(meta, pos, config.rank, k) as usize;
                    let at = comptime!(slot(&halves.inputs, k as usize));
                    if comptime!(halves.inputs[k as usize]) {
                        operand = f32::cast_from(half_inputs.index(at)[off]);
                    } else {
                        operand = inputs.index(at)[off];
                    }
                }
                Step::Output(k) => {
                    let at = comptime!(slot(&halves.outputs, k as usize));
                    if comptime!(halves.outputs[k as usize]) {
                        operand = f32::cast_from(half_outputs.index(at)[pos as usize]);
                    } else {
                        operand = outputs.index(at)[pos as usize];
                    }
                }
                _ => {}
            }
            let v = eval_step(&regs, consts, operand, step);
            regs.push(v);
        }
        #[unroll]
        for o in 0..config.results.len() {
            let v = *regs.index(comptime!(config.results[o] as usize));
            let at = comptime!(slot(&halves.outputs, o));
            if comptime!(halves.outputs[o]) {
                let out = half_outputs.index_mut(at);
                out[pos as usize] = Half::cast_from(v);
            } else {
                let out = outputs.index_mut(at);
                out[pos as usize] = v;
            }
        }
    }
}

/// [`fused_vectorized()`] for a group at whose edges mixed precision casts: inputs read
/// as vectors, and outputs, are f32 or `Half` vectors of `N` (`halves` says which; inputs
/// read as single values are f32; `vectors`, `half_vectors` and `scalars` are each
/// numbered in their own sequence, in input order). Half lanes widen as they load and
/// round to nearest even as they store, as in [`fused_mixed()`].
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fused_mixed_vectorized<Half: Float, N: Size>(
    vectors: &Sequence<Array<Vector<f32, N>>>,
    half_vectors: &Sequence<Array<Vector<Half, N>>>,
    scalars: &Sequence<Array<f32>>,
    outputs: &mut Sequence<Array<Vector<f32, N>>>,
    half_outputs: &mut Sequence<Array<Vector<Half, N>>>,
    shape: &Sequence<u32>,
    units: u32,
    zero: f32,
    consts: &Sequence<f32>,
    #[comptime] config: FusedConfig,
    #[comptime] halves: HalfEdges,
) {
    let first = linear_pos();
    let grid = CUBE_COUNT_X * CUBE_COUNT_Y * CUBE_DIM_X;
    let inputs = comptime!(config.kinds.len());
    let outs = comptime!(config.results.len());
    // Loads first, widened: vector `j`'s input `k` at `j * inputs + k`, its output `o`'s
    // current value at `j * outs + o`. Positions past the end read the last vector
    // (never stored).
    let mut loaded = Sequence::<Vector<f32, N>>::new();
    let mut current = Sequence::<Vector<f32, N>>::new();
    #[unroll]
    for j in 0..config.per_unit {
        let pos = min(first + j * grid, units - 1);
        #[unroll]
        for k in 0..inputs {
            let kind = comptime!(config.kinds[k]);
            let at = comptime!(kind_slot(&config.kinds, &halves.inputs, k));
            if comptime!(halves.inputs[k]) {
                loaded.push(load_input::<Half, N>(
                    half_vectors,
                    scalars,
                    shape,
                    pos,
                    k,
                    at,
                    kind,
                ));
            } else {
                loaded.push(load_input::<f32, N>(
                    vectors, scalars, shape, pos, k, at, kind,
                ));
            }
        }
        #[unroll]
        for o in 0..outs {
            let at = comptime!(slot(&halves.outputs, o));
            if comptime!(reads_output(&config.steps, o)) {
                if comptime!(halves.outputs[o]) {
                    current.push(Vector::<f32, N>::cast_from(
                        half_outputs.index(at)[pos as usize],
                    ));
                } else {
                    current.push(outputs.index(at)[pos as usize]);
                }
            } else {
                current.push(Vector::<f32, N>::new(zero));
            }
        }
    }
    #[unroll]
    for j in 0..config.per_unit {
        let mut lane_results = Sequence::<f32>::new();
        eval_lanes::<N>(
            &loaded,
            &current,
            consts,
            zero,
            &mut lane_results,
            comptime!(j as usize * inputs),
            comptime!(j as usize * outs),
            config.clone(),
        );
        let pos = first + j * grid;
        if pos < units {
            #[unroll]
            for o in 0..outs {
                let line = vector_of::<N>(&lane_results, zero, o, outs);
                let at = comptime!(slot(&halves.outputs, o));
                if comptime!(halves.outputs[o]) {
                    let out = half_outputs.index_mut(at);
                    out[pos as usize] = Vector::<Half, N>::cast_from(line);
                } else {
                    let out = outputs.index_mut(at);
                    out[pos as usize] = line;
                }
            }
        }
    }
}

/// The storage offset of element `pos` of operand `operand`, from metadata laid out as
/// in [`super::common::strided_offset`] but held in scalar kernel arguments (every index is comptime,
/// so the metadata travels with the launch, as kernel parameters on CUDA, instead of
/// in a buffer uploaded per launch).
#[cube]
fn offset_in(
    meta: &Sequence<u32>,
    pos: u32,
    #[comptime] rank: u32,
    #[comptime] operand: u32,
) -> u32 {
    let base = comptime!((1 + rank + operand * (rank + 1)) as usize);
    let mut off = *meta.index(base);
    let mut rem = pos;
    #[unroll]
    for i in 0..rank {
        let d = comptime!((rank - 1 - i) as usize);
        let size = *meta.index(comptime!(1 + d));
        off += (rem % size) * *meta.index(comptime!(base + 1 + d));
        rem /= size;
    }
    off
}

/// Whether a step reads output `o`'s current element.
fn reads_output(steps: &[Step], o: usize) -> bool {
    steps.contains(&Step::Output(o as u32))
}

/// Operand `k`'s index among the operands of its dtype (`kinds[k]`: bf16 or f32).
pub(crate) fn slot(kinds: &[bool], k: usize) -> usize {
    kinds[..k].iter().filter(|&&b| b == kinds[k]).count()
}

/// Input `k`'s index in the sequence it is bound in: those read as single values, or
/// those read as vectors of its dtype (`half[i]`: bf16; empty: all f32).
fn kind_slot(kinds: &[InputKind], half: &[bool], k: usize) -> usize {
    let bound = |i: usize| (kinds[i].vectors(), half.get(i).copied().unwrap_or(false));
    (0..k).filter(|&i| bound(i) == bound(k)).count()
}
