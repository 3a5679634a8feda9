//! The CPU's copies of the training code's backend-generic entry points (optimizers
//! and their updates, clipping, metrics, evaluation, checkpoints, training states, the
//! Learner's loop, the step replay and the gradient exchange), compiled in this crate
//! once. Rust shares a
//! generic function's instance with the crates downstream when the function is
//! `#[inline(never)]` and an upstream crate holds that instance, called directly: so a
//! program that trains on the CPU links to these instead of compiling them again. Each
//! function here forwards to its entry point; `kiln_fusion::instances` does the same
//! for the executor.

use crate::checkpoint::{self, Checksums, Tensors};
use crate::learner::{self, EpochReport, Evaluated, Loader, Run, Trainee};
use crate::metrics::{ClassCounts, MeanLoss, Metric, Outputs, TopK};
use crate::optim::clip::{self, Clipping};
use crate::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, Optimizer, OptimizerState, Sgd, SgdConfig,
};
use crate::parallel::{self, Backward, ByName, GradExchange};
use crate::replay::{StepInput, StepOutcome, StepParts, StepReplay};
use crate::state;
use kiln_cpu::{Cpu, CpuDevice};
use kiln_data::Batches;
use kiln_tensor::{Collective, RawTensor, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

/// Forwards to each optimizer's [`Optimizer::update_param`] and
/// [`Optimizer::update_param_in_place`] on the CPU.
macro_rules! optimizer_instances {
    ($($opt:ident: $update:ident, $in_place:ident;)*) => {$(
        #[doc(hidden)]
        pub fn $update(
            opt: &mut $opt<Cpu>,
            name: &str,
            param: &RawTensor<Cpu>,
            grad: &RawTensor<Cpu>,
        ) -> Result<RawTensor<Cpu>> {
            opt.update_param(name, param, grad)
        }

        #[doc(hidden)]
        pub fn $in_place(
            opt: &mut $opt<Cpu>,
            name: &str,
            param: &mut RawTensor<Cpu>,
            grad: &RawTensor<Cpu>,
        ) -> Result<()> {
            opt.update_param_in_place(name, param, grad)
        }
    )*};
}

optimizer_instances! {
    Sgd: sgd_update, sgd_update_in_place;
    Adam: adam_update, adam_update_in_place;
    AdamW: adamw_update, adamw_update_in_place;
}

/// Forwards to each optimizer's constructor and its [`Optimizer`] methods that touch
/// more than a field (the learning rate, the state, the per-step values) on the CPU.
macro_rules! optimizer_setup_instances {
    ($($opt:ident($config:ident): $new:ident, $set_lr:ident, $state:ident, $load_state:ident, $prepare:ident;)*) => {$(
        #[doc(hidden)]
        pub fn $new(config: $config) -> Result<$opt<Cpu>> {
            $opt::new(config)
        }

        #[doc(hidden)]
        pub fn $set_lr(opt: &mut $opt<Cpu>, lr: f64) -> Result<()> {
            opt.set_lr(lr)
        }

        #[doc(hidden)]
        pub fn $state(opt: &$opt<Cpu>) -> OptimizerState<Cpu> {
            opt.state()
        }

        #[doc(hidden)]
        pub fn $load_state(opt: &mut $opt<Cpu>, state: OptimizerState<Cpu>) -> Result<()> {
            opt.load_state(state)
        }

        #[doc(hidden)]
        pub fn $prepare(opt: &mut $opt<Cpu>) -> Result<()> {
            opt.prepare_step()
        }
    )*};
}

optimizer_setup_instances! {
    Sgd(SgdConfig): sgd_new, sgd_set_lr, sgd_state, sgd_load_state, sgd_prepare_step;
    Adam(AdamConfig): adam_new, adam_set_lr, adam_state, adam_load_state, adam_prepare_step;
    AdamW(AdamWConfig): adamw_new, adamw_set_lr, adamw_state, adamw_load_state, adamw_prepare_step;
}

/// [`crate::optim::global_norm`]'s arithmetic on the CPU.
#[doc(hidden)]
pub fn norm_of(grads: Vec<(String, RawTensor<Cpu>)>) -> Result<RawTensor<Cpu>> {
    clip::norm_of(grads)
}

/// Clipping's scale from the global norm on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn clip_scale_for(clipping: &mut Clipping<Cpu>, norm: RawTensor<Cpu>) -> Result<()> {
    clipping.scale_for(norm)
}

/// Anomaly mode's check of an update on the CPU.
#[doc(hidden)]
pub fn check_update(name: &str, param: &RawTensor<Cpu>, grad: &RawTensor<Cpu>) -> Result<()> {
    crate::optim::check_update(name, param, grad)
}

/// Forwards to each metric's [`Metric::update`] and [`Metric::value`] on the CPU.
macro_rules! metric_instances {
    ($($metric:ident: $update:ident, $value:ident;)*) => {$(
        #[doc(hidden)]
        pub fn $update(metric: &mut $metric<Cpu>, outputs: &Outputs<'_, Cpu>) -> Result<()> {
            metric.update(outputs)
        }

        #[doc(hidden)]
        pub fn $value(metric: &$metric<Cpu>) -> Result<f64> {
            metric.value()
        }
    )*};
}

metric_instances! {
    TopK: top_k_update, top_k_value;
    MeanLoss: mean_loss_update, mean_loss_value;
    ClassCounts: class_counts_update, class_counts_value;
}

/// [`crate::checkpoint::save_with_metadata`] of any model on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn save_tensors(
    model: &dyn Tensors<Cpu>,
    path: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    checkpoint::save_tensors(model, path, metadata)
}

/// [`crate::checkpoint::load`] and its kin of any model on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn load_checked(model: &mut dyn Tensors<Cpu>, path: &Path, checksums: Checksums) -> Result<()> {
    checkpoint::load_checked(model, path, checksums)
}

/// [`crate::checkpoint::load_bytes`] and its kin of any model on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn load_bytes_checked(
    model: &mut dyn Tensors<Cpu>,
    name: &str,
    bytes: &'static [u8],
    checksums: Checksums,
) -> Result<()> {
    checkpoint::load_bytes_checked(model, name, bytes, checksums)
}

/// [`crate::state::save`] of any model and optimizer on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn save_state(
    path: &Path,
    model: &dyn Tensors<Cpu>,
    opt: &dyn Optimizer<Cpu>,
    step: u64,
    run: &BTreeMap<String, String>,
) -> Result<()> {
    state::save_state(path, model, opt, step, run)
}

/// [`crate::state::load`] into any model and optimizer on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn load_state(
    path: &Path,
    model: &mut dyn Tensors<Cpu>,
    opt: &mut dyn Optimizer<Cpu>,
    run: &BTreeMap<String, String>,
) -> Result<u64> {
    state::load_state(path, model, opt, run)
}

/// [`crate::learner::evaluate`] of any model on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn evaluate_batches(
    model: &dyn Evaluated<Cpu>,
    device: &CpuDevice,
    batches: Batches,
    metrics: &mut [Box<dyn Metric<Cpu> + '_>],
) -> Result<(f64, Vec<(String, f64)>)> {
    learner::evaluate_batches(model, device, batches, metrics)
}

/// [`crate::learner::Learner::fit`]'s loop of any model, optimizer and data on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn fit(
    run: &mut Run<'_, Cpu>,
    trainee: &mut dyn Trainee<Cpu>,
    train: &dyn Loader,
    eval: Option<&dyn Loader>,
) -> Result<Vec<EpochReport>> {
    run.fit(trainee, train, eval)
}

/// [`StepReplay::step`] of any model and optimizer on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn replay_step(
    steps: &mut StepReplay<Cpu>,
    parts: &mut dyn StepParts<Cpu>,
    inputs: Vec<StepInput<'_>>,
) -> Result<StepOutcome> {
    steps.step_parts(parts, inputs)
}

/// [`GradExchange::run`] of any model on the CPU: the loss and the gradients averaged
/// over the ranks.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn exchange_grads(
    exchange: &mut GradExchange,
    ranks: &Rc<dyn Collective<Cpu>>,
    backward: &mut Backward<'_, Cpu>,
) -> Result<(RawTensor<Cpu>, Vec<RawTensor<Cpu>>)> {
    exchange.exchange(ranks, backward)
}

/// [`crate::parallel::broadcast_state`]'s exchange on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn broadcast_named(
    ranks: &dyn Collective<Cpu>,
    names: Vec<String>,
    tensors: Vec<RawTensor<Cpu>>,
    root: usize,
) -> Result<ByName<Cpu>> {
    parallel::broadcast_named(ranks, names, tensors, root)
}

/// [`crate::parallel::broadcast_state`]'s lookup by name on the CPU.
#[doc(hidden)]
#[allow(private_interfaces)]
pub fn take_named(by_name: &mut ByName<Cpu>, name: &str) -> Result<RawTensor<Cpu>> {
    by_name.take(name)
}
