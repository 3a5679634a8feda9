//! Attention as ops of the table: scaled dot-product attention
//! `softmax(q·kᵀ·scale, causal) · v` run as one kernel that never holds the `Tq×Tk`
//! scores in memory ([`Op::Attention`]), the row statistics its backward pass recomputes
//! probabilities from ([`Op::AttentionLse`]) and the gradient of each input
//! ([`Op::AttentionGrad`]). This module owns what the three share: their settings, their
//! shape and dtype rule, the math every kernel follows (written out in
//! [`AttentionSpec`]'s docs and, in f64, in the conformance suite's reference), and the
//! recognition of attention written by hand with primitives, so that a recording
//! builder (the `#[model]` macro, the dynamic path) gives hand-written attention the
//! fused kernel.
//!
//! The math, per batch element, for queries `i` and keys `j`:
//! `s_ij = scale · q_i·k_j` (masked to −∞ above the diagonal when causal),
//! `lse_i = log Σ_j exp(s_ij)`, `p_ij = exp(s_ij − lse_i)`, `out_i = Σ_j p_ij v_j`.
//! Backward, with `g` the output's gradient and `delta_i = Σ_e g_ie · out_ie`:
//! `dv_j = Σ_i p_ij g_i`, `ds_ij = p_ij (g_i·v_j − delta_i)`, `dq_i = scale Σ_j ds_ij k_j`,
//! `dk_j = scale Σ_i ds_ij q_i`.
//!
//! With dropout on the weights ([`AttentionDropout`]), each `p_ij` of the output's sum
//! is multiplied by `z_ij`, `1/(1 − p)` for a kept weight and 0 for a dropped one (the
//! log-sum-exp is the undropped one): `out_i = Σ_j p_ij z_ij v_j`, `dv_j = Σ_i p_ij z_ij g_i`
//! and `ds_ij = p_ij (z_ij g_i·v_j − delta_i)`; `delta` keeps its formula, since
//! `Σ_j p_ij z_ij g_i·v_j = g_i·out_i`.

use crate::builder::{Builder, BuilderExt};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{fmt_dims, BinaryOp, CmpOp, Op, RandDist, ReduceOp, SymDim, TensorMeta, UnaryOp};

/// The settings of an attention op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// The scores are `q·kᵀ · scale` (PyTorch's default is `1/√E` for width `E`).
    pub scale: f64,
    /// Query `i` attends to keys `j <= i` only (PyTorch's `is_causal`); causal attention
    /// takes as many queries as keys.
    pub causal: bool,
    /// Dropout on the weights (PyTorch's `dropout_p` in training), or none.
    pub dropout: Option<AttentionDropout>,
}

impl AttentionSpec {
    /// Attention scaled by `scale`, causal or not, without dropout.
    pub const fn new(scale: f64, causal: bool) -> Self {
        AttentionSpec {
            scale,
            causal,
            dropout: None,
        }
    }

    /// The same attention without dropout: what the row statistics are computed with.
    pub const fn without_dropout(self) -> Self {
        AttentionSpec {
            dropout: None,
            ..self
        }
    }
}

/// The random draws' resolution: the generator's uniform values are multiples of 2⁻²⁴.
const DRAWS: f64 = 16_777_216.0;

/// Dropout on attention's weights, PyTorch's semantics: each weight is zeroed with
/// probability `p` and the others scaled by `1/(1 − p)`. Weight `(b, i, j)` (batch
/// element, query, key) is draw number [`dropout_counter`] of the counter-based
/// generator ([`crate::rng`], stream 0 of `seed`, as `rand`'s uniform draws) and is
/// dropped when its 24-bit uniform is below [`AttentionDropout::threshold`]: an exact
/// integer test, so every kernel, and the primitive spelling (a `rand` of the weights'
/// dims compared with `p`), drop the same weights. A run mixes `seed` with its step's
/// seed as it does `rand`'s ([`crate::op::Op::with_seed`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDropout {
    /// The probability of dropping a weight, in [0, 1).
    pub p: f64,
    /// The seed of the draws.
    pub seed: u64,
}

impl AttentionDropout {
    /// A weight whose draw's 24 bits are below this is dropped: `⌈p·2²⁴⌉`.
    pub fn threshold(&self) -> u32 {
        (self.p * DRAWS).ceil() as u32
    }

    /// What a kept weight is multiplied by: `1/(1 − p)`.
    pub fn keep_scale(&self) -> f64 {
        1.0 / (1.0 - self.p)
    }

    /// The generator's key for this dropout's draws.
    pub fn key(&self) -> u32 {
        crate::rng::stream_key(self.seed, 0)
    }

    /// The factor of weight number `counter` ([`dropout_counter`]): [`Self::keep_scale`]
    /// when it is kept, else 0.
    pub fn factor(&self, counter: u32) -> f64 {
        if crate::rng::bits(self.key(), counter) >> 8 >= self.threshold() {
            self.keep_scale()
        } else {
            0.0
        }
    }

    /// The probability the primitive spelling compares draws with: `p` rounded up to a
    /// multiple of 2⁻²⁴ (exact in every float dtype), so that it drops what
    /// [`Self::threshold`] drops.
    pub fn drawn_p(&self) -> f64 {
        self.threshold() as f64 / DRAWS
    }
}

/// The draw number of weight `(b, i, j)` of attention with `tq` queries and `tk` keys:
/// the weights in row-major order. [`attention_meta`] refuses attentions with more
/// than 2³² weights, so it fits.
pub const fn dropout_counter(b: usize, i: usize, j: usize, tq: usize, tk: usize) -> u32 {
    ((b * tq + i) * tk + j) as u32
}

/// Which input of attention a gradient op returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionInput {
    /// The queries `q`.
    Query,
    /// The keys `k`.
    Key,
    /// The values `v`.
    Value,
}

impl AttentionInput {
    /// The three, in the order of the op's inputs.
    pub const ALL: [AttentionInput; 3] = [
        AttentionInput::Query,
        AttentionInput::Key,
        AttentionInput::Value,
    ];

    /// The input's name in plans and messages: `q`, `k`, `v`.
    pub const fn name(self) -> &'static str {
        match self {
            AttentionInput::Query => "q",
            AttentionInput::Key => "k",
            AttentionInput::Value => "v",
        }
    }

    /// Its position among the op's inputs.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The dtype the row statistics (`lse`, `delta`) are kept in for inputs of `dtype`: f32
/// for the half floats (a bf16 log-sum-exp would lose the probabilities' digits), else
/// the inputs' own.
pub fn stats_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// The result of attention over `q [.., Tq, E]`, `k [.., Tk, E]`, `v [.., Tk, Ev]`:
/// `[.., Tq, Ev]` in their dtype. The batch dims of the three are one and the same
/// (no broadcasting), their dtype one float dtype.
pub fn attention_meta<D: SymDim>(
    name: &'static str,
    spec: &AttentionSpec,
    q: &TensorMeta<D>,
    k: &TensorMeta<D>,
    v: &TensorMeta<D>,
) -> Result<TensorMeta<D>> {
    let shapes = || {
        format!(
            "q {}, k {}, v {}",
            fmt_dims(&q.dims),
            fmt_dims(&k.dims),
            fmt_dims(&v.dims)
        )
    };
    if q.dtype != k.dtype || q.dtype != v.dtype {
        return Err(Error::dtype(
            name,
            format!(
                "q, k and v must share a dtype, got {}, {} and {}",
                q.dtype, k.dtype, v.dtype
            ),
        ));
    }
    if !q.dtype.is_float() {
        return Err(Error::dtype(
            name,
            format!("attends over floats, not {}", q.dtype),
        ));
    }
    let r = q.dims.len();
    if r < 2 || k.dims.len() != r || v.dims.len() != r {
        return Err(Error::shape(
            name,
            format!(
                "q, k and v must be [.., T, E] of one rank (2 or more), got {}",
                shapes()
            ),
        ));
    }
    let differ = |a: &D, b: &D| a.matches(b) == Some(false);
    let batch_differs =
        (0..r - 2).any(|i| differ(&q.dims[i], &k.dims[i]) || differ(&q.dims[i], &v.dims[i]));
    if batch_differs {
        return Err(Error::shape(
            name,
            format!("q, k and v must share their batch dims, got {}", shapes()),
        ));
    }
    if differ(&q.dims[r - 1], &k.dims[r - 1]) {
        return Err(Error::shape(
            name,
            format!(
                "q and k must have one width ({} vs {}), got {}",
                q.dims[r - 1],
                k.dims[r - 1],
                shapes()
            ),
        ));
    }
    if differ(&k.dims[r - 2], &v.dims[r - 2]) {
        return Err(Error::shape(
            name,
            format!(
                "k and v must have one length ({} vs {}), got {}",
                k.dims[r - 2],
                v.dims[r - 2],
                shapes()
            ),
        ));
    }
    if spec.causal && differ(&q.dims[r - 2], &k.dims[r - 2]) {
        return Err(Error::shape(
            name,
            format!(
                "causal attention takes as many queries as keys ({} vs {}), got {}",
                q.dims[r - 2],
                k.dims[r - 2],
                shapes()
            ),
        ));
    }
    if !spec.scale.is_finite() {
        return Err(Error::invalid(
            name,
            format!("the scale must be finite, got {}", spec.scale),
        ));
    }
    if let Some(d) = spec.dropout {
        if !(0.0..1.0).contains(&d.p) {
            return Err(Error::invalid(
                name,
                format!("the dropout probability must be in [0, 1), got {}", d.p),
            ));
        }
        let lits: Option<Vec<usize>> = q.dims[..r - 1]
            .iter()
            .chain([&k.dims[r - 2]])
            .map(|d| d.as_lit())
            .collect();
        let fits = |sizes: Vec<usize>| {
            let weights = sizes.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            weights.is_some_and(|w| w <= 1 << 32)
        };
        // Run-time sizes are checked when they are known.
        if lits.is_some_and(|sizes| !fits(sizes)) {
            return Err(Error::invalid(
                name,
                format!(
                    "dropout draws one number per weight, and {} has more weights than the generator's 2^32 counter",
                    shapes()
                ),
            ));
        }
    }
    let mut dims = q.dims.clone();
    dims[r - 1] = v.dims[r - 1].clone();
    Ok(TensorMeta::new(dims, q.dtype))
}

/// The dims and dtype of a row statistic of queries `q [.., Tq, E]`: `[.., Tq, 1]`.
pub fn row_stats_meta<D: SymDim>(q: &TensorMeta<D>) -> TensorMeta<D> {
    let mut dims = q.dims.clone();
    if let Some(last) = dims.last_mut() {
        *last = D::lit(1);
    }
    TensorMeta::new(dims, stats_dtype(q.dtype))
}

/// The rule of [`Op::AttentionLse`]: queries and keys as attention takes them.
pub fn lse_meta<D: SymDim>(
    spec: &AttentionSpec,
    q: &TensorMeta<D>,
    k: &TensorMeta<D>,
) -> Result<TensorMeta<D>> {
    // Keys stand in for the values: the statistics need no values.
    attention_meta("attention_lse", spec, q, k, k)?;
    Ok(row_stats_meta(q))
}

/// The rule of [`Op::AttentionGrad`]: inputs q, k, v, the output's gradient, the row
/// log-sum-exp and `delta`; the result has the dims and dtype of input `wrt`.
pub fn grad_meta<D: SymDim>(
    spec: &AttentionSpec,
    wrt: AttentionInput,
    inputs: &[&TensorMeta<D>],
) -> Result<TensorMeta<D>> {
    let name = "attention_grad";
    let [q, k, v, g, lse, delta] = inputs else {
        return Err(Error::invalid(
            name,
            format!("takes 6 inputs, got {}", inputs.len()),
        ));
    };
    let out = attention_meta(name, spec, q, k, v)?;
    let same = |a: &TensorMeta<D>, b: &TensorMeta<D>| {
        a.dtype == b.dtype
            && a.dims.len() == b.dims.len()
            && a.dims
                .iter()
                .zip(&b.dims)
                .all(|(x, y)| x.matches(y) != Some(false))
    };
    if !same(g, &out) {
        return Err(Error::shape(
            name,
            format!(
                "the output's gradient must be {} {}, got {} {}",
                out.dtype,
                fmt_dims(&out.dims),
                g.dtype,
                fmt_dims(&g.dims)
            ),
        ));
    }
    let stats = row_stats_meta(q);
    for (what, m) in [("log-sum-exp", lse), ("delta", delta)] {
        if !same(m, &stats) {
            return Err(Error::shape(
                name,
                format!(
                    "the row {what} must be {} {}, got {} {}",
                    stats.dtype,
                    fmt_dims(&stats.dims),
                    m.dtype,
                    fmt_dims(&m.dims)
                ),
            ));
        }
    }
    Ok(inputs[wrt.index()].clone())
}

/// The gradients of attention's q, k and v given its inputs, its output `out` and the
/// output's gradient `g`: the row statistics recomputed ([`Op::AttentionLse`], which
/// dropout does not change),
/// `delta = Σ g·out` over the last axis, then one [`Op::AttentionGrad`] per input.
pub fn attention_vjp<G: Builder + ?Sized>(
    b: &mut G,
    spec: &AttentionSpec,
    x: &[&G::Value],
    out: &G::Value,
    g: &G::Value,
) -> Result<Vec<Option<G::Value>>> {
    let (q, k, v) = (x[0], x[1], x[2]);
    let lse = b.apply(Op::AttentionLse(spec.without_dropout()), &[q, k])?;
    let stats = stats_dtype(b.dtype(g));
    let (gs, os) = if stats == b.dtype(g) {
        (g.clone(), out.clone())
    } else {
        (b.cast(g, stats)?, b.cast(out, stats)?)
    };
    let prod = b.mul(&gs, &os)?;
    let last = b.rank(&prod) - 1;
    let delta = b.sum(&prod, &[last], true)?;
    AttentionInput::ALL
        .iter()
        .map(|&wrt| {
            b.apply(
                Op::AttentionGrad { spec: *spec, wrt },
                &[q, k, v, g, &lse, &delta],
            )
            .map(Some)
        })
        .collect()
}

/// Whether one pass of a kernel computes `ops` together, in this order: an
/// [`Op::Attention`] and the [`Op::AttentionLse`] of its queries and keys (the forward
/// pass has the undropped statistics whatever the dropout), or gradients of one
/// attention ([`Op::AttentionGrad`] of one spec) with respect to distinct inputs. Each
/// op reads the first of the first op's inputs (as many as it takes); the caller
/// checks that they are the same values.
pub fn one_pass<D>(ops: &[&Op<D>]) -> bool {
    match ops {
        [Op::Attention(spec), Op::AttentionLse(stats)] => spec.without_dropout() == *stats,
        [Op::AttentionGrad { spec, .. }, _, ..] => {
            let mut seen = [false; AttentionInput::ALL.len()];
            ops.iter().all(|op| match op {
                Op::AttentionGrad { spec: s, wrt } if s == spec && !seen[*wrt as usize] => {
                    seen[*wrt as usize] = true;
                    true
                }
                _ => false,
            })
        }
        _ => false,
    }
}

/// Attention written with primitives, as a user writes it by hand:
/// `dropout?(softmax(causal_mask?(q·kᵀ · scale))) · v` (the mask only when causal, the
/// dropout only with one; no product by the scale when it is 1). The fused op's
/// meaning, and what [`recognise`] finds. Half inputs have their scores and softmax in
/// f32 ([`stats_dtype`]), as the fused kernels do, and the weights cast back for the
/// product with the values.
pub fn attention_by_primitives<G: Builder + ?Sized>(
    b: &mut G,
    q: &G::Value,
    k: &G::Value,
    v: &G::Value,
    spec: &AttentionSpec,
) -> Result<G::Value> {
    let s = scores(b, q, k, spec)?;
    let last = b.rank(&s) - 1;
    let w = b.softmax(&s, last)?;
    let w = dropped(b, &w, spec)?;
    let values = b.dtype(v);
    let w = in_dtype(b, &w, values)?;
    b.apply(Op::MatMul, &[&w, v])
}

/// [`Op::AttentionLse`] written with primitives: the log-sum-exp of each query's
/// (masked) scores, `[.., Tq, 1]` in [`stats_dtype`].
pub fn lse_by_primitives<G: Builder + ?Sized>(
    b: &mut G,
    q: &G::Value,
    k: &G::Value,
    spec: &AttentionSpec,
) -> Result<G::Value> {
    let s = scores(b, q, k, spec)?;
    let last = b.rank(&s) - 1;
    b.logsumexp(&s, last, true)
}

/// [`Op::AttentionGrad`] written with primitives, from its six inputs (q, k, v, the
/// output's gradient, the row log-sum-exp and delta): the probabilities recomputed as
/// `exp(s − lse)`, then the formulas of this module's docs as batched products. The
/// scores go through memory: what a backend runs until it has a fused backward kernel,
/// and a second spelling of the math for the tests.
pub fn grad_by_primitives<G: Builder + ?Sized>(
    b: &mut G,
    spec: &AttentionSpec,
    wrt: AttentionInput,
    x: &[&G::Value],
) -> Result<G::Value> {
    let [q, k, v, g, lse, delta] = x else {
        return Err(Error::invalid(
            "attention_grad",
            format!("takes 6 inputs, got {}", x.len()),
        ));
    };
    let dtype = b.dtype(q);
    let s = scores(b, q, k, spec)?;
    let z = b.sub(&s, lse)?;
    let p = b.unary(UnaryOp::Exp, &z)?;
    if wrt == AttentionInput::Value {
        let p = dropped(b, &p, spec)?;
        let pt = b.t(&p)?;
        let pt = in_dtype(b, &pt, dtype)?;
        return b.apply(Op::MatMul, &[&pt, g]);
    }
    let vt = b.t(v)?;
    let dp = b.apply(Op::MatMul, &[g, &vt])?;
    let stats = b.dtype(&p);
    let dp = in_dtype(b, &dp, stats)?;
    let dp = dropped(b, &dp, spec)?;
    let centred = b.sub(&dp, delta)?;
    let ds = b.mul(&p, &centred)?;
    let ds = in_dtype(b, &ds, dtype)?;
    let product = if wrt == AttentionInput::Query {
        b.apply(Op::MatMul, &[&ds, k])?
    } else {
        let dst = b.t(&ds)?;
        b.apply(Op::MatMul, &[&dst, q])?
    };
    if spec.scale == 1.0 {
        return Ok(product);
    }
    b.mul_scalar(&product, spec.scale)
}

/// `w` (the weights' dims) with the spec's dropout applied: a `rand` of its dims
/// compared with [`AttentionDropout::drawn_p`] ([`BuilderExt::dropout`]); `w` itself
/// without dropout.
fn dropped<G: Builder + ?Sized>(b: &mut G, w: &G::Value, spec: &AttentionSpec) -> Result<G::Value> {
    match spec.dropout {
        Some(d) if d.threshold() > 0 => b.dropout_scaled(w, d.drawn_p(), d.keep_scale(), d.seed),
        _ => Ok(w.clone()),
    }
}

/// The scores `q·kᵀ · scale` in [`stats_dtype`], masked above the diagonal when causal.
fn scores<G: Builder + ?Sized>(
    b: &mut G,
    q: &G::Value,
    k: &G::Value,
    spec: &AttentionSpec,
) -> Result<G::Value> {
    let kt = b.t(k)?;
    let s = b.apply(Op::MatMul, &[q, &kt])?;
    let stats = stats_dtype(b.dtype(q));
    let mut s = in_dtype(b, &s, stats)?;
    if spec.scale != 1.0 {
        s = b.mul_scalar(&s, spec.scale)?;
    }
    if spec.causal {
        s = b.causal_mask(&s)?;
    }
    Ok(s)
}

/// `x` in `dtype`: itself when it has it, else a cast.
fn in_dtype<G: Builder + ?Sized>(b: &mut G, x: &G::Value, dtype: DType) -> Result<G::Value> {
    if b.dtype(x) == dtype {
        return Ok(x.clone());
    }
    b.cast(x, dtype)
}

/// Hand-written attention weights found in a recording builder: `w` is
/// `dropout?(softmax(causal_mask?(q·kᵀ ⊙ c)))` over its last axis, `⊙ c` a product by or
/// a division by a rank-0 constant, or nothing, and the dropout
/// [`BuilderExt::dropout`]'s spelling in f32 or f64.
#[derive(Clone, Debug)]
pub struct Recognised<V> {
    /// The queries.
    pub q: V,
    /// The keys' transpose, `kᵀ` as the product read it (the keys are its transpose).
    pub kt: V,
    /// The scale and the mask.
    pub spec: AttentionSpec,
}

/// Whether `w` holds attention weights computed by hand (see [`Recognised`]), reading the
/// graph a recording builder keeps ([`Builder::producer`]); `None` for anything else and
/// for every builder that runs ops as they come. The product may be narrowed by the
/// builder's precision policy (casts of its operands and its result); the softmax and
/// the mask must be [`BuilderExt::softmax`] and [`BuilderExt::causal_mask`] as they
/// are written, which the tests hold to [`attention_by_primitives`].
pub fn recognise<G: Builder + ?Sized>(b: &G, w: &G::Value) -> Option<Recognised<G::Value>> {
    if let Some((weights, dropout)) = undrop(b, w) {
        let found = recognise_softmax(b, &weights)?;
        return Some(Recognised {
            spec: AttentionSpec {
                dropout: Some(dropout),
                ..found.spec
            },
            ..found
        });
    }
    recognise_softmax(b, w)
}

/// [`recognise`] without dropout.
fn recognise_softmax<G: Builder + ?Sized>(b: &G, w: &G::Value) -> Option<Recognised<G::Value>> {
    // softmax(x) = e / Σe, e = exp(x − max x), over the last axis.
    let (div, [e, total]) = producer::<G, 2>(b, w)?;
    let rank = b.meta(w).dims.len();
    let last = vec![rank.checked_sub(1)?];
    if div != Op::Binary(BinaryOp::Div) {
        return None;
    }
    let (sum, [e2]) = producer::<G, 1>(b, &total)?;
    if sum
        != (Op::Reduce {
            op: ReduceOp::Sum,
            axes: last.clone(),
        })
        || !b.same_value(&e, &e2)
    {
        return None;
    }
    let (exp, [z]) = producer::<G, 1>(b, &e)?;
    let (sub, [x, m]) = producer::<G, 2>(b, &z)?;
    if exp != Op::Unary(UnaryOp::Exp) || sub != Op::Binary(BinaryOp::Sub) {
        return None;
    }
    let (max, [x2]) = producer::<G, 1>(b, &m)?;
    if max
        != (Op::Reduce {
            op: ReduceOp::Max,
            axes: last,
        })
        || !b.same_value(&x, &x2)
    {
        return None;
    }
    let dtype = b.meta(&x).dtype;
    // The mask: `x + bias` where the bias is `causal_mask`'s own, built again here.
    let (scaled, causal) = match unmask(b, &x) {
        Some(y) => (y, true),
        None => (x, false),
    };
    let (product, scale) = unscale(b, &scaled);
    let (op, [qn, ktn]) = producer::<G, 2>(b, &narrowed_from(b, &product, dtype)?)?;
    if op != Op::MatMul {
        return None;
    }
    // Under a narrowing policy the operands are casts of the values the user multiplied.
    let half = b.meta(&qn).dtype;
    let (q, kt) = if half == dtype {
        (qn, ktn)
    } else {
        (narrowed_from(b, &qn, half)?, narrowed_from(b, &ktn, half)?)
    };
    if b.meta(&q).dtype != dtype || b.meta(&kt).dtype != dtype {
        return None;
    }
    Some(Recognised {
        q,
        kt,
        spec: AttentionSpec::new(scale, causal),
    })
}

/// `(w, dropout)` when `x` is `w` through [`BuilderExt::dropout`]'s spelling
/// (`rand >= p ? w·scale : 0`, the draw uniform on [0, 1) of `w`'s dims and dtype, f32
/// or f64, and the scale `1/(1 − p)`): the dropout with the `p` its comparison in that
/// dtype tests.
fn undrop<G: Builder + ?Sized>(b: &G, x: &G::Value) -> Option<(G::Value, AttentionDropout)> {
    let (select, [keep, scaled, zero]) = producer::<G, 3>(b, x)?;
    let (compare, [r, p]) = producer::<G, 2>(b, &keep)?;
    let (mul, [w, scale]) = producer::<G, 2>(b, &scaled)?;
    if select != Op::Where
        || compare != Op::Compare(CmpOp::Ge)
        || mul != Op::Binary(BinaryOp::Mul)
        || constant(b, &zero)? != 0.0
    {
        return None;
    }
    let (Op::Rand { dist, seed, .. }, _) = b.producer(&r)? else {
        return None;
    };
    let meta = b.meta(&w);
    let uniform = dist
        == RandDist::Uniform {
            low: 0.0,
            high: 1.0,
        };
    if !uniform || b.meta(&r) != meta || !matches!(meta.dtype, DType::F32 | DType::F64) {
        return None;
    }
    let p = constant(b, &p)?;
    // The comparison runs in the draw's dtype.
    let p = if meta.dtype == DType::F32 {
        p as f32 as f64
    } else {
        p
    };
    let dropout = AttentionDropout { p, seed };
    let scale = constant(b, &scale)?;
    let is_dropout = (0.0..1.0).contains(&p) && (scale / dropout.keep_scale() - 1.0).abs() < 1e-4;
    is_dropout.then_some((w, dropout))
}

/// The value of `c` when it is a rank-0 constant (`full` of no dims).
fn constant<G: Builder + ?Sized>(b: &G, c: &G::Value) -> Option<f64> {
    match b.producer(c)?.0 {
        Op::Full {
            ref dims, value, ..
        } if dims.is_empty() => Some(value),
        _ => None,
    }
}

/// An op and its `N` inputs.
type ProducedN<D, V, const N: usize> = (Op<D>, [V; N]);

/// The op and the `N` inputs that made `v`, if a recording builder knows them.
fn producer<G: Builder + ?Sized, const N: usize>(
    b: &G,
    v: &G::Value,
) -> Option<ProducedN<G::Dim, G::Value, N>> {
    let (op, inputs) = b.producer(v)?;
    Some((op, inputs.try_into().ok()?))
}

/// `v` through the casts the builder's precision policy puts around a narrowed product:
/// for `wanted` f32 the product's result cast back to f32, for a half dtype an operand
/// cast down from f32. `v` itself when there is no cast; `None` when there is one the
/// policy would not have made (a cast the user wrote).
fn narrowed_from<G: Builder + ?Sized>(b: &G, v: &G::Value, wanted: DType) -> Option<G::Value> {
    let Some((Op::Cast { dtype }, [inner])) = producer::<G, 1>(b, v) else {
        return Some(v.clone());
    };
    let from = b.meta(&inner).dtype;
    let policy = b
        .precision()
        .narrowed(&Op::<G::Dim>::MatMul, &[DType::F32, DType::F32]);
    let fits = if wanted == DType::F32 {
        dtype == DType::F32 && Some(from) == policy
    } else {
        dtype == wanted && from == DType::F32 && policy == Some(wanted)
    };
    fits.then_some(inner)
}

/// `y` when `x` is `causal_mask(y)`: `y + bias` with `bias` what
/// [`BuilderExt::causal_mask`] adds to scores of `y`'s dims, built again in a scratch
/// graph and compared op by op.
fn unmask<G: Builder + ?Sized>(b: &G, x: &G::Value) -> Option<G::Value> {
    let (add, [y, bias]) = producer::<G, 2>(b, x)?;
    if add != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let meta = b.meta(&y);
    let mut scratch = crate::ir::Graph::<G::Dim>::new();
    let leaf = scratch.leaf(0, meta.dims, meta.dtype);
    let masked = scratch.causal_mask(&leaf).ok()?;
    let wanted = scratch.nodes[masked].inputs[1];
    same_tree(b, &bias, &scratch, wanted).then_some(y)
}

/// Whether `v` was computed by the same ops, from no outside values, as `node` of `g`.
fn same_tree<G: Builder + ?Sized>(
    b: &G,
    v: &G::Value,
    g: &crate::ir::Graph<G::Dim>,
    node: usize,
) -> bool {
    let crate::ir::NodeKind::Op(want) = &g.nodes[node].kind else {
        return false;
    };
    let Some((op, inputs)) = b.producer(v) else {
        return false;
    };
    op == *want
        && inputs.len() == g.nodes[node].inputs.len()
        && inputs
            .iter()
            .zip(&g.nodes[node].inputs)
            .all(|(i, &n)| same_tree(b, i, g, n))
}

/// `x` without a product by, or a division by, a finite nonzero rank-0 constant, with
/// the scale that takes it back; `(x, 1)` when there is none.
fn unscale<G: Builder + ?Sized>(b: &G, x: &G::Value) -> (G::Value, f64) {
    let found = producer::<G, 2>(b, x).and_then(|(op, [p, c])| {
        let value = constant(b, &c)?;
        let scale = match op {
            Op::Binary(BinaryOp::Mul) => value,
            Op::Binary(BinaryOp::Div) => 1.0 / value,
            _ => return None,
        };
        (scale.is_finite() && scale != 0.0).then_some((p, scale))
    });
    found.unwrap_or_else(|| (x.clone(), 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Graph, NodeKind};
    use crate::Precision;

    /// A graph recorded under a precision policy, as the macro records a model's.
    struct Recording {
        graph: Graph<usize>,
        policy: Precision,
    }

    impl Builder for Recording {
        type Dim = usize;
        type Value = usize;
        fn apply(&mut self, op: Op<usize>, inputs: &[&usize]) -> Result<usize> {
            self.policy
                .apply(self, op, inputs, |r, op, inputs| r.graph.apply(op, inputs))
        }
        fn meta(&self, v: &usize) -> TensorMeta<usize> {
            self.graph.meta(v)
        }
        fn producer(&self, v: &usize) -> Option<(Op<usize>, Vec<usize>)> {
            self.graph.producer(v)
        }
        fn same_value(&self, a: &usize, b: &usize) -> bool {
            a == b
        }
        fn precision(&self) -> Precision {
            self.policy
        }
    }

    /// q `[2, 3, 5, 4]`, k `[2, 3, 5, 4]`, v `[2, 3, 5, 6]` as leaves.
    fn recording(policy: Precision) -> (Recording, [usize; 3]) {
        let mut graph = Graph::new();
        let q = graph.leaf(0, vec![2, 3, 5, 4], DType::F32);
        let k = graph.leaf(1, vec![2, 3, 5, 4], DType::F32);
        let v = graph.leaf(2, vec![2, 3, 5, 6], DType::F32);
        (Recording { graph, policy }, [q, k, v])
    }

    /// How a user writes the scores' scale.
    #[derive(Clone, Copy, Debug)]
    enum Scaled {
        Times(f64),
        Over(f64),
        Not,
    }

    /// Hand-written attention weights, as the GPT's `CausalSelfAttention` writes them.
    fn weights(b: &mut Recording, q: usize, k: usize, scaled: Scaled, causal: bool) -> usize {
        let kt = b.t(&k).unwrap();
        let mut s = b.matmul(&q, &kt).unwrap();
        s = match scaled {
            Scaled::Times(c) => b.mul_scalar(&s, c).unwrap(),
            Scaled::Over(c) => {
                let c = b.scalar_like(&s, c).unwrap();
                b.div(&s, &c).unwrap()
            }
            Scaled::Not => s,
        };
        if causal {
            s = b.causal_mask(&s).unwrap();
        }
        b.softmax(&s, 3).unwrap()
    }

    fn op_of(b: &Recording, v: usize) -> Op<usize> {
        match &b.graph.nodes[v].kind {
            NodeKind::Op(op) => op.clone(),
            other => panic!("not an op: {other:?}"),
        }
    }

    #[test]
    fn hand_written_attention_becomes_the_fused_op() {
        let cases = [
            (Scaled::Times(0.5), true, 0.5),
            (Scaled::Over(2.0), true, 0.5),
            (Scaled::Not, true, 1.0),
            (Scaled::Times(-0.25), false, -0.25),
            (Scaled::Over(8f64.sqrt()), false, 1.0 / 8f64.sqrt()),
        ];
        for policy in Precision::ALL {
            for (scaled, causal, scale) in cases {
                let (mut b, [q, k, v]) = recording(policy);
                let w = weights(&mut b, q, k, scaled, causal);
                let found = recognise(&b, &w).expect("recognised");
                assert_eq!(found.q, q, "{scaled:?} {causal} {policy}");
                assert_eq!(found.spec, AttentionSpec::new(scale, causal));
                let out = b.matmul(&w, &v).unwrap();
                assert_eq!(b.meta(&out), TensorMeta::new(vec![2, 3, 5, 6], DType::F32));
                // Under bf16 or f16 the op is the policy's: its inputs and result cast.
                let fused = match policy.half() {
                    None => out,
                    Some(half) => {
                        assert_eq!(op_of(&b, out), Op::Cast { dtype: DType::F32 });
                        let inner = b.graph.nodes[out].inputs[0];
                        assert_eq!(b.meta(&inner).dtype, half);
                        inner
                    }
                };
                assert_eq!(
                    op_of(&b, fused),
                    Op::Attention(AttentionSpec::new(scale, causal))
                );
            }
        }
    }

    #[test]
    fn the_primitive_spelling_is_what_is_recognised() {
        let dropout = Some(AttentionDropout { p: 0.25, seed: 9 });
        for causal in [false, true] {
            for dropout in [None, dropout] {
                let spec = AttentionSpec {
                    scale: 0.125,
                    causal,
                    dropout,
                };
                let (mut b, [q, k, v]) = recording(Precision::F32);
                let out = attention_by_primitives(&mut b, &q, &k, &v, &spec).unwrap();
                let w = b.graph.nodes[out].inputs[0];
                let found = recognise(&b, &w).expect("recognised");
                assert_eq!((found.q, found.spec), (q, spec));
            }
        }
    }

    #[test]
    fn dropout_on_hand_written_weights_is_the_fused_ops() {
        for policy in Precision::ALL {
            let (mut b, [q, k, v]) = recording(policy);
            let w = weights(&mut b, q, k, Scaled::Times(0.5), true);
            let dropped = b.dropout(&w, 0.1, 7).unwrap();
            let found = recognise(&b, &dropped).expect("recognised");
            // The comparison runs in f32: `p` as that dtype holds it.
            let dropout = AttentionDropout {
                p: 0.1f32 as f64,
                seed: 7,
            };
            assert_eq!(found.spec.dropout, Some(dropout), "{policy}");
            let out = b.matmul(&dropped, &v).unwrap();
            if policy == Precision::F32 {
                let spec = AttentionSpec {
                    dropout: Some(dropout),
                    ..AttentionSpec::new(0.5, true)
                };
                assert_eq!(op_of(&b, out), Op::Attention(spec));
            }
        }
        // A select that scales by something other than 1/(1 − p) is not dropout.
        let (mut b, [q, k, _]) = recording(Precision::F32);
        let w = weights(&mut b, q, k, Scaled::Not, false);
        let odd = b.dropout_scaled(&w, 0.5, 3.0, 1).unwrap();
        assert!(recognise(&b, &odd).is_none());
        // Nor is one whose draw is normal.
        let r = b
            .rand(
                vec![2, 3, 5, 5],
                RandDist::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
                1,
                DType::F32,
            )
            .unwrap();
        let half = b.scalar_like(&w, 0.5).unwrap();
        let keep = b.compare(CmpOp::Ge, &r, &half).unwrap();
        let scaled = b.mul_scalar(&w, 2.0).unwrap();
        let zero = b.scalar_like(&w, 0.0).unwrap();
        let normal = b.select(&keep, &scaled, &zero).unwrap();
        assert!(recognise(&b, &normal).is_none());
    }

    #[test]
    fn seeds_of_draws_are_the_ops_own() {
        let dropped = AttentionSpec {
            dropout: Some(AttentionDropout { p: 0.5, seed: 4 }),
            ..AttentionSpec::new(1.0, false)
        };
        let op = Op::<usize>::AttentionGrad {
            spec: dropped,
            wrt: AttentionInput::Key,
        };
        assert_eq!(op.seed(), Some(4));
        assert_eq!(op.with_seed(11).seed(), Some(11));
        let plain = Op::<usize>::Attention(AttentionSpec::new(1.0, false));
        assert_eq!(plain.seed(), None);
        assert_eq!(plain.with_seed(3), plain);
    }

    #[test]
    fn other_weights_stay_products() {
        let (mut b, [q, k, v]) = recording(Precision::F32);
        let kt = b.t(&k).unwrap();
        let s = b.matmul(&q, &kt).unwrap();
        // Softmax over the queries' axis.
        let w = b.softmax(&s, 2).unwrap();
        assert!(recognise(&b, &w).is_none());
        // A mask that is not causal_mask's: the scores plus scores.
        let biased = b.add(&s, &s).unwrap();
        let w = b.softmax(&biased, 3).unwrap();
        assert!(recognise(&b, &w).is_none());
        // Scaled by a tensor, not a constant.
        let by_tensor = b.mul(&s, &s).unwrap();
        let w = b.softmax(&by_tensor, 3).unwrap();
        let found = recognise(&b, &w);
        assert!(found.is_none(), "{found:?}");
        // A cast the user wrote (no policy narrows this product).
        let qh = b.cast(&q, DType::BF16).unwrap();
        let kh = b.cast(&kt, DType::BF16).unwrap();
        let sh = b.matmul(&qh, &kh).unwrap();
        let s32 = b.cast(&sh, DType::F32).unwrap();
        let w = b.softmax(&s32, 3).unwrap();
        assert!(recognise(&b, &w).is_none());
        // A product by a zero scale is not attention's.
        let zero = b.mul_scalar(&s, 0.0).unwrap();
        let w = b.softmax(&zero, 3).unwrap();
        assert!(recognise(&b, &w).is_none());
        // Weights of the wrong length for the values stay a product (and its error).
        let w = weights(&mut b, q, k, Scaled::Not, true);
        let short = b.graph.leaf(3, vec![2, 3, 4, 6], DType::F32);
        assert!(b.matmul(&w, &short).is_err());
        let out = b.matmul(&w, &v).unwrap();
        assert!(matches!(op_of(&b, out), Op::Attention(_)));
    }

    #[test]
    fn the_rule_names_each_mismatch() {
        let spec = AttentionSpec::new(1.0, true);
        let m = |d: &[usize]| TensorMeta::new(d.to_vec(), DType::F32);
        let msg = |q: &[usize], k: &[usize], v: &[usize], spec: &AttentionSpec| {
            attention_meta("attention", spec, &m(q), &m(k), &m(v))
                .unwrap_err()
                .to_string()
        };
        let e = msg(&[2, 5, 4], &[2, 5, 3], &[2, 5, 4], &spec);
        assert!(e.contains("one width (4 vs 3)"), "{e}");
        let e = msg(&[2, 5, 4], &[2, 5, 4], &[2, 6, 4], &spec);
        assert!(e.contains("one length (5 vs 6)"), "{e}");
        let e = msg(&[2, 5, 4], &[2, 6, 4], &[2, 6, 4], &spec);
        assert!(e.contains("as many queries as keys (5 vs 6)"), "{e}");
        let e = msg(&[2, 5, 4], &[3, 5, 4], &[3, 5, 4], &spec);
        assert!(e.contains("share their batch dims"), "{e}");
        let e = msg(&[5], &[5], &[5], &spec);
        assert!(e.contains("one rank (2 or more)"), "{e}");
        let nan = AttentionSpec::new(f64::NAN, false);
        let e = msg(&[2, 5, 4], &[2, 5, 4], &[2, 5, 4], &nan);
        assert!(e.contains("scale must be finite"), "{e}");
        let with_p = |p: f64| AttentionSpec {
            dropout: Some(AttentionDropout { p, seed: 0 }),
            ..AttentionSpec::new(1.0, false)
        };
        for p in [1.0, -0.1, f64::NAN] {
            let e = msg(&[2, 5, 4], &[2, 5, 4], &[2, 5, 4], &with_p(p));
            assert!(e.contains("dropout probability must be in [0, 1)"), "{e}");
        }
        let e = msg(&[4, 65536, 4], &[4, 16385, 4], &[4, 16385, 4], &with_p(0.1));
        assert!(e.contains("2^32 counter"), "{e}");
        assert!(attention_meta(
            "attention",
            &with_p(0.1),
            &m(&[4, 65536, 4]),
            &m(&[4, 16384, 4]),
            &m(&[4, 16384, 4])
        )
        .is_ok());
        let ok = AttentionSpec {
            causal: false,
            ..spec
        };
        let out = attention_meta(
            "attention",
            &ok,
            &m(&[2, 5, 4]),
            &m(&[2, 7, 4]),
            &m(&[2, 7, 3]),
        );
        assert_eq!(out.unwrap(), m(&[2, 5, 3]));
        let ints = TensorMeta::new(vec![2, 2], DType::I32);
        let e = attention_meta("attention", &ok, &ints, &ints, &ints)
            .unwrap_err()
            .to_string();
        assert!(e.contains("attends over floats"), "{e}");
    }
}
