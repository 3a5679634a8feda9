//! Neural-network layers: their specifications (`spec`, shared with the `#[model]`
//! macro), the `Module` trait of parameter owners, the typed layer structs (and their
//! int8 forms) and `Param`, a learned tensor held without a layer.

pub mod int8;
pub mod layers;
pub mod loss_scale;
pub mod module;
pub mod param;
pub mod seeds;
pub mod spec;

pub use int8::{EmbeddingInt8, LinearInt8, NoGrads};
pub use layers::*;
pub use loss_scale::{LossScale, LossScaleState};
pub use module::{join, seed_for, with_name, LoadFn, Module, Slot, UpdateFn};
pub use param::{learned_spec, Param};
pub use seeds::{step_seed, StepSeed, StepSeeds};
pub use spec::{Init, LayerOut, LayerSpec, Mode, ParamSpec};
