//! Running a plan on a backend. A [`Program`] resolves a [`Plan`]'s symbolic dims
//! against the sizes of its first inputs (once per set of input shapes), turns each
//! kernel into backend calls (fused elementwise expressions, reductions and products
//! with their prologues and epilogues, single ops), and keeps one buffer per slot of
//! the plan's memory plan. A slot's buffer is reused on the next run when nobody else
//! holds it, so with static shapes a steady-state run allocates nothing.

use crate::plan::{Kernel, KernelKind, Plan};
use crate::sym::SDim;
use kiln_tensor::fused::{ExprStep, FusedExpr, NativeFn};
use kiln_tensor::ir::{Graph, KeptGuard, NodeId, NodeKind};
use kiln_tensor::op::fmt_dims;
use kiln_tensor::{
    fit_views, Backend, DType, Dims, Error, Layout, Op, RawTensor, Result, TensorMeta, View,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
        prologue: Option<(FusedExpr, Option<NativeFn>, Vec<NodeId>, NodeId)>,
        epilogue: Option<(FusedExpr, Option<NativeFn>, Vec<NodeId>)>,
        output: NodeId,
    },
    /// One op into its slot.
    Single { node: NodeId, op: Op },
    /// A layout change (a reshape that cannot view copies into its slot).
    View { node: NodeId },
}

/// A plan resolved and ready to run on backend `B`, with its buffers.
#[derive(Debug)]
pub struct Program<B: Backend> {
    plan: Plan<SDim>,
    natives: &'static [Option<NativeFn>],
    /// The size parameters and input dims the program was resolved for, if any.
    key: Option<Vec<usize>>,
    /// Whether the plan describes the inputs of `key` (else they run op by op).
    planned: bool,
    metas: Vec<TensorMeta>,
    dims: Vec<Dims>,
    ops: Vec<Option<Op>>,
    steps: Vec<Step>,
    slot_len: Vec<usize>,
    arena: Vec<Option<Arc<B::Storage>>>,
    scratch: Option<B::Storage>,
    /// Per node, during a run: where its value is and with which layout.
    src: Vec<Src>,
    layout: Vec<Layout>,
    results: Vec<RawTensor<B>>,
}

fn resolve_dims(
    ds: &[SDim],
    param: &dyn Fn(&str) -> Option<usize>,
    rt: &dyn Fn(u32) -> Option<usize>,
) -> Result<Vec<usize>> {
    ds.iter().map(|d| d.eval(param, rt)).collect()
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

/// The op with its symbolic dims resolved.
fn resolve_op(
    op: &Op<SDim>,
    param: &dyn Fn(&str) -> Option<usize>,
    rt: &dyn Fn(u32) -> Option<usize>,
) -> Result<Op> {
    let ds = |d: &[SDim]| resolve_dims(d, param, rt);
    Ok(match op {
        Op::Unary(u) => Op::Unary(*u),
        Op::Binary(b) => Op::Binary(*b),
        Op::Compare(c) => Op::Compare(*c),
        Op::Where => Op::Where,
        Op::Reduce { op, axes } => Op::Reduce {
            op: *op,
            axes: axes.clone(),
        },
        Op::Reshape { dims } => Op::Reshape { dims: ds(dims)? },
        Op::Permute { perm } => Op::Permute { perm: perm.clone() },
        Op::Expand { dims } => Op::Expand { dims: ds(dims)? },
        Op::Slice {
            axis,
            start,
            end,
            step,
        } => Op::Slice {
            axis: *axis,
            start: *start,
            end: *end,
            step: *step,
        },
        Op::Concat { axis } => Op::Concat { axis: *axis },
        Op::Pad {
            axis,
            before,
            after,
            value,
        } => Op::Pad {
            axis: *axis,
            before: *before,
            after: *after,
            value: *value,
        },
        Op::MatMul => Op::MatMul,
        Op::Gather { axis } => Op::Gather { axis: *axis },
        Op::ScatterAdd { axis, dims } => Op::ScatterAdd {
            axis: *axis,
            dims: ds(dims)?,
        },
        Op::Cast { dtype } => Op::Cast { dtype: *dtype },
        Op::Unfold2d(w) => Op::Unfold2d(*w),
        Op::Fold2d {
            window,
            height,
            width,
        } => Op::Fold2d {
            window: *window,
            height: height.eval(param, rt)?,
            width: width.eval(param, rt)?,
        },
        Op::Full { dims, value, dtype } => Op::Full {
            dims: ds(dims)?,
            value: *value,
            dtype: *dtype,
        },
        Op::Rand {
            dims,
            dist,
            seed,
            dtype,
        } => Op::Rand {
            dims: ds(dims)?,
            dist: *dist,
            seed: *seed,
            dtype: *dtype,
        },
    })
}

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
            (_, Some(Op::Cast { dtype: DType::F32 })) => {
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
struct KernelExprs {
    group: Option<FusedExpr>,
    prologue: Option<(FusedExpr, Vec<NodeId>, NodeId)>,
    epilogue: Option<(FusedExpr, Vec<NodeId>)>,
}

/// Builds kernel `k`'s expressions over `graph` with `ops` (symbolic or resolved).
fn kernel_exprs<G, D: std::fmt::Debug>(
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
        KernelKind::Single | KernelKind::View => {}
    }
    Ok(out)
}

/// The expressions of kernel `k` that `#[model]` compiles into native loops, at the
/// positions [`Program::new`] expects them: `[group or prologue, epilogue]`. An
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

/// The compiled programs of one model, one per planned method, built on first use;
/// and whether the model runs its plans (fused) or op by op (unfused).
pub struct Programs<B: Backend> {
    unfused: AtomicBool,
    programs: Mutex<Vec<Option<Program<B>>>>,
}

impl<B: Backend> Default for Programs<B> {
    fn default() -> Self {
        Programs {
            unfused: AtomicBool::new(false),
            programs: Mutex::new(Vec::new()),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Programs<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Programs {{ fused: {} }}", self.fused())
    }
}

impl<B: Backend> Clone for Programs<B> {
    /// A clone starts without compiled programs (they hold buffers of the original).
    fn clone(&self) -> Self {
        let p = Programs::default();
        p.set_fused(self.fused());
        p
    }
}

impl<B: Backend> Programs<B> {
    /// Whether methods run through their fused plans (the default).
    pub fn fused(&self) -> bool {
        !self.unfused.load(Ordering::Relaxed)
    }

    /// Chooses fused plans (`true`) or op-by-op execution (`false`).
    pub fn set_fused(&self, on: bool) {
        self.unfused.store(!on, Ordering::Relaxed);
    }

    /// Runs `f` on program `id`, built from `plan_text` and `natives` on first use.
    pub fn with<R>(
        &self,
        id: usize,
        plan_text: &str,
        natives: &'static [Option<NativeFn>],
        f: impl FnOnce(&mut Program<B>) -> Result<R>,
    ) -> Result<R> {
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        if programs.len() <= id {
            programs.resize_with(id + 1, || None);
        }
        if programs[id].is_none() {
            programs[id] = Some(Program::new(Plan::parse(plan_text)?, natives));
        }
        f(programs[id].as_mut().expect("built above"))
    }
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
    let mut pro: Vec<NodeId> = Vec::new();
    let mut stack: Vec<NodeId> = graph.nodes[main]
        .inputs
        .iter()
        .copied()
        .filter(|n| k.nodes.contains(n))
        .collect();
    while let Some(n) = stack.pop() {
        if pro.contains(&n) || is_const(n) {
            continue;
        }
        pro.push(n);
        stack.extend(
            graph.nodes[n]
                .inputs
                .iter()
                .copied()
                .filter(|j| k.nodes.contains(j)),
        );
    }
    pro.sort_unstable();
    let epi = k
        .nodes
        .iter()
        .copied()
        .filter(|&n| n != main && !pro.contains(&n) && !is_const(n))
        .collect();
    (pro, main, epi)
}

impl<B: Backend> Program<B> {
    /// A program for `plan`; `natives[2k]` and `natives[2k + 1]` are kernel `k`'s
    /// compiled loops, if any (see [`native_exprs`]).
    pub fn new(plan: Plan<SDim>, natives: &'static [Option<NativeFn>]) -> Self {
        let n = plan.graph.nodes.len();
        Program {
            arena: (0..plan.slots.len()).map(|_| None).collect(),
            plan,
            natives,
            key: None,
            planned: false,
            metas: Vec::new(),
            dims: Vec::new(),
            ops: Vec::new(),
            steps: Vec::new(),
            slot_len: Vec::new(),
            scratch: None,
            src: vec![Src::None; n],
            layout: vec![Layout::contiguous(Dims::scalar()); n],
            results: Vec::new(),
        }
    }

    /// The plan this program runs.
    pub fn plan(&self) -> &Plan<SDim> {
        &self.plan
    }

    fn key_matches(&self, params: &[(&str, usize)], inputs: &[&RawTensor<B>]) -> bool {
        let Some(key) = &self.key else {
            return false;
        };
        let mut it = key.iter();
        params.iter().all(|(_, v)| it.next() == Some(v))
            && inputs
                .iter()
                .all(|t| t.dims().iter().all(|d| it.next() == Some(d)))
            && it.next().is_none()
    }

    /// Resolves dims, ops and kernels for these parameters and inputs. Every node's
    /// dims and dtype follow from the inputs' by the op table's rules, and the guards
    /// the graph kept run again, so a plan refuses what op-by-op execution refuses,
    /// with the same message, and no kernel sees a buffer of another size than its
    /// shape says. Run-time sizes (`Dyn`) bind to what the inputs give; a reshape to a
    /// `Dyn` that no input gives takes the size its element count leaves. Returns
    /// `false` when the inputs are valid but the plan's symbolic dims do not describe
    /// them (two `Dyn` sizes that broadcast): then the caller runs op by op.
    fn resolve(&mut self, params: &[(&str, usize)], inputs: &[&RawTensor<B>]) -> Result<bool> {
        let mut key: Vec<usize> = params.iter().map(|(_, v)| *v).collect();
        for t in inputs {
            key.extend_from_slice(t.dims());
        }
        self.key = Some(key);
        self.planned = false;
        let plan = &self.plan;
        let param = |name: &str| params.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let n = plan.graph.nodes.len();
        let mut atoms: Vec<(u32, usize)> = Vec::new();
        let mut metas: Vec<TensorMeta> = Vec::with_capacity(n);
        let mut ops: Vec<Option<Op>> = Vec::with_capacity(n);
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
                    let t = inputs[k];
                    (None, TensorMeta::new(t.dims().to_vec(), t.dtype()))
                }
                NodeKind::RecipDim(d) => {
                    let count = d.eval(&param, &rt)?;
                    let op = Op::Full {
                        dims: vec![],
                        value: 1.0 / count as f64,
                        dtype: node.meta.dtype,
                    };
                    (Some(op), TensorMeta::new(vec![], node.meta.dtype))
                }
                NodeKind::Op(op) => {
                    let ins: Vec<&TensorMeta> = node.inputs.iter().map(|&j| &metas[j]).collect();
                    let op = match op {
                        Op::Reshape { dims } => Op::Reshape {
                            dims: reshape_dims(dims, &ins[0].dims, &param, &rt)?,
                        },
                        op => resolve_op(op, &param, &rt)?,
                    };
                    let meta = op.infer(&ins)?;
                    (Some(op), meta)
                }
            };
            let mut described =
                meta.dtype == node.meta.dtype && meta.dims.len() == node.meta.dims.len();
            for (sym, &size) in node.meta.dims.iter().zip(&meta.dims) {
                if !described {
                    break;
                }
                match sym.as_runtime() {
                    Some(id) if lookup(&atoms, id).is_none() => atoms.push((id, size)),
                    _ => described = sym.eval(&param, &|id| lookup(&atoms, id)).ok() == Some(size),
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
                return Ok(false);
            }
            metas.push(meta);
            ops.push(op);
        }
        for k in guards {
            run_guard(k, &metas)?;
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
            let native = |i: usize| self.natives.get(2 * ki + i).copied().flatten();
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
            });
        }
        self.metas = metas;
        self.dims = dims;
        self.ops = ops;
        self.steps = steps;
        self.slot_len = slot_len;
        self.planned = true;
        Ok(true)
    }

    /// Runs the plan on `inputs` (in the plan's input order) with the size parameters
    /// `params` (`("B", 256)`); random ops draw with their seed mixed with `seed`.
    /// Returns the plan's outputs, in order, or `None` when the inputs are valid but
    /// the plan does not describe their shapes (see `resolve`): run them op by op.
    /// Inputs that op-by-op execution would refuse are refused with its message.
    pub fn run(
        &mut self,
        device: &B::Device,
        params: &[(&str, usize)],
        inputs: &[&RawTensor<B>],
        seed: u64,
    ) -> Result<Option<std::vec::Drain<'_, RawTensor<B>>>> {
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
        if !self.key_matches(params, inputs) {
            if let Err(e) = self.resolve(params, inputs) {
                // Refused shapes are not remembered: the next call checks them again.
                self.key = None;
                return Err(e);
            }
        }
        if !self.planned {
            return Ok(None);
        }
        for (k, (&leaf, t)) in self.plan.inputs.iter().zip(inputs).enumerate() {
            self.src[leaf] = Src::Input(k);
            self.layout[leaf] = *t.layout();
        }
        for si in 0..self.steps.len() {
            self.run_step(device, si, inputs, seed)?;
        }
        self.results.clear();
        for &o in &self.plan.outputs {
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
            self.results.push(RawTensor::from_arc(
                storage,
                self.layout[o],
                device.clone(),
            )?);
        }
        Ok(Some(self.results.drain(..)))
    }

    /// The buffer behind a node's value.
    fn storage<'a>(&'a self, inputs: &[&'a RawTensor<B>], n: NodeId) -> Result<&'a B::Storage> {
        match self.src[n] {
            Src::Input(k) => Ok(inputs[k].storage()),
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
    fn take_slot(&mut self, device: &B::Device, s: usize) -> Result<Arc<B::Storage>> {
        let (dtype, len) = (self.plan.slots[s], self.slot_len[s]);
        if let Some(mut a) = self.arena[s].take() {
            if let Some(st) = Arc::get_mut(&mut a) {
                if B::storage_dtype(st) == dtype && B::storage_len(st) >= len {
                    return Ok(a);
                }
            }
        }
        Ok(Arc::new(B::alloc(device, dtype, len)?))
    }

    fn slot_of(&self, n: NodeId) -> Result<usize> {
        self.plan.slot_of[n]
            .ok_or_else(|| Error::invalid("run", format!("node {n} has no buffer slot")))
    }

    /// Views of `nodes` with the layouts an op of `class` at `dims` reads them with.
    /// The input views of op node `node`, fitted to what the backend's op expects.
    fn op_views<'a>(
        &'a self,
        inputs: &[&'a RawTensor<B>],
        node: NodeId,
        op: &Op,
    ) -> Result<smallvec::SmallVec<[View<'a, B>; 4]>> {
        let mut views = self.plan.graph.nodes[node]
            .inputs
            .iter()
            .map(|&n| {
                Ok(View {
                    storage: self.storage(inputs, n)?,
                    layout: self.layout[n],
                })
            })
            .collect::<Result<smallvec::SmallVec<[View<'a, B>; 4]>>>()?;
        fit_views(op, &mut views, &self.dims[node])?;
        Ok(views)
    }

    fn views<'a>(
        &'a self,
        inputs: &[&'a RawTensor<B>],
        nodes: &[NodeId],
        dims: &Dims,
    ) -> Result<smallvec::SmallVec<[View<'a, B>; 8]>> {
        nodes
            .iter()
            .map(|&n| {
                let layout = if self.dims[n] == *dims {
                    self.layout[n]
                } else {
                    self.layout[n].broadcast_to(dims)?
                };
                Ok(View {
                    storage: self.storage(inputs, n)?,
                    layout,
                })
            })
            .collect()
    }

    fn run_step(
        &mut self,
        device: &B::Device,
        si: usize,
        inputs: &[&RawTensor<B>],
        seed: u64,
    ) -> Result<()> {
        match &self.steps[si] {
            Step::Fused { output, .. } => {
                let output = *output;
                let s = self.slot_of(output)?;
                let mut buf = self.take_slot(device, s)?;
                let Step::Fused {
                    expr,
                    native,
                    inputs: ins,
                    ..
                } = &self.steps[si]
                else {
                    unreachable!()
                };
                let dims = self.dims[output];
                let result = (|| {
                    let views = self.views(inputs, ins, &dims)?;
                    let out = Arc::get_mut(&mut buf).expect("taken slots are unique");
                    B::fused_elementwise(device, expr, *native, &views, &dims, &mut [out])
                })();
                self.arena[s] = Some(buf);
                result?;
                self.src[output] = Src::Slot(s);
                self.layout[output] = Layout::contiguous(dims);
            }
            Step::Main { main, output, .. } => {
                let (main, output) = (*main, *output);
                let s = self.slot_of(output)?;
                let mut buf = self.take_slot(device, s)?;
                let result = self.run_main(device, si, inputs, main, &mut buf);
                self.arena[s] = Some(buf);
                result?;
                self.src[output] = Src::Slot(s);
                self.layout[output] = Layout::contiguous(self.dims[output]);
            }
            Step::Single { node, .. } => {
                let node = *node;
                let s = self.slot_of(node)?;
                let mut buf = self.take_slot(device, s)?;
                let result = (|| {
                    let Step::Single { op, .. } = &self.steps[si] else {
                        unreachable!()
                    };
                    let rand;
                    let op = match op {
                        Op::Rand {
                            dims,
                            dist,
                            seed: own,
                            dtype,
                        } => {
                            rand = Op::Rand {
                                dims: dims.clone(),
                                dist: *dist,
                                seed: own ^ seed,
                                dtype: *dtype,
                            };
                            &rand
                        }
                        op => op,
                    };
                    let views = self.op_views(inputs, node, op)?;
                    let out = Arc::get_mut(&mut buf).expect("taken slots are unique");
                    B::execute_into(device, op, &views, &self.metas[node], out)
                })();
                self.arena[s] = Some(buf);
                result?;
                self.src[node] = Src::Slot(s);
                self.layout[node] = Layout::contiguous(self.dims[node]);
            }
            Step::View { node } => {
                let node = *node;
                let input = self.plan.graph.nodes[node].inputs[0];
                let l = self.layout[input];
                let op = self.ops[node].as_ref().expect("views are ops");
                let viewed = match op {
                    Op::Permute { perm } => Some(l.permute(perm)?),
                    Op::Expand { .. } => Some(l.broadcast_to(&self.dims[node])?),
                    Op::Slice {
                        axis,
                        start,
                        end,
                        step,
                    } => Some(l.slice(*axis, *start, *end, *step)?),
                    Op::Reshape { .. } => l.reshape(&self.dims[node]),
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
                        // A reshape of a layout that cannot be viewed: copy into its slot.
                        let s = self.slot_of(node)?;
                        let copy = B::contiguous(
                            device,
                            View {
                                storage: self.storage(inputs, input)?,
                                layout: l,
                            },
                        )?;
                        self.arena[s] = Some(Arc::new(copy));
                        self.src[node] = Src::Slot(s);
                        self.layout[node] = Layout::contiguous(self.dims[node]);
                    }
                }
            }
        }
        Ok(())
    }

    /// A reduction or product with its prologue and epilogue, into `buf`.
    fn run_main(
        &mut self,
        device: &B::Device,
        si: usize,
        inputs: &[&RawTensor<B>],
        main: NodeId,
        buf: &mut Arc<B::Storage>,
    ) -> Result<()> {
        let Step::Main { prologue, .. } = &self.steps[si] else {
            unreachable!()
        };
        if let Some((_, _, _, root)) = prologue {
            let root = *root;
            let len = self.dims[root].numel();
            let fits = self
                .scratch
                .as_ref()
                .is_some_and(|s| B::storage_len(s) >= len);
            let mut scratch = match self.scratch.take() {
                Some(s) if fits => s,
                _ => B::alloc(device, DType::F32, len)?,
            };
            let result = (|| {
                let Step::Main {
                    prologue: Some((expr, native, ins, _)),
                    ..
                } = &self.steps[si]
                else {
                    unreachable!()
                };
                let dims = self.dims[root];
                let views = self.views(inputs, ins, &dims)?;
                B::fused_elementwise(device, expr, *native, &views, &dims, &mut [&mut scratch])
            })();
            self.scratch = Some(scratch);
            result?;
            self.src[root] = Src::Scratch;
            self.layout[root] = Layout::contiguous(self.dims[root]);
        }
        let out = Arc::get_mut(buf).expect("taken slots are unique");
        let op = self.ops[main].as_ref().expect("main nodes are ops");
        let views = self.op_views(inputs, main, op)?;
        // A product whose epilogue the device fuses into it (one library call).
        if let (
            Op::MatMul,
            Step::Main {
                epilogue: Some((expr, _, ins)),
                output,
                ..
            },
        ) = (op, &self.steps[si])
        {
            let epilogue_views = self.views(inputs, ins, &self.dims[*output])?;
            if let Some(fused) = B::matmul_with_epilogue(
                device,
                views[0],
                views[1],
                &self.metas[main],
                expr,
                &epilogue_views,
            )? {
                *out = fused;
                return Ok(());
            }
        }
        B::execute_into(device, op, &views, &self.metas[main], out)?;
        let Step::Main {
            epilogue, output, ..
        } = &self.steps[si]
        else {
            unreachable!()
        };
        if let Some((expr, native, ins)) = epilogue {
            let dims = self.dims[*output];
            let views = self.views(inputs, ins, &dims)?;
            B::fused_elementwise(device, expr, *native, &views, &dims, &mut [out])?;
        }
        Ok(())
    }
}
