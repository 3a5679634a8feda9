//! Launching Kiln's own tiled matmul (wgpu; CUDA uses cuBLASLt instead), and which
//! product epilogues a vendor library can run inside the product.

use super::elementwise::arg;
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
    let mt = dev.metadata(&w)?;
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

/// The input of `expr` that is a bias added to a product's result, if `expr` is exactly
/// `result + bias` (either order): the one epilogue Kiln hands to cuBLASLt. (Its ReLU
/// epilogues are not used: they turn NaN into 0, where Kiln's `relu` keeps NaN, so a
/// diverging model would look healthy.)
pub fn bias_epilogue_input(expr: &kiln_tensor::fused::FusedExpr) -> Option<usize> {
    use kiln_tensor::fused::ExprStep::{Binary, Input, Output};
    if expr.results != [2] || expr.inputs != 1 || expr.steps.len() != 3 {
        return None;
    }
    match (&expr.steps[0], &expr.steps[1], &expr.steps[2]) {
        (Output(0), Input(0), Binary(kiln_tensor::BinaryOp::Add, x, y))
        | (Input(0), Output(0), Binary(kiln_tensor::BinaryOp::Add, x, y))
            if (*x, *y) == (0, 1) || (*x, *y) == (1, 0) =>
        {
            Some(0)
        }
        _ => None,
    }
}

/// Whether a view over a product's result dims is one row broadcast over every other
/// dim (strides 0 but a unit stride along the last dim), as a library bias is.
pub fn is_broadcast_row(layout: &kiln_tensor::Layout, out_dims: &[usize]) -> bool {
    let r = out_dims.len();
    layout.dims().as_slice() == out_dims
        && r >= 1
        && layout.strides()[..r - 1].iter().all(|&s| s == 0)
        && (layout.strides()[r - 1] == 1 || out_dims[r - 1] == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_tensor::fused::{ExprStep::*, FusedExpr};
    use kiln_tensor::{BinaryOp, Dims, Layout, UnaryOp};

    fn expr(steps: Vec<kiln_tensor::fused::ExprStep>, inputs: usize) -> FusedExpr {
        let last = steps.len() - 1;
        FusedExpr {
            steps,
            results: vec![last],
            inputs,
        }
    }

    #[test]
    fn only_a_plain_bias_add_is_a_library_epilogue() {
        let add = |a, b| expr(vec![a, b, Binary(BinaryOp::Add, 0, 1)], 1);
        assert_eq!(bias_epilogue_input(&add(Output(0), Input(0))), Some(0));
        assert_eq!(bias_epilogue_input(&add(Input(0), Output(0))), Some(0));
        let sub = expr(vec![Output(0), Input(0), Binary(BinaryOp::Sub, 0, 1)], 1);
        assert_eq!(bias_epilogue_input(&sub), None);
        let relu = expr(
            vec![
                Output(0),
                Input(0),
                Binary(BinaryOp::Add, 0, 1),
                Unary(UnaryOp::Relu, 2),
            ],
            1,
        );
        assert_eq!(bias_epilogue_input(&relu), None);
        let twice = expr(vec![Output(0), Output(0), Binary(BinaryOp::Add, 0, 1)], 0);
        assert_eq!(bias_epilogue_input(&twice), None);
        let two_results = FusedExpr {
            results: vec![2, 2],
            ..add(Output(0), Input(0))
        };
        assert_eq!(bias_epilogue_input(&two_results), None);
    }

    #[test]
    fn a_bias_is_one_row_broadcast() -> kiln_tensor::Result<()> {
        let d = |v: &[usize]| Dims::new(v);
        let row = Layout::from_parts(d(&[4, 8])?, &[0, 1], 3);
        assert!(is_broadcast_row(&row, &[4, 8]));
        assert!(!is_broadcast_row(&row, &[4, 9]));
        assert!(!is_broadcast_row(&Layout::contiguous(d(&[4, 8])?), &[4, 8]));
        let column = Layout::from_parts(d(&[4, 8])?, &[1, 0], 0);
        assert!(!is_broadcast_row(&column, &[4, 8]));
        let batched = Layout::from_parts(d(&[2, 4, 8])?, &[0, 0, 1], 0);
        assert!(is_broadcast_row(&batched, &[2, 4, 8]));
        Ok(())
    }
}
