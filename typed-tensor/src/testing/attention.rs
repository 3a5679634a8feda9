//! Attention in the conformance suite: the f64 reference of its three ops (what
//! [`super::reference::eval`] runs for them), its formulas with the magnitudes their
//! rounding grows with, and the `attention` family: the fused op and the gradients its
//! backward rule computes on a backend, against those formulas, on random shapes and
//! views, causal or not, with large scores, empty sequences and `T = 1`.

use super::formulas::Expected;
use super::harness::{judge, logical, run_property, upload};
use super::reference::{RefTensor, Sum};
use super::strategy::{input, small_shape, Domain, Input};
use super::tolerance::Tol;
use super::Config;
use crate::attention::{
    attention_vjp, dropout_counter, AttentionDropout, AttentionInput, AttentionSpec,
};
use crate::backend::Backend;
use crate::builder::{Builder, BuilderExt};
use crate::dtype::DType;
use crate::op::CmpOp;
use crate::op::Op;
use crate::raw::Eager;
use proptest::prelude::*;
use proptest::sample::select;

/// Sizes of one attention: batch elements, queries, keys, widths of q/k and of v.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    batch: usize,
    tq: usize,
    tk: usize,
    e: usize,
    ev: usize,
}

impl Sizes {
    fn of(q: &RefTensor, k: &RefTensor, v: &RefTensor) -> Self {
        let r = q.dims.len();
        Sizes {
            batch: q.dims[..r - 2].iter().product(),
            tq: q.dims[r - 2],
            tk: k.dims[r - 2],
            e: q.dims[r - 1],
            ev: v.dims[r - 1],
        }
    }
}

/// The scaled scores of batch element `b`, query `i` (`None` where the mask hides key
/// `j`).
fn scores(
    q: &RefTensor,
    k: &RefTensor,
    n: Sizes,
    spec: &AttentionSpec,
    b: usize,
    i: usize,
) -> Vec<Option<f64>> {
    (0..n.tk)
        .map(|j| {
            (!spec.causal || j <= i).then(|| {
                let dot =
                    Sum::of((0..n.e).map(|c| {
                        q.data[(b * n.tq + i) * n.e + c] * k.data[(b * n.tk + j) * n.e + c]
                    }));
                spec.scale * dot
            })
        })
        .collect()
}

/// The dropout factor `z_ij` of weight `(b, i, j)`: 1 without dropout, else
/// `1/(1 − p)` or 0.
fn factor(spec: &AttentionSpec, n: Sizes, b: usize, i: usize, j: usize) -> f64 {
    spec.dropout
        .map_or(1.0, |d| d.factor(dropout_counter(b, i, j, n.tq, n.tk)))
}

/// `log Σ_j exp(s_j)` over the keys a query sees; −∞ when it sees none.
fn logsumexp(s: &[Option<f64>]) -> f64 {
    let m = s.iter().flatten().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + Sum::of(s.iter().flatten().map(|&x| (x - m).exp())).ln()
}

/// The probabilities of one query's keys from its scores and log-sum-exp.
fn probabilities(s: &[Option<f64>], lse: f64) -> Vec<f64> {
    s.iter()
        .map(|x| x.map_or(0.0, |x| (x - lse).exp()))
        .collect()
}

/// The f64 value of an attention op of the table on logical inputs (the shape rule has
/// checked them): what the reference interpreter returns for it, before rounding.
pub fn eval(op: &Op, inputs: &[&RefTensor]) -> Vec<f64> {
    match op {
        Op::Attention(spec) => forward(inputs[0], inputs[1], inputs[2], spec).0,
        Op::AttentionLse(spec) => {
            let (q, k) = (inputs[0], inputs[1]);
            let n = Sizes::of(q, k, k);
            let mut out = Vec::with_capacity(n.batch * n.tq);
            for b in 0..n.batch {
                for i in 0..n.tq {
                    out.push(logsumexp(&scores(q, k, n, spec, b, i)));
                }
            }
            out
        }
        Op::AttentionGrad { spec, wrt } => {
            let [q, k, v, g, lse, delta] = inputs else {
                unreachable!("the shape rule checked six inputs")
            };
            let tq = q.dims[q.dims.len() - 2];
            let stats = |b: usize, i: usize| (lse.data[b * tq + i], delta.data[b * tq + i]);
            let [dq, dk, dv] = backward(q, k, v, g, spec, stats);
            match wrt {
                AttentionInput::Query => dq.0,
                AttentionInput::Key => dk.0,
                AttentionInput::Value => dv.0,
            }
        }
        other => unreachable!("{} is not an attention op", other.name()),
    }
}

/// The output and the per-element magnitude of its terms:
/// `(2·S_i + 1)·Σ_j p_ij |v_j|` with `S_i` the largest `|s_ij|` plus the magnitude of its
/// product (the error of a score becomes a relative error of its probability).
fn forward(
    q: &RefTensor,
    k: &RefTensor,
    v: &RefTensor,
    spec: &AttentionSpec,
) -> (Vec<f64>, Vec<f64>) {
    let n = Sizes::of(q, k, v);
    let mut out = vec![0.0; n.batch * n.tq * n.ev];
    let mut mag = vec![0.0; out.len()];
    for b in 0..n.batch {
        for i in 0..n.tq {
            let s = scores(q, k, n, spec, b, i);
            let p: Vec<f64> = probabilities(&s, logsumexp(&s))
                .iter()
                .enumerate()
                .map(|(j, p)| p * factor(spec, n, b, i, j))
                .collect();
            let spread = 2.0 * score_magnitude(q, k, n, spec, b, i) + 1.0;
            for c in 0..n.ev {
                let at = (b * n.tq + i) * n.ev + c;
                let vj = |j: usize| v.data[(b * n.tk + j) * n.ev + c];
                out[at] = Sum::of((0..n.tk).map(|j| p[j] * vj(j)));
                mag[at] = spread * Sum::of((0..n.tk).map(|j| p[j] * vj(j).abs()));
            }
        }
    }
    (out, mag)
}

/// The largest `|s_ij| + |scale|·Σ_c |q_ic k_jc|` of query `i`.
fn score_magnitude(
    q: &RefTensor,
    k: &RefTensor,
    n: Sizes,
    spec: &AttentionSpec,
    b: usize,
    i: usize,
) -> f64 {
    (0..n.tk)
        .map(|j| {
            let terms = Sum::of((0..n.e).map(|c| {
                (q.data[(b * n.tq + i) * n.e + c] * k.data[(b * n.tk + j) * n.e + c]).abs()
            }));
            2.0 * spec.scale.abs() * terms
        })
        .fold(0.0, f64::max)
}

/// The gradients of q, k and v (each with its magnitudes), given the row statistics
/// that `stats(b, i)` returns (`(lse, delta)`).
fn backward(
    q: &RefTensor,
    k: &RefTensor,
    v: &RefTensor,
    g: &RefTensor,
    spec: &AttentionSpec,
    stats: impl Fn(usize, usize) -> (f64, f64),
) -> [(Vec<f64>, Vec<f64>); 3] {
    let n = Sizes::of(q, k, v);
    let mut dq = (vec![0.0; q.numel()], vec![0.0; q.numel()]);
    let mut dk = (vec![0.0; k.numel()], vec![0.0; k.numel()]);
    let mut dv = (vec![0.0; v.numel()], vec![0.0; v.numel()]);
    let qa = |b: usize, i: usize, c: usize| q.data[(b * n.tq + i) * n.e + c];
    let ka = |b: usize, j: usize, c: usize| k.data[(b * n.tk + j) * n.e + c];
    let va = |b: usize, j: usize, c: usize| v.data[(b * n.tk + j) * n.ev + c];
    let ga = |b: usize, i: usize, c: usize| g.data[(b * n.tq + i) * n.ev + c];
    for b in 0..n.batch {
        // ds and p of every (i, j), with the magnitude of ds.
        let mut p = vec![0.0; n.tq * n.tk];
        let mut ds = vec![0.0; n.tq * n.tk];
        let mut ds_mag = vec![0.0; n.tq * n.tk];
        let mut p_mag = vec![0.0; n.tq * n.tk];
        for i in 0..n.tq {
            let (lse, delta) = stats(b, i);
            let s = scores(q, k, n, spec, b, i);
            let pi = probabilities(&s, lse);
            let spread = 2.0 * score_magnitude(q, k, n, spec, b, i) + 1.0;
            let g_out = Sum::of((0..n.ev).map(|c| ga(b, i, c).abs()))
                * Sum::of(
                    (0..n.tk).map(|j| (0..n.ev).map(|c| va(b, j, c).abs()).fold(0.0, f64::max)),
                );
            for j in 0..n.tk {
                let z = factor(spec, n, b, i, j);
                let dp = z * Sum::of((0..n.ev).map(|c| ga(b, i, c) * va(b, j, c)));
                let dp_mag = z * Sum::of((0..n.ev).map(|c| (ga(b, i, c) * va(b, j, c)).abs()));
                p[i * n.tk + j] = pi[j] * z;
                p_mag[i * n.tk + j] = pi[j] * z * spread;
                ds[i * n.tk + j] = pi[j] * (dp - delta);
                ds_mag[i * n.tk + j] =
                    pi[j] * (spread * (dp - delta).abs() + dp_mag + delta.abs() + z * g_out);
            }
        }
        for i in 0..n.tq {
            for c in 0..n.e {
                let at = (b * n.tq + i) * n.e + c;
                dq.0[at] = spec.scale * Sum::of((0..n.tk).map(|j| ds[i * n.tk + j] * ka(b, j, c)));
                dq.1[at] = spec.scale.abs()
                    * Sum::of((0..n.tk).map(|j| ds_mag[i * n.tk + j] * ka(b, j, c).abs()));
            }
        }
        for j in 0..n.tk {
            for c in 0..n.e {
                let at = (b * n.tk + j) * n.e + c;
                dk.0[at] = spec.scale * Sum::of((0..n.tq).map(|i| ds[i * n.tk + j] * qa(b, i, c)));
                dk.1[at] = spec.scale.abs()
                    * Sum::of((0..n.tq).map(|i| ds_mag[i * n.tk + j] * qa(b, i, c).abs()));
            }
            for c in 0..n.ev {
                let at = (b * n.tk + j) * n.ev + c;
                dv.0[at] = Sum::of((0..n.tq).map(|i| p[i * n.tk + j] * ga(b, i, c)));
                dv.1[at] = Sum::of((0..n.tq).map(|i| p_mag[i * n.tk + j] * ga(b, i, c).abs()));
            }
        }
    }
    [dq, dk, dv]
}

/// The formulas of attention and its gradients from the inputs alone (the statistics
/// computed exactly, not read): output, then the gradients of q, k and v.
pub fn expected(
    q: &RefTensor,
    k: &RefTensor,
    v: &RefTensor,
    g: &RefTensor,
    spec: &AttentionSpec,
) -> [Expected; 4] {
    let n = Sizes::of(q, k, v);
    let (out, out_mag) = forward(q, k, v, spec);
    let stats = |b: usize, i: usize| {
        let lse = logsumexp(&scores(q, k, n, spec, b, i));
        let delta = Sum::of((0..n.ev).map(|c| {
            let at = (b * n.tq + i) * n.ev + c;
            g.data[at] * out[at]
        }));
        (lse, delta)
    };
    let [dq, dk, dv] = backward(q, k, v, g, spec, stats);
    let make = |like: &RefTensor, (data, mag): (Vec<f64>, Vec<f64>)| Expected {
        value: RefTensor::new(like.dims.clone(), data, like.dtype),
        mag,
    };
    [
        make(g, (out, out_mag)),
        make(q, dq),
        make(k, dk),
        make(v, dv),
    ]
}

/// One attention case: settings and inputs q, k, v and the output's gradient.
#[derive(Clone, Debug)]
pub struct AttentionCase {
    /// Scale and mask.
    pub spec: AttentionSpec,
    /// q, k, v, g (in any layout).
    pub inputs: Vec<Input>,
}

/// Random attentions: batch dims of rank 0 to 2, 0 to 9 queries and keys (as many of
/// each when causal), widths 0 to 8 (wider and longer now and then, and now and then
/// 65 to 72 queries and keys: more than one cube of a GPU's tiled kernels), the default
/// scale or any in [-2, 2], now and then a scale of 40 whose scores reach the hundreds
/// (the softmax's shift must keep them finite), and in one case of three dropout on
/// the weights with any seed.
pub fn attention_cases(config: &Config) -> BoxedStrategy<AttentionCase> {
    let sizes = prop_oneof![
        6 => (0..=9usize, 0..=9usize, 0..=8usize, 0..=8usize),
        1 => (1..=2usize, 17..=40usize, 16..=64usize, 1..=24usize),
        1 => (65..=72usize, 65..=72usize, 1..=8usize, 1..=8usize),
        // Past one key block (128): the causal pass's second block row.
        1 => (129..=140usize, 129..=140usize, 1..=3usize, 1..=3usize),
    ];
    let scale = prop_oneof![
        3 => Just(None),
        2 => (-2.0..2.0f64).prop_map(Some),
        1 => Just(Some(40.0)),
    ];
    let dropout = prop_oneof![
        2 => Just(None),
        1 => (select(vec![0.1, 0.5, 0.9]), any::<u64>())
            .prop_map(|(p, seed)| Some(AttentionDropout { p, seed })),
    ];
    (
        select(config.floats()),
        small_shape(0, 2),
        sizes,
        scale,
        any::<bool>(),
        dropout,
    )
        .prop_flat_map(|(dt, batch, (tq, tk, e, ev), scale, causal, dropout)| {
            let tk = if causal { tq } else { tk };
            let spec = AttentionSpec {
                scale: scale.unwrap_or(1.0 / (e.max(1) as f64).sqrt()),
                causal,
                dropout,
            };
            let dims = |t: usize, w: usize| {
                let mut d = batch.clone();
                d.extend([t, w]);
                d
            };
            vec![
                input(dims(tq, e), dt, Domain::Small),
                input(dims(tk, e), dt, Domain::Small),
                input(dims(tk, ev), dt, Domain::Small),
                input(dims(tq, ev), dt, Domain::Small),
            ]
            .prop_map(move |inputs| AttentionCase { spec, inputs })
        })
        .boxed()
}

/// Runs the fused op and its backward rule on a backend and judges the output and the
/// three gradients against [`expected`].
pub fn check_attention<B: Backend>(device: &B::Device, case: &AttentionCase) -> Result<(), String> {
    let xs = logical(&case.inputs)?;
    let ts = upload::<B>(device, &case.inputs)?;
    let mut b = Eager::<B>::new(device.clone());
    let want = expected(&xs[0], &xs[1], &xs[2], &xs[3], &case.spec);
    let got = b
        .attention(&ts[0], &ts[1], &ts[2], case.spec)
        .and_then(|out| {
            let grads = attention_vjp(&mut b, &case.spec, &[&ts[0], &ts[1], &ts[2]], &out, &ts[3])?;
            Ok((out, grads))
        })
        .map_err(|e| format!("{:?}: the backend failed: {e}", case.spec))?;
    let (out, grads) = got;
    let mags: Vec<&[f64]> = want.iter().map(|e| &e.mag[..]).collect();
    check_one_pass::<B>(device, case, &ts, &mags)?;
    let mut results = vec![out];
    results.extend(
        grads
            .into_iter()
            .map(|g| g.expect("attention's inputs all get gradients")),
    );
    // Products, a softmax and products again: a handful of roundings per element, in f32
    // for the half floats, then one of the result.
    let k = 16.0;
    let names = ["output", "dq", "dk", "dv"];
    for ((name, e), t) in names.iter().zip(want).zip(&results) {
        let tol = Tol::for_dtype(e.value.dtype).times(k);
        judge(Ok(e.value), RefTensor::from_raw(t), tol, Some(&e.mag))
            .map_err(|err| format!("{:?}, {name}: {err}", case.spec))?;
    }
    Ok(())
}

/// The groups one kernel pass may compute ([`crate::attention::one_pass`]) — the output
/// with its row statistics, and the three gradients — through
/// [`Backend::execute_one_pass_into`], each result equal to its op run alone within
/// the roundings the reference check allows (`mags`: the magnitudes of the output's and
/// the gradients' terms, against which a different order of summation is judged): a
/// backend's combined launch is an optimisation, never another answer.
fn check_one_pass<B: Backend>(
    device: &B::Device,
    case: &AttentionCase,
    ts: &[crate::raw::RawTensor<B>],
    mags: &[&[f64]],
) -> Result<(), String> {
    let spec = case.spec;
    let mut b = Eager::<B>::new(device.clone());
    let fail = |e: crate::Error| format!("{spec:?}: the backend failed: {e}");
    let lse_op = Op::AttentionLse(spec.without_dropout());
    let out = b
        .apply(Op::Attention(spec), &[&ts[0], &ts[1], &ts[2]])
        .map_err(fail)?;
    let lse = b.apply(lse_op.clone(), &[&ts[0], &ts[1]]).map_err(fail)?;
    let prod = b.mul(&ts[3], &out).map_err(fail)?;
    let prod = b
        .cast(&prod, crate::attention::stats_dtype(b.dtype(&prod)))
        .map_err(fail)?;
    let last = b.rank(&prod) - 1;
    let delta = b.sum(&prod, &[last], true).map_err(fail)?;
    let grad_inputs = [&ts[0], &ts[1], &ts[2], &ts[3], &lse, &delta];
    let grad = |wrt| Op::AttentionGrad { spec, wrt };
    let grads = AttentionInput::ALL
        .iter()
        .map(|&wrt| b.apply(grad(wrt), &grad_inputs))
        .collect::<crate::Result<Vec<_>>>()
        .map_err(fail)?;
    // The statistics have no magnitudes of their own: one log of a sum, judged plainly.
    type Group<'a, B> = (
        Vec<Op>,
        Vec<&'a crate::raw::RawTensor<B>>,
        Vec<&'a crate::raw::RawTensor<B>>,
        Vec<Option<&'a [f64]>>,
    );
    let groups: [Group<'_, B>; 2] = [
        (
            vec![Op::Attention(spec), lse_op],
            vec![&ts[0], &ts[1], &ts[2]],
            vec![&out, &lse],
            vec![Some(mags[0]), None],
        ),
        (
            AttentionInput::ALL.iter().map(|&w| grad(w)).collect(),
            grad_inputs.to_vec(),
            grads.iter().collect(),
            mags[1..].iter().map(|&m| Some(m)).collect(),
        ),
    ];
    for (ops, inputs, alone, mags) in groups {
        let refs: Vec<&Op> = ops.iter().collect();
        let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
        let metas: Vec<crate::TensorMeta> = alone
            .iter()
            .map(|t| crate::TensorMeta::new(t.dims().to_vec(), t.dtype()))
            .collect();
        let meta_refs: Vec<&crate::TensorMeta> = metas.iter().collect();
        let mut bufs = metas
            .iter()
            .map(|m| B::alloc(device, m.dtype, m.dims.iter().product()))
            .collect::<crate::Result<Vec<_>>>()
            .map_err(fail)?;
        let mut outs: Vec<&mut B::Storage> = bufs.iter_mut().collect();
        B::execute_one_pass_into(device, &refs, &views, &meta_refs, &mut outs).map_err(fail)?;
        for (((op, buf), t), mag) in ops.iter().zip(bufs).zip(alone).zip(mags) {
            let together = crate::raw::RawTensor::<B>::from_storage(buf, *t.dims(), device.clone())
                .and_then(|r| RefTensor::from_raw(&r))
                .map_err(fail)?;
            let one = RefTensor::from_raw(t).map_err(fail)?;
            // A kernel compiled for the group may contract a multiply-add, or sum in
            // another order, where the op's own does not: as many roundings as the
            // reference check allows.
            let tol = Tol::for_dtype(t.dtype()).times(16.0);
            super::tolerance::compare(&together, &one, tol, mag).map_err(|e| {
                format!(
                    "{spec:?}: {} computed in one pass with {} ops differs from the op alone: {e}",
                    op.name(),
                    ops.len()
                )
            })?;
        }
    }
    Ok(())
}

/// The `attention` family: the fused op and its gradients, and dropout's statistics.
pub fn attention<B: Backend>(device: &B::Device, config: &Config) {
    run_property(
        "attention",
        config.cases(96),
        attention_cases(config),
        |c| check_attention::<B>(device, &c),
    );
    for dtype in config.floats() {
        if let Err(e) = check_dropout_statistics::<B>(device, dtype) {
            panic!("attention dropout in {dtype}: {e}");
        }
    }
}

/// Dropout on the weights as PyTorch defines it, through the backend's kernel. With
/// `q = 0` each of a query's `T` weights is `1/T`, and with `v` the identity the output
/// `out_ij` is `z_ij / T`, so the factors `z` can be read back: each must be 0 or
/// `1/(1 − p)` (and 0 exactly where the op's draws say), the share dropped near `p`, the
/// same seed must drop the same weights and another seed others, and `p = 0` none.
pub fn check_dropout_statistics<B: Backend>(
    device: &B::Device,
    dtype: DType,
) -> Result<(), String> {
    let (batch, t) = (4usize, 64usize);
    let factors = |p: f64, seed: u64| -> Result<Vec<f64>, String> {
        let mut b = Eager::<B>::new(device.clone());
        let run = |b: &mut Eager<B>| -> crate::error::Result<Vec<f64>> {
            let dims = vec![batch, t, t];
            let q = b.full(dims.clone(), 0.0, dtype)?;
            let rows = b.apply(
                Op::Iota {
                    dims: dims.clone(),
                    axis: 1,
                },
                &[],
            )?;
            let cols = b.apply(
                Op::Iota {
                    dims: dims.clone(),
                    axis: 2,
                },
                &[],
            )?;
            let diagonal = b.compare(CmpOp::Eq, &rows, &cols)?;
            let (one, zero) = (b.full(dims.clone(), 1.0, dtype)?, b.full(dims, 0.0, dtype)?);
            let v = b.select(&diagonal, &one, &zero)?;
            let spec = AttentionSpec {
                dropout: Some(AttentionDropout { p, seed }),
                ..AttentionSpec::new(1.0, false)
            };
            let out = b.attention(&q, &q, &v, spec)?;
            Ok(out.to_f64_vec()?.iter().map(|x| x * t as f64).collect())
        };
        run(&mut b).map_err(|e| format!("the backend failed: {e}"))
    };
    let p = 0.3;
    let z = factors(p, 17)?;
    let keep = 1.0 / (1.0 - p);
    let d = AttentionDropout { p, seed: 17 };
    for (at, &x) in z.iter().enumerate() {
        let (bi, rest) = (at / (t * t), at % (t * t));
        let want = d.factor(dropout_counter(bi, rest / t, rest % t, t, t));
        let close = if want == 0.0 {
            x == 0.0
        } else {
            (x / want - 1.0).abs() < 0.02
        };
        if !close || (want != 0.0 && want != keep) {
            return Err(format!("weight {at}: factor {x}, the draws say {want}"));
        }
    }
    let dropped = z.iter().filter(|&&x| x == 0.0).count() as f64 / z.len() as f64;
    if (dropped - p).abs() > 0.03 {
        return Err(format!("dropped {dropped} of the weights with p = {p}"));
    }
    if factors(p, 17)? != z {
        return Err("the same seed dropped other weights".into());
    }
    let other = factors(p, 18)?;
    let moved = z
        .iter()
        .zip(&other)
        .filter(|(a, b)| (**a == 0.0) != (**b == 0.0))
        .count();
    if moved < z.len() / 10 {
        return Err(format!(
            "another seed moved only {moved} of {} drops",
            z.len()
        ));
    }
    if factors(0.0, 17)?.iter().any(|&x| (x - 1.0).abs() > 0.02) {
        return Err("p = 0 dropped or scaled weights".into());
    }
    device_seeded_draws_match::<B>(device, dtype)
        .map_err(|e| format!("with a seed in device memory: {e}"))
}

/// Attention's forward op and `dk` with dropout run through
/// [`Backend::draw_with_device_seed`] (a captured step's seed in device memory) are bit
/// for bit the ops with the seeds mixed on the host.
fn device_seeded_draws_match<B: Backend>(
    device: &B::Device,
    dtype: DType,
) -> crate::error::Result<()> {
    use crate::backend::mix_device_seed;
    use crate::raw::RawTensor;
    let mut b = Eager::<B>::new(device.clone());
    let dims = vec![2usize, 9, 5];
    let draw = |b: &mut Eager<B>, seed: u64| {
        b.rand(
            dims.clone(),
            crate::op::RandDist::Normal {
                mean: 0.0,
                std: 1.0,
            },
            seed,
            dtype,
        )
    };
    let (q, k, v) = (draw(&mut b, 1)?, draw(&mut b, 2)?, draw(&mut b, 3)?);
    let spec = AttentionSpec {
        dropout: Some(AttentionDropout { p: 0.4, seed: 17 }),
        ..AttentionSpec::new(0.5, true)
    };
    let lse = b.apply(Op::AttentionLse(spec.without_dropout()), &[&q, &k])?;
    let delta = b.full(lse.dims().to_vec(), 0.25, lse.dtype())?;
    let forward = (Op::Attention(spec), vec![&q, &k, &v]);
    let grad = Op::AttentionGrad {
        spec,
        wrt: AttentionInput::Key,
    };
    let grad = (grad, vec![&q, &k, &v, &v, &lse, &delta]);
    let seed = 0x1234_5678_9abc_def0u64;
    let words = vec![seed as u32 as i32, (seed >> 32) as u32 as i32];
    let buffer = RawTensor::<B>::from_vec(words, &[2], device)?;
    for (op, inputs) in [forward, grad] {
        let metas: Vec<_> = inputs.iter().map(|t| t.meta()).collect();
        let meta = op.infer(&metas.iter().collect::<Vec<_>>())?;
        let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
        let got = B::draw_with_device_seed(device, &op, &views, buffer.view(), &meta)?;
        let want = B::execute(device, &mix_device_seed(&op, seed)?, &views, &meta)?;
        let layout = crate::Layout::contiguous(crate::shape::Dims::new(&meta.dims)?);
        if B::download(&got, &layout)? != B::download(&want, &layout)? {
            return Err(crate::error::Error::invalid(
                op.name(),
                "drew other weights than the seeds mixed on the host",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize], data: &[f64]) -> RefTensor {
        RefTensor::new(dims.to_vec(), data.to_vec(), DType::F64)
    }

    /// One query over two keys with scores 0 and ln 3: weights 1/4 and 3/4.
    #[test]
    fn weights_follow_the_softmax_of_the_scores() {
        let q = t(&[1, 1], &[1.0]);
        let k = t(&[2, 1], &[0.0, 3f64.ln()]);
        let v = t(&[2, 1], &[4.0, 8.0]);
        let spec = AttentionSpec::new(1.0, false);
        let out = eval(&Op::Attention(spec), &[&q, &k, &v]);
        assert!((out[0] - 7.0).abs() < 1e-12, "{out:?}");
        let lse = eval(&Op::AttentionLse(spec), &[&q, &k]);
        assert!((lse[0] - 4f64.ln()).abs() < 1e-12, "{lse:?}");
    }

    /// Causal: the first query sees only the first key.
    #[test]
    fn a_causal_query_sees_the_keys_up_to_itself() {
        let q = t(&[2, 1], &[1.0, 1.0]);
        let k = t(&[2, 1], &[0.0, 0.0]);
        let v = t(&[2, 1], &[2.0, 6.0]);
        let spec = AttentionSpec::new(1.0, true);
        let out = eval(&Op::Attention(spec), &[&q, &k, &v]);
        assert_eq!(out, vec![2.0, 4.0]);
    }

    /// The gradients match central differences of `Σ g·out` in f64.
    #[test]
    fn gradients_are_the_derivatives_of_the_output() {
        let plain = AttentionSpec::new(0.7, true);
        let dropped = AttentionSpec {
            dropout: Some(AttentionDropout { p: 0.5, seed: 3 }),
            ..plain
        };
        for spec in [plain, dropped] {
            derivatives_match(spec);
        }
    }

    fn derivatives_match(spec: AttentionSpec) {
        let q = t(&[3, 2], &[0.3, -1.2, 0.8, 0.1, -0.5, 0.9]);
        let k = t(&[3, 2], &[1.1, 0.4, -0.7, 0.2, 0.6, -1.3]);
        let v = t(&[3, 2], &[0.5, -0.2, 1.4, 0.3, -0.9, 0.8]);
        let g = t(&[3, 2], &[0.2, -0.6, 1.0, 0.4, -0.3, 0.7]);
        let loss = |q: &RefTensor, k: &RefTensor, v: &RefTensor| {
            let out = forward(q, k, v, &spec).0;
            out.iter().zip(&g.data).map(|(a, b)| a * b).sum::<f64>()
        };
        let grads = expected(&q, &k, &v, &g, &spec);
        for (which, grad) in grads[1..].iter().enumerate() {
            for at in 0..6 {
                let mut xs = [q.clone(), k.clone(), v.clone()];
                let h = 1e-6;
                xs[which].data[at] += h;
                let up = loss(&xs[0], &xs[1], &xs[2]);
                xs[which].data[at] -= 2.0 * h;
                let down = loss(&xs[0], &xs[1], &xs[2]);
                let numeric = (up - down) / (2.0 * h);
                let got = grad.value.data[at];
                assert!(
                    (numeric - got).abs() < 1e-7,
                    "input {which}[{at}]: {got} vs {numeric}"
                );
            }
        }
    }
}
