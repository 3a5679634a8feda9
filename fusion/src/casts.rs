//! Mixed precision's casts moved across views before planning. Casts and views commute
//! exactly (a cast changes each value alone, a view moves values without changing
//! them), so where a cast sits among views is the planner's choice:
//!
//! - a **widening** cast (bf16 or f16 to f32) is moved after the permutes and reshapes
//!   that read it, so that it lands beside its readers: it joins their elementwise
//!   group as a load, and a reshape that must copy copies the half value, half the
//!   bytes;
//! - a **narrowing** cast (f32 to bf16 or f16) is moved before the views it reads
//!   through, so that it becomes the root of the group computing its input (the
//!   projection's bias add narrows as it stores, instead of a strided pass over a
//!   permuted head view afterwards);
//! - a narrowing cast of a widened value is the half value itself (widening is exact),
//!   so `cast_bf16(cast_f32(x))` is `x`: attention's bf16 output is not widened for the
//!   head merge and narrowed again for the output projection.
//!
//! The rewrite builds a new graph; the nodes it bypasses are left dead for the planner
//! to drop. Expands and slices are left where they are: moving a cast across them would
//! change how many values it converts.

use kiln_tensor::ir::{Graph, KeptGuard, NodeId, NodeKind};
use kiln_tensor::{Builder, DType, Op, SymDim};

/// A graph with its casts moved, and where each node of the original went.
pub(crate) struct Moved<D> {
    /// The rewritten graph (with the bypassed nodes still in it, dead).
    pub graph: Graph<D>,
    /// For each node of the original graph, the node computing its value.
    pub new_id: Vec<NodeId>,
    /// For each node of the rewritten graph, the original node it was made for, and
    /// whether it computes that node's value (the last node of a rewritten chain does;
    /// the views and casts before it only serve it).
    pub origin: Vec<(NodeId, bool)>,
}

/// Whether a view commutes with a cast without changing how many values it converts.
fn keeps_count<D>(op: &Op<D>) -> bool {
    matches!(op, Op::Permute { .. } | Op::Reshape { .. })
}

/// The half value `n` widens, if `n` is a widening cast.
fn widened<D>(g: &Graph<D>, n: NodeId) -> Option<NodeId> {
    match (&g.nodes[n].kind, g.nodes[n].inputs.as_slice()) {
        (NodeKind::Op(Op::Cast { dtype: DType::F32 }), [x]) if g.nodes[*x].meta.dtype.is_half() => {
            Some(*x)
        }
        _ => None,
    }
}

/// The rewritten graph as it grows, with what each of its nodes stands for.
struct Rewrite<D> {
    g: Graph<D>,
    origin: Vec<(NodeId, bool)>,
}

impl<D: SymDim> Rewrite<D> {
    /// Adds `op` of `inputs`, made for original node `i`, computing its value or not.
    fn add(&mut self, op: Op<D>, inputs: &[NodeId], i: NodeId, value: bool) -> NodeId {
        let refs: Vec<&NodeId> = inputs.iter().collect();
        let n = self
            .g
            .apply(op, &refs)
            .expect("a cast moved across a view applies where the view did");
        self.origin.push((i, value));
        n
    }

    /// `cast(views(y))` as `views(cast(y))` for original node `i`, when `u` is a chain
    /// of permutes and reshapes over an f32 value `y` that is not itself a view: `y`
    /// narrowed to `dtype`, then the views re-applied in order. `None` when `u` is no
    /// such chain.
    fn narrowed_before_views(&mut self, i: NodeId, u: NodeId, dtype: DType) -> Option<NodeId> {
        let mut views = Vec::new();
        let mut at = u;
        while let NodeKind::Op(op) = &self.g.nodes[at].kind {
            if !keeps_count(op) {
                break;
            }
            views.push(op.clone());
            at = self.g.nodes[at].inputs[0];
        }
        let base_is_view = matches!(&self.g.nodes[at].kind, NodeKind::Op(op) if op.is_view());
        if views.is_empty() || base_is_view || self.g.nodes[at].meta.dtype != DType::F32 {
            return None;
        }
        let mut v = self.add(Op::Cast { dtype }, &[at], i, false);
        let last = views.len() - 1;
        for (k, op) in views.into_iter().rev().enumerate() {
            v = self.add(op, &[v], i, k == last);
        }
        Some(v)
    }
}

/// Moves the casts of `graph` across the permutes and reshapes around them (see the
/// module docs). `None` when there is nothing to move: the graph plans as it is.
/// `outputs` keep their nodes: an output is never replaced, so each keeps its buffer.
pub(crate) fn move_casts<D: SymDim>(graph: &Graph<D>, outputs: &[NodeId]) -> Option<Moved<D>> {
    let mixed = graph.nodes.iter().any(|n| match &n.kind {
        NodeKind::Op(Op::Cast { dtype }) => {
            dtype.is_half() || graph.nodes[n.inputs[0]].meta.dtype.is_half()
        }
        _ => false,
    });
    if !mixed {
        return None;
    }
    let mut r = Rewrite {
        g: Graph::new(),
        origin: Vec::with_capacity(graph.nodes.len()),
    };
    let mut new_id: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    // How many rewritten nodes precede each original node (where its guards run).
    let mut position = Vec::with_capacity(graph.nodes.len() + 1);
    let mut is_output = vec![false; graph.nodes.len()];
    for &o in outputs {
        is_output[o] = true;
    }
    let mut moved = false;
    for (i, node) in graph.nodes.iter().enumerate() {
        position.push(r.g.nodes.len());
        let inputs: Vec<NodeId> = node.inputs.iter().map(|&j| new_id[j]).collect();
        let replaceable = !is_output[i];
        let rewritten = match (&node.kind, inputs.as_slice()) {
            // view(cast_f32(x)) = cast_f32(view(x)).
            (NodeKind::Op(op), &[u]) if replaceable && keeps_count(op) => {
                widened(&r.g, u).map(|x| {
                    let v = r.add(op.clone(), &[x], i, false);
                    r.add(Op::Cast { dtype: DType::F32 }, &[v], i, true)
                })
            }
            (NodeKind::Op(Op::Cast { dtype }), &[u]) if replaceable && dtype.is_half() => {
                match widened(&r.g, u) {
                    // cast_half(cast_f32(x)) = x, for x of that half dtype.
                    Some(x) if r.g.nodes[x].meta.dtype == *dtype => Some(x),
                    Some(_) => None,
                    // cast_half(views(y)) = views(cast_half(y)).
                    None => r.narrowed_before_views(i, u, *dtype),
                }
            }
            _ => None,
        };
        let n = match rewritten {
            Some(n) => {
                moved = true;
                n
            }
            None => {
                let mut n = node.clone();
                n.inputs = inputs;
                r.g.nodes.push(n);
                r.origin.push((i, true));
                r.g.nodes.len() - 1
            }
        };
        new_id.push(n);
    }
    if !moved {
        return None;
    }
    position.push(r.g.nodes.len());
    r.g.guards = graph
        .guards
        .iter()
        .map(|k| KeptGuard {
            guard: k.guard.clone(),
            inputs: k.inputs.iter().map(|&i| new_id[i]).collect(),
            at: position[k.at],
        })
        .collect();
    Some(Moved {
        graph: r.g,
        new_id,
        origin: r.origin,
    })
}
