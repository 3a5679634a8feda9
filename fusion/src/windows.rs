//! Convolution columns that are never stored: a product that reads an unfold's
//! columns through a window (a convolution's forward product and its weight gradient),
//! and a product whose result goes straight into a fold (its input gradient).
//!
//! A convolution is `unfold2d` then a product, and its input gradient a product then
//! `fold2d` (DESIGN.md, convolutions): the columns between them are `k·k` times the
//! activations. The planner puts the unfold, and the views from its result to a
//! product's operand, into that product's kernel (recomputed by each product that reads
//! them: the forward product and the weight gradient), and puts the views and the fold
//! after a product into the product's kernel. A backend that can (the CPU, over blocks
//! of whole images whose columns stay in its cache) runs each as one call; any other
//! writes the columns into the program's scratch buffer and runs the ops one after
//! another, as op-by-op execution does.

use crate::plan::Kernel;
use kiln_tensor::ir::{Graph, NodeId, NodeKind};
use kiln_tensor::{DType, Op};
use std::collections::HashMap;

/// Columns a product reads through a window instead of from memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowRead {
    /// Which operand of the product (0 or 1) reads them.
    pub operand: usize,
    /// The `Unfold2d` node whose columns they are.
    pub unfold: NodeId,
    /// The views from the unfold's result to the operand, in order.
    pub views: Vec<NodeId>,
}

/// The fold a product's result goes into without being stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldWrite {
    /// The views from the product's result to the fold's input, in order.
    pub views: Vec<NodeId>,
    /// The `Fold2d` node (the kernel's output).
    pub fold: NodeId,
}

/// Whether `op` is a view the columns may pass through (a reshape or a permute; a
/// slice or an expand of columns is no convolution's).
fn passes<D>(op: &Op<D>) -> bool {
    matches!(op, Op::Reshape { .. } | Op::Permute { .. })
}

/// Whether view `next` may follow `views` on the way from the columns to a product: no
/// reshape after a permute, so that every view of the contiguous columns is a layout
/// (a reshape of a permuted layout may need a copy, and the columns have no buffer).
fn views_after<D>(g: &Graph<D>, views: &[NodeId], next: NodeId) -> bool {
    let permuted = views
        .iter()
        .any(|&v| matches!(op_of(g, v), Some(Op::Permute { .. })));
    !(permuted && matches!(op_of(g, next), Some(Op::Reshape { .. })))
}

fn op_of<D>(g: &Graph<D>, n: NodeId) -> Option<&Op<D>> {
    match &g.nodes[n].kind {
        NodeKind::Op(op) => Some(op),
        _ => None,
    }
}

/// A float product (`Op::MatMul`) of f32 values.
fn f32_product<D>(g: &Graph<D>, n: NodeId) -> bool {
    matches!(op_of(g, n), Some(Op::MatMul)) && g.nodes[n].meta.dtype == DType::F32
}

/// The window reads the planner gives products: for each f32 unfold that is no output
/// and that only f32 products read (through reshapes and permutes that are no outputs
/// and that nothing else reads), the chain from it to each product, keyed by the
/// product. A product with both operands so read keeps the second stored.
pub(crate) fn window_reads<D>(
    g: &Graph<D>,
    consumers: &[Vec<NodeId>],
    is_output: impl Fn(NodeId) -> bool,
) -> HashMap<NodeId, WindowRead> {
    let mut reads = HashMap::new();
    for (u, node) in g.nodes.iter().enumerate() {
        if !matches!(op_of(g, u), Some(Op::Unfold2d(_)))
            || node.meta.dtype != DType::F32
            || is_output(u)
        {
            continue;
        }
        // Walk every path from the unfold; all must end at a product's operand.
        let mut found: Vec<(NodeId, WindowRead)> = Vec::new();
        let mut stack: Vec<(NodeId, Vec<NodeId>)> = vec![(u, Vec::new())];
        let mut whole = true;
        while let Some((at, views)) = stack.pop() {
            for &c in &consumers[at] {
                let operands = &g.nodes[c].inputs;
                if f32_product(g, c) {
                    // Both operands the same columns: leave them stored.
                    if operands.iter().all(|&o| o == at) {
                        whole = false;
                        continue;
                    }
                    let operand = usize::from(operands[1] == at);
                    found.push((
                        c,
                        WindowRead {
                            operand,
                            unfold: u,
                            views: views.clone(),
                        },
                    ));
                } else if op_of(g, c).is_some_and(passes)
                    && !is_output(c)
                    && views_after(g, &views, c)
                {
                    let mut next = views.clone();
                    next.push(c);
                    stack.push((c, next));
                } else {
                    whole = false;
                }
            }
        }
        // A product reached twice (both operands through other views) keeps them stored.
        let twice = (found.iter()).any(|(p, _)| found.iter().filter(|(q, _)| q == p).count() > 1);
        let taken = |p: &NodeId| reads.contains_key(p);
        if whole && !twice && !found.is_empty() && !found.iter().any(|(p, _)| taken(p)) {
            reads.extend(found);
        }
    }
    reads
}

/// The folds the planner puts after products: for each f32 `Fold2d` whose input is an
/// f32 product (no output, read by nothing else) through reshapes and permutes (no
/// outputs, each read only by the next), keyed by the product. `taken` tells products
/// whose result an epilogue already reads.
pub(crate) fn fold_writes<D>(
    g: &Graph<D>,
    consumers: &[Vec<NodeId>],
    is_output: impl Fn(NodeId) -> bool,
    taken: impl Fn(NodeId) -> bool,
) -> HashMap<NodeId, FoldWrite> {
    let mut writes = HashMap::new();
    for (f, node) in g.nodes.iter().enumerate() {
        if !matches!(op_of(g, f), Some(Op::Fold2d { .. })) || node.meta.dtype != DType::F32 {
            continue;
        }
        let mut views = Vec::new();
        let mut at = node.inputs[0];
        loop {
            if is_output(at) || consumers[at].len() != 1 {
                break;
            }
            if f32_product(g, at) {
                if !taken(at) {
                    views.reverse();
                    writes.insert(at, FoldWrite { views, fold: f });
                }
                break;
            }
            if !op_of(g, at).is_some_and(passes) {
                break;
            }
            views.push(at);
            at = g.nodes[at].inputs[0];
        }
    }
    writes
}

/// The window read and the fold of a matmul kernel, found again from its nodes (what a
/// plan read back from text knows).
pub(crate) fn of_kernel<G>(g: &Graph<G>, k: &Kernel) -> (Option<WindowRead>, Option<FoldWrite>) {
    let Some(main) = k.main else {
        return (None, None);
    };
    let inside = |n: NodeId| k.nodes.contains(&n);
    let mut read = None;
    for (operand, &first) in g.nodes[main].inputs.iter().enumerate() {
        let mut views = Vec::new();
        let mut at = first;
        while inside(at) && op_of(g, at).is_some_and(passes) {
            views.push(at);
            at = g.nodes[at].inputs[0];
        }
        if inside(at) && matches!(op_of(g, at), Some(Op::Unfold2d(_))) {
            views.reverse();
            read = Some(WindowRead {
                operand,
                unfold: at,
                views,
            });
            break;
        }
    }
    let out = k.outputs[0];
    let mut fold = None;
    if out != main && matches!(op_of(g, out), Some(Op::Fold2d { .. })) {
        let mut views = Vec::new();
        let mut at = g.nodes[out].inputs[0];
        while at != main && inside(at) && op_of(g, at).is_some_and(passes) {
            views.push(at);
            at = g.nodes[at].inputs[0];
        }
        if at == main {
            views.reverse();
            fold = Some(FoldWrite { views, fold: out });
        }
    }
    (read, fold)
}

/// The nodes of a matmul kernel that its window read and fold compute (no part of an
/// elementwise prologue or epilogue).
pub(crate) fn window_nodes(read: &Option<WindowRead>, fold: &Option<FoldWrite>) -> Vec<NodeId> {
    let mut nodes = Vec::new();
    if let Some(r) = read {
        nodes.push(r.unfold);
        nodes.extend(&r.views);
    }
    if let Some(f) = fold {
        nodes.extend(&f.views);
        nodes.push(f.fold);
    }
    nodes
}
