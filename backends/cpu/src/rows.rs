//! Row passes on the CPU ([`kiln_tensor::rows`]): the rows are cut into blocks of about
//! 16K elements (in parallel with rayon when there are many), and every phase of
//! the pass runs over one block before the next block starts, so a layer norm reads
//! its input from memory once and its statistics never leave the cache. Each phase is
//! the kernel it stands for run over the block's rows (the fused kernels' loops, the
//! reductions' row sums), so a pass gives the bits of its kernels run apart. Scratch is
//! per thread and reused: after the first run nothing is allocated.

use crate::fused::{self, Operand, OutPtr, MAX_OPERANDS};
use crate::reduce::reduce_row_f32;
use crate::storage::CpuStorage;
use kiln_tensor::rows::{RowPass, RowPhase, RowRead, RowTarget};
use kiln_tensor::shape::MAX_RANK;
use kiln_tensor::{Dims, Error, Layout, Result, View};
use rayon::prelude::*;
use smallvec::SmallVec;
use std::cell::RefCell;

/// Elements per block: a few blocks of each value fit in L1 and L2 at once.
const BLOCK: usize = 16384;
/// Below this many elements a pass runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;
/// The most values a pass may read here (more run as their kernels).
const MAX_INPUTS: usize = 32;
/// The most values a pass may write here (more run as their kernels).
const MAX_OUTPUTS: usize = 16;

thread_local! {
    /// Per-thread scratch: the pass's scratch block, then one staged row.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// An input of the pass: its elements, its row length (the pass's width or 1), where
/// each row starts, and how many rows in a row start at a fixed stride.
struct Input<'a> {
    data: Operand<'a>,
    width: usize,
    last_stride: usize,
    lead_dims: [usize; MAX_RANK],
    lead_strides: [usize; MAX_RANK],
    lead: usize,
    offset: usize,
    /// Rows `s·segment .. (s+1)·segment` start `row_stride` apart.
    segment: usize,
    row_stride: usize,
}

impl Input<'_> {
    /// Where row `row` starts.
    fn row_start(&self, mut row: usize) -> usize {
        let mut at = self.offset;
        for a in (0..self.lead).rev() {
            at += (row % self.lead_dims[a]) * self.lead_strides[a];
            row /= self.lead_dims[a];
        }
        at
    }

    /// Rows `first..first + n` (inside one segment) as a layout of `data`.
    fn block(&self, first: usize, n: usize) -> Layout {
        let dims = Dims::new(&[n, self.width]).expect("two dims");
        Layout::from_parts(
            dims,
            &[self.row_stride, self.last_stride],
            self.row_start(first),
        )
    }
}

/// An output of the pass: a contiguous buffer of `rows · width` elements.
#[derive(Clone, Copy)]
struct Output {
    ptr: OutPtr,
    width: usize,
}

impl Output {
    /// Rows `first..first + n`, read as an operand.
    ///
    /// # Safety
    /// Those rows lie inside the buffer and no one writes them meanwhile.
    unsafe fn rows(self, first: usize, n: usize) -> Operand<'static> {
        let (at, len) = (first * self.width, n * self.width);
        // SAFETY: per the caller.
        unsafe {
            match self.ptr {
                OutPtr::F32(p) => Operand::F32(std::slice::from_raw_parts(p.add(at), len)),
                OutPtr::Bool(p) => Operand::Bool(std::slice::from_raw_parts(p.add(at), len)),
                OutPtr::BF16(p) => Operand::BF16(std::slice::from_raw_parts(p.add(at), len)),
                OutPtr::F16(p) => Operand::F16(std::slice::from_raw_parts(p.add(at), len)),
            }
        }
    }
}

/// Runs `pass` over `inputs` into `outputs`; see [`kiln_tensor::Backend::fused_rows`].
/// `Ok(false)` where the kernels should run apart (an operand of a type the fused
/// kernels do not read, or more operands than they take).
pub fn fused_rows(
    pass: &RowPass,
    inputs: &[View<'_, crate::Cpu>],
    outputs: &mut [&mut CpuStorage],
) -> Result<bool> {
    let (rows, width) = (pass.rows, pass.width);
    let bad = |why: String| Err(Error::invalid("row pass", why));
    if width <= 1 || rows == 0 {
        // Nothing to compute, reductions of empty rows (the kernels say what is
        // wrong), or rows of one value, where a pass gains nothing.
        return Ok(false);
    }
    if outputs.len() != pass.whole_rows.len() {
        return bad(format!(
            "{} outputs for a pass that writes {}",
            outputs.len(),
            pass.whole_rows.len()
        ));
    }
    if outputs.len() > MAX_OUTPUTS || inputs.len() > MAX_INPUTS {
        return Ok(false);
    }
    let mut outs: SmallVec<[Output; MAX_OUTPUTS]> = SmallVec::new();
    let mut ins: SmallVec<[Input<'_>; MAX_INPUTS]> = SmallVec::new();
    for (i, v) in inputs.iter().enumerate() {
        let Some(data) = Operand::of(v.storage) else {
            return Ok(false);
        };
        pass.check_input(i, &v.layout, &inputs[0].layout)?;
        if v.layout.storage_extent() > data.len() {
            return bad(format!(
                "input {i} with layout {:?} reaches past its {} elements",
                v.layout,
                data.len()
            ));
        }
        let (d, st) = (v.layout.dims(), v.layout.strides());
        let r = d.len();
        let lead = &d[..r - 1];
        let w = d[r - 1];
        let mut input = Input {
            data,
            width: w,
            last_stride: st[r - 1],
            lead_dims: [1; MAX_RANK],
            lead_strides: [0; MAX_RANK],
            lead: r - 1,
            offset: v.layout.offset(),
            segment: 1,
            row_stride: 0,
        };
        input.lead_dims[..r - 1].copy_from_slice(lead);
        input.lead_strides[..r - 1].copy_from_slice(&st[..r - 1]);
        // The innermost lead dims whose strides merge: rows there start evenly apart.
        for a in (0..r - 1).rev() {
            if d[a] == 1 {
                continue;
            }
            if input.segment == 1 {
                (input.segment, input.row_stride) = (d[a], st[a]);
            } else if st[a] == input.row_stride * input.segment {
                input.segment *= d[a];
            } else {
                break;
            }
        }
        ins.push(input);
    }
    for (k, (o, &whole)) in outputs.iter_mut().zip(&pass.whole_rows).enumerate() {
        let w = if whole { width } else { 1 };
        let Some((len, ptr)) = OutPtr::of(o) else {
            return Ok(false);
        };
        if len < rows * w {
            return bad(format!("output {k} holds {len} < {} elements", rows * w));
        }
        outs.push(Output { ptr, width: w });
    }
    if !check_phases(pass, &ins, &outs)? {
        return Ok(false);
    }
    // Blocks of whole rows that never cross the end of a segment of any input.
    let segment = ins.iter().map(|i| i.segment).min().unwrap_or(rows).max(1);
    let per_block = (BLOCK / width).clamp(1, segment);
    let blocks_per_segment = segment.div_ceil(per_block);
    let blocks = rows.div_ceil(segment) * blocks_per_segment;
    let block = |b: usize| {
        let (s, j) = (b / blocks_per_segment, b % blocks_per_segment);
        let first = s * segment + j * per_block;
        let n = per_block.min((s + 1) * segment - first).min(rows - first);
        // SAFETY: block `b` alone reads and writes rows `first..first + n` of every
        // output, which `check_phases` found inside them.
        unsafe { run_block(pass, &ins, &outs, first, n) };
    };
    if rows * width < PARALLEL_MIN || blocks == 1 {
        (0..blocks).for_each(block);
    } else {
        (0..blocks).into_par_iter().for_each(block);
    }
    Ok(true)
}

/// Checks the pass ([`RowPass::check`]) and what this backend adds: reductions write
/// f32 values. `Ok(false)` for expressions with more operands than the fused kernels
/// take.
fn check_phases(pass: &RowPass, ins: &[Input<'_>], outs: &[Output]) -> Result<bool> {
    let per_row: SmallVec<[bool; MAX_INPUTS]> = ins.iter().map(|i| i.width == 1).collect();
    pass.check(&per_row)?;
    for phase in &pass.phases {
        match phase {
            RowPhase::Map { inputs, .. } if inputs.len() > MAX_OPERANDS => return Ok(false),
            RowPhase::Reduce { out, .. } if !matches!(outs[*out].ptr, OutPtr::F32(_)) => {
                return Err(Error::invalid(
                    "row pass",
                    "a reduction writes no f32 values".to_string(),
                ))
            }
            _ => {}
        }
    }
    Ok(true)
}

/// Runs every phase over rows `first..first + n`.
///
/// # Safety
/// No one else reads or writes those rows of the outputs meanwhile, and the pass
/// passed [`check_phases`] for these inputs and outputs.
unsafe fn run_block(pass: &RowPass, ins: &[Input<'_>], outs: &[Output], first: usize, n: usize) {
    let width = pass.width;
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < (n + 1) * width {
            s.resize((n + 1) * width, 0.0);
        }
        let (block, row) = s.split_at_mut(n * width);
        let row = &mut row[..width];
        // Phases write the block through this pointer and read it as a slice, never
        // both in one phase (`check_phases`).
        let block = block.as_mut_ptr();
        // SAFETY: the block holds `n · width` elements and nobody writes it while the
        // slice is used.
        let block_rows = |j: usize, m: usize| unsafe {
            std::slice::from_raw_parts(block.add(j * width).cast_const(), m * width)
        };
        for phase in &pass.phases {
            match phase {
                RowPhase::Map {
                    expr,
                    native,
                    inputs,
                    target,
                    per_row,
                } => {
                    let w = if *per_row { 1 } else { width };
                    let dims = Dims::new(&[n, w]).expect("two dims");
                    let mut datas = [Operand::F32(&[]); MAX_OPERANDS];
                    let mut layouts = [Layout::contiguous(dims); MAX_OPERANDS];
                    for (i, r) in inputs.iter().enumerate() {
                        (datas[i], layouts[i]) = match *r {
                            RowRead::Input(k) => (ins[k].data, ins[k].block(first, n)),
                            // SAFETY: this block's rows, written by an earlier phase.
                            RowRead::Output { k, broadcast } => {
                                (unsafe { outs[k].rows(first, n) }, {
                                    if broadcast {
                                        Layout::from_parts(dims, &[1, 0], 0)
                                    } else {
                                        Layout::contiguous(dims)
                                    }
                                })
                            }
                            RowRead::Scratch => {
                                (Operand::F32(block_rows(0, n)), Layout::contiguous(dims))
                            }
                        };
                    }
                    let out = match *target {
                        // SAFETY: this block's rows of output `k`.
                        RowTarget::Output(k) => unsafe { outs[k].ptr.add(first * outs[k].width) },
                        RowTarget::Scratch => OutPtr::F32(block),
                    };
                    let k = inputs.len();
                    // Not in parallel: this thread holds its scratch.
                    let (datas, layouts) = (&datas[..k], &layouts[..k]);
                    fused::run(expr, *native, datas, layouts, &dims, &[out], false);
                }
                RowPhase::Reduce { op, input, out } => {
                    let OutPtr::F32(p) = outs[*out].ptr else {
                        unreachable!("check_phases: reductions write f32")
                    };
                    // SAFETY: this block's rows of the output.
                    let results = unsafe { std::slice::from_raw_parts_mut(p.add(first), n) };
                    for (j, result) in results.iter_mut().enumerate() {
                        let values: &[f32] = match *input {
                            RowRead::Scratch => block_rows(j, 1),
                            RowRead::Output { k, .. } => {
                                match unsafe { outs[k].rows(first + j, 1) } {
                                    Operand::F32(d) => d,
                                    d => {
                                        d.stage(0, 1, row);
                                        row
                                    }
                                }
                            }
                            RowRead::Input(k) => {
                                let i = &ins[k];
                                let at = i.row_start(first + j);
                                match i.data {
                                    Operand::F32(d) if i.last_stride == 1 => &d[at..at + width],
                                    d => {
                                        d.stage(at, i.last_stride, row);
                                        row
                                    }
                                }
                            }
                        };
                        *result = reduce_row_f32(*op, values);
                    }
                }
            }
        }
    });
}
