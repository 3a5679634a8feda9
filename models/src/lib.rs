//! # kiln-models
//!
//! Owns Kiln's real models: `mlp`, `lenet`, `gpt`, `parts` to compose, `chain` (W2's
//! elementwise chain), `hybrid` and `dynamic` with parts on the dynamic path; the
//! classifier recipes over them (`classify::short_mnist_run`); and the binaries
//! `kiln-train` (the README's main job), `kiln-infer`, `kiln-generate` (samples from a
//! trained GPT) and `kiln-bench` (the workloads of DESIGN.md, one parseable line per
//! figure). The loaders, evaluation loops and command line they use live in
//! `kiln-harness`, re-exported here under their own names, so that editing a model
//! recompiles the models and not what surrounds them. Every function of the library
//! is generic or `#[inline]`: a model edit rebuilds its front end only, and the
//! machine code is compiled in the binaries that use it.

pub mod chain;
pub mod dynamic;
pub mod gpt;
pub mod hybrid;
pub mod lenet;
pub mod mlp;
pub mod parts;
mod short_run;

pub use kiln_harness::{cli, data, image, text};

/// Training and evaluating image classifiers ([`kiln_harness::classify`]), with the
/// zoo's classifiers and the short MNIST recipe every backend's suite runs.
pub mod classify {
    pub use crate::short_run::{mnist_mlp_run, short_mnist_run, ShortRun};
    pub use kiln_harness::classify::*;
}
