//! The `Module` trait: what optimizers, checkpoints and `#[model]`-generated code need
//! from anything holding parameters — named visits in PyTorch's naming, replacement of
//! parameters by an update rule, seeded initialisation.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::nn::StepSeeds;
use crate::raw::RawTensor;

/// A named tensor slot: a parameter or a buffer.
pub struct Slot<'a, B: Backend> {
    /// Its checkpoint name (`fc1.weight`).
    pub name: &'a str,
    /// Its value.
    pub value: &'a RawTensor<B>,
}

/// How `Module::update_params` updates a parameter in place: `(name, value, gradient)`.
pub type UpdateFn<'a, B> = dyn FnMut(&str, &mut RawTensor<B>, &RawTensor<B>) -> Result<()> + 'a;

/// How `Module::load_named` gets a tensor's new value: `(name, current) -> new value`.
pub type LoadFn<'a, B> = dyn FnMut(&str, &RawTensor<B>) -> Result<RawTensor<B>> + 'a;

/// Something that owns parameters.
pub trait Module<B: Backend>: Sized {
    /// Its gradients, mirroring its parameters.
    type Grads;

    /// Builds it on `device`, each tensor initialised from `seed` and its name (so a
    /// tensor's initial value does not depend on the order fields are declared).
    fn init_named(device: &B::Device, seed: u64, prefix: &str) -> Result<Self>;

    /// Calls `f` with every trainable parameter and its name, in declaration order.
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>));

    /// Calls `f` with every buffer (saved, not trained) and its name.
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>));

    /// Replaces each parameter `p` with `f(name, p, grad)`; the result must keep `p`'s
    /// dims and dtype.
    fn update_params(
        &mut self,
        grads: &Self::Grads,
        prefix: &str,
        f: &mut UpdateFn<'_, B>,
    ) -> Result<()>;

    /// Replaces every parameter and buffer with `get(name, dims, dtype)` (checkpoints).
    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()>;

    /// Its gradients from one raw tensor per parameter, taken from `grads` in
    /// `visit_params` order and checked against the parameters' types: how a
    /// `#[model]`'s backward pass, which sees every nested parameter, hands them back.
    /// Modules written by hand need not have it: the default refuses.
    fn grads_from_raw(grads: &mut dyn Iterator<Item = RawTensor<B>>) -> Result<Self::Grads> {
        let _ = grads;
        Err(Error::invalid(
            "grads_from_raw",
            "this module does not build its gradients from raw tensors",
        ))
    }

    /// The seeds its training steps draw random values with, for a module that counts
    /// them (a `#[model]`); the default has none.
    fn step_seeds(&self) -> Option<&StepSeeds<B>> {
        None
    }

    /// Its dynamic loss scale, for a model whose training steps are loss-scaled (an
    /// instance under `#[model(precision = f16)]`); the default has none.
    fn loss_scale(&self) -> Option<&super::LossScale<B>> {
        None
    }

    /// Builds it on `device` from `seed`.
    fn init(device: &B::Device, seed: u64) -> Result<Self> {
        Self::init_named(device, seed, "")
    }

    /// The number of trainable scalars.
    fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit_params("", &mut |s| n += s.value.numel());
        n
    }
}

/// `prefix.name`, or `name` at the top level.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Spare name buffers for `with_name` (one per nesting level in use). Shared by all
/// threads, so a step that runs on a thread for the first time still allocates nothing.
static NAMES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Calls `f` with `join(prefix, name)` built in a reused buffer, so that walking a
/// model's parameters every training step allocates nothing once warm.
pub fn with_name<R>(prefix: &str, name: impl std::fmt::Display, f: impl FnOnce(&str) -> R) -> R {
    let buf = take_name(prefix, &name);
    let r = f(&buf);
    give_back_name(buf);
    r
}

/// A spare name buffer holding `prefix.name` (the generic `with_name` stays a few
/// instructions per caller: this part is compiled once).
fn take_name(prefix: &str, name: &dyn std::fmt::Display) -> String {
    use std::fmt::Write;
    let spare = NAMES.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut buf = spare.unwrap_or_default();
    buf.clear();
    if !prefix.is_empty() {
        buf.push_str(prefix);
        buf.push('.');
    }
    let _ = write!(buf, "{name}");
    buf
}

/// Returns a name buffer to the spares.
fn give_back_name(buf: String) {
    NAMES.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
}

/// A per-tensor seed from the model seed and the tensor's name (FNV-1a of the name).
pub fn seed_for(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// An array of modules is a module: PyTorch's `ModuleList` naming (`blocks.0.weight`).
impl<B: Backend, M: Module<B>, const N: usize> Module<B> for [M; N] {
    type Grads = [M::Grads; N];

    fn init_named(device: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
        let v: Vec<M> = (0..N)
            .map(|i| M::init_named(device, seed, &join(prefix, &i.to_string())))
            .collect::<Result<_>>()?;
        Ok(v.try_into()
            .unwrap_or_else(|_| unreachable!("collected exactly N modules")))
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        for (i, m) in self.iter().enumerate() {
            m.visit_params(&join(prefix, &i.to_string()), f);
        }
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        for (i, m) in self.iter().enumerate() {
            m.visit_buffers(&join(prefix, &i.to_string()), f);
        }
    }

    fn update_params(
        &mut self,
        grads: &Self::Grads,
        prefix: &str,
        f: &mut UpdateFn<'_, B>,
    ) -> Result<()> {
        for (i, (m, g)) in self.iter_mut().zip(grads).enumerate() {
            with_name(prefix, i, |name| m.update_params(g, name, f))?;
        }
        Ok(())
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()> {
        for (i, m) in self.iter_mut().enumerate() {
            m.load_named(&join(prefix, &i.to_string()), get)?;
        }
        Ok(())
    }

    fn grads_from_raw(grads: &mut dyn Iterator<Item = RawTensor<B>>) -> Result<Self::Grads> {
        // Built in place, not through a `Vec`: this runs every training step.
        let mut failed = None;
        let parts: [Option<M::Grads>; N] = std::array::from_fn(|_| {
            if failed.is_some() {
                return None;
            }
            M::grads_from_raw(grads).map_err(|e| failed = Some(e)).ok()
        });
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(parts.map(|g| g.expect("every part was built when none failed")))
    }
}
