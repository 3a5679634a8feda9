//! Learning-rate schedules: the [`Schedule`] trait, a [`Constant`] rate and
//! [`CosineWithWarmup`]. A schedule is a pure function of the step index, so resuming
//! from a checkpoint needs only the step; apply it with
//! `optimizer.set_lr(schedule.lr_at(step))?` before each step.

use kiln_tensor::{Error, Result};

/// A learning rate as a function of the step index.
pub trait Schedule {
    /// The learning rate of the optimizer step with 0-based index `step`.
    fn lr_at(&self, step: u64) -> f64;
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
        if min_lr > base_lr {
            return Err(Error::invalid(
                OP,
                format!("min_lr ({min_lr}) must not exceed base_lr ({base_lr})"),
            ));
        }
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

fn check_rate(op: &'static str, what: &str, v: f64) -> Result<()> {
    if !(v >= 0.0 && v.is_finite()) {
        return Err(Error::invalid(
            op,
            format!("{what} must be finite and >= 0, got {v}"),
        ));
    }
    Ok(())
}
