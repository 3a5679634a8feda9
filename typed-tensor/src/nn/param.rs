//! `Param`: a learned tensor a model holds itself rather than through a layer (a class
//! token, a learned scale, position embeddings added by hand). It is named,
//! initialised, checkpointed and trained as a layer's parameters are; its checkpoint
//! name is the field's own (`cls`, not `cls.value`).

use super::layers::init_tensor;
use super::module::{LoadFn, Module, Slot, UpdateFn};
use super::spec::{Init, ParamSpec};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::raw::RawTensor;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// A learned tensor of shape `S`, every dim fixed at build time.
pub struct Param<B: Backend, S: Shape> {
    /// The current value.
    pub value: Tensor<B, S>,
}

impl<B: Backend, S: Shape> Clone for Param<B, S> {
    fn clone(&self) -> Self {
        Param {
            value: self.value.clone(),
        }
    }
}

/// The spec of a learned tensor of `dims`: the field generated code reads it through
/// (`value`), and its start, normal with standard deviation 0.02 as ViT's class token
/// and GPT-2's position table (a scale meant to start at one is written
/// `self.scale + 1.0`). The `#[model]` macro and [`Param`] share it.
pub fn learned_spec(dims: &[usize]) -> ParamSpec {
    ParamSpec {
        name: "value",
        dims: dims.to_vec(),
        init: Init::Normal(0.02),
        dtype: crate::DType::F32,
    }
}

impl<B: Backend, S: Shape> Param<B, S> {
    /// What it is as a parameter: its dims and initialisation.
    pub fn spec() -> Result<ParamSpec> {
        let dims = S::static_dims().ok_or_else(|| {
            Error::invalid(
                "Param",
                format!(
                    "a learned tensor's dims are fixed when it is built; {} has a `Dyn` dim",
                    crate::shape::describe::<S>()
                ),
            )
        })?;
        Ok(learned_spec(dims.as_slice()))
    }
}

impl<B: Backend, S: Shape> Module<B> for Param<B, S> {
    type Grads = Tensor<B, S>;

    fn init_named(device: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
        let spec = Self::spec()?;
        Ok(Param {
            value: Tensor::from_raw(init_tensor(&spec, device, seed, prefix)?)?,
        })
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        f(Slot {
            name: prefix,
            value: self.value.raw(),
        });
    }

    fn visit_buffers(&self, _prefix: &str, _f: &mut dyn FnMut(Slot<'_, B>)) {}

    fn update_params(
        &mut self,
        grads: &Self::Grads,
        prefix: &str,
        f: &mut UpdateFn<'_, B>,
    ) -> Result<()> {
        self.value.update_raw(|raw| f(prefix, raw, grads.raw()))
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()> {
        let new = get(prefix, self.value.raw())?;
        self.value = Tensor::from_raw(super::layers::same_slot(prefix, self.value.raw(), new)?)?;
        Ok(())
    }

    fn grads_from_raw(grads: &mut dyn Iterator<Item = RawTensor<B>>) -> Result<Self::Grads> {
        let raw = grads
            .next()
            .ok_or_else(|| Error::invalid("grads", "too few gradients"))?;
        Tensor::from_raw(raw)
    }
}
