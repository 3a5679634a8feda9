//! Learning-rate schedules: the [`Schedule`] trait and PyTorch's schedules as closed
//! forms of the step index — [`Constant`], [`StepDecay`] (`StepLR`), [`Exponential`]
//! (`ExponentialLR`), [`CosineRestarts`] (`CosineAnnealingWarmRestarts`),
//! [`OneCycle`] (`OneCycleLR`), [`Linear`] (`LinearLR`), [`Warmup`] (`LinearLR` then
//! another schedule, as `SequentialLR` chains them), [`Lambda`] (`LambdaLR`, a user's
//! closure) — and [`CosineWithWarmup`] (Hugging Face's). Each is checked against
//! PyTorch's rates in `train/tests/schedule.rs` (`scripts/schedule_reference.py`).
//!
//! A schedule is a pure function of the step index, so resuming from a checkpoint
//! needs only the step; apply it with `optimizer.set_lr(schedule.lr_at(step))?` before
//! each step. Steps count optimizer steps, not epochs: PyTorch's `step_size` or `T_0`
//! in epochs is that many epochs' steps here.

use kiln_tensor::{Error, Result};

/// A learning rate as a function of the step index.
pub trait Schedule {
    /// The learning rate of the optimizer step with 0-based index `step`.
    fn lr_at(&self, step: u64) -> f64;
}

impl<S: Schedule + ?Sized> Schedule for &S {
    fn lr_at(&self, step: u64) -> f64 {
        (**self).lr_at(step)
    }
}

impl<S: Schedule + ?Sized> Schedule for Box<S> {
    fn lr_at(&self, step: u64) -> f64 {
        (**self).lr_at(step)
    }
}

/// The same learning rate at every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constant {
    /// The rate.
    pub lr: f64,
}

impl Constant {
    /// A constant schedule (an error if `lr` is negative or not finite).
    pub fn new(lr: f64) -> Result<Self> {
        check_rate("Constant", "lr", lr)?;
        Ok(Constant { lr })
    }
}

impl Schedule for Constant {
    fn lr_at(&self, _step: u64) -> f64 {
        self.lr
    }
}

/// Linear warm-up from 0 to `base_lr` over `warmup_steps`, then a half cosine from
/// `base_lr` down to `min_lr` at `total_steps`, then `min_lr` for ever.
///
/// ```text
/// step < warmup:          base_lr · step / warmup
/// warmup ≤ step < total:  min_lr + (base_lr − min_lr) · (1 + cos(π · (step − warmup) / (total − warmup))) / 2
/// step ≥ total:           min_lr
/// ```
///
/// Step 0 has rate 0, as in Hugging Face's `get_cosine_schedule_with_warmup` (with
/// `min_lr = 0` the two agree at every step). The fields are public: values that
/// [`CosineWithWarmup::new`] would refuse never panic, they just give what the formula
/// gives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineWithWarmup {
    /// The rate at the end of the warm-up.
    pub base_lr: f64,
    /// The rate from `total_steps` on.
    pub min_lr: f64,
    /// Steps of linear warm-up (0 for none).
    pub warmup_steps: u64,
    /// The step at which the cosine reaches `min_lr`.
    pub total_steps: u64,
}

impl CosineWithWarmup {
    /// A checked schedule: rates finite with `0 ≤ min_lr ≤ base_lr`, and
    /// `warmup_steps ≤ total_steps`.
    pub fn new(base_lr: f64, min_lr: f64, warmup_steps: u64, total_steps: u64) -> Result<Self> {
        const OP: &str = "CosineWithWarmup";
        check_rate(OP, "base_lr", base_lr)?;
        check_rate(OP, "min_lr", min_lr)?;
        check_ordered(OP, min_lr, base_lr)?;
        if warmup_steps > total_steps {
            return Err(Error::invalid(
                OP,
                format!(
                    "warmup_steps ({warmup_steps}) must not exceed total_steps ({total_steps})"
                ),
            ));
        }
        Ok(CosineWithWarmup {
            base_lr,
            min_lr,
            warmup_steps,
            total_steps,
        })
    }
}

impl Schedule for CosineWithWarmup {
    fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * step as f64 / self.warmup_steps as f64;
        }
        if step >= self.total_steps {
            return self.min_lr;
        }
        // Here warmup_steps ≤ step < total_steps, so the span is at least 1.
        let progress =
            (step - self.warmup_steps) as f64 / (self.total_steps - self.warmup_steps) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.base_lr - self.min_lr) * cosine
    }
}

/// `base_lr · gamma^⌊step / step_size⌋`: PyTorch's `StepLR`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepDecay {
    /// The rate of the first `step_size` steps.
    pub base_lr: f64,
    /// Steps between decays (at least 1).
    pub step_size: u64,
    /// The factor of each decay.
    pub gamma: f64,
}

impl StepDecay {
    /// A checked schedule: `base_lr` and `gamma` finite and ≥ 0, `step_size` ≥ 1.
    pub fn new(base_lr: f64, step_size: u64, gamma: f64) -> Result<Self> {
        const OP: &str = "StepDecay";
        check_rate(OP, "base_lr", base_lr)?;
        check_rate(OP, "gamma", gamma)?;
        check_positive_steps(OP, "step_size", step_size)?;
        Ok(StepDecay {
            base_lr,
            step_size,
            gamma,
        })
    }
}

impl Schedule for StepDecay {
    fn lr_at(&self, step: u64) -> f64 {
        self.base_lr * power(self.gamma, step / self.step_size.max(1))
    }
}

/// `base_lr · gamma^step`: PyTorch's `ExponentialLR`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exponential {
    /// The rate of step 0.
    pub base_lr: f64,
    /// The factor of each step.
    pub gamma: f64,
}

impl Exponential {
    /// A checked schedule: `base_lr` and `gamma` finite and ≥ 0.
    pub fn new(base_lr: f64, gamma: f64) -> Result<Self> {
        const OP: &str = "Exponential";
        check_rate(OP, "base_lr", base_lr)?;
        check_rate(OP, "gamma", gamma)?;
        Ok(Exponential { base_lr, gamma })
    }
}

impl Schedule for Exponential {
    fn lr_at(&self, step: u64) -> f64 {
        self.base_lr * power(self.gamma, step)
    }
}

/// Cosine annealing with warm restarts (SGDR): PyTorch's `CosineAnnealingWarmRestarts`.
///
/// The first cycle is `first_cycle` steps, each next one `cycle_mult` times longer;
/// within a cycle, at `t` steps into a cycle of `n`:
///
/// ```text
/// min_lr + (base_lr − min_lr) · (1 + cos(π · t / n)) / 2
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineRestarts {
    /// The rate at the start of every cycle.
    pub base_lr: f64,
    /// The rate the cosine approaches at the end of a cycle.
    pub min_lr: f64,
    /// Steps of the first cycle (PyTorch's `T_0`, at least 1).
    pub first_cycle: u64,
    /// How much longer each cycle is than the one before (`T_mult`, at least 1).
    pub cycle_mult: u64,
}

impl CosineRestarts {
    /// A checked schedule: rates finite with `0 ≤ min_lr ≤ base_lr`, `first_cycle` and
    /// `cycle_mult` at least 1.
    pub fn new(base_lr: f64, min_lr: f64, first_cycle: u64, cycle_mult: u64) -> Result<Self> {
        const OP: &str = "CosineRestarts";
        check_rate(OP, "base_lr", base_lr)?;
        check_rate(OP, "min_lr", min_lr)?;
        check_ordered(OP, min_lr, base_lr)?;
        check_positive_steps(OP, "first_cycle", first_cycle)?;
        check_positive_steps(OP, "cycle_mult", cycle_mult)?;
        Ok(CosineRestarts {
            base_lr,
            min_lr,
            first_cycle,
            cycle_mult,
        })
    }

    /// Steps into the current cycle, and that cycle's length.
    fn position(&self, step: u64) -> (u64, u64) {
        let first = self.first_cycle.max(1);
        if self.cycle_mult <= 1 {
            return (step % first, first);
        }
        // Cycles grow geometrically, so this walks at most 64 of them.
        let (mut into, mut len) = (step, first);
        while into >= len {
            into -= len;
            len = len.saturating_mul(self.cycle_mult);
        }
        (into, len)
    }
}

impl Schedule for CosineRestarts {
    fn lr_at(&self, step: u64) -> f64 {
        let (into, len) = self.position(step);
        let cosine = 1.0 + (std::f64::consts::PI * into as f64 / len as f64).cos();
        self.min_lr + (self.base_lr - self.min_lr) * cosine / 2.0
    }
}

/// How [`OneCycle`] moves between two rates within a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anneal {
    /// Half a cosine (PyTorch's default, `anneal_strategy="cos"`).
    Cos,
    /// A straight line (`"linear"`).
    Linear,
}

impl Anneal {
    /// The rate `fraction` of the way from `start` to `end`, in PyTorch's arithmetic.
    fn at(self, start: f64, end: f64, fraction: f64) -> f64 {
        match self {
            Anneal::Cos => {
                end + (start - end) / 2.0 * ((std::f64::consts::PI * fraction).cos() + 1.0)
            }
            Anneal::Linear => (end - start) * fraction + start,
        }
    }
}

/// The one-cycle policy (Smith & Topin): PyTorch's `OneCycleLR`, without its momentum
/// cycling.
///
/// From `max_lr / div_factor` up to `max_lr` over the first `pct_start` of
/// `total_steps`, then down to `max_lr / div_factor / final_div_factor` at the last
/// step (with `three_phase`, down to the starting rate over as many steps as the rise,
/// then to the final rate); the final rate after `total_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneCycle {
    /// The peak rate.
    pub max_lr: f64,
    /// Steps of the whole cycle.
    pub total_steps: u64,
    /// The fraction of the cycle spent rising (PyTorch's default 0.3).
    pub pct_start: f64,
    /// The starting rate is `max_lr / div_factor` (default 25).
    pub div_factor: f64,
    /// The final rate is the starting rate over `final_div_factor` (default 10⁴).
    pub final_div_factor: f64,
    /// The shape of each phase.
    pub anneal: Anneal,
    /// Fall back to the starting rate before the final descent.
    pub three_phase: bool,
}

impl OneCycle {
    /// PyTorch's defaults: `pct_start` 0.3, `div_factor` 25, `final_div_factor` 10⁴,
    /// cosine phases, two phases.
    pub fn new(max_lr: f64, total_steps: u64) -> Result<Self> {
        OneCycle {
            max_lr,
            total_steps,
            pct_start: 0.3,
            div_factor: 25.0,
            final_div_factor: 1e4,
            anneal: Anneal::Cos,
            three_phase: false,
        }
        .checked()
    }

    /// This schedule, or an error naming what is out of range: rates finite and ≥ 0,
    /// factors finite and > 0, and every phase at least one step long.
    pub fn checked(self) -> Result<Self> {
        const OP: &str = "OneCycle";
        check_rate(OP, "max_lr", self.max_lr)?;
        for (what, v) in [
            ("div_factor", self.div_factor),
            ("final_div_factor", self.final_div_factor),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(Error::invalid(
                    OP,
                    format!("{what} must be finite and > 0, got {v}"),
                ));
            }
        }
        if !(self.pct_start > 0.0 && self.pct_start < 1.0) {
            return Err(Error::invalid(
                OP,
                format!(
                    "pct_start must lie strictly between 0 and 1, got {}",
                    self.pct_start
                ),
            ));
        }
        let ends = self.phase_ends();
        let mut start = 0.0;
        for end in ends.iter().map(|p| p.0) {
            if end <= start {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "with {} total steps and pct_start {}{}, a phase is shorter than one \
                         step; give more total_steps or another pct_start",
                        self.total_steps,
                        self.pct_start,
                        if self.three_phase {
                            " (three phases)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            start = end;
        }
        Ok(self)
    }

    /// Each phase's last step (fractional, as PyTorch computes it) and its rates.
    fn phase_ends(&self) -> Vec<(f64, f64, f64)> {
        let initial = self.max_lr / self.div_factor;
        let last = initial / self.final_div_factor;
        let total = self.total_steps as f64;
        let rise = self.pct_start * total - 1.0;
        if self.three_phase {
            vec![
                (rise, initial, self.max_lr),
                (2.0 * self.pct_start * total - 2.0, self.max_lr, initial),
                (total - 1.0, initial, last),
            ]
        } else {
            vec![
                (rise, initial, self.max_lr),
                (total - 1.0, self.max_lr, last),
            ]
        }
    }
}

impl Schedule for OneCycle {
    fn lr_at(&self, step: u64) -> f64 {
        let phases = self.phase_ends();
        let step = step as f64;
        let mut start = 0.0;
        for (i, &(end, from, to)) in phases.iter().enumerate() {
            if step <= end || i == phases.len() - 1 {
                // Past the last step the rate stays at the final one.
                let fraction = ((step - start) / (end - start)).min(1.0);
                return self.anneal.at(from, to, fraction);
            }
            start = end;
        }
        unreachable!("the last phase always answers")
    }
}

/// A straight line in the rate's factor: `base_lr · (start_factor + (end_factor −
/// start_factor) · min(step, total_steps) / total_steps)`, PyTorch's `LinearLR`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Linear {
    /// The rate the factors scale.
    pub base_lr: f64,
    /// The factor at step 0.
    pub start_factor: f64,
    /// The factor from `total_steps` on.
    pub end_factor: f64,
    /// Steps of the line (at least 1).
    pub total_steps: u64,
}

impl Linear {
    /// A checked schedule: `base_lr` finite and ≥ 0, `start_factor` in (0, 1] and
    /// `end_factor` in [0, 1] (PyTorch's ranges), `total_steps` at least 1.
    pub fn new(base_lr: f64, start_factor: f64, end_factor: f64, total_steps: u64) -> Result<Self> {
        const OP: &str = "Linear";
        check_rate(OP, "base_lr", base_lr)?;
        check_start_factor(OP, start_factor)?;
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(Error::invalid(
                OP,
                format!("end_factor must lie in [0, 1], got {end_factor}"),
            ));
        }
        check_positive_steps(OP, "total_steps", total_steps)?;
        Ok(Linear {
            base_lr,
            start_factor,
            end_factor,
            total_steps,
        })
    }
}

impl Schedule for Linear {
    fn lr_at(&self, step: u64) -> f64 {
        let total = self.total_steps.max(1);
        let fraction = step.min(total) as f64 / total as f64;
        self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * fraction)
    }
}

/// A linear warm-up into another schedule: for the first `warmup_steps`, the inner
/// schedule's first rate times a factor rising from `start_factor` towards 1; then the
/// inner schedule from its own step 0. PyTorch's `SequentialLR` of a `LinearLR` and the
/// inner schedule, with the milestone at `warmup_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Warmup<S> {
    /// The schedule after the warm-up.
    pub inner: S,
    /// The factor at step 0.
    pub start_factor: f64,
    /// Steps of warm-up (0 for none).
    pub warmup_steps: u64,
}

impl<S: Schedule> Warmup<S> {
    /// A checked warm-up: `start_factor` in (0, 1].
    pub fn new(inner: S, start_factor: f64, warmup_steps: u64) -> Result<Self> {
        check_start_factor("Warmup", start_factor)?;
        Ok(Warmup {
            inner,
            start_factor,
            warmup_steps,
        })
    }
}

impl<S: Schedule> Schedule for Warmup<S> {
    fn lr_at(&self, step: u64) -> f64 {
        if step >= self.warmup_steps {
            return self.inner.lr_at(step - self.warmup_steps);
        }
        let fraction = step as f64 / self.warmup_steps as f64;
        self.inner.lr_at(0) * (self.start_factor + (1.0 - self.start_factor) * fraction)
    }
}

/// `base_lr · factor(step)` for a function of the user's: PyTorch's `LambdaLR`. A
/// factor that makes the rate negative or not finite is refused by the optimizer's
/// `set_lr`, naming the rate.
#[derive(Clone, Copy)]
pub struct Lambda<F> {
    /// The rate the factor scales.
    pub base_lr: f64,
    /// The factor of each step.
    pub factor: F,
}

impl<F: Fn(u64) -> f64> Lambda<F> {
    /// A schedule from `factor` (an error if `base_lr` is negative or not finite).
    pub fn new(base_lr: f64, factor: F) -> Result<Self> {
        check_rate("Lambda", "base_lr", base_lr)?;
        Ok(Lambda { base_lr, factor })
    }
}

impl<F: Fn(u64) -> f64> Schedule for Lambda<F> {
    fn lr_at(&self, step: u64) -> f64 {
        self.base_lr * (self.factor)(step)
    }
}

impl<F> std::fmt::Debug for Lambda<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lambda")
            .field("base_lr", &self.base_lr)
            .finish_non_exhaustive()
    }
}

/// `x^n` for a step count `n` of any size.
fn power(x: f64, n: u64) -> f64 {
    match i32::try_from(n) {
        Ok(n) => x.powi(n),
        Err(_) => x.powf(n as f64),
    }
}

fn check_positive_steps(op: &'static str, what: &str, n: u64) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            op,
            format!("{what} must be at least 1, got 0"),
        ));
    }
    Ok(())
}

fn check_start_factor(op: &'static str, f: f64) -> Result<()> {
    if !(f > 0.0 && f <= 1.0) {
        return Err(Error::invalid(
            op,
            format!("start_factor must lie in (0, 1], got {f}"),
        ));
    }
    Ok(())
}

fn check_ordered(op: &'static str, min_lr: f64, base_lr: f64) -> Result<()> {
    if min_lr > base_lr {
        return Err(Error::invalid(
            op,
            format!("min_lr ({min_lr}) must not exceed base_lr ({base_lr})"),
        ));
    }
    Ok(())
}

fn check_rate(op: &'static str, what: &str, v: f64) -> Result<()> {
    if !(v >= 0.0 && v.is_finite()) {
        return Err(Error::invalid(
            op,
            format!("{what} must be finite and >= 0, got {v}"),
        ));
    }
    Ok(())
}
