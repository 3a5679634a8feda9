//! # kiln-harness
//!
//! Owns what the model zoo is trained and run with, apart from the models themselves:
//! the data loaders (`data` for images, `text` for the Shakespeare bytes, `image` for
//! image files), the classifier training and evaluation loops (`classify`), the
//! command-line pieces the binaries share (`cli`), training progress (`progress`) and
//! the training curve (`curve`).
//! `kiln-models` re-exports each module, so `kiln_models::data` and the rest keep
//! their paths.

pub mod classify;
pub mod cli;
pub mod curve;
pub mod data;
pub mod image;
pub mod progress;
pub mod text;
