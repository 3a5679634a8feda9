//! Row passes: which consecutive kernels of a plan work on the same rows and may run
//! as one pass over blocks of rows ([`kiln_tensor::rows`]).
//!
//! A pass starts at a reduction of each row (the last axis of a value `[.., W]`, kept as
//! `[.., 1]`), or at the elementwise group right before it over the same rows when the
//! pass reads that group's result, and takes the kernels after it, in execution order,
//! while each is an elementwise group over `[.., W]` or `[.., 1]` or another such
//! reduction, and reads something the pass computed (a layer norm's mean, then its
//! variance, then its normalisation; its gradient's two row sums and the input
//! gradient). Views between them come along: a view of a value from before the pass is
//! taken before the pass runs, a view of a value the pass computes must be the
//! broadcast of one value per row across its row, or a reshape to the same dims. A
//! pass has at least two kernels besides its views.
//!
//! Each kernel keeps its own expression and output: a pass changes where the kernels'
//! loops run, not what they compute, and a backend without passes runs them apart. The
//! slots of the values a pass reads and writes are all distinct (see `assign_slots`):
//! its kernels run interleaved, block by block.

use crate::plan::{Kernel, KernelKind};
use kiln_tensor::ir::{Graph, NodeId, NodeKind};
use kiln_tensor::{Op, ReduceOp, SymDim};

/// How a kernel can take part in a row pass over rows of `[.., W]`.
enum Role<D> {
    /// A reduction of each row of a value of these dims.
    Reduce(Vec<D>),
    /// An elementwise group over these dims.
    Map(Vec<D>),
    /// A view.
    View,
    /// Anything else (ends a pass).
    Other,
}

/// Whether `op` reduces the last axis of a value of rank `rank` alone.
pub(crate) fn reduces_rows<D>(op: &Op<D>, rank: usize) -> bool {
    matches!(op, Op::Reduce { op: ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min, axes }
        if rank >= 2 && axes[..] == [rank - 1])
}

/// `dims` with its last axis 1: the dims of one value per row.
pub(crate) fn per_row<D: SymDim>(dims: &[D]) -> Vec<D> {
    let mut d = dims.to_vec();
    if let Some(last) = d.last_mut() {
        *last = D::lit(1);
    }
    d
}

fn role<D: SymDim>(g: &Graph<D>, k: &Kernel) -> Role<D> {
    match k.kind {
        KernelKind::View => Role::View,
        KernelKind::Elementwise => Role::Map(g.nodes[k.outputs[0]].meta.dims.clone()),
        KernelKind::Reduce => {
            let Some(main) = k.main else {
                return Role::Other;
            };
            let input = &g.nodes[g.nodes[main].inputs[0]].meta.dims;
            match &g.nodes[main].kind {
                NodeKind::Op(op) if reduces_rows(op, input.len()) => Role::Reduce(input.clone()),
                _ => Role::Other,
            }
        }
        _ => Role::Other,
    }
}

/// The values a pass computes (`made`) that `n` is, or is a view of.
fn reads_made<D>(g: &Graph<D>, made: &[bool], n: NodeId) -> bool {
    if made[n] {
        return true;
    }
    match &g.nodes[n].kind {
        NodeKind::Op(op) if op.is_view() => reads_made(g, made, g.nodes[n].inputs[0]),
        _ => false,
    }
}

/// Marks the row passes among `kernels` (in execution order) in their `row_pass`.
pub(crate) fn mark_row_passes<D: SymDim>(g: &Graph<D>, kernels: &mut [Kernel]) {
    let mut made = vec![false; g.nodes.len()];
    let mut next_pass = 0;
    let mut i = 0;
    while i < kernels.len() {
        let Role::Reduce(full) = role(g, &kernels[i]) else {
            i += 1;
            continue;
        };
        let rows = per_row(&full);
        made.iter_mut().for_each(|m| *m = false);
        kernels[i].outputs.iter().for_each(|&o| made[o] = true);
        let (mut last, mut members) = (i, 1);
        for (j, k) in kernels.iter().enumerate().skip(i + 1) {
            let joins = match role(g, k) {
                Role::View => {
                    let node = k.outputs[0];
                    let x = g.nodes[node].inputs[0];
                    if !reads_made(g, &made, x) {
                        continue;
                    }
                    // Only one value per row broadcast across its row, or a reshape that
                    // changes nothing (a gradient's sum back to the dims it came from).
                    let (from, to) = (&g.nodes[x].meta.dims, &g.nodes[node].meta.dims);
                    let kept = match g.nodes[node].kind {
                        NodeKind::Op(Op::Expand { .. }) => *from == rows && *to == full,
                        NodeKind::Op(Op::Reshape { .. }) => from == to,
                        _ => false,
                    };
                    if !kept {
                        break;
                    }
                    continue;
                }
                Role::Map(d) => d == full || d == rows,
                Role::Reduce(d) => d == full,
                Role::Other => false,
            };
            if !joins || !k.inputs.iter().any(|&n| reads_made(g, &made, n)) {
                break;
            }
            k.outputs.iter().for_each(|&o| made[o] = true);
            last = j;
            members += 1;
        }
        // The group right before the reduction joins when the pass reads what it
        // computes (a gradient's `g · w`, which two row sums read).
        let mut first = i;
        if first > 0 && kernels[first - 1].row_pass.is_none() {
            let k = &kernels[first - 1];
            let over_rows = matches!(role(g, k), Role::Map(d) if d == full || d == rows);
            let read = |n: NodeId| kernels[first..=last].iter().any(|r| r.inputs.contains(&n));
            if over_rows && k.outputs.iter().any(|&o| read(o)) {
                first -= 1;
                members += 1;
            }
        }
        if members >= 2 {
            for k in &mut kernels[first..=last] {
                k.row_pass = Some(next_pass);
            }
            next_pass += 1;
        }
        i = last + 1;
    }
}

/// The kernel whose position stands for kernel `k` when slots are assigned: the last
/// kernel of its row pass (a pass's kernels run interleaved, so what any of them reads
/// or writes lives from the first to the last), else `k` itself.
pub(crate) fn pass_ends(kernels: &[Kernel]) -> Vec<usize> {
    let mut end: Vec<usize> = (0..kernels.len()).collect();
    for k in (0..kernels.len().saturating_sub(1)).rev() {
        if kernels[k].row_pass.is_some() && kernels[k].row_pass == kernels[k + 1].row_pass {
            end[k] = end[k + 1];
        }
    }
    end
}
