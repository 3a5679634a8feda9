//! Row passes: what a backend needs to run a chain of a plan's kernels that all work
//! on the same rows (a layer norm's statistics and its normalisation, its gradient's
//! two row sums and the input gradient) as one pass over blocks of rows, so that each
//! row is read from memory once while the chain's intermediate values stay in cache.
//!
//! A pass is made of the kernels a plan would run one after another: each phase is one
//! of them (a fused expression, or a reduction of each row to one value) and computes
//! exactly what that kernel computes for the same elements, so a pass gives the bits
//! of its kernels run apart. The plan decides which kernels form a pass; a backend that
//! does not run passes runs the kernels apart ([`crate::Backend::fused_rows`]).

use crate::fused::{FusedExpr, NativeFn};
use crate::op::ReduceOp;
use crate::Layout;

/// Where a phase reads one operand, for the rows of the current block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowRead {
    /// Input `k` of the pass, seen over the phase's dims (whole rows, or one value
    /// per row for a phase over the row statistics).
    Input(usize),
    /// Output `k` of the pass, written by an earlier phase for the same rows. With
    /// `broadcast`, a value per row read across a whole row.
    Output {
        /// Which output.
        k: usize,
        /// Whether one value per row is read across whole rows.
        broadcast: bool,
    },
    /// The pass's scratch block of whole rows, written by the phase before (a
    /// reduction's prologue, which no other kernel reads).
    Scratch,
}

/// Where a phase writes its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowTarget {
    /// Output `k` of the pass.
    Output(usize),
    /// The scratch block (whole rows), read by the next phase.
    Scratch,
}

/// One kernel of the pass, run over each block of rows in order.
#[derive(Clone, Debug)]
pub enum RowPhase {
    /// A fused expression, as [`crate::Backend::fused_elementwise`] runs it: over
    /// every element of the rows, or with `per_row` over one value per row. Its
    /// `Output(0)` steps read the target's current value (a reduction's epilogue).
    Map {
        /// The expression.
        expr: FusedExpr,
        /// Its compiled loop, where the plan has one.
        native: Option<NativeFn>,
        /// Its operands, in the order of the expression's inputs.
        inputs: Vec<RowRead>,
        /// Where its one result goes.
        target: RowTarget,
        /// Whether it runs over one value per row instead of whole rows.
        per_row: bool,
    },
    /// Each row of `input` (whole rows, f32) reduced to one value, into output `out`.
    Reduce {
        /// Which reduction (sum, max or min).
        op: ReduceOp,
        /// The rows reduced.
        input: RowRead,
        /// The output (one f32 per row) it writes.
        out: usize,
    },
}

/// A chain of kernels over the same rows, run block of rows by block of rows.
#[derive(Clone, Debug, Default)]
pub struct RowPass {
    /// How many rows (the product of every axis but the last).
    pub rows: usize,
    /// The length of a whole row (the last axis).
    pub width: usize,
    /// The kernels, in order.
    pub phases: Vec<RowPhase>,
    /// For each output, whether it holds whole rows (else one value per row).
    pub whole_rows: Vec<bool>,
}

impl RowPass {
    /// Checks input `i` of the pass, seen through `layout`: rows of the pass's width or
    /// of one value, under the same lead dims as `first` (input 0's layout). Returns
    /// whether it holds one value per row. Every backend that runs passes checks its
    /// inputs here, so that a bad view is the same error on each.
    pub fn check_input(&self, i: usize, layout: &Layout, first: &Layout) -> crate::Result<bool> {
        let d = layout.dims();
        let w = d.last().copied().unwrap_or(1);
        let lead_here = &d[..d.len().saturating_sub(1)];
        let first_dims = first.dims();
        let first_lead = &first_dims[..first_dims.len().saturating_sub(1)];
        if d.is_empty()
            || lead_here.iter().product::<usize>() != self.rows
            || (w != self.width && w != 1)
            || lead_here != first_lead
        {
            return Err(crate::Error::invalid(
                "row pass",
                format!(
                    "input {i} with layout {layout:?} is not {} rows of {} or 1",
                    self.rows, self.width
                ),
            ));
        }
        Ok(w == 1)
    }

    /// Checks what the phases read and write, for inputs of which `per_row_inputs`
    /// says which hold one value per row: each expression matches its operands, an
    /// output is read only once an earlier phase wrote it, and at its own width; the
    /// scratch block only right after it is written; no phase reads as an operand what
    /// it writes; a reduction writes an output of one value per row. Every backend
    /// that runs passes checks them here, so that a malformed pass is the same error
    /// on each.
    pub fn check(&self, per_row_inputs: &[bool]) -> crate::Result<()> {
        let bad = |why: &str| Err(crate::Error::invalid("row pass", why.to_string()));
        let outputs = self.whole_rows.len();
        // On the stack for the passes plans make: a planned step allocates nothing.
        let (mut inline, mut spilled) = ([false; 32], Vec::new());
        let written: &mut [bool] = if outputs <= inline.len() {
            &mut inline[..outputs]
        } else {
            spilled.resize(outputs, false);
            &mut spilled
        };
        let mut scratch = false;
        for phase in &self.phases {
            // What it reads, whether over whole rows, and where it writes (whole rows?).
            let (reads, whole, target): (&[RowRead], bool, RowTarget) = match phase {
                RowPhase::Map {
                    expr,
                    inputs,
                    target,
                    per_row,
                    ..
                } => {
                    if expr.results.len() != 1 || expr.inputs != inputs.len() {
                        return bad("a phase's expression does not match its operands");
                    }
                    (inputs, !per_row, *target)
                }
                RowPhase::Reduce { input, out, .. } => {
                    if self.whole_rows.get(*out) != Some(&false) {
                        return bad("a reduction writes no output of one value per row");
                    }
                    (std::slice::from_ref(input), true, RowTarget::Output(*out))
                }
            };
            // A reduction reads whole rows but writes one value per row.
            let whole_target = whole && matches!(phase, RowPhase::Map { .. });
            for r in reads {
                let fits = match *r {
                    RowRead::Input(k) => per_row_inputs.get(k).is_some_and(|&one| one != whole),
                    RowRead::Output { k, broadcast } => {
                        written.get(k) == Some(&true)
                            && target != RowTarget::Output(k)
                            && self.whole_rows[k] != (broadcast || !whole)
                            && (!broadcast || whole)
                    }
                    RowRead::Scratch => scratch && whole && target != RowTarget::Scratch,
                };
                if !fits {
                    return bad("a phase reads a value it cannot read there");
                }
            }
            scratch = false;
            match target {
                RowTarget::Scratch if whole_target => scratch = true,
                RowTarget::Output(k) if self.whole_rows.get(k) == Some(&whole_target) => {
                    written[k] = true
                }
                _ => return bad("a phase writes where it cannot"),
            }
        }
        Ok(())
    }
}
