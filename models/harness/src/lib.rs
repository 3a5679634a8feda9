//! # kiln-harness
//!
//! Owns what the model zoo is trained and run with, apart from the models themselves:
//! the data loaders (`data` for images, `text` for the Shakespeare bytes, `image` for
//! image files), the classifiers' datasets and evaluation (`classify`: training is
//! kiln-train's `Learner`), and the command-line pieces the binaries share (`cli`).
//! `kiln-models` re-exports each module, so `kiln_models::data` and the rest keep
//! their paths.

pub mod classify;
pub mod cli;
pub mod data;
pub mod image;
pub mod text;
