//! W3's GPT (six blocks of width 512 in eight heads, context 256), in f32 and with bf16
//! or f16 matrix products, and the small GPT with bf16 or f16 products, for the binaries that train,
//! sample and measure them, each including this file with
//! `#[path = "…/w3_instances.rs"] mod w3_instances;`. Kept apart from
//! `gpt_instances.rs` so that the tests, which include that file, do not build them.

use kiln::prelude::*;
use kiln_models::gpt::Gpt;

/// W3's GPT: six blocks of width 512 in eight heads, context up to 256.
#[model]
pub type W3Gpt = Gpt<512, 8, 6, 256>;

/// W3's GPT with bf16 matrix products (parameters, optimizer, softmax, norms and loss in
/// f32); its checkpoints name `W3Gpt`.
#[model(precision = bf16)]
pub type W3GptBf16 = Gpt<512, 8, 6, 256>;

/// The small GPT with bf16 matrix products (`kiln-train --precision bf16`, `kiln-bench
/// --w3-configs small-bf16`); its checkpoints name `SmallGpt`.
#[model(precision = bf16)]
pub type SmallGptBf16 = Gpt<128, 4, 4, 128>;

/// W3's GPT with f16 matrix products and loss-scaled training steps; its checkpoints
/// name `W3Gpt`.
#[model(precision = f16)]
pub type W3GptF16 = Gpt<512, 8, 6, 256>;

/// The small GPT with f16 matrix products and loss-scaled training steps
/// (`kiln-train --precision f16`, `kiln-bench --w3-configs small-f16`); its checkpoints
/// name `SmallGpt`.
#[model(precision = f16)]
pub type SmallGptF16 = Gpt<128, 4, 4, 128>;

kiln_models::gpt_model!(
    W3Gpt,
    W3GptBf16 as W3Gpt,
    SmallGptBf16 as SmallGpt,
    W3GptF16 as W3Gpt,
    SmallGptF16 as SmallGpt
);
