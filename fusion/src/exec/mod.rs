//! Running a plan on a backend. A [`Program`] resolves a [`Plan`]'s symbolic dims
//! against the sizes of its inputs (once per set of input shapes: every node's dims
//! derived by the op table's rules, the guards run again), turns each kernel into
//! backend calls (fused elementwise expressions, reductions and products with their
//! prologues and epilogues, single ops), and keeps one buffer per slot of the plan's
//! memory plan. A slot's buffer is reused on the next run when nobody else holds it,
//! so with static shapes a steady-state run allocates nothing.
//!
//! A program is what `resolve` decided for the current sizes (`Resolved`, read-only
//! while a run executes) beside the buffers (`Buffers`, the only state a run changes).
//!
//! The files: `context.rs` (what a run reads besides its inputs: [`RunContext`],
//! [`Seeds`]), `resolve.rs` (a plan's dims resolved for its inputs' sizes, the guards
//! run again, each kernel turned into steps), `rows.rs` (row passes resolved),
//! `buffers.rs` (the planned run's steps on
//! the slots' buffers) and `op_by_op.rs` (the reference path, one backend call per node).

mod buffers;
mod context;
mod named;
mod op_by_op;
mod resolve;
mod rows;

pub use context::{RunContext, Seeds, Watcher};
pub(crate) use named::name_index_error;
pub use resolve::Natives;

use crate::parts::{NoParts, Parts};
use crate::plan::Plan;
use crate::sym::SDim;
use buffers::{Buffers, Run, Src};
use kiln_tensor::{Backend, Dims, Error, Layout, RawTensor, Result, TensorMeta};
use resolve::{resolve, Resolved};

/// A plan resolved and ready to run on backend `B`, with its buffers.
#[derive(Debug)]
pub struct Program<B: Backend> {
    plan: Plan<SDim>,
    natives: &'static Natives,
    resolved: Option<Resolved>,
    buffers: Buffers<B>,
    results: Vec<RawTensor<B>>,
}

impl<B: Backend> Program<B> {
    /// A program for `plan` with the compiled loops `natives` (see [`Natives`]).
    pub fn new(plan: Plan<SDim>, natives: &'static Natives) -> Self {
        let n = plan.graph.nodes.len();
        Program {
            buffers: Buffers {
                arena: (0..plan.slots.len()).map(|_| None).collect(),
                scratch: None,
                columns: Vec::new(),
                run: 0,
                src: vec![Src::None; n],
                layout: vec![Layout::contiguous(Dims::scalar()); n],
                reseeded: None,
            },
            plan,
            natives,
            resolved: None,
            results: Vec::new(),
        }
    }

    /// The plan this program runs.
    pub fn plan(&self) -> &Plan<SDim> {
        &self.plan
    }

    /// The compiled loops it runs with (see [`Natives`]).
    pub fn natives(&self) -> &'static Natives {
        self.natives
    }

    /// Lets go of the buffers kept for the next run (a program whose work another one
    /// now does, such as a captured copy of it): the next run allocates its own.
    pub fn release_buffers(&mut self) {
        self.buffers.arena.iter_mut().for_each(|slot| *slot = None);
        self.buffers.scratch = None;
        self.buffers.columns.clear();
    }

    /// Runs the plan on `inputs` (in the plan's input order) in the context `cx`.
    /// Returns the plan's outputs, in order, or `None` when the inputs are valid but
    /// the plan does not describe their shapes (see `resolve`): run them op by op.
    /// Inputs that op-by-op execution would refuse are refused with its message.
    pub fn run(
        &mut self,
        cx: &mut RunContext<'_, B>,
        inputs: &[&RawTensor<B>],
    ) -> Result<Option<std::vec::Drain<'_, RawTensor<B>>>> {
        let (device, params) = (cx.device, cx.sizes);
        if inputs.len() != self.plan.inputs.len() {
            return Err(Error::invalid(
                "run",
                format!(
                    "the plan takes {} inputs, not {}",
                    self.plan.inputs.len(),
                    inputs.len()
                ),
            ));
        }
        if !self
            .resolved
            .as_ref()
            .is_some_and(|r| r.matches(params, inputs))
        {
            // Refused shapes are not remembered: the next call checks them again.
            self.resolved = None;
            let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
            self.resolved = Some(resolve(&self.plan, self.natives, params, &metas)?);
        }
        let Program {
            plan,
            resolved,
            buffers,
            results,
            ..
        } = self;
        let r = resolved.as_ref().expect("resolved above");
        if !r.planned {
            return Ok(None);
        }
        let run = Run {
            plan,
            r,
            inputs,
            device,
            seeds: cx.seeds,
        };
        buffers.run += 1;
        for (k, (&leaf, t)) in plan.inputs.iter().zip(inputs).enumerate() {
            buffers.src[leaf] = Src::Input(k);
            buffers.layout[leaf] = *t.layout();
        }
        let mut no_parts = NoParts;
        for (step, ready) in r.steps.iter().zip(&r.ready) {
            let parts: &mut dyn Parts<B> = match cx.parts.as_deref_mut() {
                Some(p) => p,
                None => &mut no_parts,
            };
            buffers.step(&run, step, parts)?;
            if cx.watch.is_some() {
                for &o in ready {
                    cx.tell(&buffers.output(inputs, plan.outputs[o], device)?);
                }
            }
        }
        results.clear();
        for &o in &plan.outputs {
            results.push(buffers.output(inputs, o, device)?);
        }
        Ok(Some(results.drain(..)))
    }
}
