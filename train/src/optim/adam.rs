//! [`Adam`] and [`AdamW`]: their settings, moments and per-step values in device
//! memory, shared by both flavours (they differ only in where weight decay goes).

use super::clip::{Clipping, GradClip};
use super::grouped::{owned, update_together, GroupedRule, Groups, Staged};
use super::rules::{self, AdamPerStep, Clip, Eager, ExprBuilder};
use super::{check_lr, check_non_negative, check_state, compute_inputs, finish};
use super::{Optimizer, OptimizerState};
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, DType, Error, RawTensor, Result};
use std::collections::HashMap;

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
    /// The fused update last built and the hyper-parameters and clipping it is for
    /// (the learning rate aside: it reaches the update through `scalars`).
    fused: Option<((AdamStep, GradClip), FusedExpr)>,
    /// The values that change between steps, in device memory: what the fused update
    /// reads, so that a captured step reads each replay's.
    scalars: Option<StepScalars<B>>,
    /// Gradient clipping.
    clip: Clipping<B>,
    /// What grouped steps keep between steps.
    groups: Groups<B, 2>,
}

/// Adam's grouped step of step count `step` on `device` ([`super::grouped`]): the
/// moments are the state.
struct AdamGroup<'a, B: Backend> {
    state: &'a mut AdamState<B>,
    op: &'static str,
    h: AdamStep,
    step: u64,
    device: B::Device,
}

impl<B: Backend> GroupedRule<B, 2> for AdamGroup<'_, B> {
    fn take_state(&mut self, name: &str, grad: &RawTensor<B>) -> Option<[RawTensor<B>; 2]> {
        let s = self.state.moments.get_mut(name)?;
        let joins = s.step + 1 == self.step
            && *grad.device() == self.device
            && owned(&s.exp_avg, grad)
            && owned(&s.exp_avg_sq, grad);
        joins.then(|| {
            [
                std::mem::replace(&mut s.exp_avg, grad.clone()),
                std::mem::replace(&mut s.exp_avg_sq, grad.clone()),
            ]
        })
    }

    fn put_back_state(&mut self, name: &str, state: [RawTensor<B>; 2], updated: bool) {
        let s = self
            .state
            .moments
            .get_mut(name)
            .expect("taken by `take_state`");
        [s.exp_avg, s.exp_avg_sq] = state;
        if updated {
            s.step = self.step;
        }
    }

    fn update_group(&mut self, staged: &mut [Staged<B, 2>]) -> Result<()> {
        let (h, st) = (self.h, &mut *self.state);
        let clip = st.clip.mode();
        let key = (AdamStep { lr: 0.0, ..h }, clip);
        if st
            .fused
            .as_ref()
            .is_none_or(|(built_for, _)| *built_for != key)
        {
            st.fused = Some((key, AdamState::<B>::fused_expr(h, clip)?));
        }
        let (_, expr) = st.fused.as_ref().expect("built above");
        let scalars = &st
            .scalars
            .as_ref()
            .expect("written by `step_grouped`")
            .values;
        let skip = usize::from(h.decoupled == 0.0);
        let scale = match clip {
            GradClip::Norm(_) => Some(st.clip.scale()?),
            _ => None,
        };
        let per_step: Vec<&RawTensor<B>> = scalars[skip..].iter().chain(scale).collect();
        update_together(self.op, &self.device, expr, &per_step, staged)
    }

    fn update_alone(
        &mut self,
        name: &str,
        param: &mut RawTensor<B>,
        grad: &RawTensor<B>,
    ) -> Result<()> {
        self.state
            .update_in_place(self.op, self.h, name, param, grad)
    }
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
pub(super) struct AdamStep {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// L2 weight decay added to the gradient (Adam).
    pub l2: f64,
    /// Decoupled weight decay applied to the parameter (AdamW).
    pub decoupled: f64,
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
        let (p, g) = compute_inputs(op, name, param, grad)?;
        let clip = self.clip.eager(g.dtype())?;
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
        let per_step = AdamPerStep::at(&h, step);
        let [new, exp_avg, exp_avg_sq] = rules::adam(
            &mut Eager::new(),
            &h,
            per_step,
            &p,
            &g,
            &clip,
            &s.exp_avg,
            &s.exp_avg_sq,
        )?;
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
        let k = AdamPerStep::at(&h, step);
        [
            k.decay.unwrap_or(1.0) as f32,
            k.inv_root_correction2 as f32,
            k.step_size as f32,
        ]
    }

    /// The update of an f32 parameter and its two moments as one fused kernel, outputs
    /// `[param, exp_avg, exp_avg_sq]` read and written in place, inputs `[grad,
    /// (1 − lr·wd when decoupled), 1/√(1 − β₂ᵗ), lr/(1 − β₁ᵗ)]`, the per-step values
    /// broadcast from device memory, and last, clipping by the global norm, its scale:
    /// [`rules::adam`] read as an expression, so it agrees bit for bit with
    /// [`AdamState::update`].
    fn fused_expr(h: AdamStep, clip: GradClip) -> Result<FusedExpr> {
        let decays = h.decoupled != 0.0;
        let norm = matches!(clip, GradClip::Norm(_));
        let inputs = 3 + usize::from(decays) + usize::from(norm);
        let (mut e, g, outputs) = ExprBuilder::new(inputs, 3);
        let decay = decays.then(|| e.input(1));
        let first = 1 + usize::from(decays);
        let per_step = AdamPerStep {
            decay,
            inv_root_correction2: e.input(first),
            step_size: e.input(first + 1),
        };
        let clip = match clip {
            GradClip::None => Clip::None,
            GradClip::Value(c) => Clip::Value(c),
            GradClip::Norm(_) => Clip::Scale(e.input(inputs - 1)),
        };
        let [p, m, v] = [outputs[0], outputs[1], outputs[2]];
        let results = rules::adam(&mut e, &h, per_step, &p, &g, &clip, &m, &v)?;
        Ok(e.finish(results.to_vec()))
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
        let clip = self.clip.mode();
        let key = (AdamStep { lr: 0.0, ..h }, clip);
        if self
            .fused
            .as_ref()
            .is_none_or(|(built_for, _)| *built_for != key)
        {
            self.fused = Some((key, Self::fused_expr(h, clip)?));
        }
        let (_, expr) = self.fused.as_ref().expect("built above");
        let scalars = &self.scalars.as_ref().expect("written above").values;
        // The decay factor only where the update decays, the clipping scale only where
        // it clips by the norm; on the stack (no allocation).
        let skip = usize::from(h.decoupled == 0.0);
        let scale = match clip {
            GradClip::Norm(_) => Some(self.clip.scale()?),
            _ => None,
        };
        let mut inputs = [grad.view(); 5];
        let mut count = 1;
        for t in scalars[skip..].iter().chain(scale) {
            inputs[count] = t.view();
            inputs[count].layout = inputs[count].layout.broadcast_to(&dims)?;
            count += 1;
        }
        let inputs = &inputs[..count];
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

    /// [`Optimizer::step`] with the parameters updated together
    /// ([`super::grouped`]) where the backend groups fused kernels and anomaly mode is
    /// off; `false`, having done nothing, where it does not apply (the caller updates
    /// them one by one). Parameters join when their fused update
    /// ([`AdamState::update_fused`], the same expression) applies at the step's count.
    fn step_grouped<M: Module<B>>(
        &mut self,
        op: &'static str,
        h: AdamStep,
        model: &mut M,
        grads: &M::Grads,
    ) -> Result<bool> {
        let group = self
            .moments
            .values()
            .next()
            .map(|s| (s.step + 1, s.exp_avg.device().clone()))
            .filter(|(_, device)| {
                !kiln_tensor::anomaly::detecting() && B::groups_fused_elementwise(device)
            });
        let Some((step, device)) = group else {
            return Ok(false);
        };
        self.write_scalars(h, step, &device)?;
        let mut groups = std::mem::take(&mut self.groups);
        let mut rule = AdamGroup {
            state: self,
            op,
            h,
            step,
            device,
        };
        let done = groups.step(op, &mut rule, model, grads);
        self.groups = groups;
        done.map(|()| true)
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
    #[inline(never)]
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
                clip: Clipping::new(),
                groups: Groups::default(),
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
    #[inline(never)]
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
                clip: Clipping::new(),
                groups: Groups::default(),
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
            #[inline(never)]
            fn update_param(
                &mut self,
                name: &str,
                param: &RawTensor<B>,
                grad: &RawTensor<B>,
            ) -> Result<RawTensor<B>> {
                self.state.update($name, self.hyper(), name, param, grad)
            }

            #[inline(never)]
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

            #[inline(never)]
            fn set_lr(&mut self, lr: f64) -> Result<()> {
                check_lr($name, lr)?;
                self.config.lr = lr;
                Ok(())
            }

            fn reset(&mut self) {
                self.state.clear();
            }

            #[inline(never)]
            fn state(&self) -> OptimizerState<B> {
                self.state.state($kind)
            }

            #[inline(never)]
            fn load_state(&mut self, state: OptimizerState<B>) -> Result<()> {
                self.state.load_state($kind, state)
            }

            #[inline(never)]
            fn prepare_step(&mut self) -> Result<()> {
                self.state.prepare_step(self.hyper())
            }

            fn step_replayed(&mut self) {
                self.state.step_replayed();
            }

            #[inline(never)]
            fn step<M: kiln_tensor::nn::Module<B>>(
                &mut self,
                model: &mut M,
                grads: &M::Grads,
            ) -> Result<()> {
                if !super::begin_step(self, model, grads)? {
                    return Ok(());
                }
                let h = self.hyper();
                match self.state.step_grouped($name, h, model, grads)? {
                    true => Ok(()),
                    false => super::step_one_by_one(self, model, grads),
                }
            }

            fn replay_refusal(&self) -> Option<String> {
                None
            }

            fn grad_clip(&self) -> GradClip {
                self.state.clip.mode()
            }

            fn set_grad_clip(&mut self, clip: GradClip) -> Result<()> {
                self.state.clip.set(clip)
            }

            fn prepare_clip<M: kiln_tensor::nn::Module<B>>(
                &mut self,
                model: &mut M,
                grads: &M::Grads,
            ) -> Result<()> {
                self.state.clip.prepare(model, grads)
            }
        }
    };
}

adam_optimizer!(Adam, "Adam", "adam");
adam_optimizer!(AdamW, "AdamW", "adamw");
