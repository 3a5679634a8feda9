//! Launching the fused elementwise kernel (`Backend::fused_elementwise`): checks the
//! operands, picks the vectorised or the strided variant, and launches one kernel for
//! the whole expression.

use crate::device::{CubeDevice, DeviceState, KilnRuntime};
use crate::kernels::fused::{self as k, FusedConfig, HalfEdges};
use crate::ops::elementwise::arg;
use crate::storage::CubeStorage;
use crate::strided::{elementwise_meta, grid, word, Operand, BLOCK};
use crate::CubeBackend;
use cubecl::prelude::*;
use kiln_tensor::fused::FusedExpr;
use kiln_tensor::{DType, Dims, Error, Result, View};

type V<'a, R> = View<'a, CubeBackend<R>>;

/// Elements per unit of the vectorised variant: 16-byte loads and stores.
const VECTOR: usize = 4;

/// Runs `expr` over `dims` (the `Backend::fused_elementwise` contract).
pub fn fused_elementwise<R: KilnRuntime>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    dims: &Dims,
    outputs: &mut [&mut CubeStorage<R>],
) -> Result<()> {
    let dev = &device.state;
    let n: usize = dims.iter().product();
    check_operands(device, expr, inputs, dims, outputs, n, &[DType::F32])?;
    if n == 0 {
        return Ok(());
    }
    note_overwritten(dev, expr, inputs, outputs);
    let c = &dev.client;
    let broadcast: Vec<bool> = inputs
        .iter()
        .map(|v| v.layout.strides().iter().all(|&s| s == 0))
        .collect();
    let vectorizable = n.is_multiple_of(VECTOR)
        && inputs
            .iter()
            .zip(&broadcast)
            .all(|(v, &b)| v.layout.offset() == 0 && (b || v.layout.is_contiguous()));
    if vectorizable {
        let units = n / VECTOR;
        // Large launches give each unit several vectors (more loads in flight).
        let per_unit = if units >= 1 << 20 { 4 } else { 1 };
        let (config, consts) = FusedConfig::new(expr, broadcast.clone(), 0, per_unit);
        note_kernel(dev, &config);
        let mut vectors = SequenceArg::new();
        let mut scalars = SequenceArg::new();
        for (v, &b) in inputs.iter().zip(&broadcast) {
            if b {
                scalars.push(arg(v.storage));
            } else {
                vectors.push(vector_arg(v.storage));
            }
        }
        let mut outs = SequenceArg::new();
        for o in outputs.iter() {
            outs.push(vector_arg(o));
        }
        let (count, dim) = grid(units.div_ceil(per_unit as usize), BLOCK);
        // SAFETY: every vector array covers at least `units` vectors (inputs are
        // contiguous with `n` elements from offset 0, outputs hold at least `n`), scalar
        // inputs hold their element 0, and the kernel reads below `units` and stores
        // only there.
        unsafe {
            k::fused_vectorized::launch_unchecked::<R>(
                c,
                count,
                dim,
                VECTOR,
                vectors,
                scalars,
                outs,
                word(units)?,
                0.0,
                constants(consts),
                config,
            )
        }
        return Ok(());
    }
    let operands: Vec<Operand> = inputs.iter().map(|v| Operand::of(&v.layout)).collect();
    let (rank, words) = elementwise_meta(dims, &operands)?;
    let mut meta = SequenceArg::new();
    for w in words {
        meta.push(w);
    }
    let (config, consts) = FusedConfig::new(expr, Vec::new(), rank, 1);
    note_kernel(dev, &config);
    let mut ins = SequenceArg::new();
    for v in inputs {
        ins.push(arg(v.storage));
    }
    let mut outs = SequenceArg::new();
    for o in outputs.iter() {
        outs.push(arg(o));
    }
    let (count, dim) = grid(n, BLOCK);
    // SAFETY: every input's layout was checked against its buffer, every output holds
    // at least `n` elements, and the kernel checks `pos < n`.
    unsafe {
        k::fused_strided::launch_unchecked::<R>(
            c,
            count,
            dim,
            ins,
            outs,
            meta,
            0.0,
            constants(consts),
            config,
        )
    }
    Ok(())
}

/// [`fused_elementwise`] for a group at whose edges mixed precision casts (bf16 inputs
/// or outputs beside f32 ones): one kernel that widens and narrows at the edges,
/// vectorised where the operands allow ([`k::fused_mixed_vectorized`]), else strided
/// ([`k::fused_mixed`]). Returns `false`, having done nothing, for operands of
/// other dtypes (f16, bool), which the caller runs another way.
pub fn fused_mixed<R: KilnRuntime>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    dims: &Dims,
    outputs: &mut [&mut CubeStorage<R>],
) -> Result<bool> {
    let edge = |d: DType| d == DType::F32 || d == DType::BF16;
    if !inputs.iter().all(|v| edge(v.storage.dtype)) || !outputs.iter().all(|o| edge(o.dtype)) {
        return Ok(false);
    }
    let dev = &device.state;
    let n: usize = dims.iter().product();
    check_operands(
        device,
        expr,
        inputs,
        dims,
        outputs,
        n,
        &[DType::F32, DType::BF16],
    )?;
    if n == 0 {
        return Ok(true);
    }
    note_overwritten(dev, expr, inputs, outputs);
    let halves = HalfEdges {
        inputs: inputs
            .iter()
            .map(|v| v.storage.dtype == DType::BF16)
            .collect(),
        outputs: outputs.iter().map(|o| o.dtype == DType::BF16).collect(),
    };
    // Broadcast f32 scalars, contiguous f32 and bf16 vectors: the vectorised kernel.
    let broadcast: Vec<bool> = inputs
        .iter()
        .map(|v| v.storage.dtype == DType::F32 && v.layout.strides().iter().all(|&s| s == 0))
        .collect();
    let vectorizable = n.is_multiple_of(VECTOR)
        && inputs
            .iter()
            .zip(&broadcast)
            .all(|(v, &b)| b || (v.layout.offset() == 0 && v.layout.is_contiguous()));
    if vectorizable {
        let units = n / VECTOR;
        let per_unit = if units >= 1 << 20 { 4 } else { 1 };
        let (config, consts) = FusedConfig::new(expr, broadcast.clone(), 0, per_unit);
        note_kernel(dev, &config);
        let (mut vectors, mut half_vectors, mut scalars) =
            (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
        for (v, &b) in inputs.iter().zip(&broadcast) {
            match (b, v.storage.dtype) {
                (true, _) => scalars.push(arg(v.storage)),
                (false, DType::BF16) => half_vectors.push(vector_arg(v.storage)),
                (false, _) => vectors.push(vector_arg(v.storage)),
            }
        }
        let (mut outs, mut half_outs) = (SequenceArg::new(), SequenceArg::new());
        for o in outputs.iter() {
            match o.dtype {
                DType::BF16 => half_outs.push(vector_arg(o)),
                _ => outs.push(vector_arg(o)),
            }
        }
        let (count, dim) = grid(units.div_ceil(per_unit as usize), BLOCK);
        // SAFETY: as for `fused_vectorized`, each operand bound in the sequence of its
        // kind: vector arrays cover at least `units` vectors of their dtype, broadcast
        // inputs hold their element 0, and stores stay below `units`.
        unsafe {
            k::fused_mixed_vectorized::launch_unchecked::<R>(
                &dev.client,
                count,
                dim,
                VECTOR,
                vectors,
                half_vectors,
                scalars,
                outs,
                half_outs,
                word(units)?,
                0.0,
                constants(consts),
                config,
                halves,
            )
        }
        return Ok(true);
    }
    let operands: Vec<Operand> = inputs.iter().map(|v| Operand::of(&v.layout)).collect();
    let (rank, words) = elementwise_meta(dims, &operands)?;
    let mut meta = SequenceArg::new();
    for w in words {
        meta.push(w);
    }
    let (config, consts) = FusedConfig::new(expr, Vec::new(), rank, 1);
    note_kernel(dev, &config);
    let (mut ins, mut half_ins) = (SequenceArg::new(), SequenceArg::new());
    for v in inputs {
        match v.storage.dtype {
            DType::BF16 => half_ins.push(arg(v.storage)),
            _ => ins.push(arg(v.storage)),
        }
    }
    let (mut outs, mut half_outs) = (SequenceArg::new(), SequenceArg::new());
    for o in outputs.iter() {
        match o.dtype {
            DType::BF16 => half_outs.push(arg(o)),
            _ => outs.push(arg(o)),
        }
    }
    let (count, dim) = grid(n, BLOCK);
    // SAFETY: every input's layout was checked against its buffer, every output holds
    // at least `n` elements, each operand is bound in the sequence of its dtype, and the
    // kernel checks `pos < n`.
    unsafe {
        k::fused_mixed::launch_unchecked::<R>(
            &dev.client,
            count,
            dim,
            ins,
            half_ins,
            outs,
            half_outs,
            meta,
            0.0,
            constants(consts),
            config,
            halves,
        )
    }
    Ok(true)
}

/// Outputs the expression neither reads nor takes as an input are overwritten (for a
/// graph capture's rules: they carry no state into the step). A buffer longer than the
/// kernel's extent counts too: it is a reused slot, read only as far as written.
fn note_overwritten<R: KilnRuntime>(
    dev: &DeviceState<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    outputs: &[&mut CubeStorage<R>],
) {
    for (k, o) in outputs.iter().enumerate() {
        let read = expr
            .steps
            .contains(&kiln_tensor::fused::ExprStep::Output(k))
            || inputs.iter().any(|v| v.storage.id == o.id);
        if !read {
            dev.note_overwritten(o);
        }
    }
}

/// Records a configuration CubeCL compiles (once) and caches.
fn note_kernel<R: KilnRuntime>(dev: &DeviceState<R>, config: &FusedConfig) {
    let mut seen = dev.fused_kernels.lock().expect("fused kernels");
    if !seen.contains(config) {
        seen.insert(config.clone());
    }
}

/// An expression's constants as scalar kernel arguments.
fn constants<R: KilnRuntime>(values: Vec<f32>) -> SequenceArg<R, f32> {
    let mut seq = SequenceArg::new();
    for v in values {
        seq.push(v);
    }
    seq
}

/// A whole buffer as an array of vectors of its dtype (its length rounded down).
fn vector_arg<R: KilnRuntime>(s: &CubeStorage<R>) -> ArrayArg<R> {
    s.device.note_bound(s);
    // SAFETY: the length in vectors never exceeds the buffer.
    unsafe { ArrayArg::from_raw_parts(s.handle.clone(), (s.len / VECTOR).max(1)) }
}

/// Refuses operands that do not match the expression, the dims or the device.
fn check_operands<R: KilnRuntime>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    dims: &Dims,
    outputs: &[&mut CubeStorage<R>],
    n: usize,
    dtypes: &[DType],
) -> Result<()> {
    let takes = dtypes
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(" or ");
    const OP: &str = "fused_elementwise";
    if inputs.len() != expr.inputs || outputs.len() != expr.results.len() {
        return Err(Error::invalid(
            OP,
            format!(
                "the expression reads {} inputs and writes {} outputs, given {} and {}",
                expr.inputs,
                expr.results.len(),
                inputs.len(),
                outputs.len()
            ),
        ));
    }
    let same_device = |s: &CubeStorage<R>| std::sync::Arc::ptr_eq(&s.device, &device.state);
    for (i, v) in inputs.iter().enumerate() {
        if !dtypes.contains(&v.storage.dtype) || v.layout.dims() != dims {
            return Err(Error::invalid(
                OP,
                format!(
                    "input {i} is {:?} {:?}, the kernel reads {takes} {:?}",
                    v.storage.dtype,
                    v.layout.dims(),
                    &dims[..]
                ),
            ));
        }
        if !same_device(v.storage) {
            return Err(Error::invalid(
                OP,
                format!("input {i} is on another device"),
            ));
        }
        crate::check_extent(v.storage, &v.layout)?;
    }
    for (i, o) in outputs.iter().enumerate() {
        if !dtypes.contains(&o.dtype) || o.len < n {
            return Err(Error::invalid(
                OP,
                format!(
                    "output {i} is {:?} of {} elements, the kernel writes {n} {takes}",
                    o.dtype, o.len
                ),
            ));
        }
        if !same_device(o) {
            return Err(Error::invalid(
                OP,
                format!("output {i} is on another device"),
            ));
        }
    }
    Ok(())
}
