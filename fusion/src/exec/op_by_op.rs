//! The reference path: a plan's graph run one backend call per node, no fused kernels
//! and no buffer reuse, checking every value in anomaly mode.

use super::context::{device_seed, seeded};
use super::resolve::{infer_nodes, Inferred};
use super::{Program, RunContext};
use crate::parts::{call_part, NoParts, Parts};
use kiln_tensor::ir::NodeKind;
use kiln_tensor::{Backend, Dims, Error, RawTensor, Result, TensorMeta};

impl<B: Backend> Program<B> {
    /// Runs the plan's graph op by op: one backend call per node the outputs need, no
    /// fused kernels, no buffer reuse: the reference path (a model's `set_fused(false)`)
    /// and what a plan falls back to when its symbolic dims do not describe the inputs.
    /// In anomaly mode ([`kiln_tensor::anomaly`]) every input and every node's value is
    /// checked, and the first that is not finite is an [`Error::NonFinite`] naming it.
    /// Takes what [`Program::run`] takes and checks the same (the guards, every node's
    /// shape rule), so both paths refuse the same inputs with the same message; the
    /// context's watcher is handed each output as soon as it is computed, as on the
    /// planned path.
    pub fn run_op_by_op(
        &self,
        cx: &mut RunContext<'_, B>,
        inputs: &[&RawTensor<B>],
    ) -> Result<Vec<RawTensor<B>>> {
        let (device, params, seeds) = (cx.device, cx.sizes, cx.seeds);
        let plan = &self.plan;
        if inputs.len() != plan.inputs.len() {
            return Err(Error::invalid(
                "run",
                format!(
                    "the plan takes {} inputs, not {}",
                    plan.inputs.len(),
                    inputs.len()
                ),
            ));
        }
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let Inferred {
            ops, metas: all, ..
        } = infer_nodes(plan, params, &metas)?;
        let live = plan.graph.live(&plan.outputs);
        let mut eager = kiln_tensor::Eager::<B>::new(device.clone());
        let mut values: Vec<Option<RawTensor<B>>> = vec![None; plan.graph.nodes.len()];
        let detect = kiln_tensor::anomaly::detecting();
        // How many of the plan's outputs each node is (handed out once per output).
        let mut outputs_at = vec![0usize; plan.graph.nodes.len()];
        for &o in &plan.outputs {
            outputs_at[o] += 1;
        }
        for (k, &leaf) in plan.inputs.iter().enumerate() {
            if detect && live[leaf] {
                if let Some(bad) = kiln_tensor::anomaly::first_non_finite(inputs[k])? {
                    return Err(anomaly::leaf(plan, leaf, k, &bad));
                }
            }
            values[leaf] = Some(inputs[k].clone());
        }
        for (i, node) in plan.graph.nodes.iter().enumerate() {
            if !live[i] || values[i].is_some() {
                continue;
            }
            if let NodeKind::Call(part) | NodeKind::CallGrad(part) = node.kind {
                let input = values[node.inputs[0]].clone().ok_or_else(|| {
                    Error::invalid(
                        "run",
                        format!("call {i} read before its input was computed"),
                    )
                })?;
                let grad = matches!(node.kind, NodeKind::CallGrad(_));
                let declared = &node.meta.dims;
                let mut no_parts = NoParts;
                let parts: &mut dyn Parts<B> = match cx.parts.as_deref_mut() {
                    Some(p) => p,
                    None => &mut no_parts,
                };
                let value = call_part(parts, part, grad, input, &all[i], declared)?;
                if detect {
                    anomaly::check(plan, i, &value)?;
                }
                for _ in 0..outputs_at[i] {
                    cx.tell(&value);
                }
                values[i] = Some(value);
                continue;
            }
            let op = ops[i]
                .as_ref()
                .ok_or_else(|| Error::invalid("run", format!("node {i} has no op")))?;
            let ins = node
                .inputs
                .iter()
                .map(|&j| {
                    values[j].as_ref().ok_or_else(|| {
                        Error::invalid("run", format!("node {j} read before it was computed"))
                    })
                })
                .collect::<Result<Vec<&RawTensor<B>>>>()?;
            let value = match device_seed(op, seeds) {
                Some(seed) => {
                    let views: Vec<_> = ins.iter().map(|t| t.view()).collect();
                    let storage =
                        B::draw_with_device_seed(device, op, &views, seed.view(), &all[i])?;
                    RawTensor::from_storage(storage, Dims::new(&all[i].dims)?, device.clone())?
                }
                None => {
                    kiln_tensor::Builder::apply(&mut eager, seeded(op, seeds)?.into_owned(), &ins)?
                }
            };
            if detect {
                anomaly::check(plan, i, &value)?;
            }
            for _ in 0..outputs_at[i] {
                cx.tell(&value);
            }
            values[i] = Some(value);
        }
        plan.outputs
            .iter()
            .map(|&o| {
                values[o].clone().ok_or_else(|| {
                    Error::invalid("run", format!("output node {o} was not computed"))
                })
            })
            .collect()
    }
}

/// Anomaly mode's reports: which node first held a value that is not finite, described
/// by its op, dims, node number, and the named values (parameters, inputs, variables)
/// nearest upstream, which say which layer it belongs to.
pub(super) mod anomaly {
    use crate::plan::Plan;
    use crate::sym::SDim;
    use kiln_tensor::anomaly::{first_non_finite, given_error, op_error, NonFinite};
    use kiln_tensor::ir::{NodeId, NodeKind};
    use kiln_tensor::{Backend, Error, RawTensor, Result};

    /// An error when node `i`'s `value` is not finite.
    pub(super) fn check<B: Backend>(
        plan: &Plan<SDim>,
        i: NodeId,
        value: &RawTensor<B>,
    ) -> Result<()> {
        let Some(bad) = first_non_finite(value)? else {
            return Ok(());
        };
        let op = match &plan.graph.nodes[i].kind {
            NodeKind::Op(op) => format!("`{}`", op.name()),
            NodeKind::Call(k) => format!("the call to dynamic part {k}"),
            NodeKind::CallGrad(k) => format!("the backward pass of dynamic part {k}"),
            NodeKind::RecipDim(_) => "a mean's scale 1/n".to_string(),
            NodeKind::Leaf(_) => "a leaf".to_string(),
        };
        let (leaves, variable) = upstream(plan, i);
        Err(op_error(
            &op,
            &bad,
            value.dtype(),
            value.dims().as_slice(),
            &format!("node {i}{}{}", layer(plan, i), own_name(plan, i)),
            &leaves,
            variable.as_deref(),
        ))
    }

    /// The error for input `k` (leaf node `leaf`) holding a value that is not finite.
    pub(super) fn leaf(plan: &Plan<SDim>, leaf: NodeId, k: usize, bad: &NonFinite) -> Error {
        let name = match plan.names.get(leaf).and_then(Option::as_ref) {
            Some(n) => format!("`{n}`"),
            None => format!("input {k}"),
        };
        given_error(&name, bad)
    }

    /// `, in layer `key`` when the plan says which layer node `i` belongs to.
    fn layer(plan: &Plan<SDim>, i: NodeId) -> String {
        match plan.layers.get(i).and_then(Option::as_ref) {
            Some(key) => format!(", in layer `{key}`"),
            None => String::new(),
        }
    }

    fn own_name(plan: &Plan<SDim>, i: NodeId) -> String {
        match plan.names.get(i).and_then(Option::as_ref) {
            Some(n) => format!(", computing `{n}`"),
            None => String::new(),
        }
    }

    /// The named leaves nearest upstream of node `i` (those within two steps of the
    /// nearest: a layer's parameters, behind the views that reshape them), searched
    /// first without crossing a named variable (another layer's result), and the
    /// nearest named computed value upstream.
    fn upstream(plan: &Plan<SDim>, i: NodeId) -> (Vec<String>, Option<String>) {
        let nodes = &plan.graph.nodes;
        let name = |n: NodeId| plan.names.get(n).and_then(Option::as_ref);
        let is_leaf = |n: NodeId| matches!(nodes[n].kind, NodeKind::Leaf(_));
        let variable = |n: NodeId| !is_leaf(n) && name(n).is_some();
        // Breadth-first levels: the inputs, their inputs, ...; `blocked` nodes are
        // reached but not searched past.
        let levels = |blocked: &dyn Fn(NodeId) -> bool| {
            let mut seen = vec![false; nodes.len()];
            let mut levels: Vec<Vec<NodeId>> = Vec::new();
            let mut level: Vec<NodeId> = nodes[i].inputs.clone();
            while !level.is_empty() {
                level.retain(|&n| !std::mem::replace(&mut seen[n], true));
                let next = level
                    .iter()
                    .filter(|&&n| !blocked(n))
                    .flat_map(|&n| nodes[n].inputs.clone())
                    .collect();
                levels.push(std::mem::replace(&mut level, next));
            }
            levels
        };
        let named_leaf = |n: &NodeId| is_leaf(*n) && name(*n).is_some();
        let nearest_leaves = |levels: &[Vec<NodeId>]| -> Vec<String> {
            let Some(d) = levels.iter().position(|l| l.iter().any(named_leaf)) else {
                return Vec::new();
            };
            let mut found: Vec<NodeId> = levels[d..levels.len().min(d + 3)]
                .iter()
                .flatten()
                .copied()
                .filter(named_leaf)
                .collect();
            found.sort_unstable();
            found.iter().filter_map(|&n| name(n).cloned()).collect()
        };
        let mut leaves = nearest_leaves(&levels(&variable));
        let all = levels(&|_| false);
        if leaves.is_empty() {
            leaves = nearest_leaves(&all);
        }
        let variable = all
            .iter()
            .flatten()
            .find(|&&n| variable(n))
            .and_then(|&n| name(n).cloned());
        (leaves, variable)
    }
}
