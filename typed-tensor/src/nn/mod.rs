//! Neural-network layers: their specifications (`spec`, shared with the `#[model]`
//! macro), the `Module` trait of parameter owners, and the typed layer structs.

pub mod layers;
pub mod module;
pub mod spec;

pub use layers::*;
pub use module::{join, seed_for, step_seed, with_name, LoadFn, Module, Slot, UpdateFn};
pub use spec::{Init, LayerOut, LayerSpec, Mode, ParamSpec};
