//! # kiln-fusion
//!
//! Owns fusion: the planner ([`plan()`]: which ops share a kernel, which buffer slot
//! each written value lives in), the [`Plan`] data type with its text form (what
//! `#[model]` embeds at build time) and printouts (`report`, `to_dot`), symbolic dims
//! ([`sym::SDim`]), and the executor that runs a plan on any backend
//! ([`exec::Program`]; [`exprs`] turns kernels into fused expressions, [`programs`]
//! caches a model's programs; [`parts`] is how a plan calls out to parts of a model
//! it does not see, modules on the dynamic path).

mod casts;
pub mod exec;
pub mod exprs;
pub mod instances;
pub mod parts;
pub mod plan;
pub mod programs;
pub mod report;
mod rows;
pub mod sym;
pub mod text;
pub mod windows;

pub use exec::{Natives, Program, RunContext, Seeds};
pub use exprs::native_exprs;
pub use parts::{NoParts, Parts};
pub use plan::{plan, plan_named, Kernel, KernelKind, Plan};
pub use programs::Programs;
pub use sym::SDim;
