//! A plan's row passes resolved for fixed dims: the steps of each pass's kernels turned
//! into the [`RowPass`] a backend runs, with the views it reads, the buffers it writes,
//! and the views to take before and after it. A plan text whose marked kernels are no
//! row pass is refused here, before anything runs.

use super::resolve::Step;
use crate::plan::Plan;
use crate::rows::reduces_rows;
use crate::sym::SDim;
use kiln_tensor::fused::{FusedExpr, NativeFn};
use kiln_tensor::ir::{NodeId, NodeKind};
use kiln_tensor::rows::{RowPass, RowPhase, RowRead, RowTarget};
use kiln_tensor::{Dims, Error, Op, Result};

/// A row pass, resolved.
#[derive(Debug)]
pub(super) struct RowsStep {
    /// Its kernels' steps, views included, in order: what runs where the backend does
    /// not run passes.
    pub(super) members: Vec<Step>,
    /// The pass the backend runs.
    pub(super) pass: RowPass,
    /// The values its phases read, each seen over these dims.
    pub(super) inputs: Vec<(NodeId, Dims)>,
    /// The values it writes, in the order of the pass's outputs.
    pub(super) outputs: Vec<NodeId>,
    /// Views of values from before the pass, taken before it runs.
    pub(super) before: Vec<NodeId>,
    /// Views of values the pass computes, taken after it.
    pub(super) after: Vec<NodeId>,
    /// Every node its members compute.
    pub(super) nodes: Vec<NodeId>,
}

/// Folds the steps of each row pass of `plan` (one step per kernel, in order) into one
/// [`Step::Rows`].
pub(super) fn fold_row_passes(
    plan: &Plan<SDim>,
    dims: &[Dims],
    ops: &[Option<Op>],
    steps: Vec<Step>,
) -> Result<Vec<Step>> {
    let mut out = Vec::with_capacity(steps.len());
    let mut members: Vec<Step> = Vec::new();
    let mut current = None;
    for (k, step) in steps.into_iter().enumerate() {
        let pass = plan.kernels[k].row_pass;
        if pass != current && !members.is_empty() {
            out.push(resolve_pass(plan, dims, ops, std::mem::take(&mut members))?);
        }
        current = pass;
        match pass {
            Some(_) => members.push(step),
            None => out.push(step),
        }
    }
    if !members.is_empty() {
        out.push(resolve_pass(plan, dims, ops, members)?);
    }
    Ok(out)
}

/// Builds the pass of `members`, or refuses a plan that marked kernels that are none.
fn resolve_pass(
    plan: &Plan<SDim>,
    dims: &[Dims],
    ops: &[Option<Op>],
    members: Vec<Step>,
) -> Result<Step> {
    let nodes: Vec<NodeId> = members
        .iter()
        .flat_map(|s| s.nodes().iter().copied())
        .collect();
    let refused = |why: &str| {
        Error::invalid(
            "plan",
            format!("kernels computing {nodes:?} are marked as a row pass, but {why}"),
        )
    };
    let g = &plan.graph;
    // A pass starts at a reduction, or at the group right before one.
    let main = match members.as_slice() {
        [Step::Main { main, .. }, ..] | [Step::Fused { .. }, Step::Main { main, .. }, ..] => *main,
        _ => return Err(refused("it starts at no reduction")),
    };
    let full = dims[g.nodes[main].inputs[0]];
    let width = *full.last().ok_or_else(|| refused("it reduces a scalar"))?;
    let per_row = {
        let mut d = full.to_vec();
        *d.last_mut().expect("rank checked above") = 1;
        Dims::new(&d)?
    };
    let rows = per_row.numel();
    let mut rs = RowsStep {
        members: Vec::new(),
        pass: RowPass {
            rows,
            width,
            phases: Vec::new(),
            whole_rows: Vec::new(),
        },
        inputs: Vec::new(),
        outputs: Vec::new(),
        before: Vec::new(),
        after: Vec::new(),
        nodes: nodes.clone(),
    };
    // The pass output node `n` is, is broadcast from, or is reshaped from unchanged.
    let made = |rs: &RowsStep, mut n: NodeId| -> Option<(usize, bool)> {
        let mut broadcast = false;
        loop {
            if let Some(k) = rs.outputs.iter().position(|&o| o == n) {
                return Some((k, broadcast));
            }
            let x = *g.nodes[n].inputs.first()?;
            match &g.nodes[n].kind {
                NodeKind::Op(Op::Expand { .. }) => broadcast = true,
                NodeKind::Op(Op::Reshape { .. }) if dims[n] == dims[x] => {}
                _ => return None,
            }
            n = x;
        }
    };
    // Whether `n` is a value of the pass or a view of one.
    let depends = |rs: &RowsStep, mut n: NodeId| loop {
        if rs.outputs.contains(&n) {
            return true;
        }
        match &g.nodes[n].kind {
            NodeKind::Op(op) if op.is_view() => n = g.nodes[n].inputs[0],
            _ => return false,
        }
    };
    let read = |rs: &mut RowsStep, n: NodeId, over: Dims| -> Result<RowRead> {
        if depends(rs, n) {
            let Some((k, via_expand)) = made(rs, n) else {
                return Err(refused("a kernel reads a value of the pass through a view"));
            };
            let o = rs.outputs[k];
            let broadcast = dims[o] != over;
            let fits = if broadcast {
                dims[o] == per_row && over == full
            } else {
                !via_expand
            };
            if !fits {
                return Err(refused("a kernel reads a value of the pass across rows"));
            }
            return Ok(RowRead::Output { k, broadcast });
        }
        let key = (n, over);
        let k = match rs.inputs.iter().position(|i| *i == key) {
            Some(k) => k,
            None => {
                rs.inputs.push(key);
                rs.inputs.len() - 1
            }
        };
        Ok(RowRead::Input(k))
    };
    let domain = |d: Dims| -> Result<bool> {
        if d == full {
            Ok(false)
        } else if d == per_row {
            Ok(true)
        } else {
            Err(refused("a kernel works over other dims"))
        }
    };
    // A phase of `expr` reading `ins` over `over`, writing `target`.
    let map = |rs: &mut RowsStep,
               (expr, native): (&FusedExpr, Option<NativeFn>),
               ins: &[NodeId],
               over: Dims,
               target: RowTarget|
     -> Result<()> {
        let inputs = (ins.iter())
            .map(|&n| read(rs, n, over))
            .collect::<Result<Vec<_>>>()?;
        rs.pass.phases.push(RowPhase::Map {
            expr: expr.clone(),
            native,
            inputs,
            target,
            per_row: over == per_row,
        });
        Ok(())
    };
    for step in &members {
        match step {
            Step::View { node } => {
                let x = g.nodes[*node].inputs[0];
                if !depends(&rs, x) {
                    rs.before.push(*node);
                } else if made(&rs, *node).is_some_and(|(k, b)| {
                    let o = dims[rs.outputs[k]];
                    (b && o == per_row && dims[*node] == full) || (!b && o == dims[*node])
                }) {
                    rs.after.push(*node);
                } else {
                    return Err(refused("a view of a value of the pass mixes rows"));
                }
            }
            Step::Fused {
                expr,
                native,
                inputs,
                output,
            } => {
                let over = dims[*output];
                let one_per_row = domain(over)?;
                rs.outputs.push(*output);
                rs.pass.whole_rows.push(!one_per_row);
                let target = RowTarget::Output(rs.outputs.len() - 1);
                map(&mut rs, (expr, *native), inputs, over, target)?;
            }
            Step::Main {
                main,
                prologue,
                epilogue,
                output,
                ..
            } => {
                let x = g.nodes[*main].inputs[0];
                let op = match ops[*main].as_ref() {
                    Some(reduce @ Op::Reduce { op, .. })
                        if reduces_rows(reduce, dims[x].rank()) =>
                    {
                        *op
                    }
                    _ => return Err(refused("a kernel is no reduction of rows")),
                };
                if dims[x] != full || dims[*output] != per_row {
                    return Err(refused("a reduction works over other dims"));
                }
                let input = match prologue {
                    Some((expr, native, ins, root)) if *root == x => {
                        map(&mut rs, (expr, *native), ins, full, RowTarget::Scratch)?;
                        RowRead::Scratch
                    }
                    Some(_) => return Err(refused("a prologue computes another value")),
                    None => read(&mut rs, x, full)?,
                };
                rs.outputs.push(*output);
                rs.pass.whole_rows.push(false);
                let out = rs.outputs.len() - 1;
                rs.pass.phases.push(RowPhase::Reduce { op, input, out });
                if let Some((expr, native, ins)) = epilogue {
                    map(
                        &mut rs,
                        (expr, *native),
                        ins,
                        per_row,
                        RowTarget::Output(out),
                    )?;
                }
            }
            _ => return Err(refused("one is neither a view, a reduction nor a group")),
        }
    }
    // The pass's kernels run interleaved: every value it writes needs its own buffer.
    let slots: Vec<Option<usize>> = rs.outputs.iter().map(|&o| plan.slot_of[o]).collect();
    for (i, s) in slots.iter().enumerate() {
        if s.is_none() || slots[..i].contains(s) {
            return Err(refused("two of its values share a buffer"));
        }
    }
    rs.members = members;
    Ok(Step::Rows(Box::new(rs)))
}
