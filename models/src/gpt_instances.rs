//! The GPT instances the binaries, examples and tests train, sample and measure, each
//! including this file with `#[path = "…/gpt_instances.rs"] mod gpt_instances;`. Not a
//! module of the library: an instance expands the whole model where it is declared,
//! and keeping them out of the library keeps the zoo's rebuilds short.

use kiln::prelude::*;
use kiln_models::gpt::Gpt;

/// The test suite's GPT: two blocks of width 16 in two heads, context up to 32.
#[model]
pub type TinyGpt = Gpt<16, 2, 2, 32>;

/// The small configuration: four blocks of width 128 in four heads, context up to 128.
#[model]
pub type SmallGpt = Gpt<128, 4, 4, 128>;

kiln_models::gpt_model!(TinyGpt, SmallGpt);
