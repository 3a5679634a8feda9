//! # kiln-fusion
//!
//! Owns fusion: the planner ([`plan()`]: which ops share a kernel, which buffer slot
//! each written value lives in), the [`Plan`] data type with its text form (what
//! `#[model]` embeds at build time) and printouts (`report`, `to_dot`), symbolic dims
//! ([`sym::SDim`]), and the executor that runs a plan on any backend
//! ([`exec::Program`], through [`exec::FusionBackend`]).

pub mod exec;
pub mod plan;
pub mod report;
pub mod sym;
pub mod text;

pub use exec::{native_exprs, Program, Programs};
pub use plan::{plan, plan_named, Kernel, KernelKind, Plan};
pub use sym::SDim;
