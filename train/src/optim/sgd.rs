//! [`Sgd`]: its settings, momentum buffers and the device copy of its learning rate.

use super::clip::{Clipping, GradClip};
use super::grouped::{owned, update_together, GroupedRule, Groups, Staged};
use super::rules::{self, Clip, Eager, ExprBuilder};
use super::{check_lr, check_non_negative, check_state, compute_inputs, finish};
use super::{Optimizer, OptimizerState};
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, DType, Error, RawTensor, Result};
use std::collections::HashMap;

/// Settings of [`Sgd`], PyTorch's `torch.optim.SGD` (`maximize` is not supported).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate (≥ 0; PyTorch's default 1e-3).
    pub lr: f64,
    /// Momentum factor (≥ 0; 0 disables momentum).
    pub momentum: f64,
    /// Dampening of the gradient added to the momentum buffer.
    pub dampening: f64,
    /// L2 penalty added to the gradient (≥ 0).
    pub weight_decay: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

/// Stochastic gradient descent with optional momentum, dampening, Nesterov momentum
/// and L2 weight decay, with the update rule of `torch.optim.SGD`:
///
/// ```text
/// g ← grad + weight_decay · p
/// b ← g                                   (first step)
/// b ← momentum · b + (1 − dampening) · g  (later steps)
/// g ← g + momentum · b  (nesterov)   or   g ← b
/// p ← p − lr · g
/// ```
pub struct Sgd<B: Backend> {
    config: SgdConfig,
    momentum_buffers: HashMap<String, RawTensor<B>>,
    /// Gradient clipping.
    clip: Clipping<B>,
    /// The fused update for the current settings and clipping, built on first use.
    fused: Option<(GradClip, FusedExpr)>,
    /// The learning rate in device memory (rank 0, f32), read by the fused update and
    /// rewritten in place by `set_lr`: a captured step (a CUDA graph) reads the rate
    /// of each replay, not the one it was captured with.
    lr_on_device: Option<RawTensor<B>>,
    /// What grouped steps keep between steps.
    groups: Groups<B, 1>,
}

impl<B: Backend> Sgd<B> {
    /// An optimizer with these settings (an error for settings PyTorch rejects).
    #[inline(never)]
    pub fn new(config: SgdConfig) -> Result<Self> {
        check_lr("Sgd", config.lr)?;
        check_non_negative("Sgd", "momentum", config.momentum)?;
        check_non_negative("Sgd", "weight_decay", config.weight_decay)?;
        if !config.dampening.is_finite() {
            return Err(Error::invalid(
                "Sgd",
                format!("dampening must be finite, got {}", config.dampening),
            ));
        }
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::invalid(
                "Sgd",
                format!(
                    "nesterov momentum needs momentum > 0 and dampening = 0, got momentum {} and dampening {}",
                    config.momentum, config.dampening
                ),
            ));
        }
        Ok(Sgd {
            config,
            momentum_buffers: HashMap::new(),
            clip: Clipping::new(),
            fused: None,
            lr_on_device: None,
            groups: Groups::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// The momentum buffer of parameter `name`, once it has taken a step with momentum.
    pub fn momentum_buffer(&self, name: &str) -> Option<&RawTensor<B>> {
        self.momentum_buffers.get(name)
    }

    /// The update of an f32 parameter and its momentum buffer as one fused kernel,
    /// outputs `[param, buffer]` read and written in place, inputs `[grad, lr]` and,
    /// clipping by the global norm, its scale (per-step values broadcast from device
    /// memory): [`rules::sgd`] read as an expression, so it agrees bit for bit with
    /// `update_param`.
    fn fused_expr(c: &SgdConfig, clip: GradClip) -> Result<FusedExpr> {
        let norm = matches!(clip, GradClip::Norm(_));
        let (mut e, g, outputs) = ExprBuilder::new(2 + usize::from(norm), 2);
        let lr = e.input(1);
        let clip = match clip {
            GradClip::None => Clip::None,
            GradClip::Value(v) => Clip::Value(v),
            GradClip::Norm(_) => Clip::Scale(e.input(2)),
        };
        let (p, b) = (outputs[0], outputs[1]);
        let (new_p, new_b) = rules::sgd(&mut e, c, lr, &p, &g, &clip, Some(&b))?;
        let new_b = new_b.expect("a fused update has momentum");
        Ok(e.finish(vec![new_p, new_b]))
    }

    /// Writes `lr` into the device copy of the learning rate, in place (one tiny
    /// kernel, no allocation), creating it on `device` the first time.
    fn write_lr_on_device(&mut self, device: &B::Device) -> Result<()> {
        let lr = self.config.lr as f32;
        match &mut self.lr_on_device {
            None => {
                self.lr_on_device = Some(RawTensor::from_vec(vec![lr], &[], device)?);
            }
            Some(t) => {
                let device = t.device().clone();
                let fill = FusedExpr {
                    steps: vec![ExprStep::Const(lr)],
                    results: vec![0],
                    inputs: 0,
                };
                let dims = *t.dims();
                let storage = t.storage_mut().ok_or_else(|| {
                    Error::invalid(
                        "Sgd",
                        "the device learning rate is shared (a broken invariant)",
                    )
                })?;
                B::fused_elementwise(&device, &fill, None, &[], &dims, &mut [storage])?;
            }
        }
        Ok(())
    }

    /// Makes the device copy of the learning rate live on `device` (moved there, or made
    /// on the first fused step, which a captured step must find already done: an upload
    /// cannot be captured).
    fn lr_on(&mut self, device: &B::Device) -> Result<()> {
        if self
            .lr_on_device
            .as_ref()
            .is_none_or(|t| t.device() != device)
        {
            self.lr_on_device = None;
            self.write_lr_on_device(device)?;
        }
        Ok(())
    }

    /// Runs the fused update when it applies (f32, momentum, a buffer from an earlier
    /// step, parameter and buffer held by nobody else); `false` otherwise.
    fn update_fused(
        &mut self,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<bool> {
        let c = self.config;
        if c.momentum == 0.0
            || param.dtype() != DType::F32
            || grad.dtype() != DType::F32
            || grad.dims() != param.dims()
        {
            return Ok(false);
        }
        // Made on the first step, which runs by value (it starts the momentum buffer):
        // a captured step must find it there (an upload cannot be captured).
        let (dims, device) = (*param.dims(), param.device().clone());
        self.lr_on(&device)?;
        let Some(buf) = self.momentum_buffers.get(name) else {
            return Ok(false);
        };
        if buf.dims() != param.dims() || buf.dtype() != DType::F32 {
            return Ok(false);
        }
        let clip = self.clip.mode();
        if self
            .fused
            .as_ref()
            .is_none_or(|(built_for, _)| *built_for != clip)
        {
            self.fused = Some((clip, Self::fused_expr(&c, clip)?));
        }
        let (_, expr) = self.fused.as_ref().expect("built above");
        let lr = self.lr_on_device.as_ref().expect("written above");
        let mut inputs = [grad.view(), lr.view(), lr.view()];
        inputs[1].layout = inputs[1].layout.broadcast_to(&dims)?;
        let count = match clip {
            GradClip::Norm(_) => {
                inputs[2] = self.clip.scale()?.view();
                inputs[2].layout = inputs[2].layout.broadcast_to(&dims)?;
                3
            }
            _ => 2,
        };
        let buf = self.momentum_buffers.get_mut(name).expect("checked above");
        let (Some(p), Some(b)) = (param.storage_mut(), buf.storage_mut()) else {
            return Ok(false);
        };
        B::fused_elementwise(&device, expr, None, &inputs[..count], &dims, &mut [p, b])?;
        Ok(true)
    }
}

impl<B: Backend> Sgd<B> {
    /// [`Optimizer::step`] with the parameters updated together
    /// ([`super::grouped`]) where the backend groups fused kernels, momentum is on and
    /// anomaly mode is off; `false`, having done nothing, where it does not apply.
    /// Parameters join when their fused update ([`Sgd::update_fused`], the same
    /// expression) applies.
    fn step_grouped<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<bool> {
        let device = self
            .momentum_buffers
            .values()
            .next()
            .map(|b| b.device().clone())
            .filter(|device| {
                self.config.momentum != 0.0
                    && !kiln_tensor::anomaly::detecting()
                    && B::groups_fused_elementwise(device)
            });
        let Some(device) = device else {
            return Ok(false);
        };
        self.lr_on(&device)?;
        let clip = self.clip.mode();
        if self
            .fused
            .as_ref()
            .is_none_or(|(built_for, _)| *built_for != clip)
        {
            self.fused = Some((clip, Self::fused_expr(&self.config, clip)?));
        }
        let mut groups = std::mem::take(&mut self.groups);
        let done = groups.step("Sgd", &mut SgdGroup { sgd: self, device }, model, grads);
        self.groups = groups;
        done.map(|()| true)
    }
}

/// SGD's grouped step on `device` ([`super::grouped`]): the momentum buffer is the
/// state.
struct SgdGroup<'a, B: Backend> {
    sgd: &'a mut Sgd<B>,
    device: B::Device,
}

impl<B: Backend> GroupedRule<B, 1> for SgdGroup<'_, B> {
    fn take_state(&mut self, name: &str, grad: &RawTensor<B>) -> Option<[RawTensor<B>; 1]> {
        let b = self.sgd.momentum_buffers.get_mut(name)?;
        let joins = *grad.device() == self.device && owned(b, grad);
        joins.then(|| [std::mem::replace(b, grad.clone())])
    }

    fn put_back_state(&mut self, name: &str, [buffer]: [RawTensor<B>; 1], _: bool) {
        let b = self
            .sgd
            .momentum_buffers
            .get_mut(name)
            .expect("taken by `take_state`");
        *b = buffer;
    }

    fn update_group(&mut self, staged: &mut [Staged<B, 1>]) -> Result<()> {
        let sgd = &*self.sgd;
        let (_, expr) = sgd.fused.as_ref().expect("built by `step_grouped`");
        let lr = sgd
            .lr_on_device
            .as_ref()
            .expect("written by `step_grouped`");
        let scale = match sgd.clip.mode() {
            GradClip::Norm(_) => Some(sgd.clip.scale()?),
            _ => None,
        };
        let per_step: Vec<&RawTensor<B>> = std::iter::once(lr).chain(scale).collect();
        update_together("Sgd", &self.device, expr, &per_step, staged)
    }

    fn update_alone(
        &mut self,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<()> {
        self.sgd.update_param_in_place(name, param, grad)
    }
}

impl<B: Backend> Optimizer<B> for Sgd<B> {
    #[inline(never)]
    fn update_param(
        &mut self,
        name: &str,
        param: &RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<RawTensor<B>> {
        let c = self.config;
        let (p, g) = compute_inputs("Sgd", name, param, grad)?;
        let buffer = match (c.momentum, self.momentum_buffers.get(name)) {
            (0.0, _) | (_, None) => None,
            (_, Some(b)) => {
                check_state("Sgd", name, "momentum buffer", b, &p)?;
                Some(b)
            }
        };
        let first = buffer.is_none();
        let clip = self.clip.eager(g.dtype())?;
        let (new, buffer) = rules::sgd(&mut Eager::new(), &c, c.lr, &p, &g, &clip, buffer)?;
        if let Some(b) = buffer {
            // The first buffer is the gradient itself: a copy, so that the buffer owns
            // its storage and later steps update it in place (the gradient's buffer
            // may be reused by whoever produced it).
            let b = if first { b.deep_copy()? } else { b };
            self.momentum_buffers.insert(name.to_string(), b);
        }
        finish(param, new)
    }

    #[inline(never)]
    fn update_param_in_place(
        &mut self,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<()> {
        if !self.update_fused(name, param, grad)? {
            *param = self.update_param(name, param, grad)?;
        }
        Ok(())
    }

    #[inline(never)]
    fn step<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<()> {
        if !super::begin_step(self, model, grads)? {
            return Ok(());
        }
        match self.step_grouped(model, grads)? {
            true => Ok(()),
            false => super::step_one_by_one(self, model, grads),
        }
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    #[inline(never)]
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_lr("Sgd", lr)?;
        if lr == self.config.lr {
            return Ok(());
        }
        self.config.lr = lr;
        if let Some(t) = &self.lr_on_device {
            let device = t.device().clone();
            self.write_lr_on_device(&device)?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.momentum_buffers.clear();
    }

    fn grad_clip(&self) -> GradClip {
        self.clip.mode()
    }

    fn set_grad_clip(&mut self, clip: GradClip) -> Result<()> {
        self.clip.set(clip)
    }

    fn prepare_clip<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<()> {
        self.clip.prepare(model, grads)
    }

    #[inline(never)]
    fn state(&self) -> OptimizerState<B> {
        let mut state = OptimizerState::empty("sgd");
        for (name, buffer) in &self.momentum_buffers {
            state
                .tensors
                .insert((MOMENTUM_BUFFER.into(), name.clone()), buffer.clone());
        }
        state
    }

    #[inline(never)]
    fn load_state(&mut self, state: OptimizerState<B>) -> Result<()> {
        state.check("sgd", &[MOMENTUM_BUFFER], &[])?;
        if self.config.momentum == 0.0 && !state.tensors.is_empty() {
            return Err(Error::invalid(
                "load_state",
                "the state has momentum buffers, but this SGD has no momentum",
            ));
        }
        self.momentum_buffers = state
            .tensors
            .into_iter()
            .map(|((_, name), t)| (name, t))
            .collect();
        Ok(())
    }

    fn replay_refusal(&self) -> Option<String> {
        (self.config.momentum == 0.0).then(|| {
            "SGD without momentum replaces each parameter instead of updating it in place"
                .to_string()
        })
    }
}

/// SGD's state slot, named as in PyTorch's optimizer state dict.
const MOMENTUM_BUFFER: &str = "momentum_buffer";
