//! The CPU's copies of kiln-tensor's backend-generic entry points (eager ops, layers'
//! initialisation, loading, gradients, updates and visits, step seeds, anomaly checks), compiled in this crate once. Rust shares a generic
//! function's instance with the crates downstream when the function is
//! `#[inline(never)]` and an upstream crate holds that instance, called directly: so a
//! program on the CPU links to these instead of compiling them again. Each function
//! here forwards to its entry point; `kiln_fusion::instances` and
//! `kiln_train::instances` do the same for the executor and for training.

use crate::Cpu;
use kiln_tensor::anomaly::{first_non_finite, NonFinite};
use kiln_tensor::builder::Builder;
use kiln_tensor::nn::{
    init_layer, init_tensor, load_layer, take_layer_grads, update_layer, visit_layer, LayerSpec,
    LayerTensors, LoadFn, ParamSpec, Slot, StepSeeds, UpdateFn,
};
use kiln_tensor::raw::Eager;
use kiln_tensor::{Op, RawTensor, Result};

/// One op applied eagerly on the CPU (what every `RawTensor` method runs).
#[doc(hidden)]
pub fn apply_eagerly(
    eager: &mut Eager<Cpu>,
    op: Op,
    inputs: &[&RawTensor<Cpu>],
) -> Result<RawTensor<Cpu>> {
    eager.apply(op, inputs)
}

/// A layer's tensor initialised on the CPU.
#[doc(hidden)]
pub fn init_layer_tensor(
    spec: &ParamSpec,
    device: &<Cpu as kiln_tensor::Backend>::Device,
    seed: u64,
    name: &str,
) -> Result<RawTensor<Cpu>> {
    init_tensor::<Cpu>(spec, device, seed, name)
}

/// Anomaly mode's search for a value that is not finite, on the CPU.
#[doc(hidden)]
pub fn find_non_finite(t: &RawTensor<Cpu>) -> Result<Option<NonFinite>> {
    first_non_finite(t)
}

/// A layer's tensors initialised on the CPU.
#[doc(hidden)]
pub fn init_layer_tensors(
    spec: &LayerSpec,
    device: &<Cpu as kiln_tensor::Backend>::Device,
    seed: u64,
    prefix: &str,
) -> Result<LayerTensors<Cpu>> {
    init_layer::<Cpu>(spec, device, seed, prefix)
}

/// A layer's tensors' new values, loaded on the CPU.
#[doc(hidden)]
pub fn load_layer_tensors(
    prefix: &str,
    names: &[&str],
    olds: &[RawTensor<Cpu>],
    get: &mut LoadFn<'_, Cpu>,
) -> Result<Vec<RawTensor<Cpu>>> {
    load_layer(prefix, names, olds, get)
}

/// The next training step's seed written into the CPU's memory.
#[doc(hidden)]
pub fn advance_seeds_on_device(
    seeds: &StepSeeds<Cpu>,
    device: &<Cpu as kiln_tensor::Backend>::Device,
) -> Result<()> {
    seeds.advance_on_device(device)
}

/// A layer's parameters updated from their gradients on the CPU.
#[doc(hidden)]
pub fn update_layer_tensors(
    prefix: &str,
    names: &[&str],
    params: &mut [&mut RawTensor<Cpu>],
    grads: &[&RawTensor<Cpu>],
    f: &mut UpdateFn<'_, Cpu>,
) -> Result<()> {
    update_layer(prefix, names, params, grads, f)
}

/// A layer's tensors visited by name on the CPU.
#[doc(hidden)]
pub fn visit_layer_tensors(
    prefix: &str,
    names: &[&str],
    tensors: &[&RawTensor<Cpu>],
    f: &mut dyn FnMut(Slot<'_, Cpu>),
) {
    visit_layer(prefix, names, tensors, f)
}

/// A layer's gradients taken and checked on the CPU.
#[doc(hidden)]
pub fn take_layer_gradients(
    raw: &mut dyn Iterator<Item = RawTensor<Cpu>>,
    wants: &[(&[Option<usize>], kiln_tensor::DType)],
    taken: &mut [Option<RawTensor<Cpu>>],
) -> Result<()> {
    take_layer_grads(raw, wants, taken)
}
