//! Launching the elementwise kernels: dtype dispatch, metadata and grid.

use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::elementwise as k;
use crate::storage::{with_device_type, with_float_type, CubeStorage};
use crate::strided::{elementwise_meta, grid, Operand, BLOCK};
use crate::CubeBackend;
use cubecl::prelude::*;
use kiln_tensor::{BinaryOp, CmpOp, DType, Error, Result, UnaryOp, View};
use std::sync::Arc;

type V<'a, R> = View<'a, CubeBackend<R>>;

/// An array argument over a whole buffer.
pub(crate) fn arg<R: KilnRuntime>(s: &CubeStorage<R>) -> ArrayArg<R> {
    s.device.note_bound(s);
    // SAFETY: the length is the buffer's element count; kernels index within the
    // extents the host checked against it.
    unsafe { ArrayArg::from_raw_parts(s.handle.clone(), s.len.max(1)) }
}

/// A buffer holding one host value (at least 8 bytes, so any dtype's kernel reads it),
/// shared through the metadata cache: a step fills with the same values every time.
pub(crate) fn constant<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    value: &kiln_tensor::HostData,
) -> Result<CubeStorage<R>> {
    let mut bytes = crate::storage::host_to_bytes(value);
    bytes.resize(bytes.len().div_ceil(4).max(2) * 4, 0);
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    dev.metadata(&words)
}

/// The metadata of an elementwise op writing a contiguous result of `dims`.
fn views_meta<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    dims: &[usize],
    inputs: &[V<'_, R>],
) -> Result<(u32, CubeStorage<R>)> {
    let ops: Vec<Operand> = inputs.iter().map(|v| Operand::of(&v.layout)).collect();
    let (rank, words) = elementwise_meta(dims, &ops)?;
    Ok((rank, dev.metadata(&words)?))
}

/// A unary op.
pub fn unary<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: UnaryOp,
    x: V<'_, R>,
    dims: &[usize],
) -> Result<CubeStorage<R>> {
    let n: usize = dims.iter().product();
    let dtype = x.storage.dtype;
    let out = dev.alloc(op.name(), dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let (rank, m) = views_meta(dev, dims, &[x])?;
    let (count, dim) = grid(n, BLOCK);
    let code = op as u32;
    let c = &dev.client;
    with_float_type!(dtype, F, A => unsafe {
        k::unary_float::launch_unchecked::<F, A, R>(c, count, dim, arg(x.storage), arg(&out), arg(&m), code, rank)
    }, match dtype {
        DType::I32 => unsafe {
            k::unary_int::launch_unchecked::<i32, R>(c, count, dim, arg(x.storage), arg(&out), arg(&m), code, rank)
        },
        _ => unsafe {
            k::unary_int::launch_unchecked::<u32, R>(c, count, dim, arg(x.storage), arg(&out), arg(&m), code, rank)
        },
    });
    Ok(out)
}

/// A binary op.
pub fn binary<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: BinaryOp,
    a: V<'_, R>,
    b: V<'_, R>,
    dims: &[usize],
) -> Result<CubeStorage<R>> {
    let n: usize = dims.iter().product();
    let dtype = a.storage.dtype;
    let out = dev.alloc(op.name(), dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let (rank, m) = views_meta(dev, dims, &[a, b])?;
    let (count, dim) = grid(n, BLOCK);
    let code = op as u32;
    let c = &dev.client;
    with_float_type!(dtype, F, A => unsafe {
        k::binary_float::launch_unchecked::<F, A, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&out), arg(&m), code, rank)
    }, {
        let checked = op == BinaryOp::Div;
        let flag = dev.new_flag()?;
        match dtype {
            DType::I32 => unsafe {
                k::binary_int::launch_unchecked::<i32, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&out), arg(&m), arg(&flag), code, rank, true)
            },
            _ => unsafe {
                k::binary_int::launch_unchecked::<u32, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&out), arg(&m), arg(&flag), code, rank, false)
            },
        }
        if checked {
            dev.defer_check(
                &flag,
                Arc::new(|_, _| {
                    Error::invalid(
                        "div",
                        "integer division by zero (kernels run asynchronously: reported at \
                         the next read or synchronisation)",
                    )
                }),
            )?;
        }
    });
    Ok(out)
}

/// A comparison (bool result).
pub fn compare<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: CmpOp,
    a: V<'_, R>,
    b: V<'_, R>,
    dims: &[usize],
) -> Result<CubeStorage<R>> {
    let n: usize = dims.iter().product();
    let dtype = a.storage.dtype;
    dev.check_dtype(op.name(), dtype)?;
    let out = dev.alloc(op.name(), DType::Bool, n)?;
    if n == 0 {
        return Ok(out);
    }
    let (rank, m) = views_meta(dev, dims, &[a, b])?;
    let (count, dim) = grid(n, BLOCK);
    let code = op as u32;
    let c = &dev.client;
    // Half floats compare exactly in f32; everything else in its own type.
    match dtype {
        DType::F16 => unsafe {
            k::compare::launch_unchecked::<half::f16, f32, R>(
                c,
                count,
                dim,
                arg(a.storage),
                arg(b.storage),
                arg(&out),
                arg(&m),
                code,
                rank,
            )
        },
        DType::BF16 => unsafe {
            k::compare::launch_unchecked::<half::bf16, f32, R>(
                c,
                count,
                dim,
                arg(a.storage),
                arg(b.storage),
                arg(&out),
                arg(&m),
                code,
                rank,
            )
        },
        _ => with_device_type!(dtype, T => unsafe {
            k::compare::launch_unchecked::<T, T, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&out), arg(&m), code, rank)
        }),
    }
    Ok(out)
}

/// `cond ? a : b`.
pub fn select<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    cond: V<'_, R>,
    a: V<'_, R>,
    b: V<'_, R>,
    dims: &[usize],
) -> Result<CubeStorage<R>> {
    let n: usize = dims.iter().product();
    let dtype = a.storage.dtype;
    let out = dev.alloc("where", dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let (rank, m) = views_meta(dev, dims, &[cond, a, b])?;
    let (count, dim) = grid(n, BLOCK);
    let c = &dev.client;
    with_device_type!(dtype, T => unsafe {
        k::select::launch_unchecked::<T, R>(c, count, dim, arg(cond.storage), arg(a.storage), arg(b.storage), arg(&out), arg(&m), rank)
    });
    Ok(out)
}

/// The kernel's conversion kind for a cast between two dtypes.
fn cast_kind(from: DType, to: DType) -> u32 {
    use k::cast_kind::*;
    match (from, to) {
        (_, DType::Bool) => TO_BOOL,
        (f, DType::I32) if f.is_float() => FLOAT_TO_I32,
        (f, DType::U32) if f.is_float() => FLOAT_TO_U32,
        (DType::I32, DType::U32) => I32_TO_U32,
        (DType::U32, DType::I32) => U32_TO_I32,
        _ => CONVERT,
    }
}

/// A dtype conversion.
pub fn cast<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    x: V<'_, R>,
    to: DType,
    dims: &[usize],
) -> Result<CubeStorage<R>> {
    let n: usize = dims.iter().product();
    let from = x.storage.dtype;
    let out = dev.alloc("cast", to, n)?;
    if n == 0 {
        return Ok(out);
    }
    if from == to || (from == DType::Bool && to == DType::U32) {
        // Same device representation: a strided copy.
        return copy_into(dev, x.storage, &Operand::of(&x.layout), out, dims);
    }
    let (rank, m) = views_meta(dev, dims, &[x])?;
    let (count, dim) = grid(n, BLOCK);
    let kind = cast_kind(from, to);
    let c = &dev.client;
    // Half floats are range-checked in f32, everything else in its own type.
    match from {
        DType::F16 => with_device_type!(to, O => unsafe {
            k::convert::launch_unchecked::<half::f16, f32, O, R>(c, count, dim, arg(x.storage), arg(&out), arg(&m), kind, rank)
        }),
        DType::BF16 => with_device_type!(to, O => unsafe {
            k::convert::launch_unchecked::<half::bf16, f32, O, R>(c, count, dim, arg(x.storage), arg(&out), arg(&m), kind, rank)
        }),
        _ => with_device_type!(from, I => with_device_type!(to, O => unsafe {
            k::convert::launch_unchecked::<I, I, O, R>(c, count, dim, arg(x.storage), arg(&out), arg(&m), kind, rank)
        })),
    }
    Ok(out)
}

/// Copies the view `src` (elements of `dims` at `op`) into `out` as a contiguous block.
pub fn copy_into<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    src: &CubeStorage<R>,
    op: &Operand,
    out: CubeStorage<R>,
    dims: &[usize],
) -> Result<CubeStorage<R>> {
    copy_strided(dev, src, op, &out, &Operand::contiguous(dims, 0), dims)?;
    Ok(out)
}

/// Copies elements of `dims` from the strided `src` into the strided `dst` of `out`.
pub fn copy_strided<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    src: &CubeStorage<R>,
    src_op: &Operand,
    out: &CubeStorage<R>,
    dst_op: &Operand,
    dims: &[usize],
) -> Result<()> {
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(());
    }
    let (rank, words) = elementwise_meta(dims, &[src_op.clone(), dst_op.clone()])?;
    let m = dev.metadata(&words)?;
    let (count, dim) = grid(n, BLOCK);
    let c = &dev.client;
    // Same-width dtypes share a kernel: a copy moves bits.
    match crate::storage::device_size(src.dtype) {
        8 => unsafe {
            k::copy::launch_unchecked::<u64, R>(c, count, dim, arg(src), arg(out), arg(&m), rank)
        },
        2 => unsafe {
            k::copy::launch_unchecked::<R::Bits16, R>(
                c,
                count,
                dim,
                arg(src),
                arg(out),
                arg(&m),
                rank,
            )
        },
        4 => unsafe {
            k::copy::launch_unchecked::<u32, R>(c, count, dim, arg(src), arg(out), arg(&m), rank)
        },
        other => {
            return Err(Error::Device(format!(
                "no copy kernel for {other}-byte elements"
            )))
        }
    }
    Ok(())
}

/// Fills `out` (all of it) with one host value already converted to its dtype.
pub fn fill<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    out: &CubeStorage<R>,
    value: &kiln_tensor::HostData,
) -> Result<()> {
    if out.len == 0 {
        return Ok(());
    }
    let v = constant(dev, value)?;
    let (count, dim) = grid(out.len, BLOCK);
    let n = crate::strided::word(out.len)?;
    let c = &dev.client;
    match crate::storage::device_size(out.dtype) {
        8 => unsafe { k::fill::launch_unchecked::<u64, R>(c, count, dim, arg(&v), arg(out), n) },
        2 => unsafe {
            k::fill::launch_unchecked::<R::Bits16, R>(c, count, dim, arg(&v), arg(out), n)
        },
        _ => unsafe { k::fill::launch_unchecked::<u32, R>(c, count, dim, arg(&v), arg(out), n) },
    }
    Ok(())
}
