//! Neural-network layers: their specifications (`spec`, shared with the `#[model]`
//! macro), the `Module` trait of parameter owners, and the typed layer structs.

pub mod layers;
pub mod module;
pub mod seeds;
pub mod spec;

pub use layers::*;
pub use module::{join, seed_for, with_name, LoadFn, Module, Slot, UpdateFn};
pub use seeds::{step_seed, StepSeed, StepSeeds};
pub use spec::{Init, LayerOut, LayerSpec, Mode, ParamSpec};
