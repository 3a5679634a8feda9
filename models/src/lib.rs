//! # kiln-models
//!
//! Owns Kiln's real models on real data: the data loaders (`data` for images, `text`
//! for the Shakespeare bytes), the models (`mlp`, `lenet`, `gpt`, `parts` to
//! compose, `hybrid` with a part on the dynamic path), and the binaries `kiln-train` (the README's main job), `kiln-infer`,
//! `kiln-generate` (samples from a trained GPT) and `kiln-bench` (the workloads of
//! DESIGN.md, one parseable line per figure).

pub mod chain;
pub mod classify;
pub mod cli;
pub mod curve;
pub mod data;
pub mod dynamic;
pub mod gpt;
pub mod hybrid;
pub mod image;
pub mod lenet;
pub mod mlp;
pub mod parts;
pub mod text;
