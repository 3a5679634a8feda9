//! # kiln-macros
//!
//! Owns `#[model]`: parse → op IR → shape inference → gradients → fusion plan → Rust.
