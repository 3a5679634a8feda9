//! Modules on the dynamic path: [`Param`] (a trainable tensor), [`Layer`] (a built-in
//! layer run from its `LayerSpec`, the same specification `#[model]` inlines at build
//! time), [`ModuleList`], and [`DynamicModule`] (what a hand-written module's forward
//! pass is). All implement `kiln_tensor::nn::Module` with [`Gradients`] as their
//! gradients, so the optimizers and checkpoints of `#[model]` models serve them too;
//! `#[derive(kiln::Module)]` writes the impl for a struct of them.

use crate::grad::Gradients;
use crate::jit::{defer_write, PendingWrite};
use crate::lazy::{Lazy, LazyTensor};
use kiln_tensor::nn::layers::init_tensor;
use kiln_tensor::nn::{join, with_name, LayerSpec, LoadFn, Mode, Module, Slot, UpdateFn};
use kiln_tensor::{Backend, Error, RawTensor, Result};
use std::sync::{Arc, Mutex};

/// A module on the dynamic path: a forward pass written in plain Rust over lazy
/// tensors, with loops and branches on data.
pub trait DynamicModule<B: Backend>: Module<B, Grads = Gradients<B>> {
    /// The output for input `x`.
    fn forward(&self, x: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>>;
}

/// Refuses `init_named` for modules whose sizes are run-time values (what
/// `#[derive(Module)]` writes for it).
pub fn built_by_constructor<T>(prefix: &str) -> Result<T> {
    Err(Error::invalid(
        "init",
        format!(
            "`{}` is a dynamic module: build it with its constructor (its sizes are run-time values), or name a function that builds it by name, `#[module(init = path)]` (what a `#[model]` holding it calls)",
            if prefix.is_empty() { "the model" } else { prefix }
        ),
    ))
}

/// A trainable tensor: its value, and the lazy leaf that forward passes read.
pub struct Param<B: Backend> {
    /// Its checkpoint name, when it has one (a [`Layer`]'s: `fc1.weight`).
    name: Option<std::sync::Arc<str>>,
    value: RawTensor<B>,
    leaf: Mutex<Leaf<B>>,
}

/// The leaf of a parameter's current value, and the id gradients know it by (kept
/// when the leaf is let go, so gradients of the last pass stay found).
struct Leaf<B: Backend> {
    tensor: Option<LazyTensor<B>>,
    id: Option<u64>,
}

impl<B: Backend> std::fmt::Debug for Param<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Param({:?})", self.value)
    }
}

impl<B: Backend> Param<B> {
    /// A parameter holding `value`.
    pub fn new(value: RawTensor<B>) -> Self {
        Param {
            name: None,
            value,
            leaf: Mutex::new(Leaf {
                tensor: None,
                id: None,
            }),
        }
    }

    /// A parameter holding `value`, named `name` (its checkpoint name, which anomaly
    /// mode's reports give).
    pub fn named(value: RawTensor<B>, name: &str) -> Self {
        Param {
            name: Some(name.into()),
            ..Param::new(value)
        }
    }

    /// The value.
    pub fn value(&self) -> &RawTensor<B> {
        &self.value
    }

    /// The parameter as a lazy tensor that requires gradients (the same tensor until
    /// the parameter changes, so gradients of one step are found by it).
    pub fn get(&self) -> LazyTensor<B> {
        let mut leaf = self.leaf.lock().unwrap_or_else(|e| e.into_inner());
        let t = leaf
            .tensor
            .get_or_insert_with(|| match &self.name {
                Some(name) => LazyTensor::named_leaf(self.value.clone(), true, name),
                None => LazyTensor::leaf(self.value.clone(), true),
            })
            .clone();
        leaf.id = Some(t.id());
        t
    }

    /// Its gradient in `grads`, zeros when the loss did not use it this step.
    pub fn grad(&self, grads: &Gradients<B>) -> Result<RawTensor<B>> {
        let leaf = self.leaf.lock().unwrap_or_else(|e| e.into_inner());
        match leaf.id.and_then(|id| grads.get_id(id)) {
            Some(g) => Ok(g.clone()),
            None => RawTensor::zeros(self.value.dims(), self.value.dtype(), self.value.device()),
        }
    }

    /// Replaces the value (same dims and dtype), forgetting the old leaf.
    fn replace(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut RawTensor<B>) -> Result<()>,
    ) -> Result<()> {
        if self.name.is_none() && !name.is_empty() {
            self.name = Some(name.into());
        }
        // The leaf shares the buffer: dropped first, an optimizer can update in place.
        self.leaf
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .tensor = None;
        let (dims, dtype) = (*self.value.dims(), self.value.dtype());
        f(&mut self.value)?;
        if *self.value.dims() != dims || self.value.dtype() != dtype {
            return Err(Error::shape(
                "update",
                format!(
                    "`{name}` is {dims} {dtype} but its replacement is {} {}",
                    self.value.dims(),
                    self.value.dtype()
                ),
            ));
        }
        Ok(())
    }
}

impl<B: Backend> Module<B> for Param<B> {
    type Grads = Gradients<B>;

    fn init_named(_: &B::Device, _: u64, prefix: &str) -> Result<Self> {
        built_by_constructor(prefix)
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        f(Slot {
            name: prefix,
            value: &self.value,
        })
    }

    fn visit_buffers(&self, _: &str, _: &mut dyn FnMut(Slot<'_, B>)) {}

    fn update_params(
        &mut self,
        grads: &Gradients<B>,
        prefix: &str,
        f: &mut UpdateFn<'_, B>,
    ) -> Result<()> {
        let g = self.grad(grads)?;
        self.replace(prefix, |v| f(prefix, v, &g))
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()> {
        let new = get(prefix, &self.value)?;
        self.replace(prefix, |v| {
            *v = new;
            Ok(())
        })
    }
}

/// A list of modules named `0`, `1`… (PyTorch's `ModuleList`).
pub struct ModuleList<M>(pub Vec<M>);

impl<M> std::ops::Deref for ModuleList<M> {
    type Target = Vec<M>;
    fn deref(&self) -> &Vec<M> {
        &self.0
    }
}

impl<B: Backend, M: Module<B, Grads = Gradients<B>>> Module<B> for ModuleList<M> {
    type Grads = Gradients<B>;

    fn init_named(_: &B::Device, _: u64, prefix: &str) -> Result<Self> {
        built_by_constructor(prefix)
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        for (i, m) in self.0.iter().enumerate() {
            m.visit_params(&join(prefix, &i.to_string()), f);
        }
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        for (i, m) in self.0.iter().enumerate() {
            m.visit_buffers(&join(prefix, &i.to_string()), f);
        }
    }

    fn update_params(
        &mut self,
        grads: &Gradients<B>,
        prefix: &str,
        f: &mut UpdateFn<'_, B>,
    ) -> Result<()> {
        for (i, m) in self.0.iter_mut().enumerate() {
            with_name(prefix, i, |name| m.update_params(grads, name, f))?;
        }
        Ok(())
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()> {
        for (i, m) in self.0.iter_mut().enumerate() {
            m.load_named(&join(prefix, &i.to_string()), get)?;
        }
        Ok(())
    }
}

/// A built-in layer on the dynamic path: its `LayerSpec` (the one `#[model]` inlines),
/// its parameters and buffers, initialised from the model seed and their full names
/// exactly as a `#[model]` field of the same name is.
pub struct Layer<B: Backend> {
    /// Its checkpoint prefix (`fc1`), which marks the ops its forward pass records.
    name: Arc<str>,
    spec: LayerSpec,
    params: Vec<Param<B>>,
    buffers: Vec<Arc<Mutex<RawTensor<B>>>>,
}

impl<B: Backend> Layer<B> {
    /// The layer `spec` named `name` (its checkpoint prefix: `fc1`, `blocks.0.up`).
    pub fn new(spec: LayerSpec, device: &B::Device, seed: u64, name: &str) -> Result<Self> {
        let params = spec
            .params()
            .iter()
            .map(|p| {
                let full = join(name, p.name);
                Ok(Param::named(init_tensor(p, device, seed, &full)?, &full))
            })
            .collect::<Result<_>>()?;
        let buffers = spec
            .buffers()
            .iter()
            .map(|b| {
                Ok(Arc::new(Mutex::new(init_tensor(
                    b,
                    device,
                    seed,
                    &join(name, b.name),
                )?)))
            })
            .collect::<Result<_>>()?;
        Ok(Layer {
            name: name.into(),
            spec,
            params,
            buffers,
        })
    }

    /// `Linear` from `inputs` to `outputs` features.
    pub fn linear(
        inputs: usize,
        outputs: usize,
        device: &B::Device,
        seed: u64,
        name: &str,
    ) -> Result<Self> {
        Self::new(LayerSpec::Linear { inputs, outputs }, device, seed, name)
    }

    /// The layer's specification.
    pub fn spec(&self) -> &LayerSpec {
        &self.spec
    }

    /// A parameter by its field name (`weight`).
    pub fn param(&self, name: &str) -> Option<&Param<B>> {
        let i = self.spec.params().iter().position(|p| p.name == name)?;
        self.params.get(i)
    }

    /// The forward pass of the spec over lazy tensors; in training, a layer with
    /// running statistics stores their new values when the step is computed.
    pub fn forward(&self, x: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>> {
        let mut tensors: Vec<LazyTensor<B>> = self.params.iter().map(Param::get).collect();
        for b in &self.buffers {
            let v = b.lock().unwrap_or_else(|e| e.into_inner()).clone();
            tensors.push(LazyTensor::from_raw(v));
        }
        let refs: Vec<&LazyTensor<B>> = tensors.iter().collect();
        let out = crate::lazy::in_layer(&self.name, || {
            self.spec
                .forward(&mut Lazy::new(x.device().clone()), &refs, x, mode)
        })?;
        let names = self.spec.buffers();
        for (name, value) in out.updates {
            let Some(i) = names.iter().position(|b| b.name == name) else {
                return Err(Error::invalid(
                    "forward",
                    format!("{} updates `{name}`, which it does not have", self.spec),
                ));
            };
            let slot = self.buffers[i].clone();
            defer_write(PendingWrite {
                value,
                store: Box::new(move |v| *slot.lock().unwrap_or_else(|e| e.into_inner()) = v),
            });
        }
        Ok(out.y)
    }
}

impl<B: Backend> Module<B> for Layer<B> {
    type Grads = Gradients<B>;

    fn init_named(_: &B::Device, _: u64, prefix: &str) -> Result<Self> {
        built_by_constructor(prefix)
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        for (spec, p) in self.spec.params().iter().zip(&self.params) {
            p.visit_params(&join(prefix, spec.name), f);
        }
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        for (spec, b) in self.spec.buffers().iter().zip(&self.buffers) {
            let v = b.lock().unwrap_or_else(|e| e.into_inner()).clone();
            f(Slot {
                name: &join(prefix, spec.name),
                value: &v,
            });
        }
    }

    fn update_params(
        &mut self,
        grads: &Gradients<B>,
        prefix: &str,
        f: &mut UpdateFn<'_, B>,
    ) -> Result<()> {
        for (spec, p) in self.spec.params().iter().zip(&mut self.params) {
            with_name(prefix, spec.name, |name| p.update_params(grads, name, f))?;
        }
        Ok(())
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()> {
        for (spec, p) in self.spec.params().iter().zip(&mut self.params) {
            p.load_named(&join(prefix, spec.name), get)?;
        }
        for (spec, b) in self.spec.buffers().iter().zip(&self.buffers) {
            let name = join(prefix, spec.name);
            let mut slot = b.lock().unwrap_or_else(|e| e.into_inner());
            let new = get(&name, &slot)?;
            if new.dims() != slot.dims() || new.dtype() != slot.dtype() {
                return Err(Error::shape(
                    "load",
                    format!(
                        "`{name}` is {} {} but the file has {} {}",
                        slot.dims(),
                        slot.dtype(),
                        new.dims(),
                        new.dtype()
                    ),
                ));
            }
            *slot = new;
        }
        Ok(())
    }
}
