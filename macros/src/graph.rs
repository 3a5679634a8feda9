//! The macro's graph: `kiln_tensor::ir::Graph` over symbolic dims, plus what code
//! generation needs to know about it — what each leaf is (an input, a parameter, a
//! buffer), where each run-time size can be read, and readable names for nodes.

use kiln_fusion::SDim;
use kiln_tensor::ir::{Graph, NodeId};
use kiln_tensor::nn::ParamSpec;
use kiln_tensor::{Builder, DType, Op, Precision, Result, TensorMeta};
use proc_macro2::TokenStream;
use std::collections::HashMap;
use syn::Ident;

/// What a leaf of the graph stands for.
#[derive(Clone)]
pub enum Leaf {
    /// The method argument of this name.
    Input(Ident),
    /// A parameter `layer.field` (checkpoint name `key`).
    Param {
        /// The layer expression (`self.fc1`).
        layer: TokenStream,
        /// The parameter's field.
        field: Ident,
        /// The checkpoint name.
        key: String,
    },
    /// A buffer `layer.field` (read with `.get()`).
    Buffer {
        /// The layer expression.
        layer: TokenStream,
        /// The buffer's field.
        field: Ident,
    },
}

/// A buffer update produced by a training forward pass.
#[derive(Clone)]
pub struct Update {
    /// The layer expression.
    pub layer: TokenStream,
    /// The buffer's field.
    pub field: Ident,
    /// The node holding the new value.
    pub node: NodeId,
}

/// A call site of a dynamic part (`self.router.forward::<B, 64>(h)`): call `k` of
/// the graph is `parts[k]`.
#[derive(Clone)]
pub struct PartSite {
    /// The expression for the part (`self.router`).
    pub path: TokenStream,
    /// How messages name the call (`self.router.forward`).
    pub display: String,
    /// Its checkpoint prefix (`router`, `blocks.0.router`): where its gradients go.
    pub key: String,
}

/// The graph under construction.
#[derive(Default)]
pub struct MGraph {
    /// The dynamic parts called, in call order (a `Call` node's index).
    pub parts: Vec<PartSite>,
    /// The nodes.
    pub g: Graph<SDim>,
    /// Leaf keys index this.
    pub leaves: Vec<Leaf>,
    /// Readable names, where a `let` gave one.
    pub names: Vec<Option<String>>,
    /// The layer (its checkpoint prefix, `blocks.0.ln1`) whose call made each node, or
    /// whose node's gradient it is, where one did: what anomaly mode names.
    pub layers: Vec<Option<String>>,
    /// Buffer updates (training only).
    pub updates: Vec<Update>,
    /// Dropout layers seen so far (each gets its own seed offset).
    pub dropouts: u64,
    /// Parameter leaves by checkpoint name, so a reused layer shares its leaves.
    param_nodes: HashMap<String, NodeId>,
    /// The model's precision: which ops get their operands cast (see
    /// [`Precision::apply`]).
    pub precision: Precision,
}

impl MGraph {
    /// Gives nodes added since the last call a (still empty) name and layer slot.
    fn grow_names(&mut self) {
        self.names.resize(self.g.nodes.len(), None);
        self.layers.resize(self.g.nodes.len(), None);
    }

    /// Puts the nodes from `first` on that have no layer yet in layer `key`.
    pub fn in_layer(&mut self, first: NodeId, key: &str) {
        self.grow_names();
        for layer in self.layers.iter_mut().skip(first) {
            layer.get_or_insert_with(|| key.to_string());
        }
    }

    /// Adds an input leaf.
    pub fn input(&mut self, name: Ident, dims: Vec<SDim>, dtype: DType) -> NodeId {
        self.leaves.push(Leaf::Input(name.clone()));
        let n = self.g.leaf(self.leaves.len() - 1, dims, dtype);
        self.grow_names();
        self.names[n] = Some(name.to_string());
        n
    }

    /// The leaf of a parameter or buffer of `layer` (shared when seen before).
    pub fn param(
        &mut self,
        layer: &TokenStream,
        layer_key: &str,
        spec: &ParamSpec,
        buffer: bool,
    ) -> NodeId {
        let key = kiln_tensor::nn::join(layer_key, spec.name);
        self.leaf_of(layer, key, spec, buffer)
    }

    /// Whether the parameter of checkpoint name `key` has a leaf already.
    pub fn has_param(&self, key: &str) -> bool {
        self.param_nodes.contains_key(key)
    }

    /// The leaf of the learned tensor (`Param`) at `layer`: its checkpoint name is the
    /// field's own.
    pub fn learned(&mut self, layer: &TokenStream, key: &str, dims: &[usize]) -> NodeId {
        let spec = kiln_tensor::nn::learned_spec(dims);
        self.leaf_of(layer, key.to_string(), &spec, false)
    }

    fn leaf_of(
        &mut self,
        layer: &TokenStream,
        key: String,
        spec: &ParamSpec,
        buffer: bool,
    ) -> NodeId {
        if let Some(&n) = self.param_nodes.get(&key) {
            return n;
        }
        let field = quote::format_ident!("{}", spec.name);
        self.leaves.push(if buffer {
            Leaf::Buffer {
                layer: layer.clone(),
                field,
            }
        } else {
            Leaf::Param {
                layer: layer.clone(),
                field,
                key: key.clone(),
            }
        });
        let dims = spec
            .dims
            .iter()
            .map(|&d| kiln_tensor::SymDim::lit(d))
            .collect();
        let n = self.g.leaf(self.leaves.len() - 1, dims, spec.dtype);
        self.grow_names();
        self.names[n] = Some(key.replace('.', "_"));
        self.param_nodes.insert(key, n);
        n
    }

    /// A call of the dynamic part `site` on `input`, declared to return `dims` of
    /// `dtype`.
    pub fn call(&mut self, site: PartSite, input: NodeId, dims: Vec<SDim>, dtype: DType) -> NodeId {
        self.parts.push(site);
        let n = self.g.call(self.parts.len() - 1, input, dims, dtype);
        self.grow_names();
        n
    }

    /// The gradient of call node `call`'s input, from its output's gradient `grad`.
    pub fn call_grad(&mut self, call: NodeId, grad: NodeId) -> NodeId {
        let n = self.g.call_grad(call, grad);
        self.grow_names();
        n
    }

    /// Names a node (the first name wins).
    pub fn name(&mut self, node: NodeId, name: &str) {
        if self.names[node].is_none() {
            self.names[node] = Some(name.to_string());
        }
    }
}

impl MGraph {
    /// An empty graph whose ops follow `precision`.
    pub fn new(precision: Precision) -> Self {
        MGraph {
            precision,
            ..MGraph::default()
        }
    }

    /// Appends one op as it is (the precision policy is applied around it by
    /// [`Builder::apply`]).
    fn add_op(&mut self, op: Op<SDim>, inputs: &[&NodeId]) -> Result<NodeId> {
        let name = op.name();
        let n = self.g.apply(op, inputs)?;
        // Dims are at most 2^40, but their products can still pass what any memory
        // holds (and what a usize counts): refuse rather than wrap.
        let dims = self.g.nodes[n].meta.dims.clone();
        let count = dims.iter().try_fold(1usize, |acc, d| {
            let largest = d.terms().iter().map(|(c, _)| *c).max().unwrap_or(1);
            acc.checked_mul(largest.max(1))
        });
        if count.is_none_or(|c| c > 1 << 50) {
            self.g.nodes.pop();
            return Err(kiln_tensor::Error::shape(
                name,
                format!(
                    "the result {} would hold more than 2^50 elements",
                    kiln_tensor::op::fmt_dims(&dims)
                ),
            ));
        }
        self.grow_names();
        Ok(n)
    }
}

impl Builder for MGraph {
    type Dim = SDim;
    type Value = NodeId;

    fn apply(&mut self, op: Op<SDim>, inputs: &[&NodeId]) -> Result<NodeId> {
        self.precision.apply(self, op, inputs, MGraph::add_op)
    }

    fn meta(&self, v: &NodeId) -> TensorMeta<SDim> {
        self.g.meta(v)
    }

    fn guard(&mut self, guard: kiln_tensor::Guard, inputs: &[&NodeId]) -> Result<()> {
        self.g.guard(guard, inputs)
    }

    fn producer(&self, v: &NodeId) -> Option<(Op<SDim>, Vec<NodeId>)> {
        self.g.producer(v)
    }

    fn same_value(&self, a: &NodeId, b: &NodeId) -> bool {
        a == b
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn recip_dim(&mut self, like: &NodeId, n: &SDim) -> Result<NodeId> {
        let r = self.g.recip_dim(like, n)?;
        self.grow_names();
        Ok(r)
    }
}
