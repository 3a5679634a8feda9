//! The vector-Jacobian rules: for each primitive op, the gradients of its inputs given
//! the gradient `g` of its output, written with primitives over any `Builder`. The
//! macro runs them symbolically at build time; the tape runs them eagerly.

use kiln_tensor::{Builder, BuilderExt, CmpOp, Error, Op, ReduceOp, Result, SymDim};

/// Gradients of an op's inputs (`None`: the input gets no gradient, e.g. indices,
/// conditions, or an op that is piecewise constant).
pub type InputGrads<V> = Vec<Option<V>>;

/// The gradients of `op`'s inputs, given its inputs `x`, its output `y` and the
/// gradient `g` of `y`. Gradients have the inputs' dims (broadcasting is undone).
pub fn vjp<G: Builder>(
    b: &mut G,
    op: &Op<G::Dim>,
    x: &[&G::Value],
    y: &G::Value,
    g: &G::Value,
) -> Result<InputGrads<G::Value>> {
    let one = |v| Ok(vec![Some(v)]);
    match op {
        Op::Unary(u) => Ok(vec![u.vjp(b, x[0], y, g)?]),
        Op::Binary(op) => {
            let (a, c) = (x[0], x[1]);
            let (ga, gc) = op.vjp(b, (a, c), y, g)?;
            Ok(vec![
                Some(unbroadcast(b, &ga, a)?),
                Some(unbroadcast(b, &gc, c)?),
            ])
        }
        Op::Compare(_) => Ok(vec![None, None]),
        Op::Where => {
            let (cond, a, c) = (x[0], x[1], x[2]);
            let zero = b.scalar_like(g, 0.0)?;
            let ga = b.select(cond, g, &zero)?;
            let gc = b.select(cond, &zero, g)?;
            Ok(vec![
                None,
                Some(unbroadcast(b, &ga, a)?),
                Some(unbroadcast(b, &gc, c)?),
            ])
        }
        Op::Reduce { op, axes } => match op {
            ReduceOp::Sum => {
                let d = b.dims(x[0]);
                one(b.expand(g, d)?)
            }
            ReduceOp::Max | ReduceOp::Min => {
                // Every element equal to the extremum shares the gradient evenly.
                let hit = b.compare(CmpOp::Eq, x[0], y)?;
                let dt = b.dtype(x[0]);
                let ones = b.cast(&hit, dt)?;
                let count = b.sum(&ones, axes, true)?;
                let share = b.div(g, &count)?;
                one(b.mul(&ones, &share)?)
            }
            ReduceOp::ArgMax | ReduceOp::ArgMin => Ok(vec![None]),
        },
        Op::Reshape { .. } => {
            let d = b.dims(x[0]);
            one(b.reshape(g, d)?)
        }
        Op::Permute { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            one(b.permute(g, &inv)?)
        }
        Op::Expand { .. } => one(unbroadcast(b, g, x[0])?),
        Op::Slice {
            axis,
            start,
            end,
            step,
        } => one(unslice(b, g, x[0], *axis, *start, *end, *step)?),
        Op::Concat { axis } => {
            let mut at = G::Dim::lit(0);
            let mut grads = Vec::with_capacity(x.len());
            for xi in x {
                let n = b.dims(xi)[*axis].clone();
                let (s, e) = match (at.as_lit(), n.as_lit()) {
                    (Some(s), Some(n)) => (s, s + n),
                    _ => {
                        return Err(Error::invalid(
                            "concat",
                            "the gradient of concat needs known sizes along the axis",
                        ))
                    }
                };
                grads.push(Some(b.slice(g, *axis, s, e)?));
                at = at.add(&n);
            }
            Ok(grads)
        }
        Op::Pad { axis, before, .. } => {
            let n = b.dims(x[0])[*axis]
                .as_lit()
                .ok_or_else(|| Error::invalid("pad", "the gradient of pad needs a known size"))?;
            one(b.slice(g, *axis, *before, before + n)?)
        }
        Op::MatMul => {
            let (a, c) = (x[0], x[1]);
            let (ra, rc) = (b.rank(a), b.rank(c));
            let ct = b.transpose(c, rc - 2, rc - 1)?;
            let ga = b.matmul(g, &ct)?;
            let gc = if rc == 2 && ra > 2 {
                // A matrix every batch shares (a layer's weight against [B, T, K]
                // activations): one product over the flattened rows, rather than a
                // product per batch summed afterwards (B times the memory and a
                // reduction over it).
                shared_matrix_grad(b, a, g)?
            } else {
                let at = b.transpose(a, ra - 2, ra - 1)?;
                let gc = b.matmul(&at, g)?;
                unbroadcast(b, &gc, c)?
            };
            Ok(vec![Some(unbroadcast(b, &ga, a)?), Some(gc)])
        }
        Op::MatMulInt8 => Err(Error::invalid(
            op.name(),
            "int8 products are for inference: train the f32 model and quantise its checkpoint (kiln-quantize)",
        )),
        Op::Attention(spec) => kiln_tensor::attention::attention_vjp(b, spec, x, y, g),
        Op::AttentionLse(_) | Op::AttentionGrad { .. } => Err(Error::invalid(
            op.name(),
            "attention's backward pass is not differentiated again (no second derivatives of attention)",
        )),
        Op::Gather { axis } => {
            let d = b.dims(x[0]);
            Ok(vec![Some(b.scatter_add(d, *axis, x[1], g)?), None])
        }
        Op::ScatterAdd { axis, .. } => Ok(vec![None, Some(b.gather(g, *axis, x[0])?)]),
        Op::Cast { .. } => {
            let dt = b.dtype(x[0]);
            if dt.is_float() {
                one(b.cast(g, dt)?)
            } else {
                Ok(vec![None])
            }
        }
        Op::Unfold2d(w) => {
            let d = b.dims(x[0]);
            one(b.apply(
                Op::Fold2d {
                    window: *w,
                    height: d[2].clone(),
                    width: d[3].clone(),
                },
                &[g],
            )?)
        }
        Op::Fold2d { window, .. } => one(b.apply(Op::Unfold2d(*window), &[g])?),
        Op::Full { .. } | Op::Iota { .. } | Op::Rand { .. } => Ok(vec![]),
    }
}

/// The gradient of the rank-2 right operand of `a · c` for `a` of rank 3 or more:
/// `aᵀ · g` with the batch dims of `a` and `g` flattened into their rows.
fn shared_matrix_grad<G: Builder>(b: &mut G, a: &G::Value, g: &G::Value) -> Result<G::Value> {
    let (da, dg) = (b.dims(a), b.dims(g));
    let rows = da[..da.len() - 1]
        .iter()
        .fold(G::Dim::lit(1), |acc, d| acc.mul(d));
    let a2 = b.reshape(a, vec![rows.clone(), da[da.len() - 1].clone()])?;
    let g2 = b.reshape(g, vec![rows, dg[dg.len() - 1].clone()])?;
    let a2t = b.transpose(&a2, 0, 1)?;
    b.matmul(&a2t, &g2)
}

/// Sums `g` over the axes that broadcasting added to `like` (leading axes, and axes
/// where `like` has size 1), so the gradient has `like`'s dims.
pub fn unbroadcast<G: Builder>(b: &mut G, g: &G::Value, like: &G::Value) -> Result<G::Value> {
    let gd = b.dims(g);
    let ld = b.dims(like);
    if gd.len() == ld.len() && gd.iter().zip(&ld).all(|(a, c)| a.matches(c) == Some(true)) {
        return Ok(g.clone());
    }
    let lead = gd.len() - ld.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, d) in ld.iter().enumerate() {
        if d.as_lit() == Some(1) && gd[lead + i].as_lit() != Some(1) {
            axes.push(lead + i);
        }
    }
    let s = if axes.is_empty() {
        g.clone()
    } else {
        b.sum(g, &axes, true)?
    };
    b.reshape(&s, ld)
}

/// The adjoint of a slice: `g` put back in place, zeros elsewhere (for a step, each
/// element is followed by `step - 1` zeros before the result is trimmed).
fn unslice<G: Builder>(
    b: &mut G,
    g: &G::Value,
    x: &G::Value,
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
) -> Result<G::Value> {
    let n = b.dims(x)[axis]
        .as_lit()
        .ok_or_else(|| Error::invalid("slice", "the gradient of slice needs a known size"))?;
    let mut spread = g.clone();
    let mut len = end.saturating_sub(start).div_ceil(step);
    if step > 1 && len > 0 {
        let mut d = b.dims(g);
        d.insert(axis + 1, G::Dim::lit(1));
        let u = b.reshape(g, d.clone())?;
        let p = b.pad(&u, axis + 1, 0, step - 1, 0.0)?;
        d.remove(axis + 1);
        d[axis] = G::Dim::lit(len * step);
        let flat = b.reshape(&p, d)?;
        let keep = (end - start).min(len * step);
        spread = b.slice(&flat, axis, 0, keep)?;
        len = keep;
    }
    b.pad(&spread, axis, start, n - start - len, 0.0)
}
