//! Optimizers: the [`Optimizer`] trait and [`Sgd`], [`Adam`] and [`AdamW`] with
//! PyTorch's update rules (`torch.optim.SGD`, `Adam`, `AdamW`, default
//! `foreach=False` path). This module owns the per-parameter state (momentum buffers,
//! moment estimates, step counts), keyed by the parameter's checkpoint name.
//!
//! Updates run as eager [`RawTensor`] ops on the parameter's own device; nothing is
//! downloaded to the host. Hyper-parameters are plain `f64`s that each op rounds to the
//! parameter's dtype, as PyTorch's kernels do with Python scalars. Parameters of
//! `f16`/`bf16` are updated in `f32` and rounded back once, and their optimizer state
//! is kept in `f32`, because an `eps` of `1e-8` or a `1 - β₂` of `1e-3` does not
//! survive a round trip through half precision.

use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, DType, Error, RawTensor, Result};
use std::collections::BTreeMap;

mod adam;
pub(crate) mod clip;
mod grouped;
mod rules;
mod sgd;

pub use adam::{Adam, AdamConfig, AdamW, AdamWConfig};
pub use clip::{global_norm, GradClip};
pub use sgd::{Sgd, SgdConfig};

/// An optimizer's per-parameter state, as a training-state checkpoint holds it.
#[derive(Clone, Debug)]
pub struct OptimizerState<B: Backend> {
    /// The optimizer it belongs to: `sgd`, `adam` or `adamw`.
    pub kind: String,
    /// Tensors keyed `(slot, parameter name)`: `("momentum_buffer", "fc1.weight")`.
    pub tensors: BTreeMap<(String, String), RawTensor<B>>,
    /// Counters keyed `(slot, parameter name)`: Adam's `("step", "fc1.weight")`.
    pub counters: BTreeMap<(String, String), u64>,
}

impl<B: Backend> OptimizerState<B> {
    /// No state yet, for an optimizer of `kind`.
    pub fn empty(kind: &str) -> Self {
        OptimizerState {
            kind: kind.to_string(),
            tensors: BTreeMap::new(),
            counters: BTreeMap::new(),
        }
    }

    /// An error unless this state is for `kind` and keeps only tensors in `slots` and
    /// counters in `counter_slots`.
    fn check(&self, kind: &str, slots: &[&str], counter_slots: &[&str]) -> Result<()> {
        let op = "load_state";
        if self.kind != kind {
            return Err(Error::invalid(
                op,
                format!("the state is {}'s, not {kind}'s", self.kind),
            ));
        }
        let stray = |what: &str, (slot, name): &(String, String)| {
            Error::invalid(
                op,
                format!("{kind} keeps no {what} `{slot}` (found one for `{name}`)"),
            )
        };
        if let Some(k) = self
            .tensors
            .keys()
            .find(|(s, _)| !slots.contains(&s.as_str()))
        {
            return Err(stray("tensor", k));
        }
        if let Some(k) = self
            .counters
            .keys()
            .find(|(s, _)| !counter_slots.contains(&s.as_str()))
        {
            return Err(stray("counter", k));
        }
        Ok(())
    }
}

/// Something that updates a model's parameters from their gradients.
///
/// [`Optimizer::update_param`] is the per-parameter rule (object safe, usable through
/// `dyn Optimizer<B>`); [`Optimizer::step`] applies it to every parameter of a
/// [`Module`].
pub trait Optimizer<B: Backend> {
    /// The new value of parameter `name` given its current value and its gradient,
    /// advancing that parameter's state by one step.
    fn update_param(
        &mut self,
        name: &str,
        param: &RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<RawTensor<B>>;

    /// The current learning rate.
    fn lr(&self) -> f64;

    /// Sets the learning rate (an error if it is negative or not finite).
    fn set_lr(&mut self, lr: f64) -> Result<()>;

    /// Forgets every parameter's state (momentum buffers, moments, step counts).
    fn reset(&mut self);

    /// The per-parameter state (momentum buffers, moments, step counts), for a
    /// training-state checkpoint.
    fn state(&self) -> OptimizerState<B>;

    /// Replaces the per-parameter state with `state`, as [`Optimizer::state`] gave it
    /// for an optimizer of the same kind. A state of another kind, or with slots this
    /// one does not keep, is an error that leaves the optimizer unchanged; shapes are
    /// checked against the parameters at the next step.
    fn load_state(&mut self, state: OptimizerState<B>) -> Result<()>;

    /// Writes the coming step's per-step values (those that change between steps,
    /// such as Adam's bias corrections) into device memory, where the update reads
    /// them: call it before a captured step and before each replay, outside the
    /// capture. Steps run without it write them themselves. The default has none.
    fn prepare_step(&mut self) -> Result<()> {
        Ok(())
    }

    /// Advances the per-step state on the host as a replayed step did: a replay runs
    /// the update on the device only (Adam counts its steps on the host). Call it
    /// after each replay. The default has nothing to count.
    fn step_replayed(&mut self) {}

    /// Why a captured step (a CUDA graph) would not replay this optimizer's update
    /// correctly, or `None` when it would: a replay repeats the captured device work,
    /// reading only what lives in device memory. The default: not known to replay.
    fn replay_refusal(&self) -> Option<String> {
        Some("this optimizer's per-step values are not kept in device memory".into())
    }

    /// [`Optimizer::update_param`] in place. Optimizers override it to write into the
    /// parameter's buffer (one fused pass, no allocation) when nobody else holds it.
    fn update_param_in_place(
        &mut self,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<()> {
        *param = self.update_param(name, param, grad)?;
        Ok(())
    }

    /// How this optimizer clips gradients ([`GradClip::None`] unless set).
    fn grad_clip(&self) -> GradClip {
        GradClip::None
    }

    /// Clips every gradient before the update, inside the update itself (the same
    /// fused kernel): by value, or by the global norm of the step's gradients. An error
    /// for a bound that is not finite and > 0, or from an optimizer that cannot clip.
    fn set_grad_clip(&mut self, clip: GradClip) -> Result<()> {
        clip.check()?;
        match clip {
            GradClip::None => Ok(()),
            _ => Err(Error::invalid(
                "set_grad_clip",
                "this optimizer does not clip gradients",
            )),
        }
    }

    /// What clipping by the global norm needs from all of the step's gradients (the
    /// scale, computed on the device). [`Optimizer::step`] calls it; call it yourself
    /// only when updating parameters one at a time with [`Optimizer::update_param`].
    fn prepare_clip<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<()>
    where
        Self: Sized,
    {
        let _ = (model, grads);
        Ok(())
    }

    /// Updates every parameter of `model` from `grads` (clipped first where
    /// [`Optimizer::set_grad_clip`] says); in anomaly mode
    /// ([`kiln_tensor::anomaly`]), an update that leaves a parameter not finite is an
    /// error naming it.
    ///
    /// Parameters are updated in declaration order; if one fails (a gradient of the
    /// wrong shape), those before it have already taken their step. Where the backend
    /// groups fused kernels, Adam, AdamW and SGD with momentum update the parameters
    /// they can together first (one or a few launches for the whole model), so those
    /// have taken theirs too.
    fn step<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<()>
    where
        Self: Sized,
    {
        if !begin_step(self, model, grads)? {
            return Ok(());
        }
        step_one_by_one(self, model, grads)
    }
}

/// What every optimizer's step does first: for a loss-scaled model, whether the step's
/// gradients are finite, which [`kiln_tensor::nn::LossScale::record`] turns into
/// taking the step or skipping it (`false`: nothing is updated, no state advances);
/// then clipping's preparation. Reading that answer waits for the step's device work.
pub(crate) fn begin_step<B: Backend, O: Optimizer<B>, M: Module<B>>(
    opt: &mut O,
    model: &mut M,
    grads: &M::Grads,
) -> Result<bool> {
    if model.loss_scale().is_some() {
        // Any gradient that is infinite or NaN makes the norm so.
        let norm = global_norm(model, grads)?.to_vec::<f32>()?[0];
        let scale = model.loss_scale().expect("checked above");
        if !scale.record(norm.is_finite())? {
            return Ok(false);
        }
    }
    opt.prepare_clip(model, grads)?;
    Ok(true)
}

/// [`Optimizer::step`] after clipping's preparation, one parameter at a time (each
/// checked in anomaly mode).
fn step_one_by_one<B: Backend, O: Optimizer<B>, M: Module<B>>(
    opt: &mut O,
    model: &mut M,
    grads: &M::Grads,
) -> Result<()> {
    let detect = kiln_tensor::anomaly::detecting();
    model.update_params(grads, "", &mut |name, p, g| {
        opt.update_param_in_place(name, p, g)?;
        if detect {
            check_update(name, p, g)?;
        }
        Ok(())
    })
}

/// Anomaly mode's check of parameter `name` after its update from gradient `grad`.
#[inline(never)]
pub(crate) fn check_update<B: Backend>(
    name: &str,
    param: &RawTensor<B>,
    grad: &RawTensor<B>,
) -> Result<()> {
    use kiln_tensor::anomaly::first_non_finite;
    let Some(bad) = first_non_finite(param)? else {
        return Ok(());
    };
    let cause = match first_non_finite(grad)? {
        Some(g) => format!("its gradient holds {g}"),
        None => "its gradient is finite: the step itself overflowed (the learning rate?)".into(),
    };
    Err(Error::NonFinite(format!(
        "the optimizer's update of `{name}` is the first op whose output is not finite: {bad}; {cause}"
    )))
}

fn check_lr(op: &'static str, lr: f64) -> Result<()> {
    if !(lr >= 0.0 && lr.is_finite()) {
        return Err(Error::invalid(
            op,
            format!("the learning rate must be finite and >= 0, got {lr}"),
        ));
    }
    Ok(())
}

fn check_non_negative(op: &'static str, what: &str, v: f64) -> Result<()> {
    if !(v >= 0.0 && v.is_finite()) {
        return Err(Error::invalid(
            op,
            format!("{what} must be finite and >= 0, got {v}"),
        ));
    }
    Ok(())
}

/// The dtype an update of a `dtype` parameter is computed in.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// The parameter and its gradient, checked against each other and cast to the
/// compute dtype.
fn compute_inputs<B: Backend>(
    op: &'static str,
    name: &str,
    param: &RawTensor<B>,
    grad: &RawTensor<B>,
) -> Result<(RawTensor<B>, RawTensor<B>)> {
    if !param.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!("parameter `{name}` is {}, not a float dtype", param.dtype()),
        ));
    }
    // Broadcasting would silently accept a gradient of the wrong shape.
    if grad.dims() != param.dims() || grad.dtype() != param.dtype() {
        return Err(Error::shape(
            op,
            format!(
                "parameter `{name}` is {} {} but its gradient is {} {}",
                param.dims(),
                param.dtype(),
                grad.dims(),
                grad.dtype()
            ),
        ));
    }
    let dt = compute_dtype(param.dtype());
    Ok((param.cast(dt)?, grad.cast(dt)?))
}

/// State from an earlier step must fit the parameter it is applied to (the same
/// optimizer reused on another model with the same names would otherwise broadcast).
fn check_state<B: Backend>(
    op: &'static str,
    name: &str,
    what: &str,
    state: &RawTensor<B>,
    p: &RawTensor<B>,
) -> Result<()> {
    if state.dims() != p.dims() || state.dtype() != p.dtype() {
        return Err(Error::shape(
            op,
            format!(
                "the {what} of `{name}` is {} {} but the parameter is now {} {}; call `reset()` \
                 before reusing an optimizer on another model",
                state.dims(),
                state.dtype(),
                p.dims(),
                p.dtype()
            ),
        ));
    }
    Ok(())
}

/// The updated value in the parameter's own dtype.
fn finish<B: Backend>(param: &RawTensor<B>, new: RawTensor<B>) -> Result<RawTensor<B>> {
    new.cast(param.dtype())
}
