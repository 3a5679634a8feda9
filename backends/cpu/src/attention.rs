//! Attention on the CPU without the `Tq×Tk` scores in memory: each batch element's
//! queries in blocks of `QUERY_BLOCK` rows against keys in blocks of `KEY_BLOCK`, the
//! scores of one block pair at a time (a GEMM), an online softmax carrying each row's
//! maximum and sum across key blocks (the forward pass), and the backward pass
//! recomputing each block's probabilities from the saved row log-sum-exp. Causal
//! attention skips the key blocks above the diagonal. Batch elements run on rayon's
//! threads, each block product on one. Dropout on the weights multiplies each block's
//! probabilities by their factors, drawn from the weights' counters as the op defines
//! them. The math is `kiln_tensor::attention`'s; f16 and bf16 compute in f32, f64 in
//! f64.

use crate::gemm::{dgemm_with, sgemm_with, GemmOptions, MatRef};
use crate::math::Real;
use crate::storage::{with_float_storage, CpuStorage, FloatKernel};
use crate::strided::{gather, gather_into};
use crate::Cpu;
use kiln_tensor::attention::{dropout_counter, stats_dtype};
use kiln_tensor::simd;
use kiln_tensor::{
    rng, AttentionInput, AttentionSpec, DType, Element, Error, HostData, Layout, Op, Result, View,
};
use num_traits::ToPrimitive;
use rayon::prelude::*;
use std::cell::RefCell;

/// Query rows per block.
const QUERY_BLOCK: usize = 32;
/// Key rows per block.
const KEY_BLOCK: usize = 64;

/// The compute types' block product on one thread: `c (m×n) (+)= a (m×k) · b (k×n)`.
trait BlockGemm: Real {
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<Self>,
        b: MatRef<Self>,
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
    fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<f32>,
        b: MatRef<f32>,
        c: &mut [f32],
        acc: bool,
    ) {
        sgemm_with(&one_thread(), m, n, k, a, b, c, acc)
    }
}

impl BlockGemm for f64 {
    fn gemm(
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

    /// Multiplies `row`, the weights of batch element `b`'s query `i` against keys
    /// `j0..`, by their factors.
    fn apply(&self, row: &mut [C], n: Sizes, b: usize, i: usize, j0: usize) {
        for (c, x) in row.iter_mut().enumerate() {
            let counter = dropout_counter(b, i, j0 + c, n.tq, n.tk);
            *x = if rng::bits(self.key, counter) >> 8 >= self.threshold {
                *x * self.keep
            } else {
                C::zero()
            };
        }
    }
}

/// Runs [`Op::Attention`], [`Op::AttentionLse`] or [`Op::AttentionGrad`] on views whose
/// dims the op table has checked; the result is contiguous, in the op's dtype.
pub fn attention(op: &Op, inputs: &[(&CpuStorage, &Layout)]) -> Result<CpuStorage> {
    let n = sizes(op, inputs);
    with_float_storage!(
        inputs[0].0,
        _v,
        T => run::<T>(op, inputs, n),
        Err(Error::dtype(op.name(), format!("attends over floats, not {}", inputs[0].0.dtype())))
    )
}

/// The sizes of the attention `op` over `inputs`.
fn sizes(op: &Op, inputs: &[(&CpuStorage, &Layout)]) -> Sizes {
    let dims = |i: usize| inputs[i].1.dims();
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
    /// Buffers the f32 path gathers strided inputs (and the forward pass's discarded
    /// log-sum-exp) into, kept between calls on this thread: a training step's
    /// attention reads its permuted heads without allocating once they have grown.
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Runs an attention op over f32 inputs into `out`, the f32 buffer of its contiguous
/// result (at least as long as the result): reads contiguous inputs in place and
/// gathers strided ones into buffers kept between calls, so that a training step's
/// attention allocates nothing once warm. `false` (nothing written) for other dtypes.
/// The inputs' extents must have been checked.
pub fn attention_f32_into(op: &Op, views: &[View<'_, Cpu>], out: &mut [f32]) -> Result<bool> {
    let mut data: [&[f32]; 6] = [&[]; 6];
    if views.is_empty() || views.len() > data.len() {
        return Ok(false);
    }
    let mut inputs: [(&CpuStorage, &Layout); 6] = [(views[0].storage, &views[0].layout); 6];
    for ((slot, input), v) in data.iter_mut().zip(&mut inputs).zip(views) {
        let CpuStorage::F32(d) = v.storage else {
            return Ok(false);
        };
        *slot = d;
        *input = (v.storage, &v.layout);
    }
    let inputs = &inputs[..views.len()];
    let n = sizes(op, inputs);
    let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    scratch.resize_with(inputs.len() + 1, Vec::new);
    for (buf, (&d, (_, layout))) in scratch.iter_mut().zip(data.iter().zip(inputs)) {
        if !layout.is_contiguous() {
            buf.clear();
            gather_into(d, layout, buf);
        }
    }
    let (bufs, extra) = scratch.split_at_mut(inputs.len());
    let mut ins: [&[f32]; 6] = [&[]; 6];
    for ((slot, &d), (buf, (_, layout))) in ins.iter_mut().zip(&data).zip(bufs.iter().zip(inputs)) {
        *slot = if layout.is_contiguous() {
            &d[layout.offset()..layout.offset() + layout.numel()]
        } else {
            buf
        };
    }
    match op {
        Op::Attention(spec) => {
            let lse = &mut extra[0];
            lse.clear();
            lse.resize(n.batch * n.tq, 0.0);
            forward_into(
                ins[0],
                ins[1],
                Some(ins[2]),
                n,
                spec,
                &mut out[..n.batch * n.tq * n.ev],
                lse,
            );
        }
        Op::AttentionLse(spec) if stats_dtype(DType::F32) == DType::F32 => {
            forward_into(
                ins[0],
                ins[1],
                None,
                n,
                spec,
                &mut [],
                &mut out[..n.batch * n.tq],
            );
        }
        Op::AttentionGrad { spec, wrt } => {
            let grads = GradInputs {
                q: ins[0],
                k: ins[1],
                v: ins[2],
                g: ins[3],
                lse: ins[4],
                delta: ins[5],
            };
            match wrt {
                AttentionInput::Query => {
                    grad_q_into(&grads, n, spec, &mut out[..n.batch * n.tq * n.e])
                }
                AttentionInput::Key => {
                    grad_kv_into(&grads, n, spec, *wrt, &mut out[..n.batch * n.tk * n.e])
                }
                AttentionInput::Value => {
                    grad_kv_into(&grads, n, spec, *wrt, &mut out[..n.batch * n.tk * n.ev])
                }
            }
        }
        _ => {
            SCRATCH.with(|s| *s.borrow_mut() = scratch);
            return Ok(false);
        }
    }
    SCRATCH.with(|s| *s.borrow_mut() = scratch);
    Ok(true)
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
    T::C: BlockGemm,
{
    let (q, k) = (load::<T::C>(inputs[0]), load::<T::C>(inputs[1]));
    Ok(match op {
        Op::Attention(spec) => {
            let v = load::<T::C>(inputs[2]);
            let (out, _) = forward(&q, &k, Some(&v), n, spec);
            T::wrap(store::<T>(out))
        }
        Op::AttentionLse(spec) => {
            let (_, lse) = forward(&q, &k, None, n, spec);
            let values: Vec<f64> = lse.iter().map(|c| c.to_f64().unwrap_or(f64::NAN)).collect();
            CpuStorage::from_host(HostData::from_f64_slice(
                stats_dtype(inputs[0].0.dtype()),
                &values,
            ))
        }
        Op::AttentionGrad { spec, wrt } => {
            let v = load::<T::C>(inputs[2]);
            let g = load::<T::C>(inputs[3]);
            let (lse, delta) = (load::<T::C>(inputs[4]), load::<T::C>(inputs[5]));
            let ins = GradInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                lse: &lse,
                delta: &delta,
            };
            let grad = match wrt {
                AttentionInput::Query => grad_q(&ins, n, spec),
                AttentionInput::Key | AttentionInput::Value => grad_kv(&ins, n, spec, *wrt),
            };
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

/// Row-major `rows × cols` starting at row `first` of a batch element's matrix.
fn rows<C>(data: &[C], first: usize, cols: usize) -> MatRef<'_, C> {
    MatRef {
        data,
        offset: first * cols,
        row_stride: cols,
        col_stride: 1,
    }
}

/// The scaled scores of queries `i0..i1` against keys `j0..j1` into `s` (row-major,
/// `j1 - j0` wide), masked to −∞ above the diagonal when causal.
#[allow(clippy::too_many_arguments)]
fn block_scores<C: BlockGemm>(
    q: &[C],
    k: &[C],
    n: Sizes,
    spec: &AttentionSpec,
    (i0, i1): (usize, usize),
    (j0, j1): (usize, usize),
    s: &mut [C],
) {
    let (bi, bj) = (i1 - i0, j1 - j0);
    let s = &mut s[..bi * bj];
    C::gemm(
        bi,
        bj,
        n.e,
        rows(q, i0, n.e),
        rows(k, j0, n.e).t(),
        s,
        false,
    );
    let scale = C::from_f64_(spec.scale);
    simd::wide(|| {
        for (r, row) in s.chunks_mut(bj.max(1)).enumerate().take(bi) {
            for (c, x) in row.iter_mut().enumerate() {
                *x = if spec.causal && j0 + c > i0 + r {
                    C::neg_infinity()
                } else {
                    *x * scale
                };
            }
        }
    });
}

/// One thread's block buffers, reused across the batch elements it runs (rayon's
/// `for_each_init`): a block's scores or probabilities and their gradients, the
/// output accumulator, and each query row's running maximum and sum. Every use
/// overwrites what it reads.
struct BlockScratch<C> {
    p: Vec<C>,
    ds: Vec<C>,
    acc: Vec<C>,
    max: Vec<C>,
    sum: Vec<C>,
}

impl<C: Real> BlockScratch<C> {
    fn new(n: Sizes) -> Self {
        BlockScratch {
            p: vec![C::zero(); QUERY_BLOCK * KEY_BLOCK],
            ds: vec![C::zero(); QUERY_BLOCK * KEY_BLOCK],
            acc: vec![C::zero(); QUERY_BLOCK * n.ev],
            max: vec![C::zero(); QUERY_BLOCK],
            sum: vec![C::zero(); QUERY_BLOCK],
        }
    }
}

/// The forward pass: the output (when `v` is given) and each query's log-sum-exp.
fn forward<C: BlockGemm>(
    q: &[C],
    k: &[C],
    v: Option<&[C]>,
    n: Sizes,
    spec: &AttentionSpec,
) -> (Vec<C>, Vec<C>) {
    let mut out = vec![
        C::zero();
        if v.is_some() {
            n.batch * n.tq * n.ev
        } else {
            0
        }
    ];
    let mut lse = vec![C::zero(); n.batch * n.tq];
    forward_into(q, k, v, n, spec, &mut out, &mut lse);
    (out, lse)
}

/// The forward pass into `out` (`batch · tq · ev` values when `v` is given, else
/// none) and `lse` (`batch · tq`), every value written.
fn forward_into<C: BlockGemm>(
    q: &[C],
    k: &[C],
    v: Option<&[C]>,
    n: Sizes,
    spec: &AttentionSpec,
    out: &mut [C],
    lse: &mut [C],
) {
    let out_rows = (n.tq * n.ev).max(1);
    let lse_rows = lse.par_chunks_mut(n.tq.max(1));
    let each = |sc: &mut BlockScratch<C>, b: usize, out_b: &mut [C], lse_b: &mut [C]| {
        let qb = &q[b * n.tq * n.e..(b + 1) * n.tq * n.e];
        let kb = &k[b * n.tk * n.e..(b + 1) * n.tk * n.e];
        let vb = v.map(|v| &v[b * n.tk * n.ev..(b + 1) * n.tk * n.ev]);
        forward_one(qb, kb, vb, n, spec, b, out_b, lse_b, sc);
    };
    let scratch = || BlockScratch::new(n);
    if v.is_some() {
        out.par_chunks_mut(out_rows)
            .zip(lse_rows)
            .enumerate()
            .for_each_init(scratch, |sc, (b, (out_b, lse_b))| each(sc, b, out_b, lse_b));
    } else {
        lse_rows
            .enumerate()
            .for_each_init(scratch, |sc, (b, lse_b)| each(sc, b, &mut [], lse_b));
    }
}

/// The forward pass of batch element `b`.
#[allow(clippy::too_many_arguments)]
fn forward_one<C: BlockGemm>(
    q: &[C],
    k: &[C],
    v: Option<&[C]>,
    n: Sizes,
    spec: &AttentionSpec,
    b: usize,
    out: &mut [C],
    lse: &mut [C],
    scratch: &mut BlockScratch<C>,
) {
    // The log-sum-exp alone needs no draws.
    let dropout = Dropout::<C>::of(spec).filter(|_| v.is_some());
    let (s, acc, max, sum) = (
        &mut scratch.p,
        &mut scratch.acc,
        &mut scratch.max,
        &mut scratch.sum,
    );
    for (i0, i1) in blocks(n.tq, QUERY_BLOCK) {
        let bi = i1 - i0;
        max[..bi].fill(C::neg_infinity());
        sum[..bi].fill(C::zero());
        acc[..bi * n.ev].fill(C::zero());
        let keys = if spec.causal { i1.min(n.tk) } else { n.tk };
        for (j0, j1) in blocks(keys, KEY_BLOCK) {
            let bj = j1 - j0;
            block_scores(q, k, n, spec, (i0, i1), (j0, j1), s);
            for r in 0..bi {
                let row = &mut s[r * bj..(r + 1) * bj];
                let m = row.iter().fold(max[r], |a, &x| a.max(x));
                if m == C::neg_infinity() {
                    // Every key so far masked: nothing to add.
                    row.fill(C::zero());
                    continue;
                }
                let alpha = if max[r] == C::neg_infinity() {
                    C::zero()
                } else {
                    (max[r] - m).exp_()
                };
                // The exponentials in a loop of their own, so that it vectorises; the
                // sum stays in order.
                simd::wide(|| {
                    for x in row.iter_mut() {
                        *x = if *x == C::neg_infinity() {
                            C::zero()
                        } else {
                            (*x - m).exp_()
                        };
                    }
                });
                let total = row.iter().fold(C::zero(), |t, &x| t + x);
                sum[r] = sum[r] * alpha + total;
                max[r] = m;
                if let Some(d) = &dropout {
                    d.apply(row, n, b, i0 + r, j0);
                }
                for a in &mut acc[r * n.ev..(r + 1) * n.ev] {
                    *a = *a * alpha;
                }
            }
            if let Some(v) = v {
                let p = MatRef {
                    data: &s[..],
                    offset: 0,
                    row_stride: bj,
                    col_stride: 1,
                };
                C::gemm(
                    bi,
                    n.ev,
                    bj,
                    p,
                    rows(v, j0, n.ev),
                    &mut acc[..bi * n.ev],
                    true,
                );
            }
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

/// What the backward pass reads, each batch element's rows after one another.
struct GradInputs<'a, C> {
    q: &'a [C],
    k: &'a [C],
    v: &'a [C],
    g: &'a [C],
    lse: &'a [C],
    delta: &'a [C],
}

/// One batch element's slice of each input.
fn element<'a, C>(ins: &GradInputs<'a, C>, n: Sizes, b: usize) -> GradInputs<'a, C> {
    GradInputs {
        q: &ins.q[b * n.tq * n.e..(b + 1) * n.tq * n.e],
        k: &ins.k[b * n.tk * n.e..(b + 1) * n.tk * n.e],
        v: &ins.v[b * n.tk * n.ev..(b + 1) * n.tk * n.ev],
        g: &ins.g[b * n.tq * n.ev..(b + 1) * n.tq * n.ev],
        lse: &ins.lse[b * n.tq..(b + 1) * n.tq],
        delta: &ins.delta[b * n.tq..(b + 1) * n.tq],
    }
}

/// For batch element `b`, queries `i0..i1` against keys `j0..j1`: with `ds` asked for,
/// the probabilities into `p` and `ds = p·(z·g·vᵀ − delta)` into `ds`; without, the
/// probabilities times their dropout factors `z` into `p` (row-major, `j1 - j0` wide).
#[allow(clippy::too_many_arguments)]
fn block_grads<C: BlockGemm>(
    x: &GradInputs<'_, C>,
    n: Sizes,
    spec: &AttentionSpec,
    b: usize,
    (i0, i1): (usize, usize),
    (j0, j1): (usize, usize),
    p: &mut [C],
    ds: Option<&mut [C]>,
) {
    let (bi, bj) = (i1 - i0, j1 - j0);
    block_scores(x.q, x.k, n, spec, (i0, i1), (j0, j1), p);
    simd::wide(|| {
        for r in 0..bi {
            let lse = x.lse[i0 + r];
            for e in &mut p[r * bj..(r + 1) * bj] {
                *e = if *e == C::neg_infinity() || lse == C::neg_infinity() {
                    C::zero()
                } else {
                    (*e - lse).exp_()
                };
            }
        }
    });
    let dropout = Dropout::<C>::of(spec);
    let Some(ds) = ds else {
        if let Some(d) = &dropout {
            for r in 0..bi {
                d.apply(&mut p[r * bj..(r + 1) * bj], n, b, i0 + r, j0);
            }
        }
        return;
    };
    let ds = &mut ds[..bi * bj];
    C::gemm(
        bi,
        bj,
        n.ev,
        rows(x.g, i0, n.ev),
        rows(x.v, j0, n.ev).t(),
        ds,
        false,
    );
    for r in 0..bi {
        if let Some(d) = &dropout {
            d.apply(&mut ds[r * bj..(r + 1) * bj], n, b, i0 + r, j0);
        }
        let delta = x.delta[i0 + r];
        let (ds, p) = (&mut ds[r * bj..(r + 1) * bj], &p[r * bj..(r + 1) * bj]);
        simd::wide(|| {
            for (d, &p) in ds.iter_mut().zip(p) {
                *d = p * (*d - delta);
            }
        });
    }
}

/// `dq = scale · Σ_j ds_ij k_j`, query blocks against the key blocks they see.
fn grad_q<C: BlockGemm>(ins: &GradInputs<'_, C>, n: Sizes, spec: &AttentionSpec) -> Vec<C> {
    let mut dq = vec![C::zero(); n.batch * n.tq * n.e];
    grad_q_into(ins, n, spec, &mut dq);
    dq
}

/// [`grad_q`] into `dq` (`batch · tq · e` values, overwritten).
fn grad_q_into<C: BlockGemm>(
    ins: &GradInputs<'_, C>,
    n: Sizes,
    spec: &AttentionSpec,
    dq: &mut [C],
) {
    dq.fill(C::zero());
    dq.par_chunks_mut((n.tq * n.e).max(1))
        .enumerate()
        .for_each_init(
            || BlockScratch::new(n),
            |sc, (b, dq)| {
                if n.tq * n.e == 0 {
                    return;
                }
                let x = element(ins, n, b);
                let (p, ds) = (&mut sc.p, &mut sc.ds);
                for (i0, i1) in blocks(n.tq, QUERY_BLOCK) {
                    let keys = if spec.causal { i1.min(n.tk) } else { n.tk };
                    for (j0, j1) in blocks(keys, KEY_BLOCK) {
                        block_grads(&x, n, spec, b, (i0, i1), (j0, j1), p, Some(ds));
                        let (bi, bj) = (i1 - i0, j1 - j0);
                        let d = MatRef {
                            data: &ds[..],
                            offset: 0,
                            row_stride: bj,
                            col_stride: 1,
                        };
                        C::gemm(
                            bi,
                            n.e,
                            bj,
                            d,
                            rows(x.k, j0, n.e),
                            &mut dq[i0 * n.e..i1 * n.e],
                            true,
                        );
                    }
                }
                let scale = C::from_f64_(spec.scale);
                dq.iter_mut().for_each(|d| *d = *d * scale);
            },
        );
}

/// `dk = scale · Σ_i ds_ij q_i` or `dv = Σ_i p_ij g_i`, key blocks against the query
/// blocks that see them.
fn grad_kv<C: BlockGemm>(
    ins: &GradInputs<'_, C>,
    n: Sizes,
    spec: &AttentionSpec,
    wrt: AttentionInput,
) -> Vec<C> {
    let width = if wrt == AttentionInput::Value {
        n.ev
    } else {
        n.e
    };
    let mut out = vec![C::zero(); n.batch * n.tk * width];
    grad_kv_into(ins, n, spec, wrt, &mut out);
    out
}

/// [`grad_kv`] into `out` (`batch · tk` rows of the gradient's width, overwritten).
fn grad_kv_into<C: BlockGemm>(
    ins: &GradInputs<'_, C>,
    n: Sizes,
    spec: &AttentionSpec,
    wrt: AttentionInput,
    out: &mut [C],
) {
    let width = if wrt == AttentionInput::Value {
        n.ev
    } else {
        n.e
    };
    out.fill(C::zero());
    out.par_chunks_mut((n.tk * width).max(1))
        .enumerate()
        .for_each_init(
            || BlockScratch::new(n),
            |sc, (b, out)| {
                if n.tk * width == 0 {
                    return;
                }
                let x = element(ins, n, b);
                let (p, ds) = (&mut sc.p, &mut sc.ds);
                for (j0, j1) in blocks(n.tk, KEY_BLOCK) {
                    let first_query = if spec.causal { j0 } else { 0 };
                    for (i0, i1) in blocks(n.tq, QUERY_BLOCK).filter(|&(_, i1)| i1 > first_query) {
                        let (bi, bj) = (i1 - i0, j1 - j0);
                        let target = &mut out[j0 * width..j1 * width];
                        if wrt == AttentionInput::Value {
                            block_grads(&x, n, spec, b, (i0, i1), (j0, j1), p, None);
                            let pt = MatRef {
                                data: &p[..],
                                offset: 0,
                                row_stride: 1,
                                col_stride: bj,
                            };
                            C::gemm(bj, n.ev, bi, pt, rows(x.g, i0, n.ev), target, true);
                        } else {
                            block_grads(&x, n, spec, b, (i0, i1), (j0, j1), p, Some(ds));
                            let dst = MatRef {
                                data: &ds[..],
                                offset: 0,
                                row_stride: 1,
                                col_stride: bj,
                            };
                            C::gemm(bj, n.e, bi, dst, rows(x.q, i0, n.e), target, true);
                        }
                    }
                }
                if wrt == AttentionInput::Key {
                    let scale = C::from_f64_(spec.scale);
                    out.iter_mut().for_each(|d| *d = *d * scale);
                }
            },
        );
}
