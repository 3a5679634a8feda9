//! Launching attention's kernels ([`crate::kernels::attention`]): the inputs made
//! contiguous rows where they are views, the sizes as metadata, the f32 (f64) scratch
//! rows of the units' running sums, one launch per op.
//!
//! A runtime whose products go to a vendor library (CUDA's cuBLASLt) runs the three ops
//! as their primitives instead ([`by_primitives`]): batched products through the
//! library with the scores in memory, as fast as the unfused plan. The portable
//! kernels, one unit per row, would be far slower there; a tiled kernel on the tensor
//! cores is what replaces both.

use super::contiguous;
use super::elementwise::arg;
use crate::device::{CubeDevice, KilnRuntime};
use crate::kernels::attention as k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{grid, word, BLOCK};
use crate::CubeBackend;
use kiln_tensor::attention::{
    attention_by_primitives, grad_by_primitives, lse_by_primitives, stats_dtype,
};
use kiln_tensor::{AttentionInput, Eager, Error, Layout, Op, RawTensor, Result, TensorMeta, View};

type V<'a, R> = View<'a, CubeBackend<R>>;

/// Runs [`Op::Attention`], [`Op::AttentionLse`] or [`Op::AttentionGrad`] (inputs as the
/// op table checked them; the result contiguous).
pub fn attention<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    if R::VENDOR_MATMUL {
        return by_primitives(device, op, inputs);
    }
    let dev = &device.state;
    // Kernels read plain rows: views (a head split's permuted q, k, v) are copied.
    let copies: Vec<Option<CubeStorage<R>>> = inputs
        .iter()
        .map(|v| {
            let plain = v.layout.offset() == 0 && v.layout.is_contiguous();
            (!plain).then(|| contiguous(dev, *v)).transpose()
        })
        .collect::<Result<_>>()?;
    let x: Vec<&CubeStorage<R>> = inputs
        .iter()
        .zip(&copies)
        .map(|(v, c)| c.as_ref().unwrap_or(v.storage))
        .collect();
    let dims = |i: usize| inputs[i].layout.dims();
    let (q, kd) = (dims(0), dims(1));
    let r = q.rank();
    let batch: usize = q.as_slice()[..r - 2].iter().product();
    let (tq, tk, e) = (q[r - 2], kd[r - 2], q[r - 1]);
    let ev = match op {
        Op::AttentionLse(_) => e,
        _ => dims(2)[r - 1],
    };
    let dtype = inputs[0].storage.dtype;
    let stats = stats_dtype(dtype);
    let result = dev.alloc(
        op.name(),
        out.dtype,
        Layout::contiguous(kiln_tensor::Dims::new(&out.dims)?).numel(),
    )?;
    let (spec, per_key, width) = match op {
        Op::Attention(s) => (s, false, ev),
        Op::AttentionLse(s) => (s, false, 1),
        Op::AttentionGrad { spec, wrt } => match wrt {
            AttentionInput::Query => (spec, false, e),
            AttentionInput::Key => (spec, true, e),
            AttentionInput::Value => (spec, true, ev),
        },
        other => return Err(Error::invalid(other.name(), "is not an attention op")),
    };
    let rows = batch * if per_key { tk } else { tq };
    if rows == 0 {
        return Ok(result);
    }
    let words = [rows, tq, tk, e, ev, spec.causal as usize]
        .iter()
        .map(|&v| word(v))
        .collect::<Result<Vec<u32>>>()?;
    word(rows * width.max(1))?;
    let meta = dev.metadata(&words)?;
    let acc = dev.alloc(op.name(), stats, rows * width.max(1))?;
    let (count, dim) = grid(rows, BLOCK);
    let c = &dev.client;
    with_float_type!(dtype, F, A => {
        let scale = spec.scale as A;
        match op {
            Op::Attention(_) | Op::AttentionLse(_) => {
                let with_values = matches!(op, Op::Attention(_));
                // The forward pass writes each row's log-sum-exp; for the output alone
                // into a row of scratch.
                let lse_rows = if with_values { Some(dev.alloc(op.name(), stats, rows)?) } else { None };
                let lse = lse_rows.as_ref().unwrap_or(&result);
                let (v, out) = if with_values { (x[2], &result) } else { (x[1], &acc) };
                unsafe {
                    k::attention_rows::launch_unchecked::<F, A, R>(
                        c, count, dim, arg(x[0]), arg(x[1]), arg(v), arg(out), arg(lse), arg(&acc),
                        arg(&meta), scale, A::NEG_INFINITY, with_values,
                    )
                }
            }
            Op::AttentionGrad { wrt: AttentionInput::Query, .. } => unsafe {
                k::attention_grad_q::launch_unchecked::<F, A, R>(
                    c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]), arg(x[5]),
                    arg(&result), arg(&acc), arg(&meta), scale,
                )
            },
            Op::AttentionGrad { wrt, .. } => unsafe {
                k::attention_grad_kv::launch_unchecked::<F, A, R>(
                    c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]), arg(x[5]),
                    arg(&result), arg(&acc), arg(&meta), scale, *wrt == AttentionInput::Value,
                )
            },
            _ => unreachable!("matched above"),
        }
    }, {
        return Err(Error::dtype(op.name(), format!("attends over floats, not {dtype}")));
    });
    Ok(result)
}

/// One of the three ops run as its primitives ([`kiln_tensor::attention`]'s
/// `*_by_primitives`) on this device, one op at a time.
fn by_primitives<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
) -> Result<CubeStorage<R>> {
    let x = inputs
        .iter()
        .map(|v| {
            let copy = contiguous(&device.state, *v)?;
            RawTensor::from_storage(copy, *v.layout.dims(), device.clone())
        })
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&RawTensor<CubeBackend<R>>> = x.iter().collect();
    let b = &mut Eager::<CubeBackend<R>>::new(device.clone());
    let result = match (op, refs.as_slice()) {
        (Op::Attention(spec), [q, k, v]) => attention_by_primitives(b, q, k, v, spec)?,
        (Op::AttentionLse(spec), [q, k]) => lse_by_primitives(b, q, k, spec)?,
        (Op::AttentionGrad { spec, wrt }, six) => grad_by_primitives(b, spec, *wrt, six)?,
        (other, _) => return Err(Error::invalid(other.name(), "is not an attention op")),
    };
    result.into_storage()
}
