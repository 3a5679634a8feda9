//! The op IR: a graph of primitive ops over leaves, recorded by a `Builder`. The
//! `#[model]` macro records forward and backward graphs in it at build time (with
//! symbolic dims), and the fusion planner reads it; a run-time JIT records the same
//! graph with `usize` dims.

use crate::builder::Builder;
use crate::dtype::DType;
use crate::error::Result;
use crate::guard::Guard;
use crate::op::{Op, SymDim, TensorMeta};

/// The index of a node in its graph.
pub type NodeId = usize;

/// What a node computes.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind<D> {
    /// A value from outside the graph (an input, a parameter), by the caller's key.
    Leaf(usize),
    /// A primitive op of earlier nodes.
    Op(Op<D>),
    /// The rank-0 constant `1/n` for a dim `n` only known when the graph runs (the
    /// scale of a mean over a symbolic axis).
    RecipDim(D),
    /// A call out to part `k` of the model that the graph does not see (a module on the
    /// dynamic path): its input is `inputs[0]`, its result has the dims and dtype the
    /// call declared, checked when it runs.
    Call(usize),
    /// The gradient of call `k`'s input, from the gradient of its output (`inputs[0]`)
    /// and the call's node (`inputs[1]`): the part runs its own backward pass and keeps
    /// its parameters' gradients.
    CallGrad(usize),
}

/// One node: what it computes, from which nodes, with which dims and dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Node<D> {
    /// The computation.
    pub kind: NodeKind<D>,
    /// Input nodes (empty for leaves).
    pub inputs: Vec<NodeId>,
    /// Result dims and dtype.
    pub meta: TensorMeta<D>,
}

/// A guard the graph keeps because it depends on a size only the run time knows.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptGuard {
    /// The check.
    pub guard: Guard,
    /// The nodes it checks.
    pub inputs: Vec<NodeId>,
    /// How many nodes the graph had when the guard ran: it runs again before node
    /// `at`, so that checks and shape rules fail in the order they would eagerly.
    pub at: NodeId,
}

/// A graph of primitive ops in creation (and so topological) order, with the guards
/// that only the run time can decide.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph<D> {
    /// The nodes.
    pub nodes: Vec<Node<D>>,
    /// Guards to run again when the sizes are numbers.
    pub guards: Vec<KeptGuard>,
}

impl<D> Default for Graph<D> {
    fn default() -> Self {
        Graph {
            nodes: Vec::new(),
            guards: Vec::new(),
        }
    }
}

impl<D: SymDim> Graph<D> {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a leaf with the caller's `key`.
    pub fn leaf(&mut self, key: usize, dims: Vec<D>, dtype: DType) -> NodeId {
        self.nodes.push(Node {
            kind: NodeKind::Leaf(key),
            inputs: vec![],
            meta: TensorMeta::new(dims, dtype),
        });
        self.nodes.len() - 1
    }

    /// The nodes `outputs` depend on (themselves included), as a mask.
    pub fn live(&self, outputs: &[NodeId]) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        for &o in outputs {
            live[o] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for &j in &self.nodes[i].inputs {
                    live[j] = true;
                }
            }
        }
        live
    }

    /// Adds a call of part `part` on `input`, declared to return `dims` of `dtype`.
    pub fn call(&mut self, part: usize, input: NodeId, dims: Vec<D>, dtype: DType) -> NodeId {
        self.nodes.push(Node {
            kind: NodeKind::Call(part),
            inputs: vec![input],
            meta: TensorMeta::new(dims, dtype),
        });
        self.nodes.len() - 1
    }

    /// Adds the gradient of call node `call`'s input, given its output's gradient `grad`.
    pub fn call_grad(&mut self, call: NodeId, grad: NodeId) -> NodeId {
        let NodeKind::Call(part) = self.nodes[call].kind else {
            panic!("node {call} is not a call");
        };
        let meta = self.nodes[self.nodes[call].inputs[0]].meta.clone();
        self.nodes.push(Node {
            kind: NodeKind::CallGrad(part),
            inputs: vec![grad, call],
            meta,
        });
        self.nodes.len() - 1
    }

    /// How many live nodes use each node as an input.
    pub fn use_counts(&self, live: &[bool]) -> Vec<usize> {
        let mut uses = vec![0; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if live[i] {
                for &j in &n.inputs {
                    uses[j] += 1;
                }
            }
        }
        uses
    }
}

impl<D: SymDim> Builder for Graph<D> {
    type Dim = D;
    type Value = NodeId;

    fn apply(&mut self, op: Op<D>, inputs: &[&NodeId]) -> Result<NodeId> {
        let metas: Vec<&TensorMeta<D>> = inputs.iter().map(|&&i| &self.nodes[i].meta).collect();
        let meta = op.infer(&metas)?;
        self.nodes.push(Node {
            kind: NodeKind::Op(op),
            inputs: inputs.iter().map(|&&i| i).collect(),
            meta,
        });
        Ok(self.nodes.len() - 1)
    }

    fn meta(&self, v: &NodeId) -> TensorMeta<D> {
        self.nodes[*v].meta.clone()
    }

    fn producer(&self, v: &NodeId) -> Option<(Op<D>, Vec<NodeId>)> {
        match &self.nodes[*v].kind {
            NodeKind::Op(op) => Some((op.clone(), self.nodes[*v].inputs.clone())),
            _ => None,
        }
    }

    fn same_value(&self, a: &NodeId, b: &NodeId) -> bool {
        a == b
    }

    fn guard(&mut self, guard: Guard, inputs: &[&NodeId]) -> Result<()> {
        let metas: Vec<&TensorMeta<D>> = inputs.iter().map(|&&i| &self.nodes[i].meta).collect();
        guard.check(&metas)?;
        if guard.is_open(&metas) {
            self.guards.push(KeptGuard {
                guard,
                inputs: inputs.iter().map(|&&i| i).collect(),
                at: self.nodes.len(),
            });
        }
        Ok(())
    }

    fn recip_dim(&mut self, like: &NodeId, n: &D) -> Result<NodeId> {
        let dtype = self.nodes[*like].meta.dtype;
        if let Some(n) = n.as_lit() {
            return self.apply(Op::recip_count(n, dtype), &[]);
        }
        self.nodes.push(Node {
            kind: NodeKind::RecipDim(n.clone()),
            inputs: vec![],
            meta: TensorMeta::new(vec![], dtype),
        });
        Ok(self.nodes.len() - 1)
    }
}
