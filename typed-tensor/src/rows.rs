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
