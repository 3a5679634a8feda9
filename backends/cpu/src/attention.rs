//! Attention on the CPU without the `Tq×Tk` scores in memory: each batch element's
//! queries in blocks of `QUERY_BLOCK` rows against keys in blocks of `KEY_BLOCK`, the
//! scores of one block pair at a time (a GEMM), an online softmax carrying each row's
//! maximum and sum across key blocks (the forward pass), and the backward pass
//! recomputing each block's probabilities from the saved row log-sum-exp. Causal
//! attention skips the key blocks above the diagonal and the masked columns of the
//! blocks on it. Batch elements run on rayon's threads, each block product on one.
//! Inputs are read where they lie (a model's heads are permuted views), never gathered.
//!
//! One forward pass writes the output, the row log-sum-exp, or both (a plan's
//! [`Op::Attention`] and [`Op::AttentionLse`] of the same queries and keys run as one
//! pass); one backward pass writes any of the three gradients, sharing each block's
//! probabilities and their gradient between them. Dropout on the weights multiplies
//! each block's probabilities by their factors, drawn from the weights' counters as the
//! op defines them. The math is `kiln_tensor::attention`'s; f16 and bf16 compute in
//! f32, f64 in f64. bf16 heads are read where they lie, the block products packing
//! them (bf16 pairs for the CPU's dot-product instructions where both factors are
//! inputs); f16 heads are widened first.

use crate::gemm::{dgemm_with, sgemm_with, GemmInput, GemmOptions, MatRef};
use crate::math::Real;
use crate::storage::{with_float_storage, CpuElement, CpuStorage, FloatKernel};
use crate::strided::gather;
use crate::Cpu;
use half::bf16;
use kiln_tensor::attention::{dropout_counter, stats_dtype};
use kiln_tensor::simd;
use kiln_tensor::{
    rng, AttentionInput, AttentionSpec, DType, Dims, Element, Error, HostData, Layout, Op, Result,
    View,
};
use num_traits::{ToPrimitive, Zero};
use rayon::iter::Either;
use rayon::prelude::*;
use std::cell::RefCell;

/// Query rows per block.
const QUERY_BLOCK: usize = 32;
/// Key rows per block: a block's scores are `QUERY_BLOCK × KEY_BLOCK`, small enough
/// to stay in the core's cache, long enough that the row work runs in wide vectors.
const KEY_BLOCK: usize = 128;

/// A compute type's thread-local block buffers.
trait BlockGemm: Real {
    /// Runs `f` on this thread's block buffers, fitted to sizes `n`.
    fn with_scratch<R>(n: Sizes, f: impl FnOnce(&mut BlockScratch<Self>) -> R) -> R;
}

/// The block products of compute type `Self` over inputs of element type `X` (the
/// compute type itself, or bf16 read as it is packed), on one thread:
/// `c (m×n) (+)= a (m×k) · b (k×n)`. `b` is always an input (keys, values, queries,
/// the output's gradient); `a` is an input or a block computed here.
trait BlockProducts<X>: BlockGemm {
    /// Both factors inputs (scores `q·kᵀ`, `g·vᵀ`): bf16 pairs on the CPU's bf16
    /// dot-product instructions where it has them.
    #[allow(clippy::too_many_arguments)]
    fn gemm_inputs(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<X>,
        b: MatRef<X>,
        c: &mut [Self],
        acc: bool,
    );

    /// A computed block times an input (`p·v`, `pᵀ·g`, `ds·k`, `dsᵀ·q`).
    #[allow(clippy::too_many_arguments)]
    fn gemm_block(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<Self>,
        b: MatRef<X>,
        c: &mut [Self],
        acc: bool,
    );
}

fn one_thread() -> GemmOptions {
    GemmOptions {
        threads: Some(1),
        ..GemmOptions::default()
    }
}

impl BlockGemm for f32 {
    fn with_scratch<R>(n: Sizes, f: impl FnOnce(&mut BlockScratch<f32>) -> R) -> R {
        F32_BLOCKS.with(|blocks| match blocks.try_borrow_mut() {
            Ok(mut blocks) => {
                blocks.fit(n);
                f(&mut blocks)
            }
            // Only if a task ran inside another on this thread: buffers of its own.
            Err(_) => {
                let mut own = BlockScratch::empty();
                own.fit(n);
                f(&mut own)
            }
        })
    }
}

impl<X: GemmInput> BlockProducts<X> for f32 {
    fn gemm_inputs(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<X>,
        b: MatRef<X>,
        c: &mut [f32],
        acc: bool,
    ) {
        sgemm_with(&one_thread(), m, n, k, a, b, c, acc)
    }

    fn gemm_block(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<f32>,
        b: MatRef<X>,
        c: &mut [f32],
        acc: bool,
    ) {
        sgemm_with(&one_thread(), m, n, k, a, b, c, acc)
    }
}

impl BlockGemm for f64 {
    // f64 attention (gradient checks) takes buffers per batch element.
    fn with_scratch<R>(n: Sizes, f: impl FnOnce(&mut BlockScratch<f64>) -> R) -> R {
        let mut own = BlockScratch::empty();
        own.fit(n);
        f(&mut own)
    }
}

impl BlockProducts<f64> for f64 {
    fn gemm_inputs(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<f64>,
        b: MatRef<f64>,
        c: &mut [f64],
        acc: bool,
    ) {
        dgemm_with(&one_thread(), m, n, k, a, b, c, acc)
    }

    fn gemm_block(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<f64>,
        b: MatRef<f64>,
        c: &mut [f64],
        acc: bool,
    ) {
        dgemm_with(&one_thread(), m, n, k, a, b, c, acc)
    }
}

/// The sizes of one attention: batch elements, queries, keys, widths of q/k and of v.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    batch: usize,
    tq: usize,
    tk: usize,
    e: usize,
    ev: usize,
}

/// An input as the kernels read it: a strided view whose last two axes are each batch
/// element's matrix (rows, columns) and whose leading axes number the batch elements.
#[derive(Clone, Copy)]
struct Operand<'a, C> {
    data: &'a [C],
    layout: &'a Layout,
}

impl<'a, C> Operand<'a, C> {
    /// Where batch element `b`'s matrix starts in `data`.
    fn base(&self, b: usize) -> usize {
        let (dims, strides) = (self.layout.dims().as_slice(), self.layout.strides());
        let mut rest = b;
        let mut at = self.layout.offset();
        for axis in (0..dims.len() - 2).rev() {
            at += (rest % dims[axis]) * strides[axis];
            rest /= dims[axis];
        }
        at
    }

    /// Batch element `b`'s matrix from row `first` on.
    fn rows(&self, b: usize, first: usize) -> MatRef<'a, C> {
        let s = self.layout.strides();
        let (row, col) = (s[s.len() - 2], s[s.len() - 1]);
        MatRef {
            data: self.data,
            offset: self.base(b) + first * row,
            row_stride: row,
            col_stride: col,
        }
    }
}

/// An attention's dropout in the compute type `C`: the generator's key, the draws that
/// drop, and the factor of the kept weights.
#[derive(Clone, Copy)]
struct Dropout<C> {
    key: u32,
    threshold: u32,
    keep: C,
}

impl<C: Real> Dropout<C> {
    fn of(spec: &AttentionSpec) -> Option<Self> {
        spec.dropout.map(|d| Dropout {
            key: d.key(),
            threshold: d.threshold(),
            keep: C::from_f64_(d.keep_scale()),
        })
    }

    /// The factors of batch element `b`'s query `i` against keys `j0..` into `row`:
    /// the kept weights' factor, or 0 for a dropped one.
    fn factors(&self, row: &mut [C], n: Sizes, b: usize, i: usize, j0: usize) {
        let first = dropout_counter(b, i, j0, n.tq, n.tk);
        simd::wide(
            #[inline(always)]
            || {
                for (c, z) in row.iter_mut().enumerate() {
                    let counter = first.wrapping_add(c as u32);
                    *z = if rng::bits(self.key, counter) >> 8 >= self.threshold {
                        self.keep
                    } else {
                        C::zero()
                    };
                }
            },
        );
    }
}

/// Multiplies each weight by its dropout factor; a dropped weight becomes 0 whatever
/// it was.
#[inline(always)]
fn apply_factors<C: Real>(row: &mut [C], z: &[C]) {
    for (x, &z) in row.iter_mut().zip(z) {
        *x = if z == C::zero() { C::zero() } else { *x * z };
    }
}

/// Lanes of the row reductions: partial results in independent lanes vectorise, and
/// their order is fixed, so every pass over the same row gives the same bits.
const LANES: usize = 16;

/// Scales `row` by `scale` in place and returns its largest value (−∞ for an empty
/// row; NaNs are passed over, as `max` does).
#[inline(always)]
fn scale_and_max<C: Real>(row: &mut [C], scale: C) -> C {
    let mut lanes = [C::neg_infinity(); LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (l, x) in lanes.iter_mut().zip(chunk) {
            *x = *x * scale;
            *l = l.max(*x);
        }
    }
    let mut m = C::neg_infinity();
    for x in chunks.into_remainder() {
        *x = *x * scale;
        m = m.max(*x);
    }
    lanes.iter().fold(m, |a, &l| a.max(l))
}

/// Replaces each value of `row` by `e^(x − shift)` and returns their sum.
#[inline(always)]
fn exp_and_sum<C: Real>(row: &mut [C], shift: C) -> C {
    let mut lanes = [C::zero(); LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (l, x) in lanes.iter_mut().zip(chunk) {
            *x = (*x - shift).exp_();
            *l = *l + *x;
        }
    }
    let mut total = C::zero();
    for x in chunks.into_remainder() {
        *x = (*x - shift).exp_();
        total = total + *x;
    }
    lanes.iter().fold(total, |a, &l| a + l)
}

/// How many of keys `j0..j0 + len` query `i` sees: all of them, or under a causal mask
/// those up to `i`.
#[inline(always)]
fn visible(spec: &AttentionSpec, i: usize, j0: usize, len: usize) -> usize {
    if spec.causal {
        (i + 1).saturating_sub(j0).min(len)
    } else {
        len
    }
}

/// Runs [`Op::Attention`], [`Op::AttentionLse`] or [`Op::AttentionGrad`] on views whose
/// dims the op table has checked; the result is contiguous, in the op's dtype.
pub fn attention(op: &Op, inputs: &[(&CpuStorage, &Layout)]) -> Result<CpuStorage> {
    let n = sizes(op, |i| inputs[i].1.dims());
    // bf16 runs the planned path's kernel, so that eager and planned give the same bits.
    if let CpuStorage::BF16(_) = inputs[0].0 {
        return attention_bf16(op, inputs, n);
    }
    with_float_storage!(
        inputs[0].0,
        _v,
        T => run::<T>(op, inputs, n),
        Err(Error::dtype(op.name(), format!("attends over floats, not {}", inputs[0].0.dtype())))
    )
}

/// The sizes of the attention `op` over inputs of dims `dims(0)`, `dims(1)`, ….
fn sizes<'a>(op: &Op, dims: impl Fn(usize) -> &'a Dims) -> Sizes {
    let (q, k) = (dims(0), dims(1));
    let r = q.rank();
    let v_width = match op {
        Op::AttentionLse(_) => k[r - 1],
        _ => dims(2)[r - 1],
    };
    Sizes {
        batch: q.as_slice()[..r - 2].iter().product(),
        tq: q[r - 2],
        tk: k[r - 2],
        e: q[r - 1],
        ev: v_width,
    }
}

thread_local! {
    /// The forward pass's row log-sum-exp when only its output is asked for, kept
    /// between calls on this thread so that a training step's attention allocates
    /// nothing once warm.
    static DISCARDED_LSE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The tensors among `views` (queries, keys, values, the output's gradient) as `X`,
/// through `data`, and the statistics after them (a gradient's `lse` and `delta`) as
/// f32; `None` when a view holds another dtype.
#[allow(clippy::type_complexity)]
fn operands<'a, X: Copy>(
    views: &'a [View<'a, Cpu>],
    data: impl Fn(&'a CpuStorage) -> Option<&'a [X]>,
) -> Option<([Operand<'a, X>; 4], [Operand<'a, f32>; 2])> {
    if views.is_empty() || views.len() > 6 {
        return None;
    }
    let layout = &views[0].layout;
    let mut x = [Operand { data: &[], layout }; 4];
    let mut stats = [Operand { data: &[], layout }; 2];
    for (i, v) in views.iter().enumerate() {
        let layout = &v.layout;
        if i < 4 {
            x[i] = Operand {
                data: data(v.storage)?,
                layout,
            };
        } else {
            let CpuStorage::F32(d) = v.storage else {
                return None;
            };
            stats[i - 4] = Operand { data: d, layout };
        }
    }
    Some((x, stats))
}

/// The f32 data of a storage.
fn f32_data(s: &CpuStorage) -> Option<&[f32]> {
    match s {
        CpuStorage::F32(d) => Some(d),
        _ => None,
    }
}

/// Runs an attention op over f32 inputs into `out`, the f32 buffer of its contiguous
/// result (at least as long as the result), reading the inputs where they lie, so that
/// a training step's attention allocates nothing once warm. `false` (nothing written)
/// for other dtypes. The inputs' extents must have been checked.
pub fn attention_f32_into(op: &Op, views: &[View<'_, Cpu>], out: &mut [f32]) -> Result<bool> {
    let Some((x, stats)) = operands(views, f32_data) else {
        return Ok(false);
    };
    let n = sizes(op, |i| views[i].layout.dims());
    ops_into(&[op], &x, &stats, n, &mut [out])
}

/// Runs attention ops that one pass computes together, over f32 inputs, into `outs`
/// (each an f32 buffer at least as long as its op's contiguous result): an
/// [`Op::Attention`] followed by the [`Op::AttentionLse`] of its queries and keys (one
/// forward pass writes both), or [`Op::AttentionGrad`]s of one attention (one
/// backward pass writes them all). `views` are the inputs of the op that reads the
/// most (the attention, or any of the gradients). `false` (nothing written) when the
/// ops are not such a group or the inputs are not f32. The inputs' extents must have
/// been checked.
pub fn attention_group_f32_into(
    ops: &[&Op],
    views: &[View<'_, Cpu>],
    outs: &mut [&mut [f32]],
) -> Result<bool> {
    if !kiln_tensor::attention::one_pass(ops) || ops.len() != outs.len() {
        return Ok(false);
    }
    let Some((x, stats)) = operands(views, f32_data) else {
        return Ok(false);
    };
    let n = sizes(ops[0], |i| views[i].layout.dims());
    ops_into(ops, &x, &stats, n, outs)
}

/// Runs one attention op, or a group that one pass computes, over tensors of element
/// type `X` (f32, or bf16 read as the block products pack it) and f32 statistics into
/// f32 `outs` (one per op, each at least as long as its result); `false` (nothing
/// written) for ops it does not run.
fn ops_into<X: GemmInput>(
    ops: &[&Op],
    x: &[Operand<'_, X>; 4],
    stats: &[Operand<'_, f32>; 2],
    n: Sizes,
    outs: &mut [&mut [f32]],
) -> Result<bool> {
    match (ops, outs) {
        ([Op::Attention(spec)], [out]) => DISCARDED_LSE.with(|lse| {
            let mut lse = lse.borrow_mut();
            lse.clear();
            lse.resize(n.batch * n.tq, 0.0);
            let out = &mut out[..n.batch * n.tq * n.ev];
            forward_into::<f32, X>(x[0], x[1], Some(x[2]), n, spec, out, &mut lse);
        }),
        ([Op::AttentionLse(spec)], [lse]) => {
            if stats_dtype(DType::F32) != DType::F32 {
                return Ok(false);
            }
            let lse = &mut lse[..n.batch * n.tq];
            forward_into::<f32, X>(x[0], x[1], None, n, spec, &mut [], lse);
        }
        ([Op::Attention(spec), Op::AttentionLse(_)], [out, lse]) => {
            let out = &mut out[..n.batch * n.tq * n.ev];
            let lse = &mut lse[..n.batch * n.tq];
            forward_into::<f32, X>(x[0], x[1], Some(x[2]), n, spec, out, lse);
        }
        (ops, outs) => {
            let mut grads = GradOutputs::default();
            let mut spec = None;
            for (op, out) in ops.iter().zip(outs.iter_mut()) {
                let Op::AttentionGrad { spec: s, wrt } = op else {
                    return Ok(false);
                };
                spec = Some(*s);
                *grads.of(*wrt) = Some(&mut out[..n.batch * n.rows(*wrt) * n.width(*wrt)]);
            }
            let Some(spec) = spec else {
                return Ok(false);
            };
            grads_into::<f32, X>(&GradInputs::of(x, stats), n, &spec, grads);
        }
    }
    Ok(true)
}

/// The length of `op`'s contiguous result over sizes `n`.
fn result_len(op: &Op, n: Sizes) -> usize {
    match op {
        Op::AttentionLse(_) => n.batch * n.tq,
        Op::AttentionGrad { wrt, .. } => n.batch * n.rows(*wrt) * n.width(*wrt),
        _ => n.batch * n.tq * n.ev,
    }
}

/// This thread's f32 results of attention over bf16, before rounding.
#[derive(Default)]
struct UnroundedResults([Vec<f32>; 3]);

thread_local! {
    static UNROUNDED: RefCell<UnroundedResults> = RefCell::new(UnroundedResults::default());
}

/// The bf16 data of a storage.
fn bf16_data(s: &CpuStorage) -> Option<&[bf16]> {
    match s {
        CpuStorage::BF16(d) => Some(d),
        _ => None,
    }
}

/// Runs one attention op, or a group [`attention_group_f32_into`] takes, over bf16
/// inputs into `outs` (bf16 results, f32 statistics, each at least as long as its
/// result): the kernels read the bf16 tensors where they lie (permuted heads in
/// place), their block products packing bf16 pairs for the CPU's bf16 dot-product
/// instructions where it has them (scores, `g·vᵀ`) or widening them (a computed block
/// times an input), and compute in f32 into this thread's buffers; each result is then
/// rounded to its dtype. So a bf16 training step's attention runs in one pass and
/// allocates nothing once warm, and [`attention`] gives the same bits (it runs this).
/// `false` (nothing written) for other dtypes, ops or outputs. The inputs' extents
/// must have been checked.
pub fn attention_bf16_into(
    ops: &[&Op],
    views: &[View<'_, Cpu>],
    outs: &mut [&mut CpuStorage],
) -> Result<bool> {
    let grouped = ops.len() == 1 || kiln_tensor::attention::one_pass(ops);
    let attends = ops.iter().all(|op| {
        let reads = match op {
            Op::Attention(_) => 3,
            Op::AttentionLse(_) => 2,
            Op::AttentionGrad { .. } => 6,
            _ => return false,
        };
        views.len() >= reads
    });
    if !grouped || !attends || ops.len() != outs.len() || ops.len() > 3 || views.len() > 6 {
        return Ok(false);
    }
    // bf16 tensors, and a gradient's statistics (`lse`, `delta`) in f32.
    let Some((x, stats)) = operands(views, bf16_data) else {
        return Ok(false);
    };
    let n = sizes(ops[0], |i| views[i].layout.dims());
    let stats_type = stats_dtype(DType::BF16);
    let fits = ops.iter().zip(outs.iter()).all(|(op, out)| {
        let len = result_len(op, n);
        match (op, &**out) {
            (Op::AttentionLse(_), CpuStorage::F32(o)) => stats_type == DType::F32 && o.len() >= len,
            (Op::AttentionLse(_), _) => false,
            (_, CpuStorage::BF16(o)) => o.len() >= len,
            _ => false,
        }
    });
    if !fits {
        return Ok(false);
    }
    UNROUNDED.with(|w| {
        let Ok(mut w) = w.try_borrow_mut() else {
            return Ok(false);
        };
        let [r0, r1, r2] = &mut w.0;
        let mut slices: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
        // The kernels write every element of their results: grow, never clear.
        for ((slice, r), op) in slices.iter_mut().zip([r0, r1, r2]).zip(ops) {
            let len = result_len(op, n);
            if r.len() < len {
                r.resize(len, 0.0);
            }
            *slice = &mut r[..len];
        }
        if !ops_into(ops, &x, &stats, n, &mut slices[..ops.len()])? {
            return Ok(false);
        }
        for ((slice, op), out) in slices.iter().zip(ops).zip(outs.iter_mut()) {
            let len = result_len(op, n);
            match &mut **out {
                CpuStorage::F32(o) => o[..len].copy_from_slice(&slice[..len]),
                CpuStorage::BF16(o) => simd::wide(
                    #[inline(always)]
                    || {
                        for (d, &v) in o[..len].iter_mut().zip(&slice[..len]) {
                            *d = bf16::from_f32(v);
                        }
                    },
                ),
                _ => unreachable!("the outputs were checked to fit"),
            }
        }
        Ok(true)
    })
}

/// [`attention`] over bf16 inputs: [`attention_bf16_into`] into fresh storage.
fn attention_bf16(op: &Op, inputs: &[(&CpuStorage, &Layout)], n: Sizes) -> Result<CpuStorage> {
    let views: Vec<View<'_, Cpu>> = inputs
        .iter()
        .map(|&(storage, layout)| View {
            storage,
            layout: *layout,
        })
        .collect();
    let len = result_len(op, n);
    let mut out = match (op, stats_dtype(DType::BF16)) {
        (Op::AttentionLse(_), DType::F32) => <f32 as CpuElement>::wrap(vec![0.0; len]),
        _ => <bf16 as CpuElement>::wrap(vec![bf16::ZERO; len]),
    };
    if !attention_bf16_into(&[op], &views, &mut [&mut out])? {
        return Err(Error::invalid(
            op.name(),
            "bf16 attention takes bf16 tensors and f32 statistics",
        ));
    }
    Ok(out)
}

/// A view's elements in row-major order, in the compute type `C`.
fn load<C: Real>(view: (&CpuStorage, &Layout)) -> Vec<C> {
    with_float_storage!(
        view.0,
        v,
        _T => gather(v, view.1)
            .iter()
            .map(|&x| C::from_f64_(Element::to_f64(x)))
            .collect(),
        unreachable!("the shape rule admits floats only")
    )
}

/// Rounds compute-type values into a buffer of `T`'s dtype.
fn store<T: FloatKernel>(values: Vec<T::C>) -> Vec<T> {
    values.into_iter().map(T::store).collect()
}

fn run<T: FloatKernel>(op: &Op, inputs: &[(&CpuStorage, &Layout)], n: Sizes) -> Result<CpuStorage>
where
    T::C: BlockProducts<T::C> + Sync,
{
    // Widened into contiguous buffers, which the kernels then read in place.
    let values: Vec<Vec<T::C>> = inputs.iter().map(|&v| load::<T::C>(v)).collect();
    let layouts: Vec<Layout> = inputs
        .iter()
        .map(|(_, l)| Layout::contiguous(*l.dims()))
        .collect();
    let x: Vec<Operand<'_, T::C>> = values
        .iter()
        .zip(&layouts)
        .map(|(data, layout)| Operand { data, layout })
        .collect();
    Ok(match op {
        Op::Attention(spec) => {
            let mut out = vec![T::C::zero(); n.batch * n.tq * n.ev];
            let mut lse = vec![T::C::zero(); n.batch * n.tq];
            forward_into(x[0], x[1], Some(x[2]), n, spec, &mut out, &mut lse);
            T::wrap(store::<T>(out))
        }
        Op::AttentionLse(spec) => {
            let mut lse = vec![T::C::zero(); n.batch * n.tq];
            forward_into(x[0], x[1], None, n, spec, &mut [], &mut lse);
            let values: Vec<f64> = lse.iter().map(|c| c.to_f64().unwrap_or(f64::NAN)).collect();
            CpuStorage::from_host(HostData::from_f64_slice(
                stats_dtype(inputs[0].0.dtype()),
                &values,
            ))
        }
        Op::AttentionGrad { spec, wrt } => {
            let mut grad = vec![T::C::zero(); n.batch * n.rows(*wrt) * n.width(*wrt)];
            let mut outs = GradOutputs::default();
            *outs.of(*wrt) = Some(&mut grad);
            let (tensors, stats) = ([x[0], x[1], x[2], x[3]], [x[4], x[5]]);
            grads_into(&GradInputs::of(&tensors, &stats), n, spec, outs);
            T::wrap(store::<T>(grad))
        }
        other => unreachable!("{} is not an attention op", other.name()),
    })
}

/// The blocks of `0..len` in steps of `step`.
fn blocks(len: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(step.max(1))
        .map(move |s| (s, (s + step).min(len)))
}

/// Row-major `rows × cols` block of `data`, transposed when `t`.
fn block<C>(data: &[C], cols: usize, t: bool) -> MatRef<'_, C> {
    let m = MatRef::row_major(data, cols);
    if t {
        m.t()
    } else {
        m
    }
}

/// `out`'s first `per · count` values cut into `count` consecutive pieces of `per`
/// (none each when `out` is absent), without collecting them.
fn pieces<C: Send>(
    out: Option<&mut [C]>,
    per: usize,
    count: usize,
) -> impl IndexedParallelIterator<Item = Option<&mut [C]>> {
    match out {
        Some(out) if per > 0 => Either::Left(out[..per * count].par_chunks_mut(per).map(Some)),
        out => {
            let present = out.is_some();
            Either::Right(
                rayon::iter::repeat_n((), count).map(move |_| present.then_some(&mut [][..])),
            )
        }
    }
}

/// One thread's block buffers, kept between the batch elements and the calls it runs
/// ([`BlockGemm::with_scratch`]): a block's probabilities, their dropout factors and
/// the weights they leave, the probabilities' gradient, the output accumulator, and
/// each query row's running maximum and sum. Every use overwrites what it reads.
struct BlockScratch<C> {
    p: Vec<C>,
    z: Vec<C>,
    pz: Vec<C>,
    ds: Vec<C>,
    acc: Vec<C>,
    max: Vec<C>,
    sum: Vec<C>,
}

impl<C: Real> BlockScratch<C> {
    const fn empty() -> Self {
        BlockScratch {
            p: Vec::new(),
            z: Vec::new(),
            pz: Vec::new(),
            ds: Vec::new(),
            acc: Vec::new(),
            max: Vec::new(),
            sum: Vec::new(),
        }
    }

    /// Grows the buffers to what attention of sizes `n` uses.
    fn fit(&mut self, n: Sizes) {
        let block = QUERY_BLOCK * KEY_BLOCK;
        for (buf, len) in [
            (&mut self.p, block),
            (&mut self.z, block),
            (&mut self.pz, block),
            (&mut self.ds, block),
            (&mut self.acc, QUERY_BLOCK * n.ev),
            (&mut self.max, QUERY_BLOCK),
            (&mut self.sum, QUERY_BLOCK),
        ] {
            if buf.len() < len {
                buf.resize(len, C::zero());
            }
        }
    }
}

thread_local! {
    /// Each thread's f32 block buffers ([`BlockScratch`]).
    static F32_BLOCKS: RefCell<BlockScratch<f32>> = const { RefCell::new(BlockScratch::empty()) };
}

/// The forward pass into `out` (`batch · tq · ev` values when `v` is given, else
/// none) and `lse` (`batch · tq`), every value written.
fn forward_into<C: BlockProducts<X>, X: Copy + Sync>(
    q: Operand<'_, X>,
    k: Operand<'_, X>,
    v: Option<Operand<'_, X>>,
    n: Sizes,
    spec: &AttentionSpec,
    out: &mut [C],
    lse: &mut [C],
) {
    let outs = pieces(v.map(|_| out), n.tq * n.ev, n.batch);
    let lses = pieces(Some(lse), n.tq, n.batch);
    outs.zip(lses).enumerate().for_each(|(b, (out, lse))| {
        let lse = lse.expect("every batch element has its statistics");
        C::with_scratch(n, |sc| {
            forward_one(q, k, v, n, spec, b, out.unwrap_or_default(), lse, sc)
        });
    });
}

/// The forward pass of batch element `b`.
#[allow(clippy::too_many_arguments)]
fn forward_one<C: BlockProducts<X>, X: Copy>(
    q: Operand<'_, X>,
    k: Operand<'_, X>,
    v: Option<Operand<'_, X>>,
    n: Sizes,
    spec: &AttentionSpec,
    b: usize,
    out: &mut [C],
    lse: &mut [C],
    sc: &mut BlockScratch<C>,
) {
    // The log-sum-exp alone needs no draws.
    let dropout = Dropout::<C>::of(spec).filter(|_| v.is_some());
    let scale = C::from_f64_(spec.scale);
    let BlockScratch {
        p: s,
        z,
        acc,
        max,
        sum,
        ..
    } = sc;
    for (i0, i1) in blocks(n.tq, QUERY_BLOCK) {
        let bi = i1 - i0;
        max[..bi].fill(C::neg_infinity());
        sum[..bi].fill(C::zero());
        acc[..bi * n.ev].fill(C::zero());
        let keys = if spec.causal { i1.min(n.tk) } else { n.tk };
        for (j0, j1) in blocks(keys, KEY_BLOCK) {
            let bj = j1 - j0;
            let s = &mut s[..bi * bj];
            C::gemm_inputs(bi, bj, n.e, q.rows(b, i0), k.rows(b, j0).t(), s, false);
            simd::wide(
                #[inline(always)]
                || {
                    for r in 0..bi {
                        let row = &mut s[r * bj..(r + 1) * bj];
                        let (live, masked) = row.split_at_mut(visible(spec, i0 + r, j0, bj));
                        masked.fill(C::zero());
                        let m = scale_and_max(live, scale).max(max[r]);
                        if m == C::neg_infinity() {
                            // Every key so far masked or at −∞: nothing to add.
                            live.fill(C::zero());
                            continue;
                        }
                        let alpha = if max[r] == C::neg_infinity() {
                            C::zero()
                        } else {
                            (max[r] - m).exp_()
                        };
                        sum[r] = sum[r] * alpha + exp_and_sum(live, m);
                        max[r] = m;
                        for a in &mut acc[r * n.ev..(r + 1) * n.ev] {
                            *a = *a * alpha;
                        }
                    }
                },
            );
            let Some(v) = v else {
                continue;
            };
            if let Some(d) = &dropout {
                let z = &mut z[..bi * bj];
                for r in 0..bi {
                    d.factors(&mut z[r * bj..(r + 1) * bj], n, b, i0 + r, j0);
                }
                simd::wide(
                    #[inline(always)]
                    || apply_factors(s, z),
                );
            }
            let p = block(s, bj, false);
            C::gemm_block(bi, n.ev, bj, p, v.rows(b, j0), &mut acc[..bi * n.ev], true);
        }
        for r in 0..bi {
            let i = i0 + r;
            let seen = sum[r] > C::zero();
            lse[i] = if seen {
                max[r] + sum[r].ln()
            } else {
                C::neg_infinity()
            };
            if v.is_some() {
                for c in 0..n.ev {
                    out[i * n.ev + c] = if seen {
                        acc[r * n.ev + c] / sum[r]
                    } else {
                        C::zero()
                    };
                }
            }
        }
    }
}

/// What the backward pass reads: the forward pass's inputs, the output's gradient `g`,
/// and each query's log-sum-exp and `delta` (rows of width 1).
struct GradInputs<'a, C, X> {
    q: Operand<'a, X>,
    k: Operand<'a, X>,
    v: Operand<'a, X>,
    g: Operand<'a, X>,
    lse: Operand<'a, C>,
    delta: Operand<'a, C>,
}

impl<'a, C: Copy, X: Copy> GradInputs<'a, C, X> {
    /// The gradient ops' inputs, in their order: the four tensors, then the two
    /// statistics.
    fn of(x: &[Operand<'a, X>; 4], stats: &[Operand<'a, C>; 2]) -> Self {
        GradInputs {
            q: x[0],
            k: x[1],
            v: x[2],
            g: x[3],
            lse: stats[0],
            delta: stats[1],
        }
    }
}

/// The gradients a backward pass writes (`batch` matrices after one another, each
/// overwritten), any of them absent.
struct GradOutputs<'a, C> {
    q: Option<&'a mut [C]>,
    k: Option<&'a mut [C]>,
    v: Option<&'a mut [C]>,
}

impl<C> Default for GradOutputs<'_, C> {
    fn default() -> Self {
        GradOutputs {
            q: None,
            k: None,
            v: None,
        }
    }
}

impl<'a, C> GradOutputs<'a, C> {
    /// The place of the gradient with respect to `wrt`.
    fn of(&mut self, wrt: AttentionInput) -> &mut Option<&'a mut [C]> {
        match wrt {
            AttentionInput::Query => &mut self.q,
            AttentionInput::Key => &mut self.k,
            AttentionInput::Value => &mut self.v,
        }
    }
}

impl Sizes {
    /// The rows of the gradient with respect to `wrt`: one per query or per key.
    fn rows(&self, wrt: AttentionInput) -> usize {
        match wrt {
            AttentionInput::Query => self.tq,
            AttentionInput::Key | AttentionInput::Value => self.tk,
        }
    }

    /// The width of the gradient with respect to `wrt`.
    fn width(&self, wrt: AttentionInput) -> usize {
        match wrt {
            AttentionInput::Query | AttentionInput::Key => self.e,
            AttentionInput::Value => self.ev,
        }
    }
}

/// The backward pass: the asked-for gradients `dq = scale · Σ_j ds_ij k_j`,
/// `dk = scale · Σ_i ds_ij q_i` and `dv = Σ_i p_ij z_ij g_i`, each batch element's key
/// blocks against the query blocks that see them.
fn grads_into<C: BlockProducts<X>, X: Copy + Sync>(
    x: &GradInputs<'_, C, X>,
    n: Sizes,
    spec: &AttentionSpec,
    outs: GradOutputs<'_, C>,
) {
    let dq = pieces(outs.q, n.tq * n.e, n.batch);
    let dk = pieces(outs.k, n.tk * n.e, n.batch);
    let dv = pieces(outs.v, n.tk * n.ev, n.batch);
    dq.zip(dk).zip(dv).enumerate().for_each(|(b, ((q, k), v))| {
        C::with_scratch(n, |sc| {
            grads_one(x, n, spec, b, GradOutputs { q, k, v }, sc)
        });
    });
}

/// The backward pass of batch element `b`.
fn grads_one<C: BlockProducts<X>, X: Copy>(
    x: &GradInputs<'_, C, X>,
    n: Sizes,
    spec: &AttentionSpec,
    b: usize,
    mut outs: GradOutputs<'_, C>,
    sc: &mut BlockScratch<C>,
) {
    for out in [&mut outs.q, &mut outs.k, &mut outs.v]
        .into_iter()
        .flatten()
    {
        out.fill(C::zero());
    }
    let wants_ds = outs.q.is_some() || outs.k.is_some();
    let dropout = Dropout::<C>::of(spec);
    let scale = C::from_f64_(spec.scale);
    let (lse, delta) = (x.lse.rows(b, 0), x.delta.rows(b, 0));
    let BlockScratch { p, z, pz, ds, .. } = sc;
    for (j0, j1) in blocks(n.tk, KEY_BLOCK) {
        let first_query = if spec.causal { j0 } else { 0 };
        for (i0, i1) in blocks(n.tq, QUERY_BLOCK).filter(|&(_, i1)| i1 > first_query) {
            let bi = i1 - i0;
            // Under a causal mask this block's queries see none of the keys past the
            // last query: their probabilities are 0 and every product skips them.
            let bj = visible(spec, i1 - 1, j0, j1 - j0);
            // The probabilities, recomputed from the saved log-sum-exp.
            let p = &mut p[..bi * bj];
            C::gemm_inputs(bi, bj, n.e, x.q.rows(b, i0), x.k.rows(b, j0).t(), p, false);
            simd::wide(
                #[inline(always)]
                || {
                    for r in 0..bi {
                        let row = &mut p[r * bj..(r + 1) * bj];
                        let (live, masked) = row.split_at_mut(visible(spec, i0 + r, j0, bj));
                        masked.fill(C::zero());
                        let l = lse.at(i0 + r, 0);
                        if l == C::neg_infinity() {
                            live.fill(C::zero());
                            continue;
                        }
                        for e in live.iter_mut() {
                            *e = (*e * scale - l).exp_();
                        }
                    }
                },
            );
            // The weights the output summed: the probabilities times their factors.
            let weights: &[C] = match &dropout {
                Some(d) => {
                    let z = &mut z[..bi * bj];
                    for r in 0..bi {
                        d.factors(&mut z[r * bj..(r + 1) * bj], n, b, i0 + r, j0);
                    }
                    let pz = &mut pz[..bi * bj];
                    pz.copy_from_slice(p);
                    simd::wide(
                        #[inline(always)]
                        || apply_factors(pz, z),
                    );
                    pz
                }
                None => p,
            };
            if let Some(dv) = outs.v.as_deref_mut() {
                let target = &mut dv[j0 * n.ev..(j0 + bj) * n.ev];
                let wt = block(weights, bj, true);
                C::gemm_block(bj, n.ev, bi, wt, x.g.rows(b, i0), target, true);
            }
            if !wants_ds {
                continue;
            }
            // ds = p · (z · g·vᵀ − delta)
            let ds = &mut ds[..bi * bj];
            C::gemm_inputs(
                bi,
                bj,
                n.ev,
                x.g.rows(b, i0),
                x.v.rows(b, j0).t(),
                ds,
                false,
            );
            if dropout.is_some() {
                simd::wide(
                    #[inline(always)]
                    || apply_factors(ds, &z[..bi * bj]),
                );
            }
            simd::wide(
                #[inline(always)]
                || {
                    for r in 0..bi {
                        let d = delta.at(i0 + r, 0);
                        let (ds, p) = (&mut ds[r * bj..(r + 1) * bj], &p[r * bj..(r + 1) * bj]);
                        for (g, &p) in ds.iter_mut().zip(p) {
                            *g = p * (*g - d);
                        }
                    }
                },
            );
            if let Some(dk) = outs.k.as_deref_mut() {
                let target = &mut dk[j0 * n.e..(j0 + bj) * n.e];
                C::gemm_block(
                    bj,
                    n.e,
                    bi,
                    block(ds, bj, true),
                    x.q.rows(b, i0),
                    target,
                    true,
                );
            }
            if let Some(dq) = outs.q.as_deref_mut() {
                let target = &mut dq[i0 * n.e..i1 * n.e];
                C::gemm_block(
                    bi,
                    n.e,
                    bj,
                    block(ds, bj, false),
                    x.k.rows(b, j0),
                    target,
                    true,
                );
            }
        }
    }
    for out in [&mut outs.q, &mut outs.k].into_iter().flatten() {
        simd::wide(
            #[inline(always)]
            || out.iter_mut().for_each(|d| *d = *d * scale),
        );
    }
}
