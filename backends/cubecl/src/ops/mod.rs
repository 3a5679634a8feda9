//! The host side of every op: the dispatch from the op table to kernel launches, and
//! the ops built from the generic copy and fill kernels (contiguous, concat, pad,
//! full) or from the host (rand).

pub mod attention;
pub mod elementwise;
pub mod fused;
pub mod index;
pub mod int8;
pub mod matmul;
pub mod reduce;
pub mod rows;
pub mod window;

use crate::device::{CubeDevice, DeviceState, KilnRuntime};
use crate::storage::CubeStorage;
use crate::strided::Operand;
use crate::CubeBackend;
use kiln_tensor::{rng, DType, Error, HostData, Op, RandDist, Result, TensorMeta, View};
use std::sync::Arc;

pub(crate) type V<'a, R> = View<'a, CubeBackend<R>>;

/// Runs one primitive op (the `Backend::execute` contract).
pub fn execute<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let dev = &device.state;
    let dims = &out.dims[..];
    for v in inputs {
        dev.check_dtype(op.name(), v.storage.dtype)?;
    }
    if *op != Op::MatMulInt8 && inputs.iter().any(|v| v.storage.dtype == DType::I8) {
        return int8::execute_widened(device, op, inputs, out);
    }
    match op {
        Op::Unary(u) => elementwise::unary(dev, *u, inputs[0], dims),
        Op::Binary(b) => elementwise::binary(dev, *b, inputs[0], inputs[1], dims),
        Op::Compare(c) => elementwise::compare(dev, *c, inputs[0], inputs[1], dims),
        Op::Where => elementwise::select(dev, inputs[0], inputs[1], inputs[2], dims),
        Op::Cast { dtype } => elementwise::cast(dev, inputs[0], *dtype, dims),
        Op::Reduce { op: r, axes } => reduce::reduce(dev, *r, inputs[0], axes, out),
        Op::Concat { axis } => concat(dev, inputs, *axis, out),
        Op::Pad {
            axis,
            before,
            value,
            ..
        } => pad(dev, inputs[0], *axis, *before, *value, out),
        Op::MatMul => product(device, inputs[0], inputs[1], out),
        Op::MatMulInt8 => int8::matmul_int8(device, inputs[0], inputs[1], inputs[2]),
        Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. } => {
            attention::attention(device, op, inputs, out)
        }
        Op::Gather { axis } => index::gather(dev, inputs[0], inputs[1], *axis, out),
        Op::ScatterAdd { axis, .. } => index::scatter_add(dev, inputs[0], inputs[1], *axis, out),
        Op::Unfold2d(w) => window::unfold2d(dev, inputs[0], w, out),
        Op::Fold2d { window: w, .. } => window::fold2d(dev, inputs[0], w, out),
        Op::Full { value, dtype, .. } => {
            let n: usize = dims.iter().product();
            let s = dev.alloc("full", *dtype, n)?;
            elementwise::fill(dev, &s, &HostData::from_f64_slice(*dtype, &[*value]))?;
            Ok(s)
        }
        Op::Iota { axis, .. } => index::iota(dev, dims, *axis),
        Op::Rand {
            dist, seed, dtype, ..
        } => rand(
            dev,
            dims.iter().product(),
            *dist,
            DrawSeed::Host(*seed),
            *dtype,
        ),
        Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. } => {
            Err(Error::invalid(
                op.name(),
                "views are layout changes and never reach a backend",
            ))
        }
    }
}

/// `a × b` through the vendor library where there is one: as laid out, or else after
/// contiguous copies of the operands it cannot take (a head-split attention operand's
/// batch dims do not merge into one batch stride; a copy is one pass over it, far less
/// than Kiln's own kernel costs beside the library's); through Kiln's own kernel
/// otherwise. A broadcast operand is not copied (that would materialise it per batch).
fn product<R: KilnRuntime>(
    device: &CubeDevice<R>,
    a: V<'_, R>,
    b: V<'_, R>,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let dev = &device.state;
    if let Some(r) = R::vendor_matmul(device, a, b, out, None) {
        return r;
    }
    let plain = |v: &V<'_, R>| v.layout.offset() == 0 && v.layout.is_contiguous();
    let broadcast = |v: &V<'_, R>| v.layout.strides().contains(&0);
    let copyable = R::VENDOR_MATMUL && !broadcast(&a) && !broadcast(&b);
    if copyable && (!plain(&a) || !plain(&b)) {
        let copy = |v: V<'_, R>| {
            if plain(&v) {
                Ok(None)
            } else {
                contiguous(dev, v).map(Some)
            }
        };
        let (ca, cb) = (copy(a)?, copy(b)?);
        let layout = |v: &V<'_, R>| kiln_tensor::Layout::contiguous(*v.layout.dims());
        let a2 = match &ca {
            Some(s) => View {
                storage: s,
                layout: layout(&a),
            },
            None => a,
        };
        let b2 = match &cb {
            Some(s) => View {
                storage: s,
                layout: layout(&b),
            },
            None => b,
        };
        if let Some(r) = R::vendor_matmul(device, a2, b2, out, None) {
            return r;
        }
    }
    matmul::matmul(dev, a, b, out)
}

/// A contiguous copy of a view.
pub fn contiguous<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    x: V<'_, R>,
) -> Result<CubeStorage<R>> {
    if x.storage.dtype == DType::I8 {
        return int8::contiguous(dev, x);
    }
    let dims = x.layout.dims().to_vec();
    let out = dev.alloc("contiguous", x.storage.dtype, x.layout.numel())?;
    elementwise::copy_into(dev, x.storage, &Operand::of(&x.layout), out, &dims)
}

/// Inputs joined along `axis`: each copied into its slab of the result.
fn concat<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    inputs: &[V<'_, R>],
    axis: usize,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let n: usize = out.dims.iter().product();
    let result = dev.alloc("concat", out.dtype, n)?;
    let full = Operand::contiguous(&out.dims, 0);
    let mut start = 0;
    for x in inputs {
        let dims = x.layout.dims().to_vec();
        let dst = Operand {
            offset: start * full.strides[axis],
            strides: full.strides.clone(),
        };
        elementwise::copy_strided(
            dev,
            x.storage,
            &Operand::of(&x.layout),
            &result,
            &dst,
            &dims,
        )?;
        start += dims[axis];
    }
    Ok(result)
}

/// `value` everywhere, then the input copied into the interior.
fn pad<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    x: V<'_, R>,
    axis: usize,
    before: usize,
    value: f64,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let n: usize = out.dims.iter().product();
    let result = dev.alloc("pad", out.dtype, n)?;
    elementwise::fill(dev, &result, &HostData::from_f64_slice(out.dtype, &[value]))?;
    let full = Operand::contiguous(&out.dims, 0);
    let dst = Operand {
        offset: before * full.strides[axis],
        strides: full.strides.clone(),
    };
    let dims = x.layout.dims().to_vec();
    elementwise::copy_strided(
        dev,
        x.storage,
        &Operand::of(&x.layout),
        &result,
        &dst,
        &dims,
    )?;
    Ok(result)
}

/// Where a draw's seed comes from.
pub(crate) enum DrawSeed<'a, R: KilnRuntime> {
    /// Known on the host (the op's own seed, already mixed).
    Host(u64),
    /// The op's own seed xor the one in this device buffer (`i32 [2]`, low word
    /// first), read by the kernel: what a captured step's replays rewrite.
    Device { own: u64, seed: &'a CubeStorage<R> },
}

/// Seeded draws computed on the device ([`crate::kernels::random`]): the generator's
/// bits exactly, the values to the compute type's accuracy (f32 for f32 and the half
/// floats, f64 for f64).
pub(crate) fn rand<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    n: usize,
    dist: RandDist,
    seed: DrawSeed<'_, R>,
    dtype: DType,
) -> Result<CubeStorage<R>> {
    dev.check_dtype("rand", dtype)?;
    if n > u32::MAX as usize {
        return Err(Error::invalid(
            "rand",
            format!("{n} values exceed the generator's 2^32 counter"),
        ));
    }
    if let DrawSeed::Host(_) = seed {
        // A replay would draw the same values again: the seed is a launch argument.
        dev.refuse_in_capture(
            "drawing random numbers with a seed on the host (a replay would repeat the same draw)",
        )?;
    }
    let result = dev.alloc("rand", dtype, n)?;
    if n == 0 {
        return Ok(result);
    }
    let (a, b, normal) = match dist {
        RandDist::Uniform { low, high } => (low, high - low, false),
        RandDist::Normal { mean, std } => (mean, std, true),
    };
    let (count, dim) = crate::strided::grid(n, crate::strided::BLOCK);
    let c = &dev.client;
    let n32 = n as u32;
    let tau = std::f64::consts::TAU;
    match seed {
        DrawSeed::Host(seed) => {
            let (key0, key1) = (rng::stream_key(seed, 0), rng::stream_key(seed, 1));
            crate::storage::with_float_type!(dtype, F, A => unsafe {
                crate::kernels::random::random::launch_unchecked::<F, A, R>(
                    c, count, dim, elementwise::arg(&result), n32, key0, key1,
                    a as A, b as A, tau as A, normal,
                )
            }, {
                return Err(Error::dtype("rand", format!("draws floats, not {dtype}")));
            });
        }
        DrawSeed::Device { own, seed } => {
            crate::storage::with_float_type!(dtype, F, A => unsafe {
                crate::kernels::random::random_device_seeded::launch_unchecked::<F, A, R>(
                    c, count, dim, elementwise::arg(&result), elementwise::arg(seed), n32,
                    own as u32, (own >> 32) as u32, a as A, b as A, tau as A, normal,
                )
            }, {
                return Err(Error::dtype("rand", format!("draws floats, not {dtype}")));
            });
        }
    }
    Ok(result)
}
