//! The fusion planner: groups the nodes of an op graph into kernels and assigns the
//! values that kernels write to reusable buffer slots. The result, a `Plan`, is plain
//! data: the `#[model]` macro builds it at build time (symbolic dims) and embeds its
//! text form; a run-time JIT can build the same thing from a graph with `usize` dims.
//!
//! Before grouping, mixed precision's casts are moved across the permutes and reshapes
//! around them (`casts`): widening casts after them, narrowing casts before them, and a
//! narrowing of a widened value dropped, so that casts fuse into the groups beside them.
//!
//! Grouping rules (all decided on the graph alone):
//! - **Elementwise groups** are trees: an elementwise node joins its consumer's group
//!   when it has exactly one consumer, that consumer is elementwise, and both have the
//!   same dims (a broadcast operand is read from memory, not recomputed). Rank-0
//!   constants are inlined into every group that uses them, and so are cheap values
//!   that several groups read (a dropout mask that the forward and the backward pass
//!   both read is recomputed from its draws in each, GELU's pieces in its gradient):
//!   they are recomputed, never stored. Only f32 (and bool values that stay inside a
//!   group) fuse; other dtypes run op by op, except the casts of
//!   mixed precision: a cast from bf16 or f16 to f32 reads its half input at a group's
//!   edge (widening is exact), and a cast from f32 to bf16 or f16 is always its group's
//!   root (the narrowing happens as the result is stored, so no half value is ever
//!   computed with inside a group). Such groups are never a product's epilogue or a
//!   reduction's prologue.
//! - **Reductions** take an elementwise group as a *prologue* when the group's root
//!   feeds only the reduction, and an elementwise group as an *epilogue* when the
//!   reduction feeds only that group and the group runs over the reduced shape.
//! - **Matrix products** (float and int8 alike) take an elementwise *epilogue* over
//!   their output (bias, activation) on the same condition.
//! - **Views** (permute, expand, slice, reshape) are not kernels: they re-read their
//!   input's buffer with another layout (a reshape of a layout that cannot be viewed
//!   copies into its own slot).
//! - **One-pass groups**: ops that one kernel pass computes together over the same
//!   values (`kiln_tensor::attention::one_pass`: an attention and its row statistics,
//!   an attention's gradients) are one kernel, run where the first of them is.
//! - **Convolution columns** (`crate::windows`): an unfold that only products read
//!   (through reshapes and permutes) is computed inside each of those products'
//!   kernels, and a fold of a product's result inside the product's kernel, so the
//!   columns between them are never stored.
//! - Everything else runs as a single-op kernel.
//! - **Row passes**: consecutive kernels over the same rows (a layer norm's reductions
//!   and normalisation) are marked to run as one pass over blocks of rows (`rows.rs`);
//!   each keeps its own expression and output.

use kiln_tensor::ir::{Graph, KeptGuard, Node, NodeId, NodeKind};
use kiln_tensor::{Builder, DType, Op, OpClass, SymDim};
use std::collections::HashMap;

/// What a kernel does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A fused group of elementwise ops.
    Elementwise,
    /// A reduction, with an optional elementwise prologue and epilogue.
    Reduce,
    /// A matrix product (float or int8), with an optional elementwise epilogue.
    MatMul,
    /// One primitive op, unfused.
    Single,
    /// A layout change of a buffer (copies only when a reshape needs to).
    View,
    /// A call out to a part of the model the plan does not see, or its gradient.
    Call,
    /// Ops that one pass computes together (an attention and its statistics, an
    /// attention's gradients), each written to its own buffer.
    OnePass,
}

impl KernelKind {
    /// The kind's name in plan text.
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Elementwise => "elementwise",
            KernelKind::Reduce => "reduce",
            KernelKind::MatMul => "matmul",
            KernelKind::Single => "single",
            KernelKind::View => "view",
            KernelKind::Call => "call",
            KernelKind::OnePass => "one_pass",
        }
    }

    /// The kind named `s`.
    pub fn from_name(s: &str) -> Option<Self> {
        [
            KernelKind::Elementwise,
            KernelKind::Reduce,
            KernelKind::MatMul,
            KernelKind::Single,
            KernelKind::View,
            KernelKind::Call,
            KernelKind::OnePass,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// One kernel of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// What it does.
    pub kind: KernelKind,
    /// The nodes it computes, in order (for `Reduce`/`MatMul`, the prologue, the main
    /// node, then the epilogue).
    pub nodes: Vec<NodeId>,
    /// The node of the reduction or product (`None` for other kinds).
    pub main: Option<NodeId>,
    /// Nodes computed elsewhere that it reads.
    pub inputs: Vec<NodeId>,
    /// The nodes it writes to memory.
    pub outputs: Vec<NodeId>,
    /// The row pass it belongs to, if any (`crate::rows`): the kernels of one pass
    /// are consecutive and may run as one pass over blocks of rows.
    pub row_pass: Option<usize>,
}

/// A graph, its kernels in execution order, and where their outputs live.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<D> {
    /// The op graph (only the nodes the outputs need).
    pub graph: Graph<D>,
    /// The leaf nodes, in the order inputs are passed when the plan runs.
    pub inputs: Vec<NodeId>,
    /// The nodes the plan returns.
    pub outputs: Vec<NodeId>,
    /// The kernels, in execution order.
    pub kernels: Vec<Kernel>,
    /// For each node, the buffer slot it is written to (`None`: computed inside a
    /// kernel, a leaf, or a view of another node's buffer).
    pub slot_of: Vec<Option<usize>>,
    /// The dtype of each slot.
    pub slots: Vec<DType>,
    /// For run-time sizes (`Dyn` dims): atom id, and the node and axis to read it from.
    pub atoms: Vec<(u32, NodeId, usize)>,
    /// Readable names of nodes, where the source gave one (`h`, `fc1.weight`).
    pub names: Vec<Option<String>>,
    /// The layer each node belongs to (`blocks.0.ln1`), where the source said.
    pub layers: Vec<Option<String>>,
}

/// Whether an op's result can be part of an elementwise group.
fn fusable_elementwise<D: SymDim>(g: &Graph<D>, n: NodeId) -> bool {
    let node = &g.nodes[n];
    let NodeKind::Op(op) = &node.kind else {
        return false;
    };
    if op.class() != OpClass::Elementwise {
        return false;
    }
    if let (Op::Cast { dtype }, [x]) = (op, node.inputs.as_slice()) {
        let from = g.nodes[*x].meta.dtype;
        if (from == DType::F32 && dtype.is_half()) || (from.is_half() && *dtype == DType::F32) {
            return true;
        }
    }
    let ok = |d: DType| d == DType::F32 || d == DType::Bool;
    ok(node.meta.dtype) && node.inputs.iter().all(|&i| ok(g.nodes[i].meta.dtype))
}

/// Whether a node is a rank-0 constant that groups inline.
fn inline_constant<D: SymDim>(g: &Graph<D>, n: NodeId) -> bool {
    match &g.nodes[n].kind {
        NodeKind::Op(Op::Full { dims, dtype, .. }) => {
            dims.is_empty() && (*dtype == DType::F32 || *dtype == DType::Bool)
        }
        NodeKind::RecipDim(_) => g.nodes[n].meta.dtype == DType::F32,
        _ => false,
    }
}

/// The most ops a value that groups recompute may cost (with the recomputed values it
/// reads): recomputing costs arithmetic in each reader, storing costs a kernel and a
/// buffer written and read again.
const RECOMPUTE_LIMIT: usize = 16;

/// The elementwise values that groups recompute where they read them, as they do
/// rank-0 constants, instead of storing them: f32 or bool values (a widening cast of a
/// half value among them: its readers load the half value), not outputs, that more
/// than one group reads (a dropout mask the forward and the backward pass both
/// read, the pieces of GELU its gradient reads again), each reader of their dims, and
/// the values only such a value reads. A value costing more than [`RECOMPUTE_LIMIT`] ops
/// is stored.
fn recomputed_values<D: SymDim>(
    g: &Graph<D>,
    fusable: &[bool],
    consumers: &[Vec<NodeId>],
    outputs: &[NodeId],
) -> Vec<bool> {
    let n = g.nodes.len();
    let candidate = |i: NodeId| {
        let node = &g.nodes[i];
        // A widening cast is a load of its half input, so readers repeat it; other
        // casts are stored (a narrowing cast roots its group).
        let cast_ok = match (&node.kind, node.inputs.as_slice()) {
            (NodeKind::Op(Op::Cast { dtype }), [x]) => {
                *dtype == DType::F32 && g.nodes[*x].meta.dtype.is_half()
            }
            _ => true,
        };
        fusable[i]
            && !outputs.contains(&i)
            && cast_ok
            && matches!(node.meta.dtype, DType::F32 | DType::Bool)
            && !consumers[i].is_empty()
            && consumers[i]
                .iter()
                .all(|&c| fusable[c] && g.nodes[c].meta.dims == node.meta.dims)
    };
    // Readers first: a value whose only reader is recomputed is part of it.
    let mut recomputed = vec![false; n];
    for i in (0..n).rev() {
        if candidate(i) {
            recomputed[i] = match consumers[i].as_slice() {
                [c] => recomputed[*c],
                _ => true,
            };
        }
    }
    let mut cost = vec![0usize; n];
    for i in 0..n {
        if !recomputed[i] {
            continue;
        }
        let inputs = &g.nodes[i].inputs;
        let c = 1 + inputs
            .iter()
            .filter(|&&j| recomputed[j])
            .map(|&j| cost[j])
            .sum::<usize>();
        if c > RECOMPUTE_LIMIT {
            recomputed[i] = false;
        } else {
            cost[i] = c;
        }
    }
    recomputed
}

/// The kept ops by their first input and name, so that an op computing what an
/// earlier one computes (the same op of the same inputs, dims and dtype: the layer
/// norm's output cast to bf16 once for each of the three projections reading it) is
/// planned once.
#[derive(Default)]
struct Repeats {
    by_key: HashMap<(Option<NodeId>, &'static str), Vec<NodeId>>,
}

impl Repeats {
    /// The key of `n`, an op whose value depends on its inputs alone; `None` for
    /// leaves, calls and draws (each draw is its own).
    fn key<D>(n: &Node<D>) -> Option<(Option<NodeId>, &'static str)> {
        match &n.kind {
            NodeKind::Op(op) if op.seed().is_none() => Some((n.inputs.first().copied(), op.name())),
            _ => None,
        }
    }

    /// The kept node `n` repeats, if any. An output is never folded into another: the
    /// plan hands each output its own buffer.
    fn earlier<D: SymDim>(&self, g: &Graph<D>, n: &Node<D>, output: bool) -> Option<NodeId> {
        if output {
            return None;
        }
        let key = Self::key(n)?;
        self.by_key
            .get(&key)?
            .iter()
            .copied()
            .find(|&m| g.nodes[m] == *n)
    }

    /// Notes kept node `id`, `n`.
    fn note<D>(&mut self, n: &Node<D>, id: NodeId) {
        if let Some(key) = Self::key(n) {
            self.by_key.entry(key).or_default().push(id);
        }
    }
}

fn is_view<D>(op: &Op<D>) -> bool {
    op.is_view()
}

/// Whether a value-and-gradient entry among `plans` (`(method, plan text)`, as a
/// `#[model]`'s `fusion_plans()` lists them) draws random values: a training step with
/// dropout, whose seed a replayed step must read from device memory.
pub fn training_draws(plans: &[(&str, &str)]) -> bool {
    plans
        .iter()
        .filter(|(name, _)| name.ends_with("_and_grad"))
        .any(|(_, text)| {
            Plan::<crate::SDim>::parse(text).is_ok_and(|plan| {
                plan.graph
                    .nodes
                    .iter()
                    .any(|n| matches!(&n.kind, NodeKind::Op(op) if op.seed().is_some()))
            })
        })
}

/// Plans `graph` for computing `outputs` from the leaves `inputs` (in run order).
pub fn plan<D: SymDim + 'static>(
    graph: &Graph<D>,
    inputs: &[NodeId],
    outputs: &[NodeId],
) -> Plan<D> {
    plan_named(graph, inputs, outputs, &[], &[])
}

/// `plan`, keeping readable node names (`names[i]` for node `i` of `graph`) and the
/// layers nodes belong to (`layers[i]`).
pub fn plan_named<D: SymDim + 'static>(
    graph: &Graph<D>,
    inputs: &[NodeId],
    outputs: &[NodeId],
    names: &[Option<String>],
    layers: &[Option<String>],
) -> Plan<D> {
    let Some(moved) = crate::casts::move_casts(graph, outputs) else {
        return plan_graph(graph, inputs, outputs, names, layers);
    };
    let at = |v: &[Option<String>], i: NodeId| v.get(i).cloned().flatten();
    let names: Vec<Option<String>> = (moved.origin.iter())
        .map(|&(i, value)| if value { at(names, i) } else { None })
        .collect();
    let layers: Vec<Option<String>> = (moved.origin.iter()).map(|&(i, _)| at(layers, i)).collect();
    let inputs: Vec<NodeId> = inputs.iter().map(|&i| moved.new_id[i]).collect();
    let outputs: Vec<NodeId> = outputs.iter().map(|&i| moved.new_id[i]).collect();
    plan_graph(&moved.graph, &inputs, &outputs, &names, &layers)
}

/// [`plan_named`] once the casts have been moved across views.
fn plan_graph<D: SymDim + 'static>(
    graph: &Graph<D>,
    inputs: &[NodeId],
    outputs: &[NodeId],
    names: &[Option<String>],
    layers: &[Option<String>],
) -> Plan<D> {
    // Keep only what the outputs need, renumbered in order.
    let live = graph.live(outputs);
    let transposed = transposed_products(graph, &live, outputs);
    let mut new_id = vec![usize::MAX; graph.nodes.len()];
    let mut g = Graph::<D>::new();
    let mut kept_names = Vec::new();
    let mut kept_layers = Vec::new();
    let layer = |i: usize| layers.get(i).cloned().flatten();
    // How many kept nodes precede each original node (where its guards run again).
    let mut position = vec![0; graph.nodes.len() + 1];
    let mut repeats = Repeats::default();
    for (i, n) in graph.nodes.iter().enumerate() {
        position[i] = g.nodes.len();
        if let Some(t) = transposed.iter().find(|t| t.permute == i) {
            // Already computed in its transposed form, at the product's position.
            let last = new_id[*t.through.last().unwrap_or(&t.product)];
            new_id[i] = last;
            kept_names[last] = names.get(i).cloned().flatten();
            kept_layers[last] = layer(i);
            continue;
        }
        if transposed.iter().any(|t| t.product == i) {
            // (a·b)ᵀ = bᵀ·aᵀ: the permutes are views, the product writes the
            // transposed result contiguously (weight gradients in PyTorch's layout,
            // which optimizers then read in order).
            let swap = Op::Permute { perm: vec![1, 0] };
            let (a, b) = (new_id[n.inputs[0]], new_id[n.inputs[1]]);
            let bt = g.apply(swap.clone(), &[&b]).expect("a rank-2 permute");
            let at = g.apply(swap, &[&a]).expect("a rank-2 permute");
            kept_names.extend([None, None]);
            kept_layers.extend([layer(i), layer(i)]);
            new_id[i] = g
                .apply(Op::MatMul, &[&bt, &at])
                .expect("the transposed product is valid");
            kept_names.push(names.get(i).cloned().flatten());
            kept_layers.push(layer(i));
            continue;
        }
        if transposed.iter().any(|t| t.through.contains(&i)) {
            // An element-wise op between the product and its transpose (a mixed
            // precision product's widening cast) commutes with the transpose: it is
            // applied to the transposed value.
            let NodeKind::Op(op) = &n.kind else {
                unreachable!("only ops are chained through")
            };
            new_id[i] = g
                .apply(op.clone(), &[&new_id[n.inputs[0]]])
                .expect("an element-wise op of the transposed value is valid");
            kept_names.push(names.get(i).cloned().flatten());
            kept_layers.push(layer(i));
            continue;
        }
        if live[i] || inputs.contains(&i) {
            let mut n = n.clone();
            n.inputs = n.inputs.iter().map(|&j| new_id[j]).collect();
            if let Some(same) = repeats.earlier(&g, &n, outputs.contains(&i)) {
                new_id[i] = same;
                continue;
            }
            new_id[i] = g.nodes.len();
            repeats.note(&n, new_id[i]);
            kept_names.push(names.get(i).cloned().flatten());
            kept_layers.push(layer(i));
            g.nodes.push(n);
        }
    }
    position[graph.nodes.len()] = g.nodes.len();
    // A guard of values the outputs do not need guards nothing the plan computes.
    g.guards = graph
        .guards
        .iter()
        .filter(|k| k.inputs.iter().all(|&i| new_id[i] != usize::MAX))
        .map(|k| KeptGuard {
            guard: k.guard.clone(),
            inputs: k.inputs.iter().map(|&i| new_id[i]).collect(),
            at: position[k.at],
        })
        .collect();
    let inputs: Vec<NodeId> = inputs.iter().map(|&i| new_id[i]).collect();
    let outputs: Vec<NodeId> = outputs.iter().map(|&i| new_id[i]).collect();
    let n = g.nodes.len();

    let mut consumers: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    for (i, node) in g.nodes.iter().enumerate() {
        for &j in &node.inputs {
            if !consumers[j].contains(&i) {
                consumers[j].push(i);
            }
        }
    }
    let is_output = |i: NodeId| outputs.contains(&i);

    // Fused kernels read and write f32 only: a bool that would leave its group (a
    // dropout mask the backward pass reads again) runs as its own op, and so do the ops
    // that read it. Blocking a reader can make another bool leave its group, hence the
    // loop.
    let mut fusable: Vec<bool> = (0..n).map(|i| fusable_elementwise(&g, i)).collect();
    // Values recomputed in each group that reads them are not group members.
    let mut recomputed = recomputed_values(&g, &fusable, &consumers, &outputs);
    for i in 0..n {
        fusable[i] &= !recomputed[i];
    }
    loop {
        let mut changed = false;
        // A recomputed value that a kernel reads from memory (one that stopped fusing)
        // is stored after all, by a group of its own.
        for i in 0..n {
            if recomputed[i] && consumers[i].iter().any(|&c| !fusable[c] && !recomputed[c]) {
                recomputed[i] = false;
                fusable[i] = true;
                changed = true;
            }
        }
        for i in 0..n {
            if !fusable[i] || g.nodes[i].meta.dtype != DType::Bool {
                continue;
            }
            let stays = match consumers[i].as_slice() {
                [c] => {
                    !is_output(i) && fusable[*c] && g.nodes[*c].meta.dims == g.nodes[i].meta.dims
                }
                _ => false,
            };
            if !stays {
                fusable[i] = false;
                for &c in &consumers[i] {
                    fusable[c] = false;
                }
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }

    // Elementwise trees, built from the roots down (reverse order).
    let mut group: Vec<Option<usize>> = vec![None; n];
    let mut groups: Vec<Vec<NodeId>> = Vec::new();
    for i in (0..n).rev() {
        if !fusable[i] {
            continue;
        }
        let joined = match consumers[i].as_slice() {
            // A half value is stored by the group that narrows it, never computed with.
            [c] if !is_output(i)
                && fusable[*c]
                && !g.nodes[i].meta.dtype.is_half()
                && g.nodes[*c].meta.dims == g.nodes[i].meta.dims =>
            {
                group[*c]
            }
            _ => None,
        };
        let gi = joined.unwrap_or_else(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        group[i] = Some(gi);
        groups[gi].push(i);
    }
    for grp in groups.iter_mut() {
        grp.sort_unstable();
    }
    let root = |gi: usize| *groups[gi].last().expect("groups are not empty");
    // Groups that read or write a half value: the products' and reductions' kernels
    // take f32 prologues and epilogues only.
    // A recomputed widening cast, which the group computes inline, reads a half value
    // too.
    let mut reads_half = vec![false; n];
    for i in 0..n {
        let node = &g.nodes[i];
        reads_half[i] = node.meta.dtype.is_half()
            || (node.inputs.iter())
                .any(|&j| g.nodes[j].meta.dtype.is_half() || (recomputed[j] && reads_half[j]));
    }
    let half_edges: Vec<bool> = groups
        .iter()
        .map(|grp| grp.iter().any(|&i| reads_half[i]))
        .collect();

    // Which group becomes a prologue or an epilogue of which reduction / product.
    let mut prologue_of: HashMap<NodeId, usize> = HashMap::new();
    let mut epilogue_of: HashMap<NodeId, usize> = HashMap::new();
    let mut absorbed = vec![false; groups.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        let main = matches!(op, Op::Reduce { .. }) || op.class() == OpClass::Contraction;
        if !main || node.meta.dtype != DType::F32 {
            continue;
        }
        if matches!(op, Op::Reduce { .. }) {
            let x = node.inputs[0];
            if let Some(gi) = group[x] {
                if root(gi) == x
                    && consumers[x] == [i]
                    && !is_output(x)
                    && !absorbed[gi]
                    && !half_edges[gi]
                {
                    prologue_of.insert(i, gi);
                    absorbed[gi] = true;
                }
            }
        }
        if let [c] = consumers[i].as_slice() {
            if let Some(gi) = group[*c] {
                let domain = &g.nodes[root(gi)].meta.dims;
                if !is_output(i) && !absorbed[gi] && !half_edges[gi] && *domain == node.meta.dims {
                    epilogue_of.insert(i, gi);
                    absorbed[gi] = true;
                }
            }
        }
    }

    // Convolution columns never stored (`crate::windows`): unfolds that only products
    // read go into those products' kernels, and folds of products into theirs.
    let reads = crate::windows::window_reads(&g, &consumers, is_output);
    let folds = crate::windows::fold_writes(&g, &consumers, is_output, |p| {
        epilogue_of.contains_key(&p) || reads.contains_key(&p)
    });
    let mut in_product = vec![false; n];
    for r in reads.values() {
        in_product[r.unfold] = true;
        r.views.iter().for_each(|&v| in_product[v] = true);
    }
    for f in folds.values() {
        f.views.iter().for_each(|&v| in_product[v] = true);
        in_product[f.fold] = true;
    }

    // Assemble kernels; the order of their last node is a valid execution order.
    let mut kernels: Vec<Kernel> = Vec::new();
    for (gi, nodes) in groups.iter().enumerate() {
        if absorbed[gi] {
            continue;
        }
        kernels.push(Kernel {
            kind: KernelKind::Elementwise,
            nodes: nodes.clone(),
            main: None,
            inputs: vec![],
            outputs: vec![root(gi)],
            row_pass: None,
        });
    }
    for (i, node) in g.nodes.iter().enumerate() {
        if group[i].is_some() || in_product[i] {
            continue;
        }
        let kind = match &node.kind {
            NodeKind::Leaf(_) => continue,
            // A constant only elementwise groups read is inlined into them instead, as
            // is every recomputed value (all its readers are in groups or recomputed).
            _ if inline_constant(&g, i)
                && !is_output(i)
                && consumers[i]
                    .iter()
                    .all(|&c| group[c].is_some() || recomputed[c]) =>
            {
                continue
            }
            _ if recomputed[i] => continue,
            NodeKind::RecipDim(_) => KernelKind::Single,
            NodeKind::Call(_) | NodeKind::CallGrad(_) => KernelKind::Call,
            NodeKind::Op(op) if is_view(op) => KernelKind::View,
            NodeKind::Op(Op::Reduce { .. }) if node.meta.dtype == DType::F32 => KernelKind::Reduce,
            NodeKind::Op(op) if op.class() == OpClass::Contraction => KernelKind::MatMul,
            NodeKind::Op(_) => KernelKind::Single,
        };
        let mut nodes = Vec::new();
        if let Some(&gi) = prologue_of.get(&i) {
            nodes.extend(groups[gi].iter().copied());
        }
        if let Some(r) = reads.get(&i) {
            nodes.push(r.unfold);
            nodes.extend(&r.views);
        }
        nodes.push(i);
        let mut out = i;
        if let Some(&gi) = epilogue_of.get(&i) {
            nodes.extend(groups[gi].iter().copied());
            out = root(gi);
        }
        if let Some(f) = folds.get(&i) {
            nodes.extend(&f.views);
            nodes.push(f.fold);
            out = f.fold;
        }
        let main = matches!(kind, KernelKind::Reduce | KernelKind::MatMul).then_some(i);
        kernels.push(Kernel {
            kind,
            nodes,
            main,
            inputs: vec![],
            outputs: vec![out],
            row_pass: None,
        });
    }
    merge_one_pass(&g, &mut kernels);
    // Group members compute rank-0 constants and recomputed values (and what those
    // read that is not in memory) inline, rather than reading them.
    for k in kernels.iter_mut() {
        let mut extra: Vec<NodeId> = Vec::new();
        let mut readers: Vec<NodeId> = k
            .nodes
            .iter()
            .copied()
            .filter(|&m| group[m].is_some())
            .collect();
        while let Some(m) = readers.pop() {
            for &j in &g.nodes[m].inputs {
                let inlined = inline_constant(&g, j) || recomputed[j];
                if inlined && !k.nodes.contains(&j) && !extra.contains(&j) {
                    extra.push(j);
                    readers.push(j);
                }
            }
        }
        k.nodes.extend(extra);
        k.nodes.sort_unstable();
    }
    for k in kernels.iter_mut() {
        let mut ins = Vec::new();
        for &m in &k.nodes {
            for &j in &g.nodes[m].inputs {
                if !k.nodes.contains(&j) && !ins.contains(&j) {
                    ins.push(j);
                }
            }
        }
        ins.sort_unstable();
        k.inputs = ins;
    }
    // A kernel runs where its last node is; a one-pass group where its first op is
    // (every member reads only values from before it).
    kernels.sort_by_key(|k| match k.kind {
        KernelKind::OnePass => k.nodes[0],
        _ => *k.nodes.iter().max().expect("kernels have nodes"),
    });

    crate::rows::mark_row_passes(&g, &mut kernels);
    let (slot_of, slots) = assign_slots(&g, &kernels, &outputs);
    let atoms = find_atoms(&g);
    Plan {
        graph: g,
        inputs,
        outputs,
        kernels,
        slot_of,
        slots,
        atoms,
        names: kept_names,
        layers: kept_layers,
    }
}

/// Merges the single-op kernels of ops that one pass computes together
/// ([`kiln_tensor::attention::one_pass`]) into one kernel: each member reads the first
/// of the first member's inputs, and the members are in node order.
fn merge_one_pass<D: SymDim>(g: &Graph<D>, kernels: &mut Vec<Kernel>) {
    let single = |k: &Kernel| match (k.kind, k.nodes.as_slice()) {
        (KernelKind::Single, &[n]) => match &g.nodes[n].kind {
            NodeKind::Op(
                op @ (Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. }),
            ) => Some((n, op)),
            _ => None,
        },
        _ => None,
    };
    let mut candidates: Vec<(NodeId, &Op<D>, usize)> = kernels
        .iter()
        .enumerate()
        .filter_map(|(ki, k)| single(k).map(|(n, op)| (n, op, ki)))
        .collect();
    candidates.sort_unstable_by_key(|c| c.0);
    let mut taken = vec![false; candidates.len()];
    let mut merged: Vec<Kernel> = Vec::new();
    let mut gone = vec![false; kernels.len()];
    for a in 0..candidates.len() {
        if taken[a] {
            continue;
        }
        let reads = &g.nodes[candidates[a].0].inputs;
        let mut members = vec![a];
        for b in a + 1..candidates.len() {
            let theirs = &g.nodes[candidates[b].0].inputs;
            if taken[b] || !reads.starts_with(theirs) {
                continue;
            }
            let mut ops: Vec<&Op<D>> = members.iter().map(|&m| candidates[m].1).collect();
            ops.push(candidates[b].1);
            if kiln_tensor::attention::one_pass(&ops) {
                members.push(b);
            }
        }
        if members.len() < 2 {
            continue;
        }
        let nodes: Vec<NodeId> = members.iter().map(|&m| candidates[m].0).collect();
        for &m in &members {
            taken[m] = true;
            gone[candidates[m].2] = true;
        }
        merged.push(Kernel {
            kind: KernelKind::OnePass,
            nodes: nodes.clone(),
            main: None,
            inputs: vec![],
            outputs: nodes,
            row_pass: None,
        });
    }
    let mut ki = 0;
    kernels.retain(|_| {
        ki += 1;
        !gone[ki - 1]
    });
    kernels.extend(merged);
}

/// A rank-2 product reaching a transpose `[1, 0]` through a chain of element-wise
/// unary ops (casts), each the only use of the one before and none an output: planned
/// as the transposed product, so the transpose costs nothing.
struct TransposedProduct {
    product: NodeId,
    /// The element-wise ops between the product and the transpose, in order.
    through: Vec<NodeId>,
    permute: NodeId,
}

/// The products that are planned transposed ([`TransposedProduct`]).
fn transposed_products<D: SymDim>(
    g: &Graph<D>,
    live: &[bool],
    outputs: &[NodeId],
) -> Vec<TransposedProduct> {
    let mut uses = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if live[i] {
            for &j in &n.inputs {
                uses[j].push(i);
            }
        }
    }
    let only_use = |n: NodeId| match uses[n].as_slice() {
        [u] if !outputs.contains(&n) => Some(*u),
        _ => None,
    };
    let mut out = Vec::new();
    for (m, node) in g.nodes.iter().enumerate() {
        let product =
            live[m] && matches!(node.kind, NodeKind::Op(Op::MatMul)) && node.meta.dims.len() == 2;
        if !product {
            continue;
        }
        let mut through = Vec::new();
        let mut at = m;
        while let Some(next) = only_use(at) {
            match &g.nodes[next].kind {
                NodeKind::Op(Op::Permute { perm }) if perm == &[1, 0] => {
                    out.push(TransposedProduct {
                        product: m,
                        through,
                        permute: next,
                    });
                    break;
                }
                NodeKind::Op(Op::Cast { .. } | Op::Unary(_)) => {
                    through.push(next);
                    at = next;
                }
                _ => break,
            }
        }
    }
    out
}

/// The slot-holding nodes whose buffers node `n` may read (itself, or through views
/// the node it views).
fn buffer_roots<D: SymDim>(g: &Graph<D>, has_slot: &[bool], n: NodeId, out: &mut Vec<NodeId>) {
    if has_slot[n] {
        out.push(n);
    }
    if let NodeKind::Op(op) = &g.nodes[n].kind {
        if op.is_view() {
            buffer_roots(g, has_slot, g.nodes[n].inputs[0], out);
        }
    }
}

/// Assigns every value a kernel writes to a slot, reusing slots whose values are dead.
fn assign_slots<D: SymDim>(
    g: &Graph<D>,
    kernels: &[Kernel],
    outputs: &[NodeId],
) -> (Vec<Option<usize>>, Vec<DType>) {
    let n = g.nodes.len();
    let mut has_slot = vec![false; n];
    let mut def = vec![usize::MAX; n];
    // The kernels of a row pass run interleaved: what any of them reads or writes is
    // live from the pass's first kernel to its last.
    let at = crate::rows::pass_ends(kernels);
    for (k, kernel) in kernels.iter().enumerate() {
        for &o in &kernel.outputs {
            let reshape = matches!(&g.nodes[o].kind, NodeKind::Op(Op::Reshape { .. }));
            has_slot[o] = kernel.kind != KernelKind::View || reshape;
            def[o] = at[k];
        }
    }
    // Last kernel reading each slot-holding node (through views too); outputs live on.
    let mut last = vec![None::<usize>; n];
    let mut pinned = vec![false; n];
    for (k, kernel) in kernels.iter().enumerate() {
        for &i in &kernel.inputs {
            let mut roots = Vec::new();
            buffer_roots(g, &has_slot, i, &mut roots);
            for r in roots {
                last[r] = Some(last[r].map_or(at[k], |l: usize| l.max(at[k])));
            }
        }
    }
    for &o in outputs {
        let mut roots = Vec::new();
        buffer_roots(g, &has_slot, o, &mut roots);
        for r in roots {
            pinned[r] = true;
        }
    }
    let mut slot_of = vec![None; n];
    let mut slots: Vec<DType> = Vec::new();
    // Free slots, with the dims of the value that last held each.
    let mut free: Vec<(usize, Vec<D>)> = Vec::new();
    for (k, kernel) in kernels.iter().enumerate() {
        for &o in &kernel.outputs {
            if !has_slot[o] {
                continue;
            }
            let meta = &g.nodes[o].meta;
            let same_dtype = |s: &usize| slots[*s] == meta.dtype;
            let same_dims = free
                .iter()
                .position(|(s, d)| same_dtype(s) && *d == meta.dims);
            // An output leaves with its buffer, which the caller may keep past the
            // next step (batch norm's running statistics, which a model holds): it
            // takes a slot of its own, so that what it keeps is never the buffer of a
            // larger value planned before it (a slot is as large as the largest value
            // it ever holds), which the next step would have to allocate again.
            let pick = match pinned[o] {
                true => None,
                false => same_dims.or_else(|| free.iter().position(|(s, _)| same_dtype(s))),
            };
            let s = match pick {
                Some(p) => free.swap_remove(p).0,
                None => {
                    slots.push(meta.dtype);
                    slots.len() - 1
                }
            };
            slot_of[o] = Some(s);
        }
        // Release what this kernel read for the last time (or wrote and nobody reads).
        for m in 0..n {
            if has_slot[m] && !pinned[m] && def[m] <= k && last[m].unwrap_or(def[m]) == k {
                if let Some(s) = slot_of[m] {
                    free.push((s, g.nodes[m].meta.dims.clone()));
                }
            }
        }
    }
    (slot_of, slots)
}

/// Where each run-time size can first be read: (atom id, node, axis).
fn find_atoms<D: SymDim + 'static>(g: &Graph<D>) -> Vec<(u32, NodeId, usize)> {
    let mut seen = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        for (ax, d) in node.meta.dims.iter().enumerate() {
            if let Some(id) = runtime_atom(d) {
                if !seen.iter().any(|(a, _, _)| *a == id) {
                    seen.push((id, i, ax));
                }
            }
        }
    }
    seen
}

/// A dim that is exactly one run-time size, if `D` has such things.
fn runtime_atom<D: SymDim + 'static>(d: &D) -> Option<u32> {
    (d as &dyn std::any::Any)
        .downcast_ref::<crate::sym::SDim>()
        .and_then(|s| s.as_runtime())
}
