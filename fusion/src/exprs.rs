//! A plan's kernels as fused expressions: which nodes of a kernel form its elementwise
//! group, or its reduction's or product's prologue and epilogue, written as the
//! `FusedExpr` a backend runs. A build-time concern shared by `#[model]` (which
//! compiles each expression it can into a native loop, [`native_exprs`]) and by the
//! executor (which builds them again for resolved sizes).

use crate::plan::{Kernel, KernelKind, Plan};
use crate::sym::SDim;
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::ir::{Graph, NodeId, NodeKind};
use kiln_tensor::{DType, Error, Op, Result};

/// The fused expression of `nodes` (an elementwise group, in order), reading the
/// nodes of `inputs` as its inputs and, when given, `main`'s value as output 0 (an
/// epilogue run in place). Rank-0 constants among `nodes` become constants.
fn build_expr<G, D: std::fmt::Debug>(
    graph: &Graph<G>,
    ops: &[Option<Op<D>>],
    nodes: &[NodeId],
    inputs: &[NodeId],
    main: Option<NodeId>,
    result: NodeId,
) -> Result<FusedExpr> {
    let mut steps = Vec::new();
    let mut reg: Vec<(NodeId, usize)> = Vec::new();
    let find =
        |reg: &[(NodeId, usize)], n: NodeId| reg.iter().find(|(m, _)| *m == n).map(|(_, r)| *r);
    for (k, &i) in inputs.iter().enumerate() {
        reg.push((i, steps.len()));
        steps.push(ExprStep::Input(k));
    }
    if let Some(m) = main {
        reg.push((m, steps.len()));
        steps.push(ExprStep::Output(0));
    }
    let is_const = |j: NodeId| matches!(&ops[j], Some(Op::Full { dims, .. }) if dims.is_empty());
    for &n in nodes {
        if Some(n) == main || inputs.contains(&n) || is_const(n) {
            continue;
        }
        let node = &graph.nodes[n];
        // Rank-0 constants are computed where they are read.
        for &j in &node.inputs {
            if find(&reg, j).is_none() && is_const(j) {
                let Some(Op::Full { value, .. }) = &ops[j] else {
                    unreachable!()
                };
                reg.push((j, steps.len()));
                steps.push(ExprStep::Const(*value as f32));
            }
        }
        let operand = |j: usize| {
            find(&reg, node.inputs[j]).ok_or_else(|| {
                Error::invalid(
                    "fusion",
                    format!("node {n} reads a value outside its kernel"),
                )
            })
        };
        let step = match (&node.kind, &ops[n]) {
            (_, Some(Op::Unary(u))) => ExprStep::Unary(*u, operand(0)?),
            (_, Some(Op::Binary(b))) => ExprStep::Binary(*b, operand(0)?, operand(1)?),
            (_, Some(Op::Compare(c))) => ExprStep::Compare(*c, operand(0)?, operand(1)?),
            (_, Some(Op::Where)) => ExprStep::Select(operand(0)?, operand(1)?, operand(2)?),
            // Widening to f32 is exact; narrowing to a half float happens when the
            // group's result is stored (the planner makes such a cast its group's root).
            (
                _,
                Some(Op::Cast {
                    dtype: DType::F32 | DType::BF16 | DType::F16,
                }),
            ) => {
                reg.push((n, operand(0)?));
                continue;
            }
            (_, Some(Op::Cast { dtype: DType::Bool })) => ExprStep::ToBool(operand(0)?),
            (_, op) => {
                return Err(Error::invalid(
                    "fusion",
                    format!("{op:?} cannot be part of a fused group"),
                ))
            }
        };
        reg.push((n, steps.len()));
        steps.push(step);
    }
    if find(&reg, result).is_none() && is_const(result) {
        let Some(Op::Full { value, .. }) = &ops[result] else {
            unreachable!()
        };
        reg.push((result, steps.len()));
        steps.push(ExprStep::Const(*value as f32));
    }
    let r = find(&reg, result).ok_or_else(|| {
        Error::invalid(
            "fusion",
            format!("the group {nodes:?} (inputs {inputs:?}) does not compute its result {result}"),
        )
    })?;
    Ok(FusedExpr {
        steps,
        results: vec![r],
        inputs: inputs.len(),
    })
}

/// The fused expressions of one kernel: an elementwise group's, or a reduction's or
/// product's prologue (with its inputs and root) and epilogue (with its inputs).
pub(crate) struct KernelExprs {
    pub(crate) group: Option<FusedExpr>,
    pub(crate) prologue: Option<(FusedExpr, Vec<NodeId>, NodeId)>,
    pub(crate) epilogue: Option<(FusedExpr, Vec<NodeId>)>,
}

/// Builds kernel `k`'s expressions over `graph` with `ops` (symbolic or resolved).
pub(crate) fn kernel_exprs<G, D: std::fmt::Debug>(
    graph: &Graph<G>,
    ops: &[Option<Op<D>>],
    k: &Kernel,
) -> Result<KernelExprs> {
    let mut out = KernelExprs {
        group: None,
        prologue: None,
        epilogue: None,
    };
    match k.kind {
        KernelKind::Elementwise => {
            out.group = Some(build_expr(
                graph,
                ops,
                &k.nodes,
                &k.inputs,
                None,
                k.outputs[0],
            )?);
        }
        KernelKind::Reduce | KernelKind::MatMul => {
            let (pro, main, epi) = split_main(graph, k, ops);
            let reads = |group: &[NodeId]| -> Vec<NodeId> {
                k.inputs
                    .iter()
                    .copied()
                    .filter(|i| group.iter().any(|&p| graph.nodes[p].inputs.contains(i)))
                    .collect()
            };
            if !pro.is_empty() {
                let root = graph.nodes[main].inputs[0];
                let ins = reads(&pro);
                out.prologue = Some((build_expr(graph, ops, &pro, &ins, None, root)?, ins, root));
            }
            if !epi.is_empty() {
                let ins = reads(&epi);
                out.epilogue = Some((
                    build_expr(graph, ops, &epi, &ins, Some(main), k.outputs[0])?,
                    ins,
                ));
            }
        }
        KernelKind::Single | KernelKind::View | KernelKind::Call | KernelKind::OnePass => {}
    }
    Ok(out)
}

/// The expressions of kernel `k` that `#[model]` compiles into native loops, at the
/// positions `Program::new` expects them: `[group or prologue, epilogue]`. An
/// expression with a constant known only at run time (`1/B`) has none.
pub fn native_exprs(plan: &Plan<SDim>, k: usize) -> [Option<FusedExpr>; 2] {
    let ops: Vec<Option<Op<SDim>>> = plan
        .graph
        .nodes
        .iter()
        .map(|n| match &n.kind {
            NodeKind::Op(op) => Some(op.clone()),
            _ => None,
        })
        .collect();
    let Ok(e) = kernel_exprs(&plan.graph, &ops, &plan.kernels[k]) else {
        return [None, None];
    };
    [e.group.or(e.prologue.map(|p| p.0)), e.epilogue.map(|e| e.0)]
}

/// Splits a reduce/matmul kernel's nodes into the prologue (the group computing the
/// main node's input) and the epilogue (the rest), rank-0 constants aside: expressions
/// compute them where they read them.
fn split_main<G, D>(
    graph: &Graph<G>,
    k: &Kernel,
    ops: &[Option<Op<D>>],
) -> (Vec<NodeId>, NodeId, Vec<NodeId>) {
    let main = k.main.expect("reduce and matmul kernels have a main node");
    let is_const = |j: NodeId| matches!(&ops[j], Some(Op::Full { dims, .. }) if dims.is_empty());
    // Convolution columns the kernel reads or folds are no part of either expression.
    let (read, fold) = crate::windows::of_kernel(graph, k);
    let windowed = crate::windows::window_nodes(&read, &fold);
    let inside = |n: &NodeId| k.nodes.contains(n) && !windowed.contains(n);
    let mut pro: Vec<NodeId> = Vec::new();
    let mut stack: Vec<NodeId> = graph.nodes[main]
        .inputs
        .iter()
        .copied()
        .filter(inside)
        .collect();
    while let Some(n) = stack.pop() {
        if pro.contains(&n) || is_const(n) {
            continue;
        }
        pro.push(n);
        stack.extend(graph.nodes[n].inputs.iter().copied().filter(inside));
    }
    pro.sort_unstable();
    let mut epi: Vec<NodeId> = k
        .nodes
        .iter()
        .copied()
        .filter(|&n| n != main && inside(&n) && !pro.contains(&n) && !is_const(n))
        .collect();
    // A value both parts read (a value groups recompute where they read it) is
    // computed in each: the prologue's values are gone when the epilogue runs.
    let mut i = 0;
    while i < epi.len() {
        for &j in &graph.nodes[epi[i]].inputs {
            if pro.contains(&j) && !epi.contains(&j) {
                epi.push(j);
            }
        }
        i += 1;
    }
    epi.sort_unstable();
    (pro, main, epi)
}
