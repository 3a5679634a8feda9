//! Launching the fused elementwise kernel (`Backend::fused_elementwise`): checks the
//! operands, picks the vectorised or the strided variant, and launches one kernel for
//! the whole expression.

use crate::device::{CubeDevice, DeviceState, KilnRuntime};
use crate::kernels::fused::{self as k, FusedConfig, HalfEdges, InputKind};
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
    let kinds: Option<Vec<(InputKind, u32)>> = inputs.iter().map(|v| input_kind(v, dims)).collect();
    if let Some(kinds) = kinds.filter(|_| n.is_multiple_of(VECTOR)) {
        let units = n / VECTOR;
        let per_unit = vectors_per_unit(units);
        let (config, consts) =
            FusedConfig::new(expr, kinds.iter().map(|k| k.0).collect(), 0, per_unit);
        note_kernel(dev, &config);
        let mut vectors = SequenceArg::new();
        let mut scalars = SequenceArg::new();
        let mut shape = SequenceArg::new();
        for (v, &(kind, extent)) in inputs.iter().zip(&kinds) {
            if kind.vectors() {
                vectors.push(vector_arg(v.storage));
            } else {
                scalars.push(arg(v.storage));
            }
            shape.push(extent);
        }
        let mut outs = SequenceArg::new();
        for o in outputs.iter() {
            outs.push(vector_arg(o));
        }
        let (count, dim) = grid(units.div_ceil(per_unit as usize), BLOCK);
        // SAFETY: every input's reads stay inside its buffer (`input_kind`: contiguous
        // inputs hold `n` elements from offset 0, repeated blocks their period, spans
        // one value per span, broadcast values their element 0), outputs hold at least
        // `n` elements, and the kernel reads below `units` and stores only there.
        unsafe {
            k::fused_vectorized::launch_unchecked::<R>(
                c,
                count,
                dim,
                VECTOR,
                vectors,
                scalars,
                outs,
                shape,
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

/// Groups one launch of [`k::fused_groups_vectorized()`] takes at most: the kernel
/// unrolls the expression once per group, and an optimizer's step over a hundred
/// parameters then takes a handful of launches.
const GROUPS_PER_LAUNCH: usize = 16;

/// Runs `expr` once per group (the `Backend::fused_elementwise_groups` contract): runs
/// of consecutive groups whose operands the vectorised kernel reads alike (f32,
/// contiguous or single values, whole vectors) share launches of
/// [`k::fused_groups_vectorized()`], as many per launch as the device binds buffers
/// for; any other group runs alone through [`fused_elementwise`].
pub fn fused_elementwise_groups<R: KilnRuntime>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    dims: &[Dims],
    outputs: &mut [&mut CubeStorage<R>],
) -> Result<()> {
    let (k, o) =
        kiln_tensor::backend::group_arity::<crate::CubeBackend<R>>(expr, inputs, dims, outputs)?;
    let dev = &device.state;
    // Per group, how the vectorised kernel reads each input, or `None` to run it alone.
    let mut kinds = Vec::with_capacity(dims.len());
    for (g, d) in dims.iter().enumerate() {
        let (ins, outs) = (&inputs[g * k..(g + 1) * k], &outputs[g * o..(g + 1) * o]);
        let n: usize = d.iter().product();
        check_operands(device, expr, ins, d, outs, n, &[DType::F32])?;
        let read: Option<Vec<InputKind>> = ins
            .iter()
            .map(|v| match input_kind(v, d)? {
                (kind @ (InputKind::Vector | InputKind::Scalar), _) => Some(kind),
                _ => None,
            })
            .collect();
        kinds.push(
            read.filter(|_| n > 0 && n.is_multiple_of(VECTOR) && n / VECTOR <= u32::MAX as usize),
        );
    }
    let bindings = dev.client.properties().hardware.max_bindings as usize;
    // Room for the launch's own buffers (its scalar arguments' and metadata's).
    let per_launch = (bindings.saturating_sub(4) / (k + o).max(1)).clamp(1, GROUPS_PER_LAUNCH);
    let mut g = 0;
    while g < dims.len() {
        let Some(read) = kinds[g].clone() else {
            let (ins, outs) = (
                &inputs[g * k..(g + 1) * k],
                &mut outputs[g * o..(g + 1) * o],
            );
            fused_elementwise(device, expr, ins, &dims[g], outs)?;
            g += 1;
            continue;
        };
        let mut end = g + 1;
        while end < dims.len() && end - g < per_launch && kinds[end].as_ref() == Some(&read) {
            end += 1;
        }
        launch_groups(
            device,
            expr,
            read,
            &inputs[g * k..end * k],
            &dims[g..end],
            &mut outputs[g * o..end * o],
        )?;
        g = end;
    }
    Ok(())
}

/// One launch of [`k::fused_groups_vectorized()`] over `dims.len()` groups whose inputs
/// are all read as `read` says (checked by the caller).
fn launch_groups<R: KilnRuntime>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    read: Vec<InputKind>,
    inputs: &[V<'_, R>],
    dims: &[Dims],
    outputs: &mut [&mut CubeStorage<R>],
) -> Result<()> {
    let dev = &device.state;
    let (k, o) = (read.len(), outputs.len() / dims.len());
    let (config, consts) = FusedConfig::new(expr, read.clone(), 0, 1);
    note_kernel(dev, &config);
    let (mut vectors, mut scalars, mut outs) =
        (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
    let mut starts = SequenceArg::new();
    let mut units = 0usize;
    starts.push(0u32);
    for (g, d) in dims.iter().enumerate() {
        let ins = &inputs[g * k..(g + 1) * k];
        note_overwritten(dev, expr, ins, &outputs[g * o..(g + 1) * o]);
        for (v, kind) in ins.iter().zip(&read) {
            match kind.vectors() {
                true => vectors.push(vector_arg(v.storage)),
                false => scalars.push(arg(v.storage)),
            }
        }
        units += d.iter().product::<usize>() / VECTOR;
        starts.push(word(units)?);
    }
    for out in outputs.iter() {
        outs.push(vector_arg(out));
    }
    let (count, dim) = grid(units, BLOCK);
    let groups = u32::try_from(dims.len()).expect("at most GROUPS_PER_LAUNCH groups");
    // SAFETY: group `g`'s units `starts[g]..starts[g + 1]` are its element count in
    // vectors; its vector inputs are contiguous from offset 0 and hold that many
    // (`input_kind`), its single-value inputs their element 0, and its outputs at least
    // that many (`check_operands`); units past the last group touch nothing.
    unsafe {
        k::fused_groups_vectorized::launch_unchecked::<R>(
            &dev.client,
            count,
            dim,
            VECTOR,
            vectors,
            scalars,
            outs,
            starts,
            0.0,
            constants(consts),
            config,
            groups,
        )
    }
    Ok(())
}

/// [`fused_elementwise`] for a group at whose edges mixed precision casts (bf16 or f16
/// inputs or outputs beside f32 ones): one kernel that widens and narrows at the edges,
/// vectorised where the operands allow ([`k::fused_mixed_vectorized()`]), else strided
/// ([`k::fused_mixed()`]). Returns `false`, having done nothing, for operands of
/// other dtypes (bool), or bf16 beside f16, which the caller runs another way.
pub fn fused_mixed<R: KilnRuntime>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    dims: &Dims,
    outputs: &mut [&mut CubeStorage<R>],
) -> Result<bool> {
    let dtypes = || {
        inputs
            .iter()
            .map(|v| v.storage.dtype)
            .chain(outputs.iter().map(|o| o.dtype))
    };
    let mut halves = dtypes().filter(|&d| d != DType::F32);
    let half = halves.next().unwrap_or(DType::BF16);
    if !half.is_half() || halves.any(|d| d != half) {
        return Ok(false);
    }
    match half {
        DType::F16 => fused_mixed_of::<R, half::f16>(device, expr, inputs, dims, outputs, half),
        _ => fused_mixed_of::<R, half::bf16>(device, expr, inputs, dims, outputs, half),
    }
}

/// [`fused_mixed`] with half operands of type `Half` (dtype `half`).
fn fused_mixed_of<R: KilnRuntime, Half: Float>(
    device: &CubeDevice<R>,
    expr: &FusedExpr,
    inputs: &[V<'_, R>],
    dims: &Dims,
    outputs: &mut [&mut CubeStorage<R>],
    half: DType,
) -> Result<bool> {
    let dev = &device.state;
    let n: usize = dims.iter().product();
    check_operands(device, expr, inputs, dims, outputs, n, &[DType::F32, half])?;
    if n == 0 {
        return Ok(true);
    }
    note_overwritten(dev, expr, inputs, outputs);
    let halves = HalfEdges {
        inputs: inputs.iter().map(|v| v.storage.dtype == half).collect(),
        outputs: outputs.iter().map(|o| o.dtype == half).collect(),
    };
    // Inputs read as single values must be f32 (the kernel's value arrays).
    let kinds: Option<Vec<(InputKind, u32)>> = inputs
        .iter()
        .map(|v| input_kind(v, dims).filter(|k| k.0.vectors() || v.storage.dtype == DType::F32))
        .collect();
    if let Some(kinds) = kinds.filter(|_| n.is_multiple_of(VECTOR)) {
        let units = n / VECTOR;
        let per_unit = vectors_per_unit(units);
        let (config, consts) =
            FusedConfig::new(expr, kinds.iter().map(|k| k.0).collect(), 0, per_unit);
        note_kernel(dev, &config);
        let (mut vectors, mut half_vectors, mut scalars) =
            (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
        let mut shape = SequenceArg::new();
        for (v, &(kind, extent)) in inputs.iter().zip(&kinds) {
            match (kind.vectors(), v.storage.dtype) {
                (false, _) => scalars.push(arg(v.storage)),
                (true, d) if d == half => half_vectors.push(vector_arg(v.storage)),
                (true, _) => vectors.push(vector_arg(v.storage)),
            }
            shape.push(extent);
        }
        let (mut outs, mut half_outs) = (SequenceArg::new(), SequenceArg::new());
        for o in outputs.iter() {
            match o.dtype {
                d if d == half => half_outs.push(vector_arg(o)),
                _ => outs.push(vector_arg(o)),
            }
        }
        let (count, dim) = grid(units.div_ceil(per_unit as usize), BLOCK);
        // SAFETY: as for `fused_vectorized`, each operand bound in the sequence of its
        // kind: vector arrays cover at least `units` vectors of their dtype, broadcast
        // inputs hold their element 0, and stores stay below `units`.
        unsafe {
            k::fused_mixed_vectorized::launch_unchecked::<Half, R>(
                &dev.client,
                count,
                dim,
                VECTOR,
                vectors,
                half_vectors,
                scalars,
                outs,
                half_outs,
                shape,
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
            d if d == half => half_ins.push(arg(v.storage)),
            _ => ins.push(arg(v.storage)),
        }
    }
    let (mut outs, mut half_outs) = (SequenceArg::new(), SequenceArg::new());
    for o in outputs.iter() {
        match o.dtype {
            d if d == half => half_outs.push(arg(o)),
            _ => outs.push(arg(o)),
        }
    }
    let (count, dim) = grid(n, BLOCK);
    // SAFETY: every input's layout was checked against its buffer, every output holds
    // at least `n` elements, each operand is bound in the sequence of its dtype, and the
    // kernel checks `pos < n`.
    unsafe {
        k::fused_mixed::launch_unchecked::<Half, R>(
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

/// How the vectorised kernels read `v` over `dims`, with its period or span (in
/// vectors), or `None` where only the strided kernels can: a contiguous
/// input, one value, a contiguous block of trailing dims broadcast over the leading
/// ones (period a whole number of vectors), or contiguous leading dims each value of
/// which covers the trailing dims (span a whole number of vectors). Every kind starts
/// at its buffer's first element.
fn input_kind<R: KilnRuntime>(v: &V<'_, R>, dims: &Dims) -> Option<(InputKind, u32)> {
    if v.layout.offset() != 0 {
        return None;
    }
    let axes: Vec<(usize, usize)> = dims
        .iter()
        .zip(v.layout.strides())
        .filter(|(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let broadcast = |part: &[(usize, usize)]| part.iter().all(|&(_, s)| s == 0);
    let compact = |part: &[(usize, usize)]| {
        let mut expected = 1;
        part.iter().rev().all(|&(d, s)| {
            let ok = s == expected;
            expected *= d;
            ok
        })
    };
    let elements = |part: &[(usize, usize)]| part.iter().map(|&(d, _)| d).product::<usize>();
    if broadcast(&axes) {
        return Some((InputKind::Scalar, 1));
    }
    if compact(&axes) {
        return Some((InputKind::Vector, 1));
    }
    (1..axes.len()).find_map(|t| {
        let (lead, trail) = axes.split_at(t);
        let run = elements(trail);
        if !run.is_multiple_of(VECTOR) {
            return None;
        }
        let vectors = u32::try_from(run / VECTOR).ok()?;
        if broadcast(lead) && compact(trail) {
            Some((InputKind::Rows, vectors))
        } else if compact(lead) && broadcast(trail) {
            Some((InputKind::Columns, vectors))
        } else {
            None
        }
    })
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

/// How many vectors each unit of a vectorised fused launch of `units` vectors takes:
/// large launches give each unit several (more loads in flight).
fn vectors_per_unit(units: usize) -> u32 {
    if units >= 1 << 20 {
        4
    } else {
        1
    }
}
