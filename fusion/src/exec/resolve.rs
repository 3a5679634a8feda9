//! A plan resolved for its inputs' sizes: every node's dims derived by the op table's
//! rules, the guards run again, and each kernel turned into the steps a planned run
//! takes ([`Resolved`]), or the reason the plan does not describe these inputs.

use super::rows::{fold_row_passes, RowsStep};
use crate::exprs::kernel_exprs;
use crate::plan::{KernelKind, Plan};
use crate::sym::SDim;
use crate::windows::{FoldWrite, WindowRead};
use kiln_tensor::fused::{FusedExpr, NativeFn};
use kiln_tensor::ir::{KeptGuard, NodeId, NodeKind};
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{Backend, Dims, Error, Op, RawTensor, Result, TensorMeta};

/// A plan's compiled loops, only those it has: `(2k, f)` is kernel `k`'s main (or
/// prologue) loop, `(2k + 1, f)` its epilogue's (see [`crate::native_exprs`]).
pub type Natives = [(u32, NativeFn)];

/// A prologue: its expression, native loop, inputs, and the node it computes.
pub(super) type Prologue = (FusedExpr, Option<NativeFn>, Vec<NodeId>, NodeId);

/// An epilogue: its expression, native loop and inputs (it runs in place).
pub(super) type Epilogue = (FusedExpr, Option<NativeFn>, Vec<NodeId>);

/// One kernel, resolved for fixed dims.
#[derive(Debug)]
pub(super) enum Step {
    /// A fused elementwise group.
    Fused {
        expr: FusedExpr,
        native: Option<NativeFn>,
        inputs: Vec<NodeId>,
        output: NodeId,
    },
    /// A reduction or product (`main`), its prologue written to scratch first, its
    /// epilogue run in place on its output. A product may read one operand's columns
    /// through a window, or fold its result (`crate::windows`).
    Main {
        main: NodeId,
        prologue: Option<Prologue>,
        epilogue: Option<Epilogue>,
        window: Option<WindowRead>,
        fold: Option<FoldWrite>,
        output: NodeId,
    },
    /// One op into its slot.
    Single { node: NodeId, op: Op },
    /// A layout change (a reshape that cannot view copies into its slot).
    View { node: NodeId },
    /// A call out to a part (or its backward pass), its result into its slot.
    Call { node: NodeId },
    /// Ops one pass computes together, each result into its slot; each reads the
    /// first of the first node's inputs.
    OnePass { nodes: Vec<NodeId>, ops: Vec<Op> },
    /// Kernels over the same rows, run as one pass over blocks of rows where the
    /// backend does (`crate::rows`).
    Rows(Box<RowsStep>),
}

impl Step {
    /// The nodes whose values the step computes.
    pub(super) fn nodes(&self) -> &[NodeId] {
        match self {
            Step::OnePass { nodes, .. } => nodes,
            Step::Rows(rows) => &rows.nodes,
            Step::Fused { output, .. } | Step::Main { output, .. } => std::slice::from_ref(output),
            Step::Single { node, .. } | Step::View { node } | Step::Call { node } => {
                std::slice::from_ref(node)
            }
        }
    }
}

/// What `resolve` decided for one set of parameters and input dims.
#[derive(Debug)]
pub(super) struct Resolved {
    /// The size parameters and input dims it was resolved for.
    pub(super) key: Vec<usize>,
    /// Whether the plan describes these inputs (else they run op by op).
    pub(super) planned: bool,
    pub(super) metas: Vec<TensorMeta>,
    pub(super) dims: Vec<Dims>,
    pub(super) ops: Vec<Option<Op>>,
    pub(super) steps: Vec<Step>,
    pub(super) slot_len: Vec<usize>,
    /// For each step, the positions in the plan's outputs of the nodes it computes
    /// (handed to an output watcher as soon as the step is queued).
    pub(super) ready: Vec<Vec<usize>>,
}

impl Resolved {
    /// Inputs the plan does not describe.
    pub(super) fn declined(key: Vec<usize>) -> Self {
        Resolved {
            key,
            planned: false,
            metas: Vec::new(),
            dims: Vec::new(),
            ops: Vec::new(),
            steps: Vec::new(),
            slot_len: Vec::new(),
            ready: Vec::new(),
        }
    }

    /// Whether it was resolved for these parameters and input dims.
    pub(super) fn matches<B: Backend>(
        &self,
        params: &[(&str, usize)],
        inputs: &[&RawTensor<B>],
    ) -> bool {
        let mut it = self.key.iter();
        params.iter().all(|(_, v)| it.next() == Some(v))
            && inputs
                .iter()
                .all(|t| t.dims().iter().all(|d| it.next() == Some(d)))
            && it.next().is_none()
    }
}

/// The value bound to run-time size `id`, if any yet.
pub(super) fn lookup(atoms: &[(u32, usize)], id: u32) -> Option<usize> {
    atoms.iter().find(|(a, _)| *a == id).map(|(_, v)| *v)
}

/// Runs a kept guard on the resolved metas of its inputs.
pub(super) fn run_guard(k: &KeptGuard, metas: &[TensorMeta]) -> Result<()> {
    let ins = k
        .inputs
        .iter()
        .map(|&j| {
            metas.get(j).ok_or_else(|| {
                Error::invalid("plan", format!("a guard reads node {j} before it exists"))
            })
        })
        .collect::<Result<Vec<&TensorMeta>>>()?;
    k.guard.check(&ins)
}

/// A reshape's target dims: a run-time size that no input gives is left open and
/// solved from the element count, as the typed `reshape` solves a `Dyn`.
pub(super) fn reshape_dims(
    dims: &[SDim],
    from: &[usize],
    param: &dyn Fn(&str) -> Option<usize>,
    rt: &dyn Fn(u32) -> Option<usize>,
) -> Result<Vec<usize>> {
    let to = dims
        .iter()
        .map(|d| match d.eval(param, rt) {
            Ok(v) => Ok(Some(v)),
            Err(_) if d.as_runtime().is_some() => Ok(None),
            Err(e) => Err(e),
        })
        .collect::<Result<Vec<Option<usize>>>>()?;
    if to.iter().all(Option::is_some) {
        // Nothing to solve: the reshape's own rule checks the count.
        return Ok(to.into_iter().flatten().collect());
    }
    kiln_tensor::op::solve_reshape(from, &to)
}

/// Every node's dims and dtype, and its op with dims resolved, for one set of
/// parameters and inputs.
pub(super) struct Inferred {
    pub(super) metas: Vec<TensorMeta>,
    pub(super) ops: Vec<Option<Op>>,
    /// Whether the plan's symbolic dims describe every node (else the inputs are
    /// valid but only op-by-op execution handles them).
    pub(super) described: bool,
}

/// Derives every node's dims and dtype from the inputs' by the op table's rules and
/// runs the guards the graph kept, so what op-by-op execution refuses is refused here,
/// with its message. Run-time sizes (`Dyn`) bind to what the inputs give, at the
/// first node whose dims name them; a reshape to a `Dyn` that no input gives takes the
/// size its element count leaves. A leaf that disagrees with the plan is an error; a
/// computed node that does (two `Dyn` sizes that broadcast) clears `described`.
pub(super) fn infer_nodes(
    plan: &Plan<SDim>,
    params: &[(&str, usize)],
    inputs: &[TensorMeta],
) -> Result<Inferred> {
    let param = |name: &str| params.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let n = plan.graph.nodes.len();
    let mut atoms: Vec<(u32, usize)> = Vec::new();
    let mut metas: Vec<TensorMeta> = Vec::with_capacity(n);
    let mut ops: Vec<Option<Op>> = Vec::with_capacity(n);
    let mut all_described = true;
    let mut guards = plan.graph.guards.iter().peekable();
    for (i, node) in plan.graph.nodes.iter().enumerate() {
        while let Some(k) = guards.next_if(|k| k.at <= i) {
            run_guard(k, &metas)?;
        }
        let rt = |id: u32| lookup(&atoms, id);
        let (op, meta) = match &node.kind {
            NodeKind::Leaf(_) => {
                let k = plan.inputs.iter().position(|&l| l == i).ok_or_else(|| {
                    Error::invalid("plan", format!("leaf {i} is not one of its inputs"))
                })?;
                (None, inputs[k].clone())
            }
            NodeKind::RecipDim(d) => {
                let op = Op::recip_count(d.eval(&param, &rt)?, node.meta.dtype);
                (Some(op), TensorMeta::new(vec![], node.meta.dtype))
            }
            NodeKind::Call(_) => {
                if node.inputs.len() != 1 {
                    return Err(Error::invalid(
                        "plan",
                        format!("call {i} has {} inputs, not one", node.inputs.len()),
                    ));
                }
                let dims = node
                    .meta
                    .dims
                    .iter()
                    .map(|d| d.eval(&param, &rt))
                    .collect::<Result<Vec<usize>>>()?;
                (None, TensorMeta::new(dims, node.meta.dtype))
            }
            NodeKind::CallGrad(_) => {
                // Its inputs: the gradient and the call, whose input it is the gradient of.
                let call_input = node
                    .inputs
                    .get(1)
                    .and_then(|&c| plan.graph.nodes.get(c))
                    .and_then(|c| c.inputs.first())
                    .and_then(|&x| metas.get(x))
                    .filter(|_| node.inputs.len() == 2)
                    .ok_or_else(|| {
                        Error::invalid("plan", format!("call gradient {i} names no call before it"))
                    })?;
                (None, call_input.clone())
            }
            NodeKind::Op(op) => {
                let ins: Vec<&TensorMeta> = node.inputs.iter().map(|&j| &metas[j]).collect();
                let op = match op {
                    Op::Reshape { dims } => Op::Reshape {
                        dims: reshape_dims(dims, &ins[0].dims, &param, &rt)?,
                    },
                    op => op.try_map_dims(|d| d.eval(&param, &rt))?,
                };
                let meta = op.infer_sizes(&ins)?;
                (Some(op), meta)
            }
        };
        let mut described =
            meta.dtype == node.meta.dtype && meta.dims.len() == node.meta.dims.len();
        for (sym, &size) in node.meta.dims.iter().zip(&meta.dims) {
            match sym.as_runtime() {
                Some(id) if lookup(&atoms, id).is_none() => atoms.push((id, size)),
                _ => described &= sym.eval(&param, &|id| lookup(&atoms, id)).ok() == Some(size),
            }
        }
        if !described {
            if let NodeKind::Leaf(_) = node.kind {
                let name = plan.names.get(i).cloned().flatten();
                let name = name.unwrap_or_else(|| format!("input {i}"));
                let want: Vec<String> = node
                    .meta
                    .dims
                    .iter()
                    .map(|d| {
                        d.eval(&param, &|_| None)
                            .map_or(d.to_string(), |v| v.to_string())
                    })
                    .collect();
                return Err(Error::shape(
                    "run",
                    format!(
                        "`{name}` is {} {} but the plan was built for {} [{}]",
                        meta.dtype,
                        fmt_dims(&meta.dims),
                        node.meta.dtype,
                        want.join(", ")
                    ),
                ));
            }
            all_described = false;
        }
        metas.push(meta);
        ops.push(op);
    }
    for k in guards {
        run_guard(k, &metas)?;
    }
    Ok(Inferred {
        metas,
        ops,
        described: all_described,
    })
}

/// Kernel `ki`'s one pass over `nodes`, or an error when a plan text names ops that
/// one pass does not compute together: each must read the first of the first node's
/// inputs, as the backends' one-pass kernels read them.
fn one_pass_step(
    plan: &Plan<SDim>,
    ops: &[Option<Op>],
    ki: usize,
    nodes: &[NodeId],
) -> Result<Step> {
    let refused = || {
        Error::invalid(
            "plan",
            format!("kernel {ki} runs nodes {nodes:?} as one pass, which they are not"),
        )
    };
    let ops = nodes
        .iter()
        .map(|&n| ops.get(n).cloned().flatten().ok_or_else(refused))
        .collect::<Result<Vec<Op>>>()?;
    let refs: Vec<&Op> = ops.iter().collect();
    let Some(&lead) = nodes.first() else {
        return Err(refused());
    };
    let first = &plan.graph.nodes[lead].inputs;
    let shared = nodes
        .iter()
        .all(|&n| first.starts_with(&plan.graph.nodes[n].inputs));
    if !shared || !kiln_tensor::attention::one_pass(&refs) {
        return Err(refused());
    }
    Ok(Step::OnePass {
        nodes: nodes.to_vec(),
        ops,
    })
}

/// Resolves dims, ops and kernels for these parameters and inputs (see
/// `infer_nodes`): no kernel sees a buffer of another size than its shape says. The
/// result is declined (not `planned`) when the inputs are valid but the plan's
/// symbolic dims do not describe them: then the caller runs op by op.
pub(super) fn resolve(
    plan: &Plan<SDim>,
    natives: &Natives,
    params: &[(&str, usize)],
    inputs: &[TensorMeta],
) -> Result<Resolved> {
    let mut key: Vec<usize> = params.iter().map(|(_, v)| *v).collect();
    for t in inputs {
        key.extend_from_slice(&t.dims);
    }
    let Inferred {
        metas,
        ops,
        described,
    } = infer_nodes(plan, params, inputs)?;
    if !described {
        return Ok(Resolved::declined(key));
    }
    let dims: Vec<Dims> = metas
        .iter()
        .map(|m| Dims::new(&m.dims))
        .collect::<Result<_>>()?;
    let mut slot_len = vec![0usize; plan.slots.len()];
    for (i, s) in plan.slot_of.iter().enumerate() {
        if let Some(s) = s {
            slot_len[*s] = slot_len[*s].max(dims[i].numel());
        }
    }
    let mut steps = Vec::with_capacity(plan.kernels.len());
    for (ki, k) in plan.kernels.iter().enumerate() {
        let native = |i: usize| {
            let at = 2 * ki + i;
            natives
                .iter()
                .find(|(k, _)| *k as usize == at)
                .map(|&(_, f)| f)
        };
        let exprs = kernel_exprs(&plan.graph, &ops, k)?;
        steps.push(match k.kind {
            KernelKind::Elementwise => Step::Fused {
                expr: exprs.group.expect("elementwise kernels have a group"),
                native: native(0),
                inputs: k.inputs.clone(),
                output: k.outputs[0],
            },
            KernelKind::Reduce | KernelKind::MatMul => {
                let (window, fold) = crate::windows::of_kernel(&plan.graph, k);
                Step::Main {
                    main: k.main.expect("reduce and matmul kernels have a main node"),
                    prologue: exprs
                        .prologue
                        .map(|(e, ins, root)| (e, native(0), ins, root)),
                    epilogue: exprs.epilogue.map(|(e, ins)| (e, native(1), ins)),
                    window,
                    fold,
                    output: k.outputs[0],
                }
            }
            KernelKind::Single => {
                let node = k.outputs[0];
                Step::Single {
                    node,
                    op: ops[node].clone().expect("single kernels run an op"),
                }
            }
            KernelKind::View => Step::View { node: k.outputs[0] },
            KernelKind::Call => Step::Call { node: k.outputs[0] },
            KernelKind::OnePass => one_pass_step(plan, &ops, ki, &k.outputs)?,
        });
    }
    let steps = fold_row_passes(plan, &dims, &ops, steps)?;
    let ready = steps
        .iter()
        .map(|step| {
            (0..plan.outputs.len())
                .filter(|&o| step.nodes().contains(&plan.outputs[o]))
                .collect()
        })
        .collect();
    Ok(Resolved {
        key,
        planned: true,
        metas,
        dims,
        ops,
        steps,
        slot_len,
        ready,
    })
}
