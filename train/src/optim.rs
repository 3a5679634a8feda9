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

use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, DType, Error, RawTensor, Result};
use std::collections::{BTreeMap, HashMap};

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

    /// Updates every parameter of `model` from `grads`; in anomaly mode
    /// ([`kiln_tensor::anomaly`]), an update that leaves a parameter not finite is an
    /// error naming it.
    ///
    /// Parameters are updated in declaration order; if one fails (a gradient of the
    /// wrong shape), those before it have already taken their step.
    fn step<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<()>
    where
        Self: Sized,
    {
        let detect = kiln_tensor::anomaly::detecting();
        model.update_params(grads, "", &mut |name, p, g| {
            self.update_param_in_place(name, p, g)?;
            if detect {
                check_update(name, p, g)?;
            }
            Ok(())
        })
    }
}

/// Anomaly mode's check of parameter `name` after its update from gradient `grad`.
fn check_update<B: Backend>(name: &str, param: &RawTensor<B>, grad: &RawTensor<B>) -> Result<()> {
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
    /// The fused update for the current settings, built on first use.
    fused: Option<FusedExpr>,
    /// The learning rate in device memory (rank 0, f32), read by the fused update and
    /// rewritten in place by `set_lr`: a captured step (a CUDA graph) reads the rate
    /// of each replay, not the one it was captured with.
    lr_on_device: Option<RawTensor<B>>,
}

impl<B: Backend> Sgd<B> {
    /// An optimizer with these settings (an error for settings PyTorch rejects).
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
            fused: None,
            lr_on_device: None,
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
    /// outputs `[param, buffer]` read and written in place, inputs `[grad, lr]` (the
    /// learning rate broadcast from device memory); the same ops in the same order as
    /// `update_param`, so the results are bit-identical.
    fn fused_expr(c: &SgdConfig) -> FusedExpr {
        use kiln_tensor::fused::ExprStep::*;
        use kiln_tensor::BinaryOp::{Add, Mul, Sub};
        let mut s = vec![Input(0), Output(0), Output(1)];
        let push = |s: &mut Vec<ExprStep>, e: ExprStep| {
            s.push(e);
            s.len() - 1
        };
        let (g, p, b) = (0, 1, 2);
        let d = if c.weight_decay != 0.0 {
            let wd = push(&mut s, Const(c.weight_decay as f32));
            let t = push(&mut s, Binary(Mul, p, wd));
            push(&mut s, Binary(Add, g, t))
        } else {
            g
        };
        let m = push(&mut s, Const(c.momentum as f32));
        let bm = push(&mut s, Binary(Mul, b, m));
        let damp = push(&mut s, Const((1.0 - c.dampening) as f32));
        let dd = push(&mut s, Binary(Mul, d, damp));
        let nb = push(&mut s, Binary(Add, bm, dd));
        let step = if c.nesterov {
            let t = push(&mut s, Binary(Mul, nb, m));
            push(&mut s, Binary(Add, d, t))
        } else {
            nb
        };
        let lr = push(&mut s, Input(1));
        let t = push(&mut s, Binary(Mul, step, lr));
        let np = push(&mut s, Binary(Sub, p, t));
        FusedExpr {
            steps: s,
            results: vec![np, nb],
            inputs: 2,
        }
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
        if self
            .lr_on_device
            .as_ref()
            .is_none_or(|t| *t.device() != device)
        {
            self.lr_on_device = None;
            self.write_lr_on_device(&device)?;
        }
        let Some(buf) = self.momentum_buffers.get(name) else {
            return Ok(false);
        };
        if buf.dims() != param.dims() || buf.dtype() != DType::F32 {
            return Ok(false);
        }
        let expr = self.fused.get_or_insert_with(|| Self::fused_expr(&c));
        let lr = self.lr_on_device.as_ref().expect("written above");
        let mut lr = lr.view();
        lr.layout = lr.layout.broadcast_to(&dims)?;
        let buf = self.momentum_buffers.get_mut(name).expect("checked above");
        let (Some(p), Some(b)) = (param.storage_mut(), buf.storage_mut()) else {
            return Ok(false);
        };
        B::fused_elementwise(&device, expr, None, &[grad.view(), lr], &dims, &mut [p, b])?;
        Ok(true)
    }
}

impl<B: Backend> Optimizer<B> for Sgd<B> {
    fn update_param(
        &mut self,
        name: &str,
        param: &RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<RawTensor<B>> {
        let c = self.config;
        let (p, g) = compute_inputs("Sgd", name, param, grad)?;
        let mut d = if c.weight_decay != 0.0 {
            g.add(&p.mul_scalar(c.weight_decay)?)?
        } else {
            g
        };
        if c.momentum != 0.0 {
            let buf = match self.momentum_buffers.get(name) {
                // PyTorch starts the buffer at the (decayed) gradient, undampened. A
                // copy, so the buffer owns its storage and later steps update it in
                // place (the gradient's buffer may be reused by whoever produced it).
                None => d.deep_copy()?,
                Some(b) => {
                    check_state("Sgd", name, "momentum buffer", b, &p)?;
                    b.mul_scalar(c.momentum)?
                        .add(&d.mul_scalar(1.0 - c.dampening)?)?
                }
            };
            d = if c.nesterov {
                d.add(&buf.mul_scalar(c.momentum)?)?
            } else {
                buf.clone()
            };
            self.momentum_buffers.insert(name.to_string(), buf);
        }
        finish(param, p.sub(&d.mul_scalar(c.lr)?)?)
    }

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

    fn lr(&self) -> f64 {
        self.config.lr
    }

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

    fn state(&self) -> OptimizerState<B> {
        let mut state = OptimizerState::empty("sgd");
        for (name, buffer) in &self.momentum_buffers {
            state
                .tensors
                .insert((MOMENTUM_BUFFER.into(), name.clone()), buffer.clone());
        }
        state
    }

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

/// Adam's state slots, named as in PyTorch's optimizer state dict.
const EXP_AVG: &str = "exp_avg";
const EXP_AVG_SQ: &str = "exp_avg_sq";
const STEP: &str = "step";

/// Settings of [`Adam`], PyTorch's `torch.optim.Adam` (no AMSGrad).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate (≥ 0; default 1e-3).
    pub lr: f64,
    /// Decay rates (β₁, β₂) of the first and second moment estimates, each in [0, 1)
    /// (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for numerical stability (≥ 0; default 1e-8).
    pub eps: f64,
    /// L2 penalty added to the gradient, coupled with the moments (≥ 0; default 0).
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Settings of [`AdamW`], PyTorch's `torch.optim.AdamW` (no AMSGrad).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate (≥ 0; default 1e-3).
    pub lr: f64,
    /// Decay rates (β₁, β₂) of the first and second moment estimates, each in [0, 1)
    /// (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for numerical stability (≥ 0; default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay: `p ← p · (1 − lr · weight_decay)` before the Adam step
    /// (≥ 0; default 1e-2, as in PyTorch).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// Adam with coupled L2 weight decay, the update rule of `torch.optim.Adam`:
///
/// ```text
/// t ← t + 1
/// g ← grad + weight_decay · p
/// m ← m + (1 − β₁)(g − m)           v ← β₂ v + (1 − β₂) g²
/// p ← p − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + eps)
/// ```
pub struct Adam<B: Backend> {
    config: AdamConfig,
    state: AdamState<B>,
}

/// AdamW: Adam with decoupled weight decay, the update rule of `torch.optim.AdamW`:
/// `p ← p · (1 − lr · weight_decay)`, then [`Adam`]'s step without the L2 term.
pub struct AdamW<B: Backend> {
    config: AdamWConfig,
    state: AdamState<B>,
}

/// One parameter's Adam state.
struct Moments<B: Backend> {
    step: u64,
    exp_avg: RawTensor<B>,
    exp_avg_sq: RawTensor<B>,
}

/// Adam's per-parameter state, shared by [`Adam`] and [`AdamW`].
struct AdamState<B: Backend> {
    moments: HashMap<String, Moments<B>>,
    /// The fused update last built and the hyper-parameters it is for (the learning
    /// rate aside: it reaches the update through `scalars`).
    fused: Option<(AdamStep, FusedExpr)>,
    /// The values that change between steps, in device memory: what the fused update
    /// reads, so that a captured step reads each replay's.
    scalars: Option<StepScalars<B>>,
}

/// Adam's per-step values in device memory (f32, rank 0 each), written between steps.
struct StepScalars<B: Backend> {
    /// The step and hyper-parameters they were written for.
    written_for: (AdamStep, u64),
    /// `[1 − lr·weight_decay (decoupled), 1/√(1 − β₂ᵗ), lr/(1 − β₁ᵗ)]`.
    values: [RawTensor<B>; 3],
    /// The kernel that writes them: three constants, rewritten each step in place (a
    /// steady-state step allocates nothing).
    fill: FusedExpr,
}

/// The hyper-parameters of one Adam update, whichever the flavour of weight decay.
#[derive(Clone, Copy, PartialEq)]
struct AdamStep {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    l2: f64,
    decoupled: f64,
}

fn check_adam(
    op: &'static str,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
) -> Result<()> {
    check_lr(op, lr)?;
    for (i, b) in [betas.0, betas.1].into_iter().enumerate() {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::invalid(
                op,
                format!("beta{} must be in [0, 1), got {b}", i + 1),
            ));
        }
    }
    check_non_negative(op, "eps", eps)?;
    check_non_negative(op, "weight_decay", weight_decay)
}

impl<B: Backend> AdamState<B> {
    fn update(
        &mut self,
        op: &'static str,
        h: AdamStep,
        name: &str,
        param: &RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<RawTensor<B>> {
        let (mut p, mut g) = compute_inputs(op, name, param, grad)?;
        if h.decoupled != 0.0 {
            p = p.mul_scalar(1.0 - h.lr * h.decoupled)?;
        }
        if h.l2 != 0.0 {
            g = g.add(&p.mul_scalar(h.l2)?)?;
        }
        let (b1, b2) = h.betas;
        let s = match self.moments.remove(name) {
            Some(s) => {
                check_state(op, name, "first moment", &s.exp_avg, &p)?;
                check_state(op, name, "second moment", &s.exp_avg_sq, &p)?;
                s
            }
            None => {
                let zeros = RawTensor::zeros(p.dims().as_slice(), p.dtype(), p.device())?;
                Moments {
                    step: 0,
                    exp_avg: zeros.clone(),
                    exp_avg_sq: zeros,
                }
            }
        };
        let step = s.step + 1;
        // `lerp` form, as PyTorch's `exp_avg.lerp_(grad, 1 - beta1)`.
        let exp_avg = s.exp_avg.add(&g.sub(&s.exp_avg)?.mul_scalar(1.0 - b1)?)?;
        let exp_avg_sq = s
            .exp_avg_sq
            .mul_scalar(b2)?
            .add(&g.mul(&g)?.mul_scalar(1.0 - b2)?)?;
        let bias_correction1 = 1.0 - b1.powf(step as f64);
        let bias_correction2 = 1.0 - b2.powf(step as f64);
        let step_size = h.lr / bias_correction1;
        let denom = exp_avg_sq
            .sqrt()?
            .mul_scalar(1.0 / bias_correction2.sqrt())?
            .add_scalar(h.eps)?;
        let new = p.sub(&exp_avg.div(&denom)?.mul_scalar(step_size)?)?;
        self.moments.insert(
            name.to_string(),
            Moments {
                step,
                exp_avg,
                exp_avg_sq,
            },
        );
        finish(param, new)
    }

    /// Adam's per-step values for step `step` under `h`, in the order of
    /// [`StepScalars::values`], rounded to f32 as the update reads them.
    fn step_values(h: AdamStep, step: u64) -> [f32; 3] {
        let (b1, b2) = h.betas;
        let bias_correction1 = 1.0 - b1.powf(step as f64);
        let bias_correction2 = 1.0 - b2.powf(step as f64);
        [
            (1.0 - h.lr * h.decoupled) as f32,
            (1.0 / bias_correction2.sqrt()) as f32,
            (h.lr / bias_correction1) as f32,
        ]
    }

    /// The update of an f32 parameter and its two moments as one fused kernel, outputs
    /// `[param, exp_avg, exp_avg_sq]` read and written in place, inputs `[grad,
    /// (1 − lr·wd when decoupled), 1/√(1 − β₂ᵗ), lr/(1 − β₁ᵗ)]`, the per-step values
    /// broadcast from device memory; the same ops in the same order as
    /// [`AdamState::update`], so the results are bit-identical.
    fn fused_expr(h: AdamStep) -> FusedExpr {
        use kiln_tensor::fused::ExprStep::*;
        use kiln_tensor::BinaryOp::{Add, Div, Mul, Sub};
        use kiln_tensor::UnaryOp::Sqrt;
        let mut s = vec![Input(0), Output(0), Output(1), Output(2)];
        let push = |s: &mut Vec<ExprStep>, e: ExprStep| {
            s.push(e);
            s.len() - 1
        };
        let (mut g, mut p, m, v) = (0, 1, 2, 3);
        let mut next_input = 1;
        let mut input = |s: &mut Vec<ExprStep>| {
            next_input += 1;
            push(s, Input(next_input - 1))
        };
        if h.decoupled != 0.0 {
            let k = input(&mut s);
            p = push(&mut s, Binary(Mul, p, k));
        }
        if h.l2 != 0.0 {
            let k = push(&mut s, Const(h.l2 as f32));
            let t = push(&mut s, Binary(Mul, p, k));
            g = push(&mut s, Binary(Add, g, t));
        }
        let (b1, b2) = h.betas;
        let d = push(&mut s, Binary(Sub, g, m));
        let k1 = push(&mut s, Const((1.0 - b1) as f32));
        let d = push(&mut s, Binary(Mul, d, k1));
        let new_m = push(&mut s, Binary(Add, m, d));
        let kb2 = push(&mut s, Const(b2 as f32));
        let vb = push(&mut s, Binary(Mul, v, kb2));
        let gg = push(&mut s, Binary(Mul, g, g));
        let k2 = push(&mut s, Const((1.0 - b2) as f32));
        let gg = push(&mut s, Binary(Mul, gg, k2));
        let new_v = push(&mut s, Binary(Add, vb, gg));
        let root = push(&mut s, Unary(Sqrt, new_v));
        let kc = input(&mut s);
        let root = push(&mut s, Binary(Mul, root, kc));
        let eps = push(&mut s, Const(h.eps as f32));
        let denom = push(&mut s, Binary(Add, root, eps));
        let q = push(&mut s, Binary(Div, new_m, denom));
        let ks = input(&mut s);
        let q = push(&mut s, Binary(Mul, q, ks));
        let new_p = push(&mut s, Binary(Sub, p, q));
        FusedExpr {
            steps: s,
            results: vec![new_p, new_m, new_v],
            inputs: next_input,
        }
    }

    /// Writes step `step`'s values under `h` into device memory on `device`: nothing
    /// when they are there already, uploaded the first time, one small kernel after
    /// that. Inside a capture that is an error (a replay would write the captured
    /// step's values again): [`Optimizer::prepare_step`] writes them before.
    fn write_scalars(&mut self, h: AdamStep, step: u64, device: &B::Device) -> Result<()> {
        let written = self
            .scalars
            .as_ref()
            .filter(|s| s.values[0].device() == device);
        if written.is_some_and(|s| s.written_for == (h, step)) {
            return Ok(());
        }
        B::refuse_in_capture(device, &|| {
            "writing Adam's per-step values (call `Optimizer::prepare_step` before a captured step)"
                .to_string()
        })?;
        let values = Self::step_values(h, step);
        match &mut self.scalars {
            Some(s) if s.values[0].device() == device => {
                for (step, &v) in s.fill.steps.iter_mut().zip(&values) {
                    *step = ExprStep::Const(v);
                }
                let [a, b, c] = &mut s.values;
                let (Some(a), Some(b), Some(c)) =
                    (a.storage_mut(), b.storage_mut(), c.storage_mut())
                else {
                    return Err(Error::invalid(
                        "Adam",
                        "the device copy of the per-step values is shared (a broken invariant)",
                    ));
                };
                let dims = kiln_tensor::Dims::new(&[])?;
                B::fused_elementwise(device, &s.fill, None, &[], &dims, &mut [a, b, c])?;
                s.written_for = (h, step);
            }
            _ => {
                let scalar = |v: f32| RawTensor::from_vec(vec![v], &[], device);
                self.scalars = Some(StepScalars {
                    written_for: (h, step),
                    values: [scalar(values[0])?, scalar(values[1])?, scalar(values[2])?],
                    fill: FusedExpr {
                        steps: values.iter().map(|&v| ExprStep::Const(v)).collect(),
                        results: vec![0, 1, 2],
                        inputs: 0,
                    },
                });
            }
        }
        Ok(())
    }

    /// [`Optimizer::step_replayed`]: every parameter took one more step.
    fn step_replayed(&mut self) {
        for s in self.moments.values_mut() {
            s.step += 1;
        }
    }

    /// [`Optimizer::prepare_step`]: the next step's values, for the step count and
    /// device of the parameters' moments (which step together).
    fn prepare_step(&mut self, h: AdamStep) -> Result<()> {
        let Some((step, device)) = self
            .moments
            .values()
            .next()
            .map(|s| (s.step + 1, s.exp_avg.device().clone()))
        else {
            return Ok(()); // the first step runs by value and starts the moments
        };
        self.write_scalars(h, step, &device)
    }

    /// Runs the fused update when it applies (f32, moments from an earlier step,
    /// parameter and moments held by nobody else); `false` otherwise.
    fn update_fused(
        &mut self,
        h: AdamStep,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<bool> {
        if param.dtype() != DType::F32 || grad.dtype() != DType::F32 || grad.dims() != param.dims()
        {
            return Ok(false);
        }
        let Some(s) = self.moments.get(name) else {
            return Ok(false);
        };
        let fits = |t: &RawTensor<B>| t.dims() == param.dims() && t.dtype() == DType::F32;
        if !fits(&s.exp_avg) || !fits(&s.exp_avg_sq) {
            return Ok(false);
        }
        let step = s.step + 1;
        let (dims, device) = (*param.dims(), param.device().clone());
        self.write_scalars(h, step, &device)?;
        let shape_of = |h: AdamStep| AdamStep { lr: 0.0, ..h };
        if self
            .fused
            .as_ref()
            .is_none_or(|(built_for, _)| *built_for != shape_of(h))
        {
            self.fused = Some((shape_of(h), Self::fused_expr(h)));
        }
        let (_, expr) = self.fused.as_ref().expect("built above");
        let scalars = &self.scalars.as_ref().expect("written above").values;
        // The decay factor only where the update decays; on the stack (no allocation).
        let skip = usize::from(h.decoupled == 0.0);
        let mut inputs = [grad.view(); 4];
        for (slot, t) in inputs[1..].iter_mut().zip(&scalars[skip..]) {
            *slot = t.view();
            slot.layout = slot.layout.broadcast_to(&dims)?;
        }
        let inputs = &inputs[..4 - skip];
        let s = self.moments.get_mut(name).expect("checked above");
        let (Some(p), Some(m), Some(v)) = (
            param.storage_mut(),
            s.exp_avg.storage_mut(),
            s.exp_avg_sq.storage_mut(),
        ) else {
            return Ok(false);
        };
        B::fused_elementwise(&device, expr, None, inputs, &dims, &mut [p, m, v])?;
        s.step = step;
        Ok(true)
    }

    /// [`Optimizer::state`], for an optimizer of `kind`.
    fn state(&self, kind: &str) -> OptimizerState<B> {
        let mut state = OptimizerState::empty(kind);
        for (name, m) in &self.moments {
            let key = |slot: &str| (slot.to_string(), name.clone());
            state.tensors.insert(key(EXP_AVG), m.exp_avg.clone());
            state.tensors.insert(key(EXP_AVG_SQ), m.exp_avg_sq.clone());
            state.counters.insert(key(STEP), m.step);
        }
        state
    }

    /// [`Optimizer::load_state`], for an optimizer of `kind`: each parameter needs
    /// both moments, of one shape, and a step count of at least 1.
    fn load_state(&mut self, kind: &str, mut state: OptimizerState<B>) -> Result<()> {
        state.check(kind, &[EXP_AVG, EXP_AVG_SQ], &[STEP])?;
        let bad = |what: String| Err(Error::invalid("load_state", what));
        let names: std::collections::BTreeSet<String> = state
            .tensors
            .keys()
            .chain(state.counters.keys())
            .map(|(_, n)| n.clone())
            .collect();
        let mut moments = HashMap::with_capacity(names.len());
        for name in names {
            let mut take = |slot: &str| state.tensors.remove(&(slot.to_string(), name.clone()));
            let (Some(exp_avg), Some(exp_avg_sq), Some(&step)) = (
                take(EXP_AVG),
                take(EXP_AVG_SQ),
                state.counters.get(&(STEP.to_string(), name.clone())),
            ) else {
                return bad(format!(
                    "`{name}` needs `{EXP_AVG}`, `{EXP_AVG_SQ}` and `{STEP}`, and lacks one"
                ));
            };
            if exp_avg.dims() != exp_avg_sq.dims() || exp_avg.dtype() != exp_avg_sq.dtype() {
                return bad(format!(
                    "the moments of `{name}` differ: {} {} and {} {}",
                    exp_avg.dims(),
                    exp_avg.dtype(),
                    exp_avg_sq.dims(),
                    exp_avg_sq.dtype()
                ));
            }
            if step == 0 {
                return bad(format!("`{name}` has moments but took no step"));
            }
            moments.insert(
                name,
                Moments {
                    step,
                    exp_avg,
                    exp_avg_sq,
                },
            );
        }
        self.clear();
        self.moments = moments;
        Ok(())
    }

    /// Forgets every parameter's moments, the fused update and the per-step values.
    fn clear(&mut self) {
        self.moments.clear();
        self.fused = None;
        self.scalars = None;
    }

    /// [`AdamState::update`] written into `param`: fused in place when it can be.
    fn update_in_place(
        &mut self,
        op: &'static str,
        h: AdamStep,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<()> {
        if !self.update_fused(h, name, param, grad)? {
            *param = self.update(op, h, name, param, grad)?;
        }
        Ok(())
    }

    fn step_count(&self, name: &str) -> Option<u64> {
        self.moments.get(name).map(|s| s.step)
    }
}

impl<B: Backend> Adam<B> {
    /// One update's hyper-parameters: weight decay as L2 on the gradient.
    fn hyper(&self) -> AdamStep {
        let c = self.config;
        AdamStep {
            lr: c.lr,
            betas: c.betas,
            eps: c.eps,
            l2: c.weight_decay,
            decoupled: 0.0,
        }
    }

    /// An optimizer with these settings (an error for settings PyTorch rejects).
    pub fn new(config: AdamConfig) -> Result<Self> {
        check_adam(
            "Adam",
            config.lr,
            config.betas,
            config.eps,
            config.weight_decay,
        )?;
        Ok(Adam {
            config,
            state: AdamState {
                moments: HashMap::new(),
                fused: None,
                scalars: None,
            },
        })
    }

    /// The settings.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// How many steps parameter `name` has taken.
    pub fn step_count(&self, name: &str) -> Option<u64> {
        self.state.step_count(name)
    }
}

impl<B: Backend> AdamW<B> {
    /// One update's hyper-parameters: weight decay decoupled from the gradient.
    fn hyper(&self) -> AdamStep {
        let c = self.config;
        AdamStep {
            lr: c.lr,
            betas: c.betas,
            eps: c.eps,
            l2: 0.0,
            decoupled: c.weight_decay,
        }
    }

    /// An optimizer with these settings (an error for settings PyTorch rejects).
    pub fn new(config: AdamWConfig) -> Result<Self> {
        check_adam(
            "AdamW",
            config.lr,
            config.betas,
            config.eps,
            config.weight_decay,
        )?;
        Ok(AdamW {
            config,
            state: AdamState {
                moments: HashMap::new(),
                fused: None,
                scalars: None,
            },
        })
    }

    /// The settings.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// How many steps parameter `name` has taken.
    pub fn step_count(&self, name: &str) -> Option<u64> {
        self.state.step_count(name)
    }
}

/// The `Optimizer` impl of an Adam flavour: its per-parameter rule is `AdamState`'s
/// with the flavour's hyper-parameters (`hyper`); everything else is shared.
macro_rules! adam_optimizer {
    ($ty:ident, $name:literal, $kind:literal) => {
        impl<B: Backend> Optimizer<B> for $ty<B> {
            fn update_param(
                &mut self,
                name: &str,
                param: &RawTensor<B>,
                grad: &RawTensor<B>,
            ) -> Result<RawTensor<B>> {
                self.state.update($name, self.hyper(), name, param, grad)
            }

            fn update_param_in_place(
                &mut self,
                name: &str,
                param: &mut RawTensor<B>,
                grad: &RawTensor<B>,
            ) -> Result<()> {
                self.state
                    .update_in_place($name, self.hyper(), name, param, grad)
            }

            fn lr(&self) -> f64 {
                self.config.lr
            }

            fn set_lr(&mut self, lr: f64) -> Result<()> {
                check_lr($name, lr)?;
                self.config.lr = lr;
                Ok(())
            }

            fn reset(&mut self) {
                self.state.clear();
            }

            fn state(&self) -> OptimizerState<B> {
                self.state.state($kind)
            }

            fn load_state(&mut self, state: OptimizerState<B>) -> Result<()> {
                self.state.load_state($kind, state)
            }

            fn prepare_step(&mut self) -> Result<()> {
                self.state.prepare_step(self.hyper())
            }

            fn step_replayed(&mut self) {
                self.state.step_replayed();
            }

            fn replay_refusal(&self) -> Option<String> {
                None
            }
        }
    };
}

adam_optimizer!(Adam, "Adam", "adam");
adam_optimizer!(AdamW, "AdamW", "adamw");

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
