//! The optimizers' update rules, each written once against [`UpdateOps`] and read two
//! ways: [`Eager`] runs it as tensor ops (any dtype, any step), [`ExprBuilder`] turns
//! it into the fused kernel that updates a parameter and its state in place. Both
//! interpretations issue the same ops in the same order with the same scalars rounded
//! the same way, so an eager and a fused step agree bit for bit by construction.

use super::adam::AdamStep;
use super::sgd::SgdConfig;
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::{Backend, BinaryOp, BuilderExt, RawTensor, Result, UnaryOp};
use std::marker::PhantomData;

/// What an update rule is written against: values (a parameter, its gradient, its
/// state) and the scalars that scale them, either constants fixed when the rule is
/// read or per-step values that change between steps.
pub(super) trait UpdateOps {
    /// A tensor-valued intermediate.
    type Value: Clone;
    /// A scalar operand.
    type Scalar: Copy;
    /// A constant of the rule (a hyper-parameter other than the learning rate).
    fn constant(&mut self, x: f64) -> Self::Scalar;
    /// `a ∘ b`, element-wise.
    fn binary(&mut self, op: BinaryOp, a: &Self::Value, b: &Self::Value) -> Result<Self::Value>;
    /// `a ∘ k` for a scalar `k`, element-wise.
    fn with_scalar(
        &mut self,
        op: BinaryOp,
        a: &Self::Value,
        k: Self::Scalar,
    ) -> Result<Self::Value>;
    /// `√a`, element-wise.
    fn sqrt(&mut self, a: &Self::Value) -> Result<Self::Value>;
}

/// The rules run as eager tensor ops: scalars are `f64`s that each op rounds to the
/// tensor's dtype.
pub(super) struct Eager<B>(PhantomData<B>);

impl<B> Eager<B> {
    /// The eager reading.
    pub(super) fn new() -> Self {
        Eager(PhantomData)
    }
}

impl<B: Backend> UpdateOps for Eager<B> {
    type Value = RawTensor<B>;
    type Scalar = f64;
    fn constant(&mut self, x: f64) -> f64 {
        x
    }
    fn binary(&mut self, op: BinaryOp, a: &RawTensor<B>, b: &RawTensor<B>) -> Result<RawTensor<B>> {
        a.ops().binary(op, a, b)
    }
    fn with_scalar(&mut self, op: BinaryOp, a: &RawTensor<B>, k: f64) -> Result<RawTensor<B>> {
        let mut ops = a.ops();
        let k = ops.scalar_like(a, k)?;
        ops.binary(op, a, &k)
    }
    fn sqrt(&mut self, a: &RawTensor<B>) -> Result<RawTensor<B>> {
        a.ops().unary(UnaryOp::Sqrt, a)
    }
}

/// The rules read into one fused expression over f32: values and scalars are the
/// expression's steps, constants are `f32` literals, per-step scalars are inputs read
/// from device memory.
pub(super) struct ExprBuilder {
    steps: Vec<ExprStep>,
    inputs: usize,
}

impl ExprBuilder {
    /// An expression reading `inputs` inputs (the gradient first) and updating
    /// `outputs` tensors in place (the parameter first, then its state); returns the
    /// builder and the steps that read the gradient and the outputs.
    pub(super) fn new(inputs: usize, outputs: usize) -> (Self, usize, Vec<usize>) {
        let mut steps = vec![ExprStep::Input(0)];
        steps.extend((0..outputs).map(ExprStep::Output));
        let b = ExprBuilder { steps, inputs };
        (b, 0, (1..=outputs).collect())
    }

    /// The step reading input `k` (a per-step scalar broadcast from device memory).
    pub(super) fn input(&mut self, k: usize) -> usize {
        debug_assert!(k < self.inputs, "input {k} of {}", self.inputs);
        self.push(ExprStep::Input(k))
    }

    /// The expression whose results are `results`, written to the outputs in order.
    pub(super) fn finish(self, results: Vec<usize>) -> FusedExpr {
        FusedExpr {
            steps: self.steps,
            results,
            inputs: self.inputs,
        }
    }

    fn push(&mut self, step: ExprStep) -> usize {
        self.steps.push(step);
        self.steps.len() - 1
    }
}

impl UpdateOps for ExprBuilder {
    type Value = usize;
    type Scalar = usize;
    fn constant(&mut self, x: f64) -> usize {
        self.push(ExprStep::Const(x as f32))
    }
    fn binary(&mut self, op: BinaryOp, a: &usize, b: &usize) -> Result<usize> {
        Ok(self.push(ExprStep::Binary(op, *a, *b)))
    }
    fn with_scalar(&mut self, op: BinaryOp, a: &usize, k: usize) -> Result<usize> {
        Ok(self.push(ExprStep::Binary(op, *a, k)))
    }
    fn sqrt(&mut self, a: &usize) -> Result<usize> {
        Ok(self.push(ExprStep::Unary(UnaryOp::Sqrt, *a)))
    }
}

/// How a rule clips its gradient before using it (see `optim/clip.rs`).
pub(super) enum Clip<V> {
    /// As it is.
    None,
    /// Clamped into `[−c, c]`.
    Value(f64),
    /// Multiplied by a per-step value (the global norm's scale).
    Scale(V),
}

/// `g` clipped as `clip` says.
fn clipped<O: UpdateOps>(o: &mut O, clip: &Clip<O::Value>, g: &O::Value) -> Result<O::Value> {
    match clip {
        Clip::None => Ok(g.clone()),
        Clip::Value(c) => {
            let (lo, hi) = (o.constant(-c), o.constant(*c));
            let above = o.with_scalar(BinaryOp::Max, g, lo)?;
            o.with_scalar(BinaryOp::Min, &above, hi)
        }
        Clip::Scale(k) => o.binary(BinaryOp::Mul, g, k),
    }
}

/// `torch.optim.SGD`'s update of parameter `p` from gradient `g` (clipped first, as
/// `clip_grad_*_` before `step()` would) at learning rate `lr`, given its momentum
/// buffer from the last step (`None` on the first): the new parameter and, with
/// momentum, the new buffer.
pub(super) fn sgd<O: UpdateOps>(
    o: &mut O,
    c: &SgdConfig,
    lr: O::Scalar,
    p: &O::Value,
    g: &O::Value,
    clip: &Clip<O::Value>,
    buffer: Option<&O::Value>,
) -> Result<(O::Value, Option<O::Value>)> {
    use BinaryOp::{Add, Mul, Sub};
    let g = &clipped(o, clip, g)?;
    let d = match c.weight_decay {
        0.0 => g.clone(),
        wd => {
            let wd = o.constant(wd);
            let decay = o.with_scalar(Mul, p, wd)?;
            o.binary(Add, g, &decay)?
        }
    };
    let (step, buffer) = match c.momentum {
        0.0 => (d, None),
        momentum => {
            let m = o.constant(momentum);
            // PyTorch starts the buffer at the (decayed) gradient, undampened.
            let b = match buffer {
                None => d.clone(),
                Some(b) => {
                    let kept = o.with_scalar(Mul, b, m)?;
                    let damp = o.constant(1.0 - c.dampening);
                    let added = o.with_scalar(Mul, &d, damp)?;
                    o.binary(Add, &kept, &added)?
                }
            };
            let step = match c.nesterov {
                true => {
                    let ahead = o.with_scalar(Mul, &b, m)?;
                    o.binary(Add, &d, &ahead)?
                }
                false => b.clone(),
            };
            (step, Some(b))
        }
    };
    let scaled = o.with_scalar(Mul, &step, lr)?;
    Ok((o.binary(Sub, p, &scaled)?, buffer))
}

/// Adam's values that change between steps, as the rule reads them.
#[derive(Clone, Copy)]
pub(super) struct AdamPerStep<S> {
    /// `1 − lr·weight_decay`, where weight decay is decoupled (AdamW).
    pub decay: Option<S>,
    /// `1 / √(1 − β₂ᵗ)`.
    pub inv_root_correction2: S,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: S,
}

impl AdamPerStep<f64> {
    /// The values of step `t` (counted from 1) under `h`.
    pub(super) fn at(h: &AdamStep, t: u64) -> Self {
        let (b1, b2) = h.betas;
        let correction1 = 1.0 - b1.powf(t as f64);
        let correction2 = 1.0 - b2.powf(t as f64);
        AdamPerStep {
            decay: (h.decoupled != 0.0).then_some(1.0 - h.lr * h.decoupled),
            inv_root_correction2: 1.0 / correction2.sqrt(),
            step_size: h.lr / correction1,
        }
    }
}

/// `torch.optim.Adam`'s (with `decay`, `AdamW`'s) update of parameter `p` from
/// gradient `g` (clipped first) given its moments `m` and `v`: `[p, m, v]` after the
/// step.
#[allow(clippy::too_many_arguments)]
pub(super) fn adam<O: UpdateOps>(
    o: &mut O,
    h: &AdamStep,
    k: AdamPerStep<O::Scalar>,
    p: &O::Value,
    g: &O::Value,
    clip: &Clip<O::Value>,
    m: &O::Value,
    v: &O::Value,
) -> Result<[O::Value; 3]> {
    use BinaryOp::{Add, Div, Mul, Sub};
    let g = &clipped(o, clip, g)?;
    let p = match k.decay {
        Some(decay) => o.with_scalar(Mul, p, decay)?,
        None => p.clone(),
    };
    let g = match h.l2 {
        0.0 => g.clone(),
        l2 => {
            let l2 = o.constant(l2);
            let decay = o.with_scalar(Mul, &p, l2)?;
            o.binary(Add, g, &decay)?
        }
    };
    let (b1, b2) = h.betas;
    // `m + (1 − β₁)(g − m)`: PyTorch's `exp_avg.lerp_(grad, 1 - beta1)`.
    let towards = o.binary(Sub, &g, m)?;
    let k1 = o.constant(1.0 - b1);
    let towards = o.with_scalar(Mul, &towards, k1)?;
    let new_m = o.binary(Add, m, &towards)?;
    let kb2 = o.constant(b2);
    let kept = o.with_scalar(Mul, v, kb2)?;
    let squared = o.binary(Mul, &g, &g)?;
    let k2 = o.constant(1.0 - b2);
    let squared = o.with_scalar(Mul, &squared, k2)?;
    let new_v = o.binary(Add, &kept, &squared)?;
    let root = o.sqrt(&new_v)?;
    let root = o.with_scalar(Mul, &root, k.inv_root_correction2)?;
    let eps = o.constant(h.eps);
    let denom = o.with_scalar(Add, &root, eps)?;
    let ratio = o.binary(Div, &new_m, &denom)?;
    let ratio = o.with_scalar(Mul, &ratio, k.step_size)?;
    let new_p = o.binary(Sub, &p, &ratio)?;
    Ok([new_p, new_m, new_v])
}
