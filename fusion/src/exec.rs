//! Running a plan on a backend. A [`Program`] resolves a [`Plan`]'s symbolic dims
//! against the sizes of its inputs (once per set of input shapes: every node's dims
//! derived by the op table's rules, the guards run again), turns each kernel into
//! backend calls (fused elementwise expressions, reductions and products with their
//! prologues and epilogues, single ops), and keeps one buffer per slot of the plan's
//! memory plan. A slot's buffer is reused on the next run when nobody else holds it,
//! so with static shapes a steady-state run allocates nothing.
//!
//! A program is what `resolve` decided for the current sizes ([`Resolved`], read-only
//! while a run executes) beside the buffers ([`Buffers`], the only state a run changes).

use crate::exprs::kernel_exprs;
use crate::parts::{call_part, NoParts, Parts};
use crate::plan::{KernelKind, Plan};
use crate::sym::SDim;
use kiln_tensor::fused::{FusedExpr, NativeFn};
use kiln_tensor::ir::{KeptGuard, NodeId, NodeKind};
use kiln_tensor::nn::StepSeed;
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{
    fit_views, Backend, DType, Dims, Error, Layout, Op, RawTensor, Result, TensorMeta, View,
};
use std::any::Any;
use std::sync::Arc;

/// Where a node's value lives during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Src {
    /// Not materialised (computed inside a kernel).
    None,
    /// The caller's input `k`.
    Input(usize),
    /// A slot of the arena.
    Slot(usize),
    /// The program's prologue scratch buffer.
    Scratch,
}

/// A prologue: its expression, native loop, inputs, and the node it computes.
type Prologue = (FusedExpr, Option<NativeFn>, Vec<NodeId>, NodeId);
/// An epilogue: its expression, native loop and inputs (it runs in place).
type Epilogue = (FusedExpr, Option<NativeFn>, Vec<NodeId>);

/// One kernel, resolved for fixed dims.
#[derive(Debug)]
enum Step {
    /// A fused elementwise group.
    Fused {
        expr: FusedExpr,
        native: Option<NativeFn>,
        inputs: Vec<NodeId>,
        output: NodeId,
    },
    /// A reduction or product (`main`), its prologue written to scratch first, its
    /// epilogue run in place on its output.
    Main {
        main: NodeId,
        prologue: Option<Prologue>,
        epilogue: Option<Epilogue>,
        output: NodeId,
    },
    /// One op into its slot.
    Single { node: NodeId, op: Op },
    /// A layout change (a reshape that cannot view copies into its slot).
    View { node: NodeId },
    /// A call out to a part (or its backward pass), its result into its slot.
    Call { node: NodeId },
}

impl Step {
    /// The node whose value the step computes.
    fn node(&self) -> NodeId {
        match self {
            Step::Fused { output, .. } | Step::Main { output, .. } => *output,
            Step::Single { node, .. } | Step::View { node } | Step::Call { node } => *node,
        }
    }
}

/// What `resolve` decided for one set of parameters and input dims.
#[derive(Debug)]
struct Resolved {
    /// The size parameters and input dims it was resolved for.
    key: Vec<usize>,
    /// Whether the plan describes these inputs (else they run op by op).
    planned: bool,
    metas: Vec<TensorMeta>,
    dims: Vec<Dims>,
    ops: Vec<Option<Op>>,
    steps: Vec<Step>,
    slot_len: Vec<usize>,
    /// For each step, the positions in the plan's outputs of the nodes it computes
    /// (handed to an output watcher as soon as the step is queued).
    ready: Vec<Vec<usize>>,
}

impl Resolved {
    /// Inputs the plan does not describe.
    fn declined(key: Vec<usize>) -> Self {
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
    fn matches<B: Backend>(&self, params: &[(&str, usize)], inputs: &[&RawTensor<B>]) -> bool {
        let mut it = self.key.iter();
        params.iter().all(|(_, v)| it.next() == Some(v))
            && inputs
                .iter()
                .all(|t| t.dims().iter().all(|d| it.next() == Some(d)))
            && it.next().is_none()
    }
}

/// The buffers of a program: one per slot, the prologue scratch, and where each node's
/// value is during a run.
#[derive(Debug)]
struct Buffers<B: Backend> {
    arena: Vec<Option<Arc<B::Storage>>>,
    scratch: Option<B::Storage>,
    src: Vec<Src>,
    layout: Vec<Layout>,
}

/// What one run reads: the plan, its resolution, the inputs and the device.
struct Run<'a, B: Backend> {
    plan: &'a Plan<SDim>,
    r: &'a Resolved,
    inputs: &'a [&'a RawTensor<B>],
    device: &'a B::Device,
    seeds: Seeds<'a, B>,
}

/// Where a run's random ops get their seeds.
#[derive(Debug)]
pub enum Seeds<'a, B: Backend> {
    /// Each op's own seed mixed (xor) with this one: a `#[model]`'s training step, whose
    /// `i`-th dropout layer draws with `i ^ step_seed`.
    Mix(u64),
    /// Each op's own seed mixed (xor) with the one in this device buffer (`i32 [2]`,
    /// low word first; [`Backend::rand_with_device_seed`]): a training step captured
    /// as a graph, whose seed the host rewrites before each replay.
    Device(&'a RawTensor<B>),
    /// The op's own seed is an index into this table, which holds the seed it draws
    /// with: a plan recorded at run time, cached with its seeds abstracted away, so the
    /// same program draws fresh masks each call.
    Table(&'a [u64]),
}

impl<B: Backend> Clone for Seeds<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for Seeds<'_, B> {}

impl<'a, B: Backend> From<&'a StepSeed<B>> for Seeds<'a, B> {
    fn from(seed: &'a StepSeed<B>) -> Self {
        match seed {
            StepSeed::Host(seed) => Seeds::Mix(*seed),
            StepSeed::Device(buffer) => Seeds::Device(buffer),
        }
    }
}

/// Who is told of each output of a run (a `RawTensor<B>` behind the `&dyn Any`).
pub type Watcher<'a> = &'a mut dyn FnMut(&dyn Any);

/// What a [`Program`] run reads besides its inputs: the device, the size parameters
/// bound by name (`("B", 256)`), where random ops get their seeds, the parts of a model
/// the plan calls out to (modules on the dynamic path), and who is told of each output
/// as soon as the work computing it is queued (a data-parallel step sending gradients
/// during the backward pass). Built with [`RunContext::new`] and the setters below;
/// one value for both paths, planned ([`Program::run`]) and op by op
/// ([`Program::run_op_by_op`]).
pub struct RunContext<'a, B: Backend> {
    pub(crate) device: &'a B::Device,
    pub(crate) sizes: &'a [(&'a str, usize)],
    pub(crate) seeds: Seeds<'a, B>,
    pub(crate) parts: Option<&'a mut dyn Parts<B>>,
    pub(crate) watch: Option<Watcher<'a>>,
}

impl<'a, B: Backend> RunContext<'a, B> {
    /// A run on `device` with no size parameters, random ops drawing with their own
    /// seeds (mixed with 0), no parts and no watcher.
    pub fn new(device: &'a B::Device) -> Self {
        RunContext {
            device,
            sizes: &[],
            seeds: Seeds::Mix(0),
            parts: None,
            watch: None,
        }
    }

    /// A `#[model]` method's run: on `device`, with the method's size parameters
    /// `sizes`, random ops mixing their own seed with the step's `seed`.
    pub fn step(
        device: &'a B::Device,
        sizes: &'a [(&'a str, usize)],
        seed: &'a StepSeed<B>,
    ) -> Self {
        RunContext::new(device)
            .sizes(sizes)
            .seeds(Seeds::from(seed))
    }

    /// Binds the plan's size parameters by name (`("B", 256)`).
    pub fn sizes(mut self, sizes: &'a [(&'a str, usize)]) -> Self {
        self.sizes = sizes;
        self
    }

    /// Where random ops get their seeds.
    pub fn seeds(mut self, seeds: Seeds<'a, B>) -> Self {
        self.seeds = seeds;
        self
    }

    /// The parts the plan calls out to.
    pub fn parts(mut self, parts: &'a mut dyn Parts<B>) -> Self {
        self.parts = Some(parts);
        self
    }

    /// Who is handed each output (a `RawTensor<B>` behind the `&dyn Any`) as soon as
    /// the work computing it is queued; `None` for nobody.
    pub fn watch(mut self, watch: Option<Watcher<'a>>) -> Self {
        self.watch = watch;
        self
    }

    /// Hands `output` to the watcher, if there is one.
    fn tell(&mut self, output: &RawTensor<B>) {
        if let Some(watch) = self.watch.as_deref_mut() {
            watch(output);
        }
    }
}

/// A plan's compiled loops, only those it has: `(2k, f)` is kernel `k`'s main (or
/// prologue) loop, `(2k + 1, f)` its epilogue's (see [`crate::native_exprs`]).
pub type Natives = [(u32, NativeFn)];

/// A plan resolved and ready to run on backend `B`, with its buffers.
#[derive(Debug)]
pub struct Program<B: Backend> {
    plan: Plan<SDim>,
    natives: &'static Natives,
    resolved: Option<Resolved>,
    buffers: Buffers<B>,
    results: Vec<RawTensor<B>>,
}

/// The value bound to run-time size `id`, if any yet.
fn lookup(atoms: &[(u32, usize)], id: u32) -> Option<usize> {
    atoms.iter().find(|(a, _)| *a == id).map(|(_, v)| *v)
}

/// Runs a kept guard on the resolved metas of its inputs.
fn run_guard(k: &KeptGuard, metas: &[TensorMeta]) -> Result<()> {
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
fn reshape_dims(
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
struct Inferred {
    metas: Vec<TensorMeta>,
    ops: Vec<Option<Op>>,
    /// Whether the plan's symbolic dims describe every node (else the inputs are
    /// valid but only op-by-op execution handles them).
    described: bool,
}

/// Derives every node's dims and dtype from the inputs' by the op table's rules and
/// runs the guards the graph kept, so what op-by-op execution refuses is refused here,
/// with its message. Run-time sizes (`Dyn`) bind to what the inputs give, at the
/// first node whose dims name them; a reshape to a `Dyn` that no input gives takes the
/// size its element count leaves. A leaf that disagrees with the plan is an error; a
/// computed node that does (two `Dyn` sizes that broadcast) clears `described`.
fn infer_nodes(
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

/// Resolves dims, ops and kernels for these parameters and inputs (see
/// `infer_nodes`): no kernel sees a buffer of another size than its shape says. The
/// result is declined (not `planned`) when the inputs are valid but the plan's
/// symbolic dims do not describe them: then the caller runs op by op.
fn resolve(
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
            KernelKind::Reduce | KernelKind::MatMul => Step::Main {
                main: k.main.expect("reduce and matmul kernels have a main node"),
                prologue: exprs
                    .prologue
                    .map(|(e, ins, root)| (e, native(0), ins, root)),
                epilogue: exprs.epilogue.map(|(e, ins)| (e, native(1), ins)),
                output: k.outputs[0],
            },
            KernelKind::Single => {
                let node = k.outputs[0];
                Step::Single {
                    node,
                    op: ops[node].clone().expect("single kernels run an op"),
                }
            }
            KernelKind::View => Step::View { node: k.outputs[0] },
            KernelKind::Call => Step::Call { node: k.outputs[0] },
        });
    }
    let ready = steps
        .iter()
        .map(|step| {
            let node = step.node();
            (0..plan.outputs.len())
                .filter(|&o| plan.outputs[o] == node)
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

impl<B: Backend> Program<B> {
    /// A program for `plan` with the compiled loops `natives` (see [`Natives`]).
    pub fn new(plan: Plan<SDim>, natives: &'static Natives) -> Self {
        let n = plan.graph.nodes.len();
        Program {
            buffers: Buffers {
                arena: (0..plan.slots.len()).map(|_| None).collect(),
                scratch: None,
                src: vec![Src::None; n],
                layout: vec![Layout::contiguous(Dims::scalar()); n],
            },
            plan,
            natives,
            resolved: None,
            results: Vec::new(),
        }
    }

    /// The plan this program runs.
    pub fn plan(&self) -> &Plan<SDim> {
        &self.plan
    }

    /// Runs the plan on `inputs` (in the plan's input order) in the context `cx`.
    /// Returns the plan's outputs, in order, or `None` when the inputs are valid but
    /// the plan does not describe their shapes (see `resolve`): run them op by op.
    /// Inputs that op-by-op execution would refuse are refused with its message.
    pub fn run(
        &mut self,
        cx: &mut RunContext<'_, B>,
        inputs: &[&RawTensor<B>],
    ) -> Result<Option<std::vec::Drain<'_, RawTensor<B>>>> {
        let (device, params) = (cx.device, cx.sizes);
        if inputs.len() != self.plan.inputs.len() {
            return Err(Error::invalid(
                "run",
                format!(
                    "the plan takes {} inputs, not {}",
                    self.plan.inputs.len(),
                    inputs.len()
                ),
            ));
        }
        if !self
            .resolved
            .as_ref()
            .is_some_and(|r| r.matches(params, inputs))
        {
            // Refused shapes are not remembered: the next call checks them again.
            self.resolved = None;
            let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
            self.resolved = Some(resolve(&self.plan, self.natives, params, &metas)?);
        }
        let Program {
            plan,
            resolved,
            buffers,
            results,
            ..
        } = self;
        let r = resolved.as_ref().expect("resolved above");
        if !r.planned {
            return Ok(None);
        }
        let run = Run {
            plan,
            r,
            inputs,
            device,
            seeds: cx.seeds,
        };
        for (k, (&leaf, t)) in plan.inputs.iter().zip(inputs).enumerate() {
            buffers.src[leaf] = Src::Input(k);
            buffers.layout[leaf] = *t.layout();
        }
        let mut no_parts = NoParts;
        for (step, ready) in r.steps.iter().zip(&r.ready) {
            let parts: &mut dyn Parts<B> = match cx.parts.as_deref_mut() {
                Some(p) => p,
                None => &mut no_parts,
            };
            buffers.step(&run, step, parts)?;
            if cx.watch.is_some() {
                for &o in ready {
                    cx.tell(&buffers.output(inputs, plan.outputs[o], device)?);
                }
            }
        }
        results.clear();
        for &o in &plan.outputs {
            results.push(buffers.output(inputs, o, device)?);
        }
        Ok(Some(results.drain(..)))
    }
}

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
                    let storage = B::rand_with_device_seed(device, op, seed.view(), &all[i])?;
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

/// The slot a node is written to.
fn slot_of(plan: &Plan<SDim>, n: NodeId) -> Result<usize> {
    plan.slot_of[n].ok_or_else(|| Error::invalid("run", format!("node {n} has no buffer slot")))
}

/// `op` with the seed the run gives it (other ops unchanged). A draw whose seed is in
/// device memory runs through [`draw_with_device_seed`] instead.
fn seeded<'o, B: Backend>(op: &'o Op, seeds: Seeds<'_, B>) -> Result<std::borrow::Cow<'o, Op>> {
    Ok(match op {
        Op::Rand {
            dims,
            dist,
            seed: own,
            dtype,
        } => {
            std::borrow::Cow::Owned(Op::Rand {
                dims: dims.clone(),
                dist: *dist,
                seed: match seeds {
                    Seeds::Mix(seed) => own ^ seed,
                    Seeds::Table(table) => *usize::try_from(*own)
                        .ok()
                        .and_then(|i| table.get(i))
                        .ok_or_else(|| {
                        Error::invalid(
                            "run",
                            format!("random op {own} has no seed in a table of {}", table.len()),
                        )
                    })?,
                    Seeds::Device(_) => return Err(Error::invalid(
                        "run",
                        "a draw with a device seed is not mixed on the host (a broken invariant)",
                    )),
                },
                dtype: *dtype,
            })
        }
        op => std::borrow::Cow::Borrowed(op),
    })
}

/// The device seed `op` draws with, when it is a draw and the run's seed is in device
/// memory.
fn device_seed<'a, B: Backend>(op: &Op, seeds: Seeds<'a, B>) -> Option<&'a RawTensor<B>> {
    match (op, seeds) {
        (Op::Rand { .. }, Seeds::Device(seed)) => Some(seed),
        _ => None,
    }
}

impl<B: Backend> Buffers<B> {
    /// The buffer behind a node's value.
    fn storage<'a>(&'a self, run: &Run<'a, B>, n: NodeId) -> Result<&'a B::Storage> {
        match self.src[n] {
            Src::Input(k) => Ok(run.inputs[k].storage()),
            Src::Slot(s) => self.arena[s]
                .as_deref()
                .ok_or_else(|| Error::invalid("run", "slot read before written")),
            Src::Scratch => self
                .scratch
                .as_ref()
                .ok_or_else(|| Error::invalid("run", "scratch read before written")),
            Src::None => Err(Error::invalid(
                "run",
                format!("node {n} read before it was computed"),
            )),
        }
    }

    /// Takes slot `s` out of the arena as a buffer that can be written: the old one if
    /// nobody else holds it and it fits, else a new one.
    fn take_slot(&mut self, run: &Run<'_, B>, s: usize) -> Result<Arc<B::Storage>> {
        let (dtype, len) = (run.plan.slots[s], run.r.slot_len[s]);
        if let Some(mut a) = self.arena[s].take() {
            if let Some(st) = Arc::get_mut(&mut a) {
                if B::storage_dtype(st) == dtype && B::storage_len(st) >= len {
                    return Ok(a);
                }
            }
        }
        Ok(Arc::new(B::alloc(run.device, dtype, len)?))
    }

    /// Writes `node`'s slot with `write` (which reads other values through `self`),
    /// then records where the node's value is.
    fn write_slot(
        &mut self,
        run: &Run<'_, B>,
        node: NodeId,
        write: impl FnOnce(&Self, &mut B::Storage) -> Result<()>,
    ) -> Result<()> {
        let s = slot_of(run.plan, node)?;
        let mut buf = self.take_slot(run, s)?;
        let result = write(
            self,
            Arc::get_mut(&mut buf).expect("taken slots are unique"),
        );
        self.arena[s] = Some(buf);
        result?;
        self.src[node] = Src::Slot(s);
        self.layout[node] = Layout::contiguous(run.r.dims[node]);
        Ok(())
    }

    /// The input views of op node `node`, fitted to what the backend's op expects.
    fn op_views<'a>(
        &'a self,
        run: &Run<'a, B>,
        node: NodeId,
        op: &Op,
    ) -> Result<smallvec::SmallVec<[View<'a, B>; 4]>> {
        let mut views = run.plan.graph.nodes[node]
            .inputs
            .iter()
            .map(|&n| {
                Ok(View {
                    storage: self.storage(run, n)?,
                    layout: self.layout[n],
                })
            })
            .collect::<Result<smallvec::SmallVec<[View<'a, B>; 4]>>>()?;
        fit_views(op, &mut views, &run.r.dims[node])?;
        Ok(views)
    }

    /// Views of `nodes`, broadcast to `dims` (an elementwise expression's inputs).
    fn views<'a>(
        &'a self,
        run: &Run<'a, B>,
        nodes: &[NodeId],
        dims: &Dims,
    ) -> Result<smallvec::SmallVec<[View<'a, B>; 8]>> {
        nodes
            .iter()
            .map(|&n| {
                let layout = if run.r.dims[n] == *dims {
                    self.layout[n]
                } else {
                    self.layout[n].broadcast_to(dims)?
                };
                Ok(View {
                    storage: self.storage(run, n)?,
                    layout,
                })
            })
            .collect()
    }

    /// The value of node `n` as a tensor sharing its buffer (what a part is given).
    fn tensor(&self, run: &Run<'_, B>, n: NodeId) -> Result<RawTensor<B>> {
        let storage = match self.src[n] {
            Src::Input(k) => run.inputs[k].storage().clone(),
            Src::Slot(s) => self.arena[s]
                .clone()
                .ok_or_else(|| Error::invalid("run", "slot read before written"))?,
            Src::Scratch | Src::None => {
                return Err(Error::invalid(
                    "run",
                    format!("node {n} read before it was computed"),
                ))
            }
        };
        RawTensor::from_arc(storage, self.layout[n], run.device.clone())
    }

    /// Output node `o`'s value, once the step computing it has run.
    fn output(
        &self,
        inputs: &[&RawTensor<B>],
        o: NodeId,
        device: &B::Device,
    ) -> Result<RawTensor<B>> {
        let storage = match self.src[o] {
            Src::Input(k) => inputs[k].storage().clone(),
            Src::Slot(s) => self.arena[s].clone().expect("written slots hold a buffer"),
            Src::None | Src::Scratch => {
                return Err(Error::invalid(
                    "run",
                    format!("output node {o} was not written"),
                ))
            }
        };
        RawTensor::from_arc(storage, self.layout[o], device.clone())
    }

    /// Runs one kernel.
    fn step(&mut self, run: &Run<'_, B>, step: &Step, parts: &mut dyn Parts<B>) -> Result<()> {
        let (r, device) = (run.r, run.device);
        match step {
            Step::Fused {
                expr,
                native,
                inputs,
                output,
            } => {
                let dims = r.dims[*output];
                self.write_slot(run, *output, |b, out| {
                    let views = b.views(run, inputs, &dims)?;
                    B::fused_elementwise(device, expr, *native, &views, &dims, &mut [out])
                })
            }
            Step::Main {
                main,
                prologue,
                epilogue,
                output,
            } => {
                if let Some(prologue) = prologue {
                    self.prologue(run, prologue)?;
                }
                let op = r.ops[*main].as_ref().expect("main nodes are ops");
                self.write_slot(run, *output, |b, out| {
                    let views = b.op_views(run, *main, op)?;
                    // A product whose epilogue the device fuses into it (one call).
                    if let (Op::MatMul, Some((expr, _, ins))) = (op, epilogue) {
                        let epilogue_views = b.views(run, ins, &r.dims[*output])?;
                        if let Some(fused) = B::matmul_with_epilogue(
                            device,
                            views[0],
                            views[1],
                            &r.metas[*main],
                            expr,
                            &epilogue_views,
                        )? {
                            *out = fused;
                            return Ok(());
                        }
                    }
                    B::execute_into(device, op, &views, &r.metas[*main], out)?;
                    if let Some((expr, native, ins)) = epilogue {
                        let dims = r.dims[*output];
                        let views = b.views(run, ins, &dims)?;
                        B::fused_elementwise(device, expr, *native, &views, &dims, &mut [out])?;
                    }
                    Ok(())
                })
            }
            Step::Single { node, op } => {
                if let Some(seed) = device_seed(op, run.seeds) {
                    let meta = &r.metas[*node];
                    return self.write_slot(run, *node, |_, out| {
                        *out = B::rand_with_device_seed(device, op, seed.view(), meta)?;
                        Ok(())
                    });
                }
                let op = seeded(op, run.seeds)?;
                self.write_slot(run, *node, |b, out| {
                    let views = b.op_views(run, *node, &op)?;
                    B::execute_into(device, &op, &views, &r.metas[*node], out)
                })
            }
            Step::View { node } => self.view(run, *node),
            Step::Call { node } => {
                let n = &run.plan.graph.nodes[*node];
                let (part, grad) = match n.kind {
                    NodeKind::Call(p) => (p, false),
                    NodeKind::CallGrad(p) => (p, true),
                    _ => return Err(Error::invalid("run", format!("node {node} is not a call"))),
                };
                let input = self.tensor(run, n.inputs[0])?;
                let declared = &n.meta.dims;
                let out = call_part(parts, part, grad, input, &r.metas[*node], declared)?;
                // The part's result is the node's buffer (no copy); the slot's next
                // writer allocates afresh while the part still holds it.
                let s = slot_of(run.plan, *node)?;
                self.layout[*node] = *out.layout();
                self.arena[s] = Some(out.storage().clone());
                self.src[*node] = Src::Slot(s);
                Ok(())
            }
        }
    }

    /// A reduction's or product's prologue, into the scratch buffer.
    fn prologue(&mut self, run: &Run<'_, B>, prologue: &Prologue) -> Result<()> {
        let (expr, native, ins, root) = prologue;
        let dims = run.r.dims[*root];
        let fits = self
            .scratch
            .as_ref()
            .is_some_and(|s| B::storage_len(s) >= dims.numel());
        let mut scratch = match self.scratch.take() {
            Some(s) if fits => s,
            _ => B::alloc(run.device, DType::F32, dims.numel())?,
        };
        let result = self.views(run, ins, &dims).and_then(|views| {
            B::fused_elementwise(
                run.device,
                expr,
                *native,
                &views,
                &dims,
                &mut [&mut scratch],
            )
        });
        self.scratch = Some(scratch);
        result?;
        self.src[*root] = Src::Scratch;
        self.layout[*root] = Layout::contiguous(dims);
        Ok(())
    }

    /// A layout change: a view of its input's buffer, or a copy into its slot when a
    /// reshape cannot view.
    fn view(&mut self, run: &Run<'_, B>, node: NodeId) -> Result<()> {
        let input = run.plan.graph.nodes[node].inputs[0];
        let l = self.layout[input];
        let dims = run.r.dims[node];
        let viewed = match run.r.ops[node].as_ref().expect("views are ops") {
            Op::Permute { perm } => Some(l.permute(perm)?),
            Op::Expand { .. } => Some(l.broadcast_to(&dims)?),
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => Some(l.slice(*axis, *start, *end, *step)?),
            Op::Reshape { .. } => l.reshape(&dims),
            other => {
                return Err(Error::invalid(
                    "run",
                    format!("{} is not a view", other.name()),
                ))
            }
        };
        match viewed {
            Some(layout) => {
                self.src[node] = self.src[input];
                self.layout[node] = layout;
            }
            None => {
                let s = slot_of(run.plan, node)?;
                let copy = B::contiguous(
                    run.device,
                    View {
                        storage: self.storage(run, input)?,
                        layout: l,
                    },
                )?;
                self.arena[s] = Some(Arc::new(copy));
                self.src[node] = Src::Slot(s);
                self.layout[node] = Layout::contiguous(dims);
            }
        }
        Ok(())
    }
}

/// Anomaly mode's reports: which node first held a value that is not finite, described
/// by its op, dims, node number, and the named values (parameters, inputs, variables)
/// nearest upstream, which say which layer it belongs to.
mod anomaly {
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
            &format!("node {i}{}", own_name(plan, i)),
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
