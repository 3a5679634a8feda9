//! Dynamic loss scaling, what a model trained under `#[model(precision = f16)]` needs:
//! f16 flushes values under 6e-8 to zero, and many gradients are that small. The
//! training step starts its backward pass from the loss scale instead of 1, so every
//! gradient on the way is that many times larger, and divides each parameter's
//! gradient by it before the optimizer sees it. The optimizer asks [`LossScale::record`]
//! whether to take the step: one whose gradients are not finite (the scale was too
//! large, and some f16 value overflowed) is skipped and the scale halved; after
//! [`LossScale::growth_interval`] steps in a row that were taken, the scale doubles.
//!
//! The scale is always a power of two, so scaling and unscaling are exact and a
//! loss-scaled step's gradients are those of an unscaled one wherever no f16 value
//! flushed or overflowed. PyTorch's `GradScaler` defaults are kept: 2¹⁶ to start,
//! doubled after 2,000 good steps, halved on overflow.

use crate::backend::Backend;
use crate::dtype::HostData;
use crate::error::{Error, Result};
use crate::raw::RawTensor;
use std::sync::Mutex;

/// The scale a model starts with: 2¹⁶, `torch.amp.GradScaler`'s default.
pub const INITIAL_LOSS_SCALE: f32 = 65536.0;

/// Good steps in a row after which the scale doubles (`GradScaler`'s default).
pub const DEFAULT_GROWTH_INTERVAL: u64 = 2000;

/// The smallest scale: a step that overflows at it is an error, since halving the
/// scale further cannot help (the forward pass itself overflows f16, or training
/// diverged).
pub const MIN_LOSS_SCALE: f32 = 1.0 / 16_777_216.0; // 2⁻²⁴

/// The largest scale: past it the scaled gradients risk f32's own range.
pub const MAX_LOSS_SCALE: f32 = 16_777_216.0 * 16_777_216.0; // 2⁴⁸

/// A loss scale as a training state saves it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleState {
    /// The scale.
    pub scale: f32,
    /// Steps taken in a row at this scale.
    pub good_steps: u64,
    /// Steps skipped so far for gradients that were not finite.
    pub skipped: u64,
}

impl LossScaleState {
    /// An error unless the scale is one [`LossScale::set_scale`] takes (a training state
    /// that was edited or damaged).
    pub fn check(&self) -> Result<()> {
        check_scale(self.scale)
    }
}

struct Scaler<B: Backend> {
    state: LossScaleState,
    growth_interval: u64,
    /// The scale as a rank-0 f32 tensor, kept while the scale and device stay the same.
    on_device: Option<RawTensor<B>>,
}

/// A model's dynamic loss scale (see the module doc).
pub struct LossScale<B: Backend> {
    inner: Mutex<Scaler<B>>,
}

impl<B: Backend> Default for LossScale<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> std::fmt::Debug for LossScale<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("LossScale")
            .field("state", &s.state)
            .field("growth_interval", &s.growth_interval)
            .finish()
    }
}

impl<B: Backend> LossScale<B> {
    /// A scale of [`INITIAL_LOSS_SCALE`] that doubles after [`DEFAULT_GROWTH_INTERVAL`]
    /// good steps.
    pub fn new() -> Self {
        LossScale {
            inner: Mutex::new(Scaler {
                state: LossScaleState {
                    scale: INITIAL_LOSS_SCALE,
                    good_steps: 0,
                    skipped: 0,
                },
                growth_interval: DEFAULT_GROWTH_INTERVAL,
                on_device: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Scaler<B>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current scale.
    pub fn scale(&self) -> f32 {
        self.lock().state.scale
    }

    /// Sets the scale: a power of two from [`MIN_LOSS_SCALE`] to [`MAX_LOSS_SCALE`]
    /// (so that unscaling is exact), or an error. The run of good steps starts again.
    pub fn set_scale(&self, scale: f32) -> Result<()> {
        check_scale(scale)?;
        let mut s = self.lock();
        s.state.scale = scale;
        s.state.good_steps = 0;
        s.on_device = None;
        Ok(())
    }

    /// Good steps in a row after which the scale doubles.
    pub fn growth_interval(&self) -> u64 {
        self.lock().growth_interval
    }

    /// Sets [`LossScale::growth_interval`]: at least 1, or an error.
    pub fn set_growth_interval(&self, steps: u64) -> Result<()> {
        if steps == 0 {
            return Err(Error::invalid(
                "loss scale",
                "the growth interval is a number of steps, at least 1",
            ));
        }
        self.lock().growth_interval = steps;
        Ok(())
    }

    /// The scale, the good steps since it last changed and the steps skipped.
    pub fn state(&self) -> LossScaleState {
        self.lock().state
    }

    /// Restores a state [`LossScale::state`] gave (a resumed run); an error for a scale
    /// [`LossScale::set_scale`] would refuse.
    pub fn load_state(&self, state: LossScaleState) -> Result<()> {
        state.check()?;
        let mut s = self.lock();
        s.state = state;
        s.on_device = None;
        Ok(())
    }

    /// The scale as a rank-0 f32 tensor on `device`: what a loss-scaled step starts
    /// its backward pass from.
    pub fn tensor(&self, device: &B::Device) -> Result<RawTensor<B>> {
        let mut s = self.lock();
        let scale = s.state.scale;
        // Every change of the scale drops the tensor, so a kept one holds the scale.
        if let Some(t) = &s.on_device {
            if t.device() == device {
                return Ok(t.clone());
            }
        }
        let t = RawTensor::from_host(HostData::F32(vec![scale]), &[], device)?;
        s.on_device = Some(t.clone());
        Ok(t)
    }

    /// Records a step whose gradients were finite or not, and says whether to take it:
    /// a finite one is taken (the scale doubles after enough of them in a row), one
    /// that is not is skipped and the scale halved. An error when the scale is already
    /// [`MIN_LOSS_SCALE`] and the gradients are still not finite.
    pub fn record(&self, finite: bool) -> Result<bool> {
        let mut s = self.lock();
        let scale = s.state.scale;
        if finite {
            s.state.good_steps += 1;
            if s.state.good_steps >= s.growth_interval && scale < MAX_LOSS_SCALE {
                s.state.scale = scale * 2.0;
                s.state.good_steps = 0;
                s.on_device = None;
            }
            return Ok(true);
        }
        if scale <= MIN_LOSS_SCALE {
            return Err(Error::invalid(
                "loss scale",
                format!(
                    "the gradients are not finite even with the loss scaled by {scale:e}: the forward pass overflows f16, or training diverged"
                ),
            ));
        }
        s.state.scale = scale * 0.5;
        s.state.good_steps = 0;
        s.state.skipped += 1;
        s.on_device = None;
        Ok(false)
    }
}

/// An error unless `scale` is a power of two in the allowed range.
fn check_scale(scale: f32) -> Result<()> {
    let power_of_two = scale.is_finite() && scale > 0.0 && scale.to_bits() & 0x7f_ffff == 0;
    if power_of_two && (MIN_LOSS_SCALE..=MAX_LOSS_SCALE).contains(&scale) {
        return Ok(());
    }
    Err(Error::invalid(
        "loss scale",
        format!(
            "{scale} is not a power of two from 2^-24 to 2^48 (a power of two keeps unscaling exact)"
        ),
    ))
}
