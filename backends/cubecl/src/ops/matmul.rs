//! Launching Kiln's own tiled matmul (wgpu; CUDA uses cuBLASLt instead).

use super::elementwise::{arg, meta};
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::matmul as k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{coalesce, word, Operand, MAX_GRID};
use crate::CubeBackend;
use cubecl::prelude::*;
use kiln_tensor::{Error, Result, TensorMeta, View};
use std::sync::Arc;

type V<'a, R> = View<'a, CubeBackend<R>>;

/// `[.., M, K] × [.., K, N]` with identical (broadcast) batch dims.
pub fn matmul<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    a: V<'_, R>,
    b: V<'_, R>,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let total: usize = out.dims.iter().product();
    let result = dev.alloc("matmul", out.dtype, total)?;
    let r = out.dims.len();
    let (m, n) = (out.dims[r - 2], out.dims[r - 1]);
    let kdim = a.layout.dims()[r - 1];
    if total == 0 {
        return Ok(result);
    }
    if kdim == 0 {
        super::elementwise::fill(
            dev,
            &result,
            &kiln_tensor::HostData::from_f64_slice(out.dtype, &[0.0]),
        )?;
        return Ok(result);
    }
    let batch_dims = &out.dims[..r - 2];
    let batch: usize = batch_dims.iter().product();
    let (sa, sb) = (a.layout.strides(), b.layout.strides());
    let (bd, ops) = coalesce(
        batch_dims,
        &[
            Operand {
                offset: 0,
                strides: sa[..r - 2].to_vec(),
            },
            Operand {
                offset: 0,
                strides: sb[..r - 2].to_vec(),
            },
        ],
    );
    let mut w = vec![word(m)?, word(n)?, word(kdim)?];
    for &d in &bd {
        w.push(word(d)?);
    }
    w.extend([word(a.layout.offset())?, word(sa[r - 2])?, word(sa[r - 1])?]);
    for &s in &ops[0].strides {
        w.push(word(s)?);
    }
    w.extend([word(b.layout.offset())?, word(sb[r - 2])?, word(sb[r - 1])?]);
    for &s in &ops[1].strides {
        w.push(word(s)?);
    }
    let mt = meta(dev, &w);
    let br = bd.len() as u32;
    let tiles = (
        word(n.div_ceil(k::TILE as usize))?,
        word(m.div_ceil(k::TILE as usize))?,
    );
    if tiles.0 > MAX_GRID || tiles.1 > MAX_GRID {
        return Err(Error::invalid(
            "matmul",
            format!("a {m}×{n} result needs more than {MAX_GRID} tiles along one side"),
        ));
    }
    let direct = (
        word(n.div_ceil(k::DIRECT_COLS as usize))?,
        word(m.div_ceil(k::DIRECT_ROWS as usize))?,
    );
    if dev.cpu_adapter && (direct.0 > MAX_GRID || direct.1 > MAX_GRID) {
        return Err(Error::invalid(
            "matmul",
            format!("a {m}×{n} result needs more than {MAX_GRID} cubes along one side"),
        ));
    }
    let c = &dev.client;
    let mut base = 0usize;
    while base < batch {
        let chunk = (batch - base).min(MAX_GRID as usize) as u32;
        let b0 = word(base)?;
        if dev.cpu_adapter {
            // CPU drivers run barriers by switching invocations: the kernel without them.
            let count = CubeCount::Static(direct.0, direct.1, chunk);
            let dim = CubeDim::new_1d(k::DIRECT_COLS);
            with_float_type!(out.dtype, F, A => unsafe {
                k::matmul_direct::launch_unchecked::<F, A, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&result), arg(&mt), b0, br)
            }, return Err(Error::dtype("matmul", format!("multiplies floats, not {}", out.dtype))));
        } else {
            let count = CubeCount::Static(tiles.0, tiles.1, chunk);
            let dim = CubeDim::new_1d(256);
            with_float_type!(out.dtype, F, A => unsafe {
                k::matmul::launch_unchecked::<F, A, R>(c, count, dim, arg(a.storage), arg(b.storage), arg(&result), arg(&mt), b0, br)
            }, return Err(Error::dtype("matmul", format!("multiplies floats, not {}", out.dtype))));
        }
        base += chunk as usize;
    }
    Ok(result)
}
