//! # kiln-fusion
//!
//! Owns the fusion planner: which ops of a graph share a kernel, buffer lifetimes, and
//! the plan data types that the `#[model]` macro emits and the runtime JIT builds.
