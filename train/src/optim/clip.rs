//! Gradient clipping inside an optimizer's update: by value (each element clamped) or
//! by the global norm of all gradients (each scaled by `min(1, max_norm / (‖g‖₂ +
//! 1e-6))`, PyTorch's `clip_grad_norm_`). The clipped gradient is never stored: the
//! update rules read it through [`Clip`], so the eager update and the fused kernel
//! clip alike, bit for bit. The global norm's scale is computed on the device and kept
//! there, rewritten in place each step, so a captured step replays it.

use super::rules::Clip;
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, BinaryOp, BuilderExt, DType, Dims, Error, RawTensor, Result, UnaryOp};

/// How an optimizer clips gradients before its update.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum GradClip {
    /// No clipping.
    #[default]
    None,
    /// Each gradient element clamped into `[−c, c]` (`clip_grad_value_`).
    Value(f64),
    /// Every gradient scaled by `min(1, max_norm / (‖g‖₂ + 1e-6))`, the norm taken
    /// over all of the step's gradients together (`clip_grad_norm_`).
    Norm(f64),
}

impl GradClip {
    /// An error unless the bound is finite and > 0.
    pub(super) fn check(self) -> Result<()> {
        let (what, v) = match self {
            GradClip::None => return Ok(()),
            GradClip::Value(v) => ("a clipping value", v),
            GradClip::Norm(v) => ("a clipping norm", v),
        };
        if !(v > 0.0 && v.is_finite()) {
            return Err(Error::invalid(
                "set_grad_clip",
                format!("{what} must be finite and > 0, got {v}"),
            ));
        }
        Ok(())
    }
}

/// The global L2 norm of `grads` (every gradient of `model`'s step, in f32), a rank-0
/// f32 tensor on their device: what [`GradClip::Norm`] scales by, for logging too.
pub fn global_norm<B: Backend, M: Module<B>>(
    model: &mut M,
    grads: &M::Grads,
) -> Result<RawTensor<B>> {
    norm_of(crate::parallel::named_grads(model, grads)?)
}

/// The norm of all of `grads` together: [`global_norm`]'s arithmetic, generic over the
/// backend only (the CPU's copy compiled in this crate, `instances.rs`).
#[inline(never)]
pub(crate) fn norm_of<B: Backend>(grads: Vec<(String, RawTensor<B>)>) -> Result<RawTensor<B>> {
    let mut total: Option<RawTensor<B>> = None;
    for (_, g) in grads {
        let g = g.cast(DType::F32)?;
        let axes: Vec<usize> = (0..g.rank()).collect();
        let squares = g.ops().mul(&g, &g)?.sum(&axes, false)?;
        total = Some(match total.take() {
            None => squares,
            Some(t) => t.ops().add(&t, &squares)?,
        });
    }
    let total = total.ok_or_else(|| Error::invalid("global_norm", "the model has no gradients"))?;
    total.ops().unary(UnaryOp::Sqrt, &total)
}

/// An optimizer's clipping: the mode and, for the global norm, this step's scale.
pub(crate) struct Clipping<B: Backend> {
    mode: GradClip,
    /// `min(1, max_norm / (‖g‖ + 1e-6))`, rank 0, f32, on the gradients' device.
    scale: Option<RawTensor<B>>,
}

impl<B: Backend> Clipping<B> {
    /// No clipping.
    pub(super) fn new() -> Self {
        Clipping {
            mode: GradClip::None,
            scale: None,
        }
    }

    /// The mode.
    pub(super) fn mode(&self) -> GradClip {
        self.mode
    }

    /// Sets the mode (checked); the scale of an earlier step is forgotten.
    pub(super) fn set(&mut self, mode: GradClip) -> Result<()> {
        mode.check()?;
        self.mode = mode;
        self.scale = None;
        Ok(())
    }

    /// For the global norm: this step's scale, from all of `grads`, written into
    /// device memory (in place after the first step, so that a replay recomputes it).
    pub(super) fn prepare<M: Module<B>>(&mut self, model: &mut M, grads: &M::Grads) -> Result<()> {
        let GradClip::Norm(_) = self.mode else {
            return Ok(());
        };
        self.scale_for(global_norm(model, grads)?)
    }

    /// Writes the scale that clipping to [`GradClip::Norm`] applies given the
    /// gradients' global `norm` (generic over the backend only, as [`norm_of`]).
    #[inline(never)]
    pub(crate) fn scale_for(&mut self, norm: RawTensor<B>) -> Result<()> {
        let GradClip::Norm(max_norm) = self.mode else {
            return Ok(());
        };
        let device = norm.device().clone();
        if self.scale.as_ref().is_none_or(|s| *s.device() != device) {
            self.scale = Some(RawTensor::zeros(&[], DType::F32, &device)?);
        }
        // min(max_norm / (norm + 1e-6), 1), in f32 as PyTorch computes it.
        let expr = FusedExpr {
            steps: vec![
                ExprStep::Input(0),
                ExprStep::Const(1e-6),
                ExprStep::Binary(BinaryOp::Add, 0, 1),
                ExprStep::Const(max_norm as f32),
                ExprStep::Binary(BinaryOp::Div, 3, 2),
                ExprStep::Const(1.0),
                ExprStep::Binary(BinaryOp::Min, 4, 5),
            ],
            results: vec![6],
            inputs: 1,
        };
        let scale = self.scale.as_mut().expect("made above");
        let storage = scale.storage_mut().ok_or_else(|| {
            Error::invalid("clip", "the clipping scale is shared (a broken invariant)")
        })?;
        let dims = Dims::new(&[])?;
        B::fused_elementwise(&device, &expr, None, &[norm.view()], &dims, &mut [storage])
    }

    /// The clipping an eager update of a `dtype` gradient applies: an error for the
    /// global norm before [`Clipping::prepare`] ran on the step's gradients.
    pub(super) fn eager(&self, dtype: DType) -> Result<Clip<RawTensor<B>>> {
        Ok(match self.mode {
            GradClip::None => Clip::None,
            GradClip::Value(c) => Clip::Value(c),
            GradClip::Norm(_) => Clip::Scale(self.scale()?.cast(dtype)?),
        })
    }

    /// The global norm's scale in device memory, for a fused update to read.
    pub(super) fn scale(&self) -> Result<&RawTensor<B>> {
        self.scale.as_ref().ok_or_else(|| {
            Error::invalid(
                "clip",
                "clipping by the global norm needs all of the step's gradients: update \
                 through `Optimizer::step`, or call `Optimizer::prepare_clip` first",
            )
        })
    }
}
