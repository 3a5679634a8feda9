//! The CPU's copies of the executor's backend-generic entry points, compiled in this
//! crate once. Rust shares a generic function's instance with the crates downstream
//! when the function is `#[inline(never)]` and an upstream crate holds that instance,
//! called directly: so a program that runs `#[model]`s on the CPU links to these
//! instead of compiling the whole executor again (what keeps a one-model binary's
//! release rebuild short). Each function here forwards to its entry point.

use crate::exec::RunContext;
use crate::{Natives, Programs};
use kiln_cpu::Cpu;
use kiln_tensor::{RawTensor, Result};

/// [`Programs::call`] on the CPU, with the outputs' receiver behind a reference.
#[doc(hidden)]
pub fn call_on_cpu(
    programs: &Programs<Cpu>,
    id: usize,
    plan_text: &str,
    natives: &'static Natives,
    cx: RunContext<'_, Cpu>,
    inputs: &[&RawTensor<Cpu>],
    take: &mut dyn FnMut(&mut dyn Iterator<Item = RawTensor<Cpu>>),
) -> Result<()> {
    programs.call_with(id, plan_text, natives, cx, inputs, take)
}
