//! What a [`Program`](super::Program) run reads besides its inputs: the device, the
//! size parameters, where random ops get their seeds, the parts it calls out to and
//! who is told of each output.

use crate::parts::Parts;
use kiln_tensor::nn::StepSeed;
use kiln_tensor::{Backend, Error, Op, RawTensor, Result};
use std::any::Any;

/// Where a run's random ops get their seeds.
#[derive(Debug)]
pub enum Seeds<'a, B: Backend> {
    /// Each op's own seed mixed (xor) with this one: a `#[model]`'s training step, whose
    /// `i`-th dropout layer draws with `i ^ step_seed`.
    Mix(u64),
    /// Each op's own seed mixed (xor) with the one in this device buffer (`i32 [2]`,
    /// low word first; [`Backend::draw_with_device_seed`]): a training step captured
    /// as a graph, whose seed the host rewrites before each replay.
    Device(&'a RawTensor<B>),
    /// The op's own seed is an index into this table, which holds the seed it draws
    /// with: a plan recorded at run time, cached with its seeds abstracted away, so the
    /// same program draws fresh masks each call.
    Table(&'a [u64]),
}

impl<B: Backend> Clone for Seeds<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Seeds<'_, B> {}

impl<'a, B: Backend> From<&'a StepSeed<B>> for Seeds<'a, B> {
    fn from(seed: &'a StepSeed<B>) -> Self {
        match seed {
            StepSeed::Host(seed) => Seeds::Mix(*seed),
            StepSeed::Device(buffer) => Seeds::Device(buffer),
        }
    }
}

/// Who is told of each output of a run (a `RawTensor<B>` behind the `&dyn Any`).
pub type Watcher<'a> = &'a mut dyn FnMut(&dyn Any);

/// What a `Program` run reads besides its inputs: the device, the size parameters
/// bound by name (`("B", 256)`), where random ops get their seeds, the parts of a model
/// the plan calls out to (modules on the dynamic path), and who is told of each output
/// as soon as the work computing it is queued (a data-parallel step sending gradients
/// during the backward pass). Built with [`RunContext::new`] and the setters below;
/// one value for both paths, planned (`Program::run`) and op by op
/// (`Program::run_op_by_op`).
pub struct RunContext<'a, B: Backend> {
    pub(crate) device: &'a B::Device,
    pub(crate) sizes: &'a [(&'a str, usize)],
    pub(crate) seeds: Seeds<'a, B>,
    pub(crate) parts: Option<&'a mut dyn Parts<B>>,
    pub(crate) watch: Option<Watcher<'a>>,
}

impl<'a, B: Backend> RunContext<'a, B> {
    /// A run on `device` with no size parameters, random ops drawing with their own
    /// seeds (mixed with 0), no parts and no watcher.
    pub fn new(device: &'a B::Device) -> Self {
        RunContext {
            device,
            sizes: &[],
            seeds: Seeds::Mix(0),
            parts: None,
            watch: None,
        }
    }

    /// A `#[model]` method's run: on `device`, with the method's size parameters
    /// `sizes`, random ops mixing their own seed with the step's `seed`.
    pub fn step(
        device: &'a B::Device,
        sizes: &'a [(&'a str, usize)],
        seed: &'a StepSeed<B>,
    ) -> Self {
        RunContext::new(device)
            .sizes(sizes)
            .seeds(Seeds::from(seed))
    }

    /// Binds the plan's size parameters by name (`("B", 256)`).
    pub fn sizes(mut self, sizes: &'a [(&'a str, usize)]) -> Self {
        self.sizes = sizes;
        self
    }

    /// Where random ops get their seeds.
    pub fn seeds(mut self, seeds: Seeds<'a, B>) -> Self {
        self.seeds = seeds;
        self
    }

    /// The parts the plan calls out to.
    pub fn parts(mut self, parts: &'a mut dyn Parts<B>) -> Self {
        self.parts = Some(parts);
        self
    }

    /// Who is handed each output (a `RawTensor<B>` behind the `&dyn Any`) as soon as
    /// the work computing it is queued; `None` for nobody.
    pub fn watch(mut self, watch: Option<Watcher<'a>>) -> Self {
        self.watch = watch;
        self
    }

    /// Hands `output` to the watcher, if there is one.
    pub(super) fn tell(&mut self, output: &RawTensor<B>) {
        if let Some(watch) = self.watch.as_deref_mut() {
            watch(output);
        }
    }
}

/// `op` with the seed the run gives it (ops that draw nothing unchanged). A draw whose
/// seed is in device memory runs through [`Backend::draw_with_device_seed`] instead.
pub(super) fn seeded<'o, B: Backend>(
    op: &'o Op,
    seeds: Seeds<'_, B>,
) -> Result<std::borrow::Cow<'o, Op>> {
    Ok(match run_seed(op, seeds)? {
        Some(seed) => std::borrow::Cow::Owned(op.with_seed(seed)),
        None => std::borrow::Cow::Borrowed(op),
    })
}

/// The seed the run gives `op` in place of its own, when it draws.
pub(super) fn run_seed<B: Backend>(op: &Op, seeds: Seeds<'_, B>) -> Result<Option<u64>> {
    let Some(own) = op.seed() else {
        return Ok(None);
    };
    Ok(Some(match seeds {
        Seeds::Mix(seed) => own ^ seed,
        Seeds::Table(table) => *usize::try_from(own)
            .ok()
            .and_then(|i| table.get(i))
            .ok_or_else(|| {
                Error::invalid(
                    "run",
                    format!("random op {own} has no seed in a table of {}", table.len()),
                )
            })?,
        Seeds::Device(_) => {
            return Err(Error::invalid(
                "run",
                "a draw with a device seed is not mixed on the host (a broken invariant)",
            ))
        }
    }))
}

/// The device seed `op` draws with, when it draws ([`Op::seed`]) and the run's seed is
/// in device memory.
pub(super) fn device_seed<'a, B: Backend>(
    op: &Op,
    seeds: Seeds<'a, B>,
) -> Option<&'a RawTensor<B>> {
    match seeds {
        Seeds::Device(seed) if op.seed().is_some() => Some(seed),
        _ => None,
    }
}
