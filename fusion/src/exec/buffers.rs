//! The planned run: each step's backend calls on the buffers of the plan's slots,
//! reused across runs when nobody else holds them ([`Buffers`]).

use super::context::{device_seed, run_seed, seeded, Seeds};
use super::resolve::{Epilogue, Prologue, Resolved, Step};
use super::rows::RowsStep;
use crate::parts::{call_part, Parts};
use crate::plan::Plan;
use crate::sym::SDim;
use crate::windows::{FoldWrite, WindowRead};
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::ir::{NodeId, NodeKind};
use kiln_tensor::{
    fit_product_operand, fit_views, Backend, DType, Dims, Error, FoldInto, Layout, Op, OpClass,
    ProductOperand, RawTensor, Result, TensorMeta, View, WindowView,
};
use smallvec::SmallVec;
use std::sync::{Arc, LazyLock};

/// The expression that copies its one input: a reshape that cannot view writes its
/// input's elements into its slot with it.
static COPY: LazyLock<FusedExpr> = LazyLock::new(|| FusedExpr {
    steps: vec![ExprStep::Input(0)],
    results: vec![0],
    inputs: 1,
});

/// Slots taken out of the arena to be written, put back by the caller.
type TakenSlots<B> = SmallVec<[Arc<<B as Backend>::Storage>; 8]>;

/// Where a node's value lives during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Src {
    /// Not materialised (computed inside a kernel).
    None,
    /// The caller's input `k`.
    Input(usize),
    /// A slot of the arena.
    Slot(usize),
    /// The program's prologue scratch buffer.
    Scratch,
    /// The columns of this unfold node, stored for a backend that reads them from
    /// memory ([`Buffers::columns`]).
    Columns(NodeId),
}

/// The buffers of a program: one per slot, the prologue scratch, and where each node's
/// value is during a run.
#[derive(Debug)]
pub(super) struct Buffers<B: Backend> {
    pub(super) arena: Vec<Option<Arc<B::Storage>>>,
    pub(super) scratch: Option<B::Storage>,
    pub(super) src: Vec<Src>,
    pub(super) layout: Vec<Layout>,
    /// The last draw run, reseeded for the next one in place.
    pub(super) reseeded: Option<Op>,
    /// Columns of unfolds that products read through windows, stored where the backend
    /// reads them from memory: per unfold node, the buffer (kept between runs) and the
    /// run that last wrote it, so that a convolution's forward product and its weight
    /// gradient unfold once per run, as op-by-op execution does.
    pub(super) columns: Vec<(NodeId, B::Storage, u64)>,
    /// The number of the run in progress.
    pub(super) run: u64,
}

/// What one run reads: the plan, its resolution, the inputs and the device.
pub(super) struct Run<'a, B: Backend> {
    pub(super) plan: &'a Plan<SDim>,
    pub(super) r: &'a Resolved,
    pub(super) inputs: &'a [&'a RawTensor<B>],
    pub(super) device: &'a B::Device,
    pub(super) seeds: Seeds<'a, B>,
}

/// The slot a node is written to.
pub(super) fn slot_of(plan: &Plan<SDim>, n: NodeId) -> Result<usize> {
    plan.slot_of[n].ok_or_else(|| Error::invalid("run", format!("node {n} has no buffer slot")))
}

impl<B: Backend> Buffers<B> {
    /// The buffer behind a node's value.
    pub(super) fn storage<'a>(&'a self, run: &Run<'a, B>, n: NodeId) -> Result<&'a B::Storage> {
        match self.src[n] {
            Src::Input(k) => Ok(run.inputs[k].storage()),
            Src::Slot(s) => self.arena[s]
                .as_deref()
                .ok_or_else(|| Error::invalid("run", "slot read before written")),
            Src::Scratch => self
                .scratch
                .as_ref()
                .ok_or_else(|| Error::invalid("run", "scratch read before written")),
            Src::Columns(u) => (self.columns.iter())
                .find(|(node, _, _)| *node == u)
                .map(|(_, columns, _)| columns)
                .ok_or_else(|| Error::invalid("run", "columns read before written")),
            Src::None => Err(Error::invalid(
                "run",
                format!("node {n} read before it was computed"),
            )),
        }
    }

    /// Takes slot `s` out of the arena as a buffer that can be written: the old one if
    /// nobody else holds it and it fits, else a new one.
    pub(super) fn take_slot(&mut self, run: &Run<'_, B>, s: usize) -> Result<Arc<B::Storage>> {
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

    /// Takes the slots of `nodes` out of the arena as buffers that can be written (see
    /// [`Buffers::take_slot`]), all or none; the caller puts them back.
    pub(super) fn take_slots(
        &mut self,
        run: &Run<'_, B>,
        nodes: &[NodeId],
    ) -> Result<(SmallVec<[usize; 8]>, TakenSlots<B>)> {
        let slots = (nodes.iter())
            .map(|&n| slot_of(run.plan, n))
            .collect::<Result<SmallVec<[usize; 8]>>>()?;
        let mut bufs = SmallVec::<[Arc<B::Storage>; 8]>::new();
        for &s in &slots {
            match self.take_slot(run, s) {
                Ok(buf) => bufs.push(buf),
                Err(e) => {
                    for (&s, buf) in slots.iter().zip(bufs) {
                        self.arena[s] = Some(buf);
                    }
                    return Err(e);
                }
            }
        }
        Ok((slots, bufs))
    }

    /// Writes `node`'s slot with `write` (which reads other values through `self`),
    /// then records where the node's value is.
    pub(super) fn write_slot(
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

    /// The input views of op node `node`, fitted to what the backend's op expects (held
    /// inline up to six, attention's gradients' count: a step allocates nothing).
    pub(super) fn op_views<'a>(
        &'a self,
        run: &Run<'a, B>,
        node: NodeId,
        op: &Op,
    ) -> Result<smallvec::SmallVec<[View<'a, B>; 6]>> {
        let mut views = run.plan.graph.nodes[node]
            .inputs
            .iter()
            .map(|&n| {
                Ok(View {
                    storage: self.storage(run, n)?,
                    layout: self.layout[n],
                })
            })
            .collect::<Result<smallvec::SmallVec<[View<'a, B>; 6]>>>()?;
        fit_views(op, &mut views, &run.r.dims[node])?;
        Ok(views)
    }

    /// Views of `nodes`, broadcast to `dims` (an elementwise expression's inputs, held
    /// inline up to sixteen, what the CPU's fused kernels take).
    pub(super) fn views<'a>(
        &'a self,
        run: &Run<'a, B>,
        nodes: &[NodeId],
        dims: &Dims,
    ) -> Result<smallvec::SmallVec<[View<'a, B>; 16]>> {
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
    pub(super) fn tensor(&self, run: &Run<'_, B>, n: NodeId) -> Result<RawTensor<B>> {
        let storage = match self.src[n] {
            Src::Input(k) => run.inputs[k].storage().clone(),
            Src::Slot(s) => self.arena[s]
                .clone()
                .ok_or_else(|| Error::invalid("run", "slot read before written"))?,
            Src::Scratch | Src::Columns(_) | Src::None => {
                return Err(Error::invalid(
                    "run",
                    format!("node {n} read before it was computed"),
                ))
            }
        };
        RawTensor::from_arc(storage, self.layout[n], run.device.clone())
    }

    /// Output node `o`'s value, once the step computing it has run.
    pub(super) fn output(
        &self,
        inputs: &[&RawTensor<B>],
        o: NodeId,
        device: &B::Device,
    ) -> Result<RawTensor<B>> {
        let storage = match self.src[o] {
            Src::Input(k) => inputs[k].storage().clone(),
            Src::Slot(s) => self.arena[s].clone().expect("written slots hold a buffer"),
            Src::None | Src::Scratch | Src::Columns(_) => {
                return Err(Error::invalid(
                    "run",
                    format!("output node {o} was not written"),
                ))
            }
        };
        RawTensor::from_arc(storage, self.layout[o], device.clone())
    }

    /// Runs one kernel.
    pub(super) fn step(
        &mut self,
        run: &Run<'_, B>,
        step: &Step,
        parts: &mut dyn Parts<B>,
    ) -> Result<()> {
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
                window,
                fold,
                output,
            } => {
                let op = r.ops[*main].as_ref().expect("main nodes are ops");
                if let Some(read) = window {
                    if self.windowed_product(run, *main, op, read, epilogue, *output)? {
                        return Ok(());
                    }
                    self.stored_columns(run, read)?;
                }
                if let Some(fold) = fold {
                    return self.folded_product(run, *main, op, fold);
                }
                if let Some(prologue) = prologue {
                    if self.reduce_with_prologue(run, *main, op, prologue, epilogue, *output)? {
                        return Ok(());
                    }
                    self.prologue(run, prologue)?;
                }
                self.write_slot(run, *output, |b, out| {
                    let views = b.op_views(run, *main, op)?;
                    // A product whose epilogue the device fuses into it (one call).
                    if let (OpClass::Contraction, Some((expr, _, ins))) = (op.class(), epilogue) {
                        let epilogue_views = b.views(run, ins, &r.dims[*output])?;
                        if let Some(fused) = B::product_with_epilogue(
                            device,
                            op,
                            &views,
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
            Step::Single { node, op } => self.single(run, *node, op),
            Step::OnePass { nodes, ops } => {
                if ops.iter().any(|op| device_seed(op, run.seeds).is_some()) {
                    // Draws whose seed is in device memory run one by one.
                    for (&node, op) in nodes.iter().zip(ops) {
                        self.single(run, node, op)?;
                    }
                    return Ok(());
                }
                self.one_pass(run, nodes, ops)
            }
            Step::View { node } => self.view(run, *node),
            Step::Rows(rows) => self.rows(run, rows, parts),
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

    /// One op into its slot.
    fn single(&mut self, run: &Run<'_, B>, node: NodeId, op: &Op) -> Result<()> {
        let (r, device) = (run.r, run.device);
        if let Some(seed) = device_seed(op, run.seeds) {
            let meta = &r.metas[node];
            return self.write_slot(run, node, |b, out| {
                let views = b.op_views(run, node, op)?;
                *out = B::draw_with_device_seed(device, op, &views, seed.view(), meta)?;
                Ok(())
            });
        }
        // A draw runs reseeded in the program's own copy of it (no allocation).
        let mut reseeded = self.reseeded.take();
        let op = match (run_seed(op, run.seeds)?, &mut reseeded) {
            (Some(seed), Some(copy)) => {
                op.reseed_into(seed, copy);
                &*copy
            }
            (Some(seed), copy) => copy.insert(op.with_seed(seed)),
            (None, _) => op,
        };
        let result = self.write_slot(run, node, |b, out| {
            let views = b.op_views(run, node, op)?;
            B::execute_into(device, op, &views, &r.metas[node], out)
        });
        self.reseeded = reseeded;
        result
    }

    /// A row pass: one backend call where the backend runs passes, else its kernels
    /// one after another.
    fn rows(&mut self, run: &Run<'_, B>, rows: &RowsStep, parts: &mut dyn Parts<B>) -> Result<()> {
        for &v in &rows.before {
            self.view(run, v)?;
        }
        let (slots, mut bufs) = self.take_slots(run, &rows.outputs)?;
        let result = (|| {
            let views = (rows.inputs.iter())
                .map(|(n, dims)| {
                    let layout = if run.r.dims[*n] == *dims {
                        self.layout[*n]
                    } else {
                        self.layout[*n].broadcast_to(dims)?
                    };
                    Ok(View {
                        storage: self.storage(run, *n)?,
                        layout,
                    })
                })
                .collect::<Result<SmallVec<[View<'_, B>; 16]>>>()?;
            let mut outs: SmallVec<[&mut B::Storage; 8]> = bufs
                .iter_mut()
                .map(|b| Arc::get_mut(b).expect("taken slots are unique"))
                .collect();
            B::fused_rows(run.device, &rows.pass, &views, &mut outs)
        })();
        for (&s, buf) in slots.iter().zip(bufs) {
            self.arena[s] = Some(buf);
        }
        if !result? {
            for step in &rows.members {
                match step {
                    Step::View { node } if rows.before.contains(node) => {}
                    step => self.step(run, step, parts)?,
                }
            }
            return Ok(());
        }
        for (&n, &s) in rows.outputs.iter().zip(&slots) {
            self.src[n] = Src::Slot(s);
            self.layout[n] = Layout::contiguous(run.r.dims[n]);
        }
        for &v in &rows.after {
            self.view(run, v)?;
        }
        Ok(())
    }

    /// Ops one pass computes together, each into its slot; they read the first node's
    /// inputs.
    fn one_pass(&mut self, run: &Run<'_, B>, nodes: &[NodeId], ops: &[Op]) -> Result<()> {
        let (slots, mut bufs) = self.take_slots(run, nodes)?;
        let result = (|| {
            let ops = ops
                .iter()
                .map(|op| seeded(op, run.seeds))
                .collect::<Result<SmallVec<[_; 3]>>>()?;
            let ops: SmallVec<[&Op; 3]> = ops.iter().map(|op| op.as_ref()).collect();
            let views = self.op_views(run, nodes[0], ops[0])?;
            let metas: SmallVec<[&TensorMeta; 3]> =
                nodes.iter().map(|&n| &run.r.metas[n]).collect();
            let mut outs: SmallVec<[&mut B::Storage; 3]> = bufs
                .iter_mut()
                .map(|b| Arc::get_mut(b).expect("taken slots are unique"))
                .collect();
            B::execute_one_pass_into(run.device, &ops, &views, &metas, &mut outs)
        })();
        for (&s, buf) in slots.iter().zip(bufs) {
            self.arena[s] = Some(buf);
        }
        result?;
        for (&n, &s) in nodes.iter().zip(&slots) {
            self.src[n] = Src::Slot(s);
            self.layout[n] = Layout::contiguous(run.r.dims[n]);
        }
        Ok(())
    }

    /// A reduction of its prologue's result in one call where the backend fuses the
    /// two ([`Backend::reduce_with_prologue`]), then its epilogue in place; `false` when
    /// the backend leaves them apart (or `main` is no reduction of the prologue's root).
    fn reduce_with_prologue(
        &mut self,
        run: &Run<'_, B>,
        main: NodeId,
        op: &Op,
        prologue: &Prologue,
        epilogue: &Option<Epilogue>,
        output: NodeId,
    ) -> Result<bool> {
        let (expr, _, ins, root) = prologue;
        if !matches!(op, Op::Reduce { .. }) || run.plan.graph.nodes[main].inputs[..] != [*root] {
            return Ok(false);
        }
        let dims = run.r.dims[*root];
        let mut fused = false;
        self.write_slot(run, output, |b, out| {
            let views = b.views(run, ins, &dims)?;
            let Some(result) =
                B::reduce_with_prologue(run.device, op, expr, &views, &dims, &run.r.metas[main])?
            else {
                return Ok(());
            };
            *out = result;
            fused = true;
            if let Some((expr, native, ins)) = epilogue {
                let dims = run.r.dims[output];
                let views = b.views(run, ins, &dims)?;
                B::fused_elementwise(run.device, expr, *native, &views, &dims, &mut [out])?;
            }
            Ok(())
        })?;
        Ok(fused)
    }

    /// A product that reads one operand's columns through a window, and its epilogue,
    /// in one backend call ([`Backend::windowed_product_into`]); `false` when the
    /// backend leaves them to the caller.
    fn windowed_product(
        &mut self,
        run: &Run<'_, B>,
        main: NodeId,
        op: &Op,
        read: &WindowRead,
        epilogue: &Option<Epilogue>,
        output: NodeId,
    ) -> Result<bool> {
        let r = run.r;
        let Some(Op::Unfold2d(window)) = r.ops[read.unfold] else {
            return Err(Error::invalid("run", "a window read starts at no unfold"));
        };
        let columns = r.dims[read.unfold];
        let Some(layout) = viewed_through(run, Layout::contiguous(columns), &read.views)? else {
            return Ok(false);
        };
        let out_dims = r.dims[main];
        let image = run.plan.graph.nodes[read.unfold].inputs[0];
        let stored = run.plan.graph.nodes[main].inputs[1 - read.operand];
        let mut fused = false;
        self.write_slot(run, output, |b, out| {
            let window = ProductOperand::Window(WindowView {
                image: View {
                    storage: b.storage(run, image)?,
                    layout: b.layout[image],
                },
                window,
                columns,
                layout: fit_product_operand(layout, &out_dims)?,
            });
            let stored = ProductOperand::Stored(View {
                storage: b.storage(run, stored)?,
                layout: fit_product_operand(b.layout[stored], &out_dims)?,
            });
            let (lhs, rhs) = match read.operand {
                0 => (window, stored),
                _ => (stored, window),
            };
            fused = B::windowed_product_into(run.device, op, lhs, rhs, &r.metas[main], out)?;
            if let (true, Some((expr, native, ins))) = (fused, epilogue) {
                let dims = r.dims[output];
                let views = b.views(run, ins, &dims)?;
                B::fused_elementwise(run.device, expr, *native, &views, &dims, &mut [out])?;
            }
            Ok(())
        })?;
        Ok(fused)
    }

    /// The columns a window read would not store, written to memory (once per run for
    /// all the products that read them) and its views over them laid out, for a backend
    /// that reads them from memory.
    fn stored_columns(&mut self, run: &Run<'_, B>, read: &WindowRead) -> Result<()> {
        let unfold = read.unfold;
        let written = |c: &(NodeId, B::Storage, u64)| c.0 == unfold && c.2 == self.run;
        if !self.columns.iter().any(written) {
            let op = run.r.ops[unfold].as_ref().expect("unfolds are ops");
            let len = run.r.dims[unfold].numel();
            let at = self.columns.iter().position(|c| c.0 == unfold);
            let mut columns = match at.map(|i| self.columns.swap_remove(i)) {
                Some((_, s, _)) if B::storage_len(&s) >= len => s,
                _ => B::alloc(run.device, DType::F32, len)?,
            };
            let result = (self.op_views(run, unfold, op)).and_then(|views| {
                B::execute_into(run.device, op, &views, &run.r.metas[unfold], &mut columns)
            });
            self.columns.push((unfold, columns, self.run));
            result?;
        }
        self.src[unfold] = Src::Columns(unfold);
        self.layout[unfold] = Layout::contiguous(run.r.dims[unfold]);
        for &v in &read.views {
            self.view(run, v)?;
        }
        Ok(())
    }

    /// Op node `node` (f32) computed into the scratch buffer.
    fn compute_in_scratch(&mut self, run: &Run<'_, B>, node: NodeId, op: &Op) -> Result<()> {
        let dims = run.r.dims[node];
        let mut scratch = self.f32_scratch(run, dims.numel())?;
        let result = self.op_views(run, node, op).and_then(|views| {
            B::execute_into(run.device, op, &views, &run.r.metas[node], &mut scratch)
        });
        self.scratch = Some(scratch);
        result?;
        self.src[node] = Src::Scratch;
        self.layout[node] = Layout::contiguous(dims);
        Ok(())
    }

    /// The scratch buffer taken out to be written, at least `len` f32 values long.
    fn f32_scratch(&mut self, run: &Run<'_, B>, len: usize) -> Result<B::Storage> {
        match self.scratch.take() {
            Some(s) if B::storage_len(&s) >= len && B::storage_dtype(&s) == DType::F32 => Ok(s),
            _ => B::alloc(run.device, DType::F32, len),
        }
    }

    /// A product whose result a fold takes: one backend call where the backend fuses
    /// them ([`Backend::folded_product_into`]), else the product into the scratch
    /// buffer, then the fold into its slot.
    fn folded_product(
        &mut self,
        run: &Run<'_, B>,
        main: NodeId,
        op: &Op,
        fold: &FoldWrite,
    ) -> Result<()> {
        let r = run.r;
        let fold_op = r.ops[fold.fold].as_ref().expect("folds are ops");
        let Op::Fold2d {
            window,
            height,
            width,
        } = *fold_op
        else {
            return Err(Error::invalid("run", "a folded product ends at no fold"));
        };
        if let Some(columns) = viewed_through(run, Layout::contiguous(r.dims[main]), &fold.views)? {
            let into = FoldInto {
                columns,
                window,
                height,
                width,
            };
            let mut fused = false;
            self.write_slot(run, fold.fold, |b, out| {
                let views = b.op_views(run, main, op)?;
                let (product, meta) = (&r.metas[main], &r.metas[fold.fold]);
                fused = B::folded_product_into(run.device, op, &views, product, &into, meta, out)?;
                Ok(())
            })?;
            if fused {
                return Ok(());
            }
        }
        self.compute_in_scratch(run, main, op)?;
        for &v in &fold.views {
            self.view(run, v)?;
        }
        self.single(run, fold.fold, fold_op)
    }

    /// A reduction's or product's prologue, into the scratch buffer.
    pub(super) fn prologue(&mut self, run: &Run<'_, B>, prologue: &Prologue) -> Result<()> {
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
    pub(super) fn view(&mut self, run: &Run<'_, B>, node: NodeId) -> Result<()> {
        let input = run.plan.graph.nodes[node].inputs[0];
        let l = self.layout[input];
        let dims = run.r.dims[node];
        match viewed(run.r.ops[node].as_ref().expect("views are ops"), l, dims)? {
            Some(layout) => {
                self.src[node] = self.src[input];
                self.layout[node] = layout;
            }
            // The input's elements in row-major order are the reshape's: an f32 value,
            // or a half one (which fused kernels read and write at their edges, and
            // copy exactly through f32), is copied into the node's slot over the
            // input's own dims (no allocation once the slot has grown); other dtypes,
            // which fused kernels do not all read and write, into a fresh buffer.
            None if {
                let dtype = run.plan.graph.nodes[node].meta.dtype;
                dtype == DType::F32 || dtype.is_half()
            } =>
            {
                let in_dims = *l.dims();
                self.write_slot(run, node, |b, out| {
                    let view = View {
                        storage: b.storage(run, input)?,
                        layout: l,
                    };
                    B::fused_elementwise(run.device, &COPY, None, &[view], &in_dims, &mut [out])
                })?;
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

/// `layout` seen through the view nodes `views` in turn, or `None` where a reshape
/// cannot view it.
fn viewed_through<B: Backend>(
    run: &Run<'_, B>,
    mut layout: Layout,
    views: &[NodeId],
) -> Result<Option<Layout>> {
    for &v in views {
        match viewed(
            run.r.ops[v].as_ref().expect("views are ops"),
            layout,
            run.r.dims[v],
        )? {
            Some(l) => layout = l,
            None => return Ok(None),
        }
    }
    Ok(Some(layout))
}

/// Layout `l` seen through view `op` (result `dims`), or `None` where a reshape
/// cannot view it.
fn viewed(op: &Op, l: Layout, dims: Dims) -> Result<Option<Layout>> {
    Ok(match op {
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
    })
}
