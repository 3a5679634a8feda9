//! `Builder`: anything that can take primitive ops, whether it runs them now (the eager
//! executor), records them symbolically (the `#[model]` macro, the fusion JIT) or tapes
//! them for gradients. Composite ops (softmax, layer norm, cross-entropy, conv2d...)
//! are written once here, over `Builder`, so every path gets the same definition and
//! autodiff and fusion see only primitives.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::op::{
    fmt_dims, BinaryOp, CmpOp, Op, RandDist, ReduceOp, SymDim, TensorMeta, UnaryOp, Window2d,
};

/// An op and the inputs it was applied to, as a recording builder keeps them.
pub type Produced<D, V> = (Op<D>, Vec<V>);

/// A sink for primitive ops.
pub trait Builder {
    /// How this builder represents sizes.
    type Dim: SymDim;
    /// How this builder represents a tensor.
    type Value: Clone;
    /// Applies one primitive op to its inputs (source ops take none).
    fn apply(&mut self, op: Op<Self::Dim>, inputs: &[&Self::Value]) -> Result<Self::Value>;
    /// The dims and dtype of a value.
    fn meta(&self, v: &Self::Value) -> TensorMeta<Self::Dim>;
    /// Checks a composite's or a layer's inputs (see [`Guard`]). A builder whose dims
    /// can be symbolic also keeps the guard, to run again once the sizes are numbers.
    fn guard(&mut self, guard: Guard, inputs: &[&Self::Value]) -> Result<()> {
        let metas: Vec<TensorMeta<Self::Dim>> = inputs.iter().map(|v| self.meta(v)).collect();
        guard.check(&metas.iter().collect::<Vec<_>>())
    }
    /// The op and the inputs that made `v`, where this builder keeps the graph it
    /// records (the macro's, the dynamic path's): what
    /// [`recognise`](crate::attention::recognise) reads to find attention written by
    /// hand. `None` (the default) for builders that run ops as they come.
    fn producer(&self, v: &Self::Value) -> Option<Produced<Self::Dim, Self::Value>> {
        let _ = v;
        None
    }
    /// Whether `a` and `b` are one value of the recorded graph (see
    /// [`Builder::producer`]); the default cannot tell and says no.
    fn same_value(&self, a: &Self::Value, b: &Self::Value) -> bool {
        let _ = (a, b);
        false
    }
    /// The precision policy this builder applies ops under (the default: each op in
    /// its inputs' dtype).
    fn precision(&self) -> crate::Precision {
        crate::Precision::F32
    }
    /// A rank-0 constant `1/n` of `like`'s dtype, for means. The default needs `n` to
    /// be literal; a symbolic builder overrides it to compute `1/n` when `n` is known.
    fn recip_dim(&mut self, like: &Self::Value, n: &Self::Dim) -> Result<Self::Value> {
        let dtype = self.meta(like).dtype;
        match n.as_lit() {
            Some(n) => self.apply(Op::recip_count(n, dtype), &[]),
            None => Err(Error::invalid(
                "mean",
                format!("the size {n} must be known to take a mean"),
            )),
        }
    }
}

/// The primitives under readable names, and the composites built from them. Every
/// method is a default method, so any `Builder` gets all of them.
pub trait BuilderExt: Builder {
    /// The dims of a value.
    fn dims(&self, v: &Self::Value) -> Vec<Self::Dim> {
        self.meta(v).dims
    }
    /// The dtype of a value.
    fn dtype(&self, v: &Self::Value) -> DType {
        self.meta(v).dtype
    }
    /// The rank of a value.
    fn rank(&self, v: &Self::Value) -> usize {
        self.meta(v).dims.len()
    }

    // ---- primitives -------------------------------------------------------------

    /// An elementwise unary op.
    fn unary(&mut self, op: UnaryOp, x: &Self::Value) -> Result<Self::Value> {
        self.apply(Op::Unary(op), &[x])
    }
    /// An elementwise binary op, broadcasting.
    fn binary(&mut self, op: BinaryOp, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.apply(Op::Binary(op), &[a, b])
    }
    /// An elementwise binary op as a user writes it (`a - b` in a model body,
    /// `a.sub(&b)` on a tensor): broadcasting as [`BuilderExt::binary`], but never
    /// expanding both operands ([`Guard::Broadcast`], checked again at run time where a
    /// `Dyn` leaves it open). Compositions call `binary`.
    fn checked_binary(
        &mut self,
        op: BinaryOp,
        a: &Self::Value,
        b: &Self::Value,
    ) -> Result<Self::Value> {
        self.guard(Guard::Broadcast { op }, &[a, b])?;
        self.binary(op, a, b)
    }
    /// a + b
    fn add(&mut self, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.binary(BinaryOp::Add, a, b)
    }
    /// a - b
    fn sub(&mut self, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.binary(BinaryOp::Sub, a, b)
    }
    /// a * b
    fn mul(&mut self, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// a / b
    fn div(&mut self, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.binary(BinaryOp::Div, a, b)
    }
    /// An elementwise comparison (bool result).
    fn compare(&mut self, op: CmpOp, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.apply(Op::Compare(op), &[a, b])
    }
    /// `cond ? a : b`.
    fn select(
        &mut self,
        cond: &Self::Value,
        a: &Self::Value,
        b: &Self::Value,
    ) -> Result<Self::Value> {
        self.apply(Op::Where, &[cond, a, b])
    }
    /// A reduction over `axes`; `keepdim` keeps them as size 1.
    fn reduce(
        &mut self,
        op: ReduceOp,
        x: &Self::Value,
        axes: &[usize],
        keepdim: bool,
    ) -> Result<Self::Value> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        let kept = self.apply(
            Op::Reduce {
                op,
                axes: axes.clone(),
            },
            &[x],
        )?;
        if keepdim {
            return Ok(kept);
        }
        let dims: Vec<Self::Dim> = self
            .dims(&kept)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, d)| d)
            .collect();
        self.reshape(&kept, dims)
    }
    /// Σ over `axes`.
    fn sum(&mut self, x: &Self::Value, axes: &[usize], keepdim: bool) -> Result<Self::Value> {
        self.reduce(ReduceOp::Sum, x, axes, keepdim)
    }
    /// Maximum over `axes`.
    fn max(&mut self, x: &Self::Value, axes: &[usize], keepdim: bool) -> Result<Self::Value> {
        self.reduce(ReduceOp::Max, x, axes, keepdim)
    }
    /// Index of the maximum along `axis` (i32).
    fn argmax(&mut self, x: &Self::Value, axis: usize, keepdim: bool) -> Result<Self::Value> {
        self.reduce(ReduceOp::ArgMax, x, &[axis], keepdim)
    }
    /// Same elements, new dims.
    fn reshape(&mut self, x: &Self::Value, dims: Vec<Self::Dim>) -> Result<Self::Value> {
        self.apply(Op::Reshape { dims }, &[x])
    }
    /// Same elements, new dims, at most one of them open (`None`): solved from the
    /// element count (`op::solve_reshape`'s rule; a symbolic builder leaves it to the
    /// run when the sizes are not numbers yet). An open leading size keeps rows whole
    /// ([`Guard::WholeRows`]); [`BuilderExt::regroup`] is the reshape that regroups them.
    fn reshape_open(
        &mut self,
        x: &Self::Value,
        dims: Vec<Option<Self::Dim>>,
    ) -> Result<Self::Value> {
        let leading_open = dims.first().is_some_and(Option::is_none);
        let y = self.regroup(x, dims)?;
        if leading_open {
            self.guard(Guard::WholeRows, &[x, &y])?;
        }
        Ok(y)
    }
    /// Same elements, new dims, at most one of them open: [`BuilderExt::reshape_open`]
    /// without its whole-rows rule, for a reshape that regroups rows on purpose
    /// (`[2, 10]` into `[5, 4]`).
    fn regroup(&mut self, x: &Self::Value, dims: Vec<Option<Self::Dim>>) -> Result<Self::Value> {
        let from = self.dims(x);
        let open = dims.iter().filter(|d| d.is_none()).count();
        let known: Vec<Self::Dim> = dims.iter().flatten().cloned().collect();
        if open == 0 {
            return self.reshape(x, known);
        }
        if open > 1 {
            let target: Vec<String> = dims
                .iter()
                .map(|d| d.as_ref().map_or("?".to_string(), |d| d.to_string()))
                .collect();
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape {} into [{}]: {open} sizes are left open, at most one can be (it is solved from the element count)",
                    fmt_dims(&from),
                    target.join(", ")
                ),
            ));
        }
        crate::op::check_kept_rows(&from, &dims)?;
        let inputs: Vec<&Self::Dim> = from.iter().chain(&known).collect();
        let lits: Vec<Option<usize>> = dims.iter().map(|d| d.as_ref().map(|_| 0)).collect();
        let solved = Self::Dim::derive(&inputs, "reshape", |sizes| {
            let (from, known) = sizes.split_at(from.len());
            let mut known = known.iter();
            let to: Vec<Option<usize>> = lits
                .iter()
                .map(|d| d.map(|_| *known.next().expect("one size per known dim")))
                .collect();
            let out = crate::op::solve_reshape(from, &to)?;
            Ok(out[to.iter().position(Option::is_none).expect("one open dim")])
        })?;
        let dims = dims
            .into_iter()
            .map(|d| d.unwrap_or_else(|| solved.clone()))
            .collect();
        self.reshape(x, dims)
    }
    /// `[N, ..]` as `[N, rest]`: every axis after the first merged into one.
    fn flatten(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let dims = self.dims(x);
        let Some((first, rest)) = dims.split_first() else {
            return Err(Error::shape(
                "flatten",
                "cannot flatten a scalar".to_string(),
            ));
        };
        let rest = rest.iter().fold(Self::Dim::lit(1), |a, d| a.mul(d));
        self.reshape(x, vec![first.clone(), rest])
    }
    /// Swaps the last two axes (a matrix's transpose, batched over the others).
    fn t(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let dims = self.dims(x);
        let r = dims.len();
        if r < 2 {
            return Err(Error::shape(
                "t",
                format!(
                    "swaps the last two axes, but the tensor has shape {}",
                    fmt_dims(&dims)
                ),
            ));
        }
        self.transpose(x, r - 2, r - 1)
    }
    /// Reorders dims.
    fn permute(&mut self, x: &Self::Value, perm: &[usize]) -> Result<Self::Value> {
        self.apply(
            Op::Permute {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }
    /// Swaps two axes.
    fn transpose(&mut self, x: &Self::Value, a: usize, b: usize) -> Result<Self::Value> {
        let r = self.rank(x);
        if a >= r || b >= r {
            return Err(Error::invalid(
                "transpose",
                format!("axes {a} and {b} on a rank-{r} tensor"),
            ));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(a, b);
        self.permute(x, &perm)
    }
    /// Broadcasts to `dims`.
    fn expand(&mut self, x: &Self::Value, dims: Vec<Self::Dim>) -> Result<Self::Value> {
        self.apply(Op::Expand { dims }, &[x])
    }
    /// Broadcasts to `dims`, where `None` keeps the input's size on that axis (axes
    /// aligned on the right, PyTorch's `expand(-1, ..)`): the explicit form of an
    /// expansion, such as one side of an outer product.
    fn expand_open(
        &mut self,
        x: &Self::Value,
        dims: Vec<Option<Self::Dim>>,
    ) -> Result<Self::Value> {
        let from = self.dims(x);
        let new = dims.len().saturating_sub(from.len());
        let mut to = Vec::with_capacity(dims.len());
        for (i, d) in dims.iter().enumerate() {
            match (d, i.checked_sub(new)) {
                (Some(d), _) => to.push(d.clone()),
                (None, Some(j)) => to.push(from[j].clone()),
                (None, None) => {
                    return Err(Error::shape(
                        "broadcast_to",
                        format!(
                            "axis {i} of the target is new to {}, so it needs a size, not `Dyn`",
                            fmt_dims(&from)
                        ),
                    ))
                }
            }
        }
        self.expand(x, to)
    }
    /// Elements `start..end` along `axis`.
    fn slice(
        &mut self,
        x: &Self::Value,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<Self::Value> {
        self.apply(
            Op::Slice {
                axis,
                start,
                end,
                step: 1,
            },
            &[x],
        )
    }
    /// `len` elements from `start` along `axis` (`x.narrow::<AXIS, START, LEN>()`).
    fn narrow(
        &mut self,
        x: &Self::Value,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Result<Self::Value> {
        let end = start
            .checked_add(len)
            .ok_or_else(|| Error::invalid("narrow", format!("{start} + {len} overflows a size")))?;
        self.slice(x, axis, start, end)
    }
    /// Joins values along `axis`.
    fn concat(&mut self, xs: &[&Self::Value], axis: usize) -> Result<Self::Value> {
        self.apply(Op::Concat { axis }, xs)
    }
    /// Pads `axis` with `before`/`after` elements of `value`.
    fn pad(
        &mut self,
        x: &Self::Value,
        axis: usize,
        before: usize,
        after: usize,
        value: f64,
    ) -> Result<Self::Value> {
        self.apply(
            Op::Pad {
                axis,
                before,
                after,
                value,
            },
            &[x],
        )
    }
    /// Batched matrix product. Where the builder records a graph, attention weights
    /// written by hand ([`recognise`](crate::attention::recognise)) times the values
    /// become one [`Op::Attention`] instead (the weights stay in the graph for other
    /// readers, unplanned if there are none).
    fn matmul(&mut self, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        if let Some(found) = crate::attention::recognise(self, a) {
            let k = self.t(&found.kt)?;
            let metas = [self.meta(&found.q), self.meta(&k), self.meta(b)];
            let fits = crate::attention::attention_meta(
                "attention",
                &found.spec,
                &metas[0],
                &metas[1],
                &metas[2],
            )
            .is_ok();
            if fits {
                return self.attention(&found.q, &k, b, found.spec);
            }
        }
        self.apply(Op::MatMul, &[a, b])
    }
    /// Scaled dot-product attention `softmax(q·kᵀ·scale, causal)·v` as one op (see
    /// [`crate::attention`]).
    fn attention(
        &mut self,
        q: &Self::Value,
        k: &Self::Value,
        v: &Self::Value,
        spec: crate::AttentionSpec,
    ) -> Result<Self::Value> {
        self.apply(Op::Attention(spec), &[q, k, v])
    }
    /// PyTorch's gather along `axis`.
    fn gather(&mut self, x: &Self::Value, axis: usize, index: &Self::Value) -> Result<Self::Value> {
        self.apply(Op::Gather { axis }, &[x, index])
    }
    /// Zeros of `dims` with `src` added at `index` along `axis`.
    fn scatter_add(
        &mut self,
        dims: Vec<Self::Dim>,
        axis: usize,
        index: &Self::Value,
        src: &Self::Value,
    ) -> Result<Self::Value> {
        self.apply(Op::ScatterAdd { axis, dims }, &[index, src])
    }
    /// Converts the dtype (a no-op when it already is `dtype`).
    fn cast(&mut self, x: &Self::Value, dtype: DType) -> Result<Self::Value> {
        if self.dtype(x) == dtype {
            return Ok(x.clone());
        }
        self.apply(Op::Cast { dtype }, &[x])
    }
    /// A value of `dims` filled with `value`.
    fn full(&mut self, dims: Vec<Self::Dim>, value: f64, dtype: DType) -> Result<Self::Value> {
        self.apply(Op::Full { dims, value, dtype }, &[])
    }
    /// A rank-0 constant of `x`'s dtype, for broadcasting against `x`.
    fn scalar_like(&mut self, x: &Self::Value, value: f64) -> Result<Self::Value> {
        let dtype = self.dtype(x);
        self.full(vec![], value, dtype)
    }
    /// Seeded random values.
    fn rand(
        &mut self,
        dims: Vec<Self::Dim>,
        dist: RandDist,
        seed: u64,
        dtype: DType,
    ) -> Result<Self::Value> {
        self.apply(
            Op::Rand {
                dims,
                dist,
                seed,
                dtype,
            },
            &[],
        )
    }

    // ---- small composites -------------------------------------------------------

    /// The positions `0..T` (`iota`) of a sequence of ids `[.., T]`, for a position
    /// table of `table` rows: what `pos.positions(ids)` embeds. Refused when `T`
    /// exceeds the table or `ids` is a scalar (a guard kept for run-time sizes).
    fn positions(&mut self, ids: &Self::Value, table: usize) -> Result<Self::Value> {
        self.guard(Guard::Positions { table }, &[ids])?;
        let t = self
            .dims(ids)
            .last()
            .cloned()
            .expect("the guard refuses scalars");
        self.apply(
            Op::Iota {
                dims: vec![t],
                axis: 0,
            },
            &[],
        )
    }

    /// Scores of rows `h [.., D]` against every row of an embedding table `[V, D]`:
    /// `h · tableᵀ`, an output head tied to the embedding (`tok.attend(h)`).
    /// `scale` is the table's int8 scales where it is held as int8 (one per row).
    fn tied_scores(
        &mut self,
        h: &Self::Value,
        table: &Self::Value,
        scale: Option<&Self::Value>,
    ) -> Result<Self::Value> {
        let td = self.dims(table);
        let (Some(vocab), Some(features)) = (
            td.first().and_then(|d| d.as_lit()),
            td.get(1).and_then(|d| d.as_lit()),
        ) else {
            return Err(Error::shape(
                "attend",
                format!(
                    "the table must be [V, D] with known sizes, got {}",
                    fmt_dims(&td)
                ),
            ));
        };
        self.guard(Guard::TiedHead { vocab, features }, &[h])?;
        if let Some(scale) = scale {
            return self.matmul_int8(h, table, scale);
        }
        let wt = self.transpose(table, 0, 1)?;
        self.matmul(h, &wt)
    }

    /// `x [.., K]` by the int8 weight `w [N, K]` scaled per row by `scale [N]`
    /// ([`Op::MatMulInt8`]): `x · (w · scale)ᵀ`.
    fn matmul_int8(
        &mut self,
        x: &Self::Value,
        w: &Self::Value,
        scale: &Self::Value,
    ) -> Result<Self::Value> {
        self.apply(Op::MatMulInt8, &[x, w, scale])
    }

    /// The rows of an int8 embedding table `[V, D]` with its scales `[V]`, as f32:
    /// each row taken as int8, then cast and scaled by its own scale.
    fn embedding_int8(
        &mut self,
        ids: &Self::Value,
        table: &Self::Value,
        scale: &Self::Value,
    ) -> Result<Self::Value> {
        let rows = self.embedding(ids, table)?;
        let rows = self.cast(&rows, DType::F32)?;
        let vocab = self.dims(scale);
        let column = self.reshape(scale, vec![vocab[0].clone(), Self::Dim::lit(1)])?;
        let scales = self.embedding(ids, &column)?;
        self.mul(&rows, &scales)
    }

    /// x + s
    fn add_scalar(&mut self, x: &Self::Value, s: f64) -> Result<Self::Value> {
        let c = self.scalar_like(x, s)?;
        self.add(x, &c)
    }
    /// x * s
    fn mul_scalar(&mut self, x: &Self::Value, s: f64) -> Result<Self::Value> {
        let c = self.scalar_like(x, s)?;
        self.mul(x, &c)
    }
    /// x²
    fn square(&mut self, x: &Self::Value) -> Result<Self::Value> {
        self.mul(x, x)
    }
    /// Mean over `axes` (f16 and bf16 are summed in f32, as PyTorch does).
    fn mean(&mut self, x: &Self::Value, axes: &[usize], keepdim: bool) -> Result<Self::Value> {
        let dims = self.dims(x);
        let n = count(&dims, axes)?;
        let dtype = self.dtype(x);
        if !dtype.is_float() {
            // Its 1/n would be 0 in an integer dtype (PyTorch refuses too).
            return Err(Error::dtype(
                "mean",
                format!("averages floats, not {dtype}: cast to a float dtype first"),
            ));
        }
        // An f16 sum overflows (past 65504) long before the mean does.
        let half = dtype.is_half();
        let wide = if half {
            self.cast(x, DType::F32)?
        } else {
            x.clone()
        };
        let s = self.sum(&wide, axes, keepdim)?;
        let inv = self.recip_dim(&s, &n)?;
        let m = self.mul(&s, &inv)?;
        self.cast(&m, dtype)
    }
    /// Σ over every axis, as a rank-0 value.
    fn sum_all(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let axes: Vec<usize> = (0..self.rank(x)).collect();
        self.sum(x, &axes, false)
    }
    /// Mean over every axis, as a rank-0 value.
    fn mean_all(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let axes: Vec<usize> = (0..self.rank(x)).collect();
        self.mean(x, &axes, false)
    }
    /// Biased variance over `axes` (as batch and layer norm use it).
    fn var(&mut self, x: &Self::Value, axes: &[usize], keepdim: bool) -> Result<Self::Value> {
        let m = self.mean(x, axes, true)?;
        let d = self.sub(x, &m)?;
        let d2 = self.square(&d)?;
        self.mean(&d2, axes, keepdim)
    }
    /// max(x, 0)
    fn relu(&mut self, x: &Self::Value) -> Result<Self::Value> {
        self.unary(UnaryOp::Relu, x)
    }
    /// x · sigmoid(x)
    fn silu(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let s = self.unary(UnaryOp::Sigmoid, x)?;
        self.mul(x, &s)
    }
    /// GELU, exact form: x/2 · (1 + erf(x/√2)).
    fn gelu_erf(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let xs = self.mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2)?;
        let e = self.unary(UnaryOp::Erf, &xs)?;
        let one = self.add_scalar(&e, 1.0)?;
        let h = self.mul_scalar(x, 0.5)?;
        self.mul(&h, &one)
    }
    /// GELU, tanh form: x/2 · (1 + tanh(√(2/π)(x + 0.044715x³))).
    fn gelu_tanh(&mut self, x: &Self::Value) -> Result<Self::Value> {
        let x2 = self.square(x)?;
        let x3 = self.mul(&x2, x)?;
        let c = self.mul_scalar(&x3, 0.044_715)?;
        let inner = self.add(x, &c)?;
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let scaled = self.mul_scalar(&inner, k)?;
        let t = self.unary(UnaryOp::Tanh, &scaled)?;
        let one = self.add_scalar(&t, 1.0)?;
        let h = self.mul_scalar(x, 0.5)?;
        self.mul(&h, &one)
    }
    /// `x` with every entry above the diagonal of its last two axes pushed down by its
    /// dtype's largest finite value: row (query) `i` keeps columns (keys) `j <= i`, and
    /// a softmax over the last axis then gives the others zero weight, so attention
    /// scores `[.., T, T]` through it attend causally. The mask is finite (no −∞), so
    /// anomaly mode sees an intended mask, not a fault. The positions come from `iota` on
    /// the device (no mask is built on the host) and are compared in f32 (exact up to
    /// 2^24 positions, whatever `x`'s dtype). The mask is added,
    /// `x + min(relu(j − i), 1) · (−max)`, not selected, so no bool value crosses kernels
    /// and the addition fuses with what reads `x`.
    fn causal_mask(&mut self, x: &Self::Value) -> Result<Self::Value> {
        self.guard(Guard::SquareScores, &[x])?;
        let dims = self.dims(x);
        let dtype = self.dtype(x);
        let Some(big) = dtype.finite_max() else {
            return Err(Error::dtype(
                "causal_mask",
                format!("masks float scores, not {dtype}"),
            ));
        };
        let r = dims.len();
        let square = vec![dims[r - 2].clone(), dims[r - 1].clone()];
        let rows = self.apply(
            Op::Iota {
                dims: square.clone(),
                axis: 0,
            },
            &[],
        )?;
        let cols = self.apply(
            Op::Iota {
                dims: square,
                axis: 1,
            },
            &[],
        )?;
        let rows = self.cast(&rows, DType::F32)?;
        let cols = self.cast(&cols, DType::F32)?;
        let ahead = self.sub(&cols, &rows)?;
        let ahead = self.unary(UnaryOp::Relu, &ahead)?;
        // 1 above the diagonal, 0 on and below it.
        let one = self.scalar_like(&ahead, 1.0)?;
        let mut above = self.binary(BinaryOp::Min, &ahead, &one)?;
        if dtype != DType::F32 {
            above = self.cast(&above, dtype)?;
        }
        let penalty = self.full(vec![], -big, dtype)?;
        let bias = self.mul(&above, &penalty)?;
        self.add(x, &bias)
    }
    /// Softmax along `axis` (max-subtracted for stability).
    fn softmax(&mut self, x: &Self::Value, axis: usize) -> Result<Self::Value> {
        let m = self.max(x, &[axis], true)?;
        let z = self.sub(x, &m)?;
        let e = self.unary(UnaryOp::Exp, &z)?;
        let s = self.sum(&e, &[axis], true)?;
        self.div(&e, &s)
    }
    /// log(Σ exp(x)) along `axis`, stable.
    fn logsumexp(&mut self, x: &Self::Value, axis: usize, keepdim: bool) -> Result<Self::Value> {
        let m = self.max(x, &[axis], true)?;
        // The shift is the maximum clamped to finite values: a row whose maximum is
        // ±inf then gives that infinity (as in PyTorch) instead of inf - inf = NaN.
        // (A clamp rather than a select on a finiteness mask: no bool crosses kernels.)
        let shift = match self.dtype(x).finite_max() {
            Some(big) => {
                let hi = self.scalar_like(&m, big)?;
                let lo = self.scalar_like(&m, -big)?;
                let below = self.binary(BinaryOp::Min, &m, &hi)?;
                self.binary(BinaryOp::Max, &below, &lo)?
            }
            None => m,
        };
        let z = self.sub(x, &shift)?;
        let e = self.unary(UnaryOp::Exp, &z)?;
        let s = self.sum(&e, &[axis], true)?;
        let l = self.unary(UnaryOp::Log, &s)?;
        let r = self.add(&l, &shift)?;
        if keepdim {
            Ok(r)
        } else {
            let mut dims = self.dims(&r);
            dims.remove(axis);
            self.reshape(&r, dims)
        }
    }
    /// log(softmax(x)) along `axis`, stable: `x − (m + log Σ exp(x − m))` with `m` the
    /// row's maximum itself, not [`Self::logsumexp`]'s clamped one, so that a row
    /// holding +inf (or only −inf) is NaN throughout, as [`Self::softmax`]'s row and
    /// PyTorch's are (a clamped shift would give −inf beside one NaN). `x − m` feeds
    /// only the sum, so planners fuse it into the reduction.
    fn log_softmax(&mut self, x: &Self::Value, axis: usize) -> Result<Self::Value> {
        let m = self.max(x, &[axis], true)?;
        let z = self.sub(x, &m)?;
        let e = self.unary(UnaryOp::Exp, &z)?;
        let s = self.sum(&e, &[axis], true)?;
        let l = self.unary(UnaryOp::Log, &s)?;
        let lse = self.add(&l, &m)?;
        self.sub(x, &lse)
    }
    /// Normalises over the trailing `norm_rank` axes, then scales and shifts (when given).
    fn layer_norm(
        &mut self,
        x: &Self::Value,
        norm_rank: usize,
        weight: Option<&Self::Value>,
        bias: Option<&Self::Value>,
        eps: f64,
    ) -> Result<Self::Value> {
        let r = self.rank(x);
        if norm_rank == 0 || norm_rank > r {
            return Err(Error::invalid(
                "layer_norm",
                format!("cannot normalise {norm_rank} axes of a rank-{r} tensor"),
            ));
        }
        let axes: Vec<usize> = (r - norm_rank..r).collect();
        let m = self.mean(x, &axes, true)?;
        let d = self.sub(x, &m)?;
        let d2 = self.square(&d)?;
        let v = self.mean(&d2, &axes, true)?;
        let ve = self.add_scalar(&v, eps)?;
        let inv = self.unary(UnaryOp::Rsqrt, &ve)?;
        let mut y = self.mul(&d, &inv)?;
        if let Some(w) = weight {
            y = self.mul(&y, w)?;
        }
        if let Some(b) = bias {
            y = self.add(&y, b)?;
        }
        Ok(y)
    }
    /// `x @ wᵀ + b` with PyTorch's layout: `w` is `[out, in]`, `b` is `[out]`.
    fn linear(
        &mut self,
        x: &Self::Value,
        w: &Self::Value,
        b: Option<&Self::Value>,
    ) -> Result<Self::Value> {
        let wt = self.transpose(w, 0, 1)?;
        let y = self.matmul(x, &wt)?;
        match b {
            Some(b) => self.add(&y, b),
            None => Ok(y),
        }
    }
    /// Mean cross-entropy of `logits [N, C]` against integer `labels [N]`, with label
    /// smoothing `smoothing` (0 for none).
    fn cross_entropy(
        &mut self,
        logits: &Self::Value,
        labels: &Self::Value,
        smoothing: f64,
    ) -> Result<Self::Value> {
        self.guard(Guard::CrossEntropy, &[logits, labels])?;
        let yd = self.dims(labels);
        if !(0.0..1.0).contains(&smoothing) {
            return Err(Error::invalid(
                "cross_entropy",
                format!("label smoothing {smoothing} is not in [0, 1)"),
            ));
        }
        let logp = self.log_softmax(logits, 1)?;
        let idx = self.reshape(labels, vec![yd[0].clone(), Self::Dim::lit(1)])?;
        let picked = self.gather(&logp, 1, &idx)?;
        let nll = self.mean_all(&picked)?;
        let nll = self.mul_scalar(&nll, -(1.0 - smoothing))?;
        if smoothing == 0.0 {
            return Ok(nll);
        }
        let all = self.mean_all(&logp)?;
        let smooth = self.mul_scalar(&all, -smoothing)?;
        self.add(&nll, &smooth)
    }
    /// Mean squared error of two tensors of one shape (no broadcasting: `[B, 1]`
    /// against `[B]` would average over `[B, B]`).
    fn mse(&mut self, a: &Self::Value, b: &Self::Value) -> Result<Self::Value> {
        self.guard(
            Guard::EqualShapes {
                op: crate::guard::SameShapeOp::Mse,
            },
            &[a, b],
        )?;
        let d = self.sub(a, b)?;
        let d2 = self.square(&d)?;
        self.mean_all(&d2)
    }
    /// Rows of `weight [V, D]` picked by integer `ids` of any shape: `[..ids, D]`.
    fn embedding(&mut self, ids: &Self::Value, weight: &Self::Value) -> Result<Self::Value> {
        let wd = self.dims(weight);
        if wd.len() != 2 {
            return Err(Error::shape(
                "embedding",
                format!("the table must be [V, D], got {}", fmt_dims(&wd)),
            ));
        }
        let id_dims = self.dims(ids);
        let n = id_dims.iter().fold(Self::Dim::lit(1), |a, d| a.mul(d));
        let flat = self.reshape(ids, vec![n.clone(), Self::Dim::lit(1)])?;
        let idx = self.expand(&flat, vec![n.clone(), wd[1].clone()])?;
        let rows = self.gather(weight, 0, &idx)?;
        let mut out = id_dims;
        out.push(wd[1].clone());
        self.reshape(&rows, out)
    }
    /// Zeroes each element with probability `p` and scales the rest by 1/(1-p).
    fn dropout(&mut self, x: &Self::Value, p: f64, seed: u64) -> Result<Self::Value> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "dropout",
                format!("probability {p} is not in [0, 1)"),
            ));
        }
        if p == 0.0 {
            return Ok(x.clone());
        }
        self.dropout_scaled(x, p, 1.0 / (1.0 - p), seed)
    }
    /// Dropout's spelling with primitives: `rand(dims(x), seed) >= p ? x·scale : 0`, the
    /// draw and the comparison in `x`'s dtype.
    fn dropout_scaled(
        &mut self,
        x: &Self::Value,
        p: f64,
        scale: f64,
        seed: u64,
    ) -> Result<Self::Value> {
        let dims = self.dims(x);
        let dtype = self.dtype(x);
        let r = self.rand(
            dims,
            RandDist::Uniform {
                low: 0.0,
                high: 1.0,
            },
            seed,
            dtype,
        )?;
        let pv = self.scalar_like(x, p)?;
        let keep = self.compare(CmpOp::Ge, &r, &pv)?;
        let scaled = self.mul_scalar(x, scale)?;
        let zero = self.scalar_like(x, 0.0)?;
        self.select(&keep, &scaled, &zero)
    }
    /// 2-d convolution of `x [N, Cin, H, W]` with `w [Cout, Cin/groups, kh, kw]` (im2col
    /// then one batched matrix product), plus `b [Cout]`.
    fn conv2d(
        &mut self,
        x: &Self::Value,
        w: &Self::Value,
        b: Option<&Self::Value>,
        options: Conv2dOptions,
    ) -> Result<Self::Value> {
        let Conv2dOptions {
            stride,
            padding,
            dilation,
            groups,
        } = options;
        self.guard(Guard::Conv2d { groups }, &[x, w])?;
        let xd = self.dims(x);
        let wd = self.dims(w);
        let (kh, kw) = match (wd[2].as_lit(), wd[3].as_lit()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::invalid("conv2d", "kernel sizes must be known")),
        };
        let g = Self::Dim::lit(groups);
        let cin_g = wd[1].clone();
        let window = Window2d {
            kernel: [kh, kw],
            stride,
            padding,
            dilation,
        };
        // Columns `[Cin·kh·kw, N, L]`: the whole batch in one product per group.
        let cols = self.apply(Op::Unfold2d(window), &[x])?;
        let cd = self.dims(&cols);
        let per_group = cin_g.mul(&Self::Dim::lit(kh * kw));
        let cols = self.reshape(&cols, vec![g.clone(), per_group.clone(), cd[1].mul(&cd[2])])?;
        let cout_g = Self::Dim::derive(&[&wd[0]], "output channels per group", |d| {
            if d[0] % groups != 0 {
                return Err(Error::shape(
                    "conv2d",
                    format!("{} output channels do not split into {groups} groups", d[0]),
                ));
            }
            Ok(d[0] / groups)
        })?;
        let wm = self.reshape(w, vec![g, cout_g, per_group])?; // [g, O/g, C/g·kh·kw]
        let y = self.matmul(&wm, &cols)?; // [g, O/g, N·L]
        let (oh, ow) = out_hw::<Self::Dim>(&xd, &window)?;
        let y = self.reshape(&y, vec![wd[0].clone(), xd[0].clone(), oh, ow])?;
        // Back to `[N, O, OH, OW]` as a view: readers take the strides.
        let mut y = self.permute(&y, &[1, 0, 2, 3])?;
        if let Some(b) = b {
            let b4 = self.reshape(b, vec![wd[0].clone(), Self::Dim::lit(1), Self::Dim::lit(1)])?;
            y = self.add(&y, &b4)?;
        }
        Ok(y)
    }
    /// Max pooling over `kernel` windows moved by `stride` (padding never wins: it is
    /// -inf, as in PyTorch).
    fn max_pool2d(
        &mut self,
        x: &Self::Value,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Self::Value> {
        self.pool2d(ReduceOp::Max, x, kernel, stride, padding)
    }
    /// Average pooling (padding counts as zeros, as PyTorch's default).
    fn avg_pool2d(
        &mut self,
        x: &Self::Value,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Self::Value> {
        self.pool2d(ReduceOp::Sum, x, kernel, stride, padding)
    }
    /// Pooling as a reduction over unfolded windows (`Sum` means average).
    fn pool2d(
        &mut self,
        op: ReduceOp,
        x: &Self::Value,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Self::Value> {
        let name = if op == ReduceOp::Max {
            "max_pool2d"
        } else {
            "avg_pool2d"
        };
        for i in 0..2 {
            // PyTorch's rule: more would make windows of padding alone.
            if padding[i] * 2 > kernel[i] {
                return Err(Error::invalid(
                    name,
                    format!(
                        "padding {:?} is more than half the kernel {:?}",
                        padding, kernel
                    ),
                ));
            }
        }
        let xd = self.dims(x);
        if xd.len() != 4 {
            return Err(Error::shape(
                "pool2d",
                format!("expects [N, C, H, W], got {}", fmt_dims(&xd)),
            ));
        }
        let window = Window2d {
            kernel,
            stride,
            padding,
            dilation: [1, 1],
        };
        let (oh, ow) = out_hw::<Self::Dim>(&xd, &window)?;
        // Unfold pads with zeros, which would win a max over negative values: max
        // pooling pads with -inf itself (PyTorch's semantics) and unfolds unpadded.
        let (x, window) = if op == ReduceOp::Max && padding != [0, 0] {
            let p = self.pad(x, 2, padding[0], padding[0], f64::NEG_INFINITY)?;
            let p = self.pad(&p, 3, padding[1], padding[1], f64::NEG_INFINITY)?;
            let unpadded = Window2d {
                padding: [0, 0],
                ..window
            };
            (p, unpadded)
        } else {
            (x.clone(), window)
        };
        // Columns `[C·k·k, N, L]`, reduced over the taps and put back as `[N, C, OH, OW]`
        // (a view).
        let cols = self.apply(Op::Unfold2d(window), &[&x])?;
        let taps = kernel[0] * kernel[1];
        let cd = self.dims(&cols);
        let cols = self.reshape(
            &cols,
            vec![
                xd[1].clone(),
                Self::Dim::lit(taps),
                cd[1].clone(),
                cd[2].clone(),
            ],
        )?;
        let r = match op {
            ReduceOp::Sum => {
                let s = self.sum(&cols, &[1], false)?;
                self.mul_scalar(&s, 1.0 / taps as f64)?
            }
            _ => self.reduce(op, &cols, &[1], false)?,
        };
        let r = self.reshape(&r, vec![xd[1].clone(), xd[0].clone(), oh, ow])?;
        self.permute(&r, &[1, 0, 2, 3])
    }
}

impl<G: Builder + ?Sized> BuilderExt for G {}

/// The settings of a 2-d convolution besides its kernel (which the weight's shape gives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dOptions {
    /// Step between windows (height, width).
    pub stride: [usize; 2],
    /// Zeros added on each side.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1; 2],
            padding: [0; 2],
            dilation: [1; 2],
            groups: 1,
        }
    }
}

/// The number of elements over `axes` of `dims`.
fn count<D: SymDim>(dims: &[D], axes: &[usize]) -> Result<D> {
    let mut n = D::lit(1);
    for &a in axes {
        let d = dims.get(a).ok_or_else(|| {
            Error::invalid(
                "reduce",
                format!("axis {a} out of range for {}", fmt_dims(dims)),
            )
        })?;
        n = n.mul(d);
    }
    Ok(n)
}

/// The output height and width of a window over `[N, C, H, W]`.
fn out_hw<D: SymDim>(xd: &[D], w: &Window2d) -> Result<(D, D)> {
    Ok((
        D::derive(&[&xd[2]], "output height", |d| w.out_size(0, d[0]))?,
        D::derive(&[&xd[3]], "output width", |d| w.out_size(1, d[0]))?,
    ))
}
