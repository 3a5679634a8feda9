//! The multi-tensor update: an optimizer's step over every parameter in one or a few
//! launches, where the backend groups fused kernels
//! ([`Backend::groups_fused_elementwise`]). The walk over a model hands out one
//! parameter at a time, so a step walks twice: the first takes each parameter that
//! joins, and its state, out of their places (each place holding the parameter's
//! gradient meanwhile: the same dims and dtype, and no allocation), the launch updates
//! them together, the second puts them back and updates the others one by one. The
//! launch runs the expression each optimizer's one-by-one fused update runs, reading
//! the same per-step values, so both give the same bits.

use kiln_tensor::fused::FusedExpr;
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, DType, Error, RawTensor, Result};
use std::sync::Arc;

/// A parameter updated with others in one launch, with its gradient and its `N` state
/// tensors, while they are out of their places.
pub(super) struct Staged<B: Backend, const N: usize> {
    pub param: RawTensor<B>,
    pub grad: RawTensor<B>,
    pub state: [RawTensor<B>; N],
}

/// An optimizer's side of a grouped step: its state of `N` tensors per parameter, the
/// grouped launch, and the one-by-one update of the parameters that do not join.
pub(super) trait GroupedRule<B: Backend, const N: usize> {
    /// Parameter `name`'s state, taken out of the optimizer (each place then holding
    /// `grad`), if its update joins the group: state from the step before, of the
    /// parameter's dims, f32, held by nobody else. The parameter and gradient are
    /// checked already.
    fn take_state(&mut self, name: &str, grad: &RawTensor<B>) -> Option<[RawTensor<B>; N]>;

    /// Puts back what [`GroupedRule::take_state`] took for parameter `name`; `updated`:
    /// whether the launch ran.
    fn put_back_state(&mut self, name: &str, state: [RawTensor<B>; N], updated: bool);

    /// Updates the staged parameters and their state together.
    fn update_group(&mut self, staged: &mut [Staged<B, N>]) -> Result<()>;

    /// Updates parameter `name` alone (it did not join).
    fn update_alone(
        &mut self,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<()>;
}

/// What a grouped step keeps between steps, reused from one to the next: the staged
/// parameters and, per parameter visited, whether it joined. (The launch's operand
/// lists are built per step: grouping runs on GPU backends only.)
pub(super) struct Groups<B: Backend, const N: usize> {
    staged: Vec<Staged<B, N>>,
    joined: Vec<bool>,
}

impl<B: Backend, const N: usize> Default for Groups<B, N> {
    fn default() -> Self {
        Groups {
            staged: Vec::new(),
            joined: Vec::new(),
        }
    }
}

/// Whether `t` is an f32 tensor of `like`'s dims on its device whose buffer nobody
/// else holds (so that an update may write it in place).
pub(super) fn owned<B: Backend>(t: &RawTensor<B>, like: &RawTensor<B>) -> bool {
    t.dims() == like.dims()
        && t.dtype() == DType::F32
        && t.device() == like.device()
        && Arc::strong_count(t.storage()) == 1
}

impl<B: Backend, const N: usize> Groups<B, N> {
    /// One step of `rule` over every parameter of `model` (module docs). If an update
    /// fails, the parameters updated together have taken their step, and those after
    /// the failing one in the walk have not.
    pub(super) fn step<M: Module<B>>(
        &mut self,
        op: &'static str,
        rule: &mut impl GroupedRule<B, N>,
        model: &mut M,
        grads: &M::Grads,
    ) -> Result<()> {
        let (mut staged, mut joined) = (
            std::mem::take(&mut self.staged),
            std::mem::take(&mut self.joined),
        );
        staged.clear();
        joined.clear();
        let walk = model.update_params(grads, "", &mut |name, p, g| {
            let state = (g.dtype() == DType::F32 && owned(p, g))
                .then(|| rule.take_state(name, g))
                .flatten();
            joined.push(state.is_some());
            if let Some(state) = state {
                staged.push(Staged {
                    param: std::mem::replace(p, g.clone()),
                    grad: g.clone(),
                    state,
                });
            }
            Ok(())
        });
        let launched = walk.and_then(|()| match staged.is_empty() {
            true => Ok(()),
            false => rule.update_group(&mut staged),
        });
        // The others after the launch: it read per-step values they may rewrite.
        let (mut visited, mut restored) = (0, 0);
        let mut failed = None;
        let back = model.update_params(grads, "", &mut |name, p, g| {
            let took = joined.get(visited).copied().unwrap_or(false);
            visited += 1;
            if took {
                let t = &mut staged[restored];
                restored += 1;
                std::mem::swap(p, &mut t.param);
                let state = std::array::from_fn(|i| std::mem::replace(&mut t.state[i], g.clone()));
                rule.put_back_state(name, state, launched.is_ok());
            } else if launched.is_ok() && failed.is_none() {
                failed = rule.update_alone(name, p, g).err();
            }
            Ok(())
        });
        let complete = restored == staged.len();
        staged.clear();
        self.staged = staged;
        self.joined = joined;
        if !complete {
            return Err(Error::invalid(
                op,
                "the model's parameters changed between the walks of one step (a broken invariant)",
            ));
        }
        launched?;
        back?;
        failed.map_or(Ok(()), Err)
    }
}

/// One [`Backend::fused_elementwise_groups`] call of `expr` over `staged` on `device`:
/// each group reads its gradient, then each of `per_step` (rank-0 values broadcast to
/// the parameter's dims), and updates its parameter and state in place, in that order.
pub(super) fn update_together<B: Backend, const N: usize>(
    op: &'static str,
    device: &B::Device,
    expr: &FusedExpr,
    per_step: &[&RawTensor<B>],
    staged: &mut [Staged<B, N>],
) -> Result<()> {
    let mut inputs = Vec::with_capacity(staged.len() * (1 + per_step.len()));
    let mut dims = Vec::with_capacity(staged.len());
    let mut outputs = Vec::with_capacity(staged.len() * (1 + N));
    for Staged { param, grad, state } in staged.iter_mut() {
        let d = *param.dims();
        inputs.push(grad.view());
        for t in per_step {
            let mut v = t.view();
            v.layout = v.layout.broadcast_to(&d)?;
            inputs.push(v);
        }
        dims.push(d);
        let shared = || Error::invalid(op, "a staged buffer is shared (a broken invariant)");
        outputs.push(param.storage_mut().ok_or_else(shared)?);
        for t in state.iter_mut() {
            outputs.push(t.storage_mut().ok_or_else(shared)?);
        }
    }
    B::fused_elementwise_groups(device, expr, &inputs, &dims, &mut outputs)
}
