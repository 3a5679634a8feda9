//! Launching reductions: the kept and reduced dims are coalesced separately, and the
//! cube size follows the reduced extent (32 to 256 units).

use super::elementwise::arg;
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::reduce as k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{coalesce, grid_per_item, word, Operand};
use crate::CubeBackend;
use kiln_tensor::{DType, Error, ReduceOp, Result, TensorMeta, View};
use std::sync::Arc;

/// A reduction over `axes` (kept as size-1 dims in `out`).
pub fn reduce<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    op: ReduceOp,
    x: View<'_, CubeBackend<R>>,
    axes: &[usize],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let dims = x.layout.dims().to_vec();
    let strides = x.layout.strides().to_vec();
    let extent: usize = axes.iter().map(|&a| dims[a]).product();
    let n_out: usize = out.dims.iter().product();
    if op != ReduceOp::Sum && extent == 0 {
        return Err(Error::invalid(op.name(), "cannot reduce an empty axis"));
    }
    let result = dev.alloc(op.name(), out.dtype, n_out)?;
    if n_out == 0 {
        return Ok(result);
    }
    let split = |keep: bool| {
        let idx: Vec<usize> = (0..dims.len())
            .filter(|i| axes.contains(i) != keep)
            .collect();
        let d: Vec<usize> = idx.iter().map(|&i| dims[i]).collect();
        let s: Vec<usize> = idx.iter().map(|&i| strides[i]).collect();
        coalesce(
            &d,
            &[Operand {
                offset: 0,
                strides: s,
            }],
        )
    };
    let (kd, ko) = split(true);
    let (rd, ro) = split(false);
    let mut w = vec![word(n_out)?, word(extent)?];
    for &d in kd.iter().chain(&rd) {
        w.push(word(d)?);
    }
    w.push(word(x.layout.offset())?);
    for &s in ko[0].strides.iter().chain(&ro[0].strides) {
        w.push(word(s)?);
    }
    let m = dev.metadata(&w)?;
    let (kr, rr) = (kd.len() as u32, rd.len() as u32);
    let block = (extent.next_power_of_two() as u32).clamp(32, 256);
    let (count, dim) = grid_per_item(n_out, block);
    let c = &dev.client;
    let code = op as u32;
    let dtype = x.storage.dtype;
    let (xs, os, ms) = (x.storage, &result, &m);
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        match dtype {
            DType::F16 => unsafe {
                k::reduce_arg::launch_unchecked::<half::f16, f32, R>(
                    c,
                    count,
                    dim,
                    arg(xs),
                    arg(os),
                    arg(ms),
                    code,
                    kr,
                    rr,
                    block,
                )
            },
            DType::BF16 => unsafe {
                k::reduce_arg::launch_unchecked::<half::bf16, f32, R>(
                    c,
                    count,
                    dim,
                    arg(xs),
                    arg(os),
                    arg(ms),
                    code,
                    kr,
                    rr,
                    block,
                )
            },
            DType::F32 => unsafe {
                k::reduce_arg::launch_unchecked::<f32, f32, R>(
                    c,
                    count,
                    dim,
                    arg(xs),
                    arg(os),
                    arg(ms),
                    code,
                    kr,
                    rr,
                    block,
                )
            },
            DType::F64 => unsafe {
                k::reduce_arg::launch_unchecked::<f64, f64, R>(
                    c,
                    count,
                    dim,
                    arg(xs),
                    arg(os),
                    arg(ms),
                    code,
                    kr,
                    rr,
                    block,
                )
            },
            DType::I32 => unsafe {
                k::reduce_arg::launch_unchecked::<i32, i32, R>(
                    c,
                    count,
                    dim,
                    arg(xs),
                    arg(os),
                    arg(ms),
                    code,
                    kr,
                    rr,
                    block,
                )
            },
            _ => unsafe {
                k::reduce_arg::launch_unchecked::<u32, u32, R>(
                    c,
                    count,
                    dim,
                    arg(xs),
                    arg(os),
                    arg(ms),
                    code,
                    kr,
                    rr,
                    block,
                )
            },
        }
        return Ok(result);
    }
    with_float_type!(dtype, F, A => unsafe {
        k::reduce_float::launch_unchecked::<F, A, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block)
    }, match dtype {
        DType::I32 => unsafe {
            k::reduce_int::launch_unchecked::<i32, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block)
        },
        _ => unsafe {
            k::reduce_int::launch_unchecked::<u32, R>(c, count, dim, arg(xs), arg(os), arg(ms), code, kr, rr, block)
        },
    });
    Ok(result)
}
