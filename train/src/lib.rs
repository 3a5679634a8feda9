//! # kiln-train
//!
//! Owns what training needs beyond gradients: the training loop ([`learner`], with its
//! progress display ([`progress`]) and training curve ([`curve`])), optimizers ([`optim`]), learning-rate
//! schedules ([`schedule`]), safetensors checkpoints in PyTorch's naming
//! ([`checkpoint`]), training states a crashed run resumes from ([`state`]), training
//! steps replayed as graphs ([`replay`]), evaluation metrics on the device
//! ([`metrics`]), and data parallelism ([`parallel`]): ranks
//! that average their gradients, started as processes by [`launch`], torchrun, Slurm
//! or MPI ([`rank_env`]), meeting and exchanging over TCP ([`tcp`]) or MPI. Everything here
//! works on any
//! [`kiln_tensor::nn::Module`] through
//! its named parameter visits, so a `#[model]` struct and a hand-written one are
//! treated alike.
//!
//! ```no_run
//! use kiln_tensor::nn::{Linear, Module};
//! use kiln_train::optim::{AdamW, AdamWConfig, Optimizer};
//! use kiln_train::schedule::{CosineWithWarmup, Schedule};
//! # fn demo<B: kiln_tensor::Backend>(dev: B::Device, grads: kiln_tensor::nn::LinearGrads<B, 3, 2>)
//! # -> kiln_tensor::Result<()> {
//! let mut model = Linear::<B, 3, 2>::init(&dev, 0)?;
//! let mut opt = AdamW::new(AdamWConfig { lr: 1e-3, ..Default::default() })?;
//! let sched = CosineWithWarmup::new(1e-3, 1e-5, 100, 1_000)?;
//! for step in 0..1_000 {
//!     opt.set_lr(sched.lr_at(step))?;
//!     // ... compute `grads` of the loss ...
//!     opt.step(&mut model, &grads)?;
//! }
//! kiln_train::checkpoint::save(&model, "model.safetensors")?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod checkpoint;
pub mod curve;
pub mod instances;
pub mod launch;
pub mod learner;
pub mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi_rank;
pub mod optim;
pub mod parallel;
pub mod progress;
pub mod rank_env;
pub mod replay;
pub mod schedule;
pub mod state;
pub mod tcp;
pub mod torch_store;

pub use optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, GradClip, Optimizer, OptimizerState, Sgd, SgdConfig,
};
pub use schedule::{
    Anneal, Constant, CosineRestarts, CosineWithWarmup, Exponential, Lambda, Linear, OneCycle,
    Schedule, StepDecay, Warmup,
};
