//! Launching attention's kernels: the inputs made contiguous rows where they are views,
//! the sizes as metadata, one launch per op. Half-float heads up to
//! [`flash::MAX_WIDTH`] wide on a device whose tensor cores take fragments in registers
//! (CUDA, sm80 on) run FlashAttention-2's kernels ([`crate::kernels::attention_flash`]);
//! elsewhere, on a device with 16×16×16 cooperative matrices, the tensor-core kernel
//! ([`crate::kernels::attention_mma`]); other
//! heads up to [`k::MAX_TILED_WIDTH`] wide the tiled kernels
//! ([`crate::kernels::attention`]); wider ones (and empty ones) the per-row kernels
//! ([`crate::kernels::attention_rows`]), whose running sums live in an f32 (f64) scratch
//! row of global memory. Dropout on the weights runs on the tiled (or per-row) kernels:
//! the tensor-core kernels do not draw.

use super::contiguous;
use super::elementwise::arg;
use crate::device::{CubeDevice, DeviceState, KilnRuntime};
use crate::kernels::attention as k;
use crate::kernels::attention_flash as flash;
use crate::kernels::attention_mma as mma;
use crate::kernels::attention_rows as rows_k;
use crate::storage::{with_float_type, CubeStorage};
use crate::strided::{grid, grid_per_item, word, BLOCK};
use crate::CubeBackend;
use cubecl::ir::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind, StorageType};
use cubecl::prelude::{CubeCount, CubeDim};
use kiln_tensor::attention::stats_dtype;
use kiln_tensor::{
    AttentionDropout, AttentionInput, DType, Error, Layout, Op, Result, TensorMeta, View,
};
use std::sync::Arc;

type V<'a, R> = View<'a, CubeBackend<R>>;

/// Runs [`Op::Attention`], [`Op::AttentionLse`] or [`Op::AttentionGrad`] (inputs as the
/// op table checked them; the result contiguous), a dropout drawing with its own seed.
pub fn attention<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    attention_drawing(device, op, inputs, out, None)
}

/// [`attention`], a dropout drawing with its own seed xor the one in `device_seed`
/// (`i32 [2]`, checked) when there is one: a captured step's.
pub fn attention_drawing<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
    device_seed: Option<&CubeStorage<R>>,
) -> Result<CubeStorage<R>> {
    launch(device, op, inputs, out, device_seed, Beside::Nothing).map(|(result, _)| result)
}

/// An [`Op::Attention`] and the [`Op::AttentionLse`] of its queries and keys in one
/// launch (`kiln_tensor::attention::one_pass`): the forward kernels compute each row's
/// log-sum-exp on the way to the output, and here write it too. The same values, bit
/// for bit, as the two ops one after the other.
pub fn attention_with_lse<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
) -> Result<(CubeStorage<R>, CubeStorage<R>)> {
    if !matches!(op, Op::Attention(_)) {
        return Err(Error::invalid(
            op.name(),
            "only an attention's output has its statistics computed beside it",
        ));
    }
    match launch(device, op, inputs, out, None, Beside::Lse)? {
        (result, Some(lse)) => Ok((result, lse)),
        (_, None) => unreachable!("every forward kernel keeps its statistics when asked"),
    }
}

/// The gradient of attention's keys (`op`: its [`Op::AttentionGrad`]; `inputs` its
/// six) and, where the tensor-core kernel runs, the values' from the same launch
/// ([`mma::MODE_DKV`]), bit for bit what the two ops compute alone; elsewhere the
/// values' is `None` (the caller runs its op).
pub fn key_and_value_grads<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
) -> Result<(CubeStorage<R>, Option<CubeStorage<R>>)> {
    if !matches!(
        op,
        Op::AttentionGrad {
            wrt: AttentionInput::Key,
            ..
        }
    ) {
        return Err(Error::invalid(
            op.name(),
            "only the keys' gradient has the values' computed beside it",
        ));
    }
    launch(device, op, inputs, out, None, Beside::ValueGrad)
}

/// What one launch computes beside its op's result, when asked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    Nothing,
    /// An [`Op::Attention`]'s row log-sum-exp (`[rows]` in the statistics' dtype): every
    /// forward kernel computes it on the way.
    Lse,
    /// The values' gradient beside the keys': only the tensor-core kernel computes it
    /// (elsewhere nothing is returned beside).
    ValueGrad,
}

/// One attention op's launch, and what `beside` asks for where the kernel computes it.
fn launch<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
    device_seed: Option<&CubeStorage<R>>,
    beside: Beside,
) -> Result<(CubeStorage<R>, Option<CubeStorage<R>>)> {
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
    // The forward pass's statistics, when kept: one per query row.
    let kept_lse = match beside {
        Beside::Lse => Some(dev.alloc(op.name(), stats, rows)?),
        _ => None,
    };
    if rows == 0 {
        return Ok((result, kept_lse));
    }
    // The row statistics need no draws.
    let dropout = spec.dropout.filter(|_| !matches!(op, Op::AttentionLse(_)));
    let draws = Draws::new(dev, dropout, device_seed)?;
    let tiles = Tiles {
        batch,
        tq,
        tk,
        e,
        ev,
        causal: spec.causal,
        own_rows: if per_key { tk } else { tq },
        result_len: rows * width,
    };
    let flash_fits = (1..=flash::MAX_WIDTH).contains(&e) && (1..=flash::MAX_WIDTH).contains(&ev);
    if flash_fits && dropout.is_none() && has_half_mma_registers(dev, dtype) {
        let (ew, evw) = (k::padded(e), k::padded(ev));
        let (meta, count, dim) = tiles.launch(dev, flash::WARPS * 16, flash::WARPS * 32)?;
        let tile = flash::grad_tile(ew, evw);
        // Unused operands bind one element of scratch (writable bindings must not
        // alias).
        let scratch_f = dev.alloc(op.name(), dtype, 1)?;
        let scratch_a = dev.alloc(op.name(), stats, 1)?;
        let both = beside == Beside::ValueGrad;
        // The values' gradient beside the keys': one row of `ev` per key.
        let dv = match both {
            true => Some(dev.alloc(op.name(), dtype, rows * ev)?),
            false => None,
        };
        let c = &dev.client;
        let (scale, neg_inf) = (spec.scale as f32, f32::NEG_INFINITY);
        with_float_type!(dtype, F, _A => {
            match op {
                Op::Attention(_) | Op::AttentionLse(_) => {
                    let with_values = matches!(op, Op::Attention(_));
                    // The log-sum-exp alone reads no values and writes no output; the
                    // output's statistics go to scratch unless kept.
                    let (v, out, lse_out) = if with_values {
                        (x[2], &result, kept_lse.as_ref().unwrap_or(&scratch_a))
                    } else {
                        (x[1], &scratch_f, &result)
                    };
                    unsafe {
                        flash::flash_forward_mma::launch_unchecked::<F, R>(
                            c, count, dim, arg(x[0]), arg(x[1]), arg(v), arg(out), arg(lse_out),
                            arg(&meta), scale, neg_inf, ew, evw, with_values, kept_lse.is_some(),
                        )
                    }
                }
                Op::AttentionGrad { wrt: AttentionInput::Query, .. } => unsafe {
                    flash::flash_grad_q_mma::launch_unchecked::<F, R>(
                        c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]),
                        arg(x[5]), arg(&result), arg(&meta), scale, neg_inf, ew, evw, tile,
                    )
                },
                Op::AttentionGrad { wrt, .. } => {
                    let keys = *wrt == AttentionInput::Key;
                    let (dk, dv_out) = match (keys, &dv) {
                        (true, Some(dv)) => (&result, dv),
                        (true, None) => (&result, &scratch_f),
                        (false, _) => (&scratch_f, &result),
                    };
                    unsafe {
                        flash::flash_grad_kv_mma::launch_unchecked::<F, R>(
                            c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]),
                            arg(x[5]), arg(dk), arg(dv_out), arg(&meta), scale, neg_inf, ew, evw,
                            tile, keys, !keys || both,
                        )
                    }
                }
                _ => unreachable!("matched above"),
            }
        }, {
            return Err(Error::dtype(op.name(), format!("attends over floats, not {dtype}")));
        });
        return Ok((result, kept_lse.or(dv)));
    }
    let widths_fit =
        (1..=mma::MAX_MMA_WIDTH).contains(&e) && (1..=mma::MAX_MMA_WIDTH).contains(&ev);
    if widths_fit && dropout.is_none() && has_half_mma(dev, dtype) {
        let (ew, evw) = (k::padded(e), k::padded(ev));
        let warps = mma::warps(ew, evw);
        let (meta, count, dim) = tiles.launch(dev, warps * 16, warps * 32)?;
        let both = beside == Beside::ValueGrad;
        let mode = match op {
            Op::AttentionLse(_) => mma::MODE_LSE,
            Op::Attention(_) => mma::MODE_OUT,
            Op::AttentionGrad {
                wrt: AttentionInput::Query,
                ..
            } => mma::MODE_DQ,
            Op::AttentionGrad {
                wrt: AttentionInput::Key,
                ..
            } if both => mma::MODE_DKV,
            Op::AttentionGrad {
                wrt: AttentionInput::Key,
                ..
            } => mma::MODE_DK,
            _ => mma::MODE_DV,
        };
        // The values' gradient: one row of `ev` per key.
        let dv = match both {
            true => Some(dev.alloc(op.name(), dtype, rows * ev)?),
            false => None,
        };
        // Unused operands bind one element of scratch (writable bindings must not
        // alias): the statistics for the forward passes, the output for the
        // log-sum-exp, the statistics written by all but the log-sum-exp.
        let scratch_f = dev.alloc(op.name(), dtype, 1)?;
        let scratch_a = dev.alloc(op.name(), stats, 1)?;
        let (v, g, lse, delta) = match x.len() {
            6 => (x[2], x[3], x[4], x[5]),
            3 => (x[2], x[2], &scratch_a, &scratch_a),
            _ => (x[1], x[1], &scratch_a, &scratch_a),
        };
        let (out, lse_out) = if mode == mma::MODE_LSE {
            (&scratch_f, &result)
        } else {
            (&result, kept_lse.as_ref().unwrap_or(&scratch_a))
        };
        let keep_stats = kept_lse.is_some();
        let own_out2;
        let out2 = match &dv {
            Some(dv) => dv,
            None => {
                own_out2 = dev.alloc(op.name(), dtype, 1)?;
                &own_out2
            }
        };
        let c = &dev.client;
        with_float_type!(dtype, F, A => {
            unsafe {
                mma::flash_mma::launch_unchecked::<F, A, R>(
                    c, count, dim, arg(x[0]), arg(x[1]), arg(v), arg(g), arg(lse), arg(delta),
                    arg(out), arg(out2), arg(lse_out), arg(&meta), spec.scale as A, A::NEG_INFINITY, ew, evw,
                    mode, warps, keep_stats,
                )
            }
        }, {
            return Err(Error::dtype(op.name(), format!("attends over floats, not {dtype}")));
        });
        return Ok((result, kept_lse.or(dv)));
    }
    let tiled = (1..=k::MAX_TILED_WIDTH).contains(&e) && (1..=k::MAX_TILED_WIDTH).contains(&ev);
    if tiled {
        let (meta, count, dim) = tiles.launch(dev, k::TILE_ROWS, k::TILE_ROWS)?;
        let (ew, evw) = (k::padded(e), k::padded(ev));
        let tile = k::tile_len(ew, evw);
        let c = &dev.client;
        let (seed, drop) = (draws.buffer(&meta), dropout.is_some());
        let [own_lo, own_hi] = draws.own;
        let threshold = draws.threshold;
        with_float_type!(dtype, F, A => {
            let scale = spec.scale as A;
            let keep = draws.keep as A;
            match op {
                Op::Attention(_) | Op::AttentionLse(_) => {
                    let with_values = matches!(op, Op::Attention(_));
                    // The output keeps its log-sum-exp in scratch; the log-sum-exp alone
                    // binds one element of scratch as the output it does not write
                    // (writable bindings must not alias).
                    let own_scratch;
                    let scratch = match &kept_lse {
                        Some(kept) => kept,
                        None => {
                            own_scratch = dev.alloc(op.name(), if with_values { stats } else { dtype }, if with_values { rows } else { 1 })?;
                            &own_scratch
                        }
                    };
                    let (v, out, lse) = if with_values { (x[2], &result, scratch) } else { (x[1], scratch, &result) };
                    unsafe {
                        k::flash_forward::launch_unchecked::<F, A, R>(
                            c, count, dim, arg(x[0]), arg(x[1]), arg(v), arg(out), arg(lse),
                            arg(&meta), arg(seed), own_lo, own_hi, threshold, keep, scale, A::NEG_INFINITY, ew, evw, tile,
                            with_values, drop,
                        )
                    }
                }
                Op::AttentionGrad { wrt: AttentionInput::Query, .. } => unsafe {
                    k::flash_grad_q::launch_unchecked::<F, A, R>(
                        c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]),
                        arg(x[5]), arg(&result), arg(&meta), arg(seed), own_lo, own_hi, threshold, keep, scale, ew, evw,
                        tile, drop,
                    )
                },
                Op::AttentionGrad { wrt, .. } => unsafe {
                    k::flash_grad_kv::launch_unchecked::<F, A, R>(
                        c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]),
                        arg(x[5]), arg(&result), arg(&meta), arg(seed), own_lo, own_hi, threshold, keep, scale, ew, evw,
                        tile, *wrt == AttentionInput::Value, drop,
                    )
                },
                _ => unreachable!("matched above"),
            }
        }, {
            return Err(Error::dtype(op.name(), format!("attends over floats, not {dtype}")));
        });
        return Ok((result, kept_lse));
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
    let (seed, drop) = (draws.buffer(&meta), dropout.is_some());
    let [own_lo, own_hi] = draws.own;
    let threshold = draws.threshold;
    with_float_type!(dtype, F, A => {
        let scale = spec.scale as A;
        let keep = draws.keep as A;
        match op {
            Op::Attention(_) | Op::AttentionLse(_) => {
                let with_values = matches!(op, Op::Attention(_));
                // The forward pass writes each row's log-sum-exp; for the output alone
                // into a row of scratch.
                let lse_rows = match (&kept_lse, with_values) {
                    (None, true) => Some(dev.alloc(op.name(), stats, rows)?),
                    _ => None,
                };
                let lse = kept_lse.as_ref().or(lse_rows.as_ref()).unwrap_or(&result);
                let (v, out) = if with_values { (x[2], &result) } else { (x[1], &acc) };
                unsafe {
                    rows_k::attention_rows::launch_unchecked::<F, A, R>(
                        c, count, dim, arg(x[0]), arg(x[1]), arg(v), arg(out), arg(lse), arg(&acc),
                        arg(&meta), arg(seed), own_lo, own_hi, threshold, keep, scale, A::NEG_INFINITY, with_values, drop,
                    )
                }
            }
            Op::AttentionGrad { wrt: AttentionInput::Query, .. } => unsafe {
                rows_k::attention_grad_q::launch_unchecked::<F, A, R>(
                    c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]), arg(x[5]),
                    arg(&result), arg(&acc), arg(&meta), arg(seed), own_lo, own_hi, threshold, keep, scale, drop,
                )
            },
            Op::AttentionGrad { wrt, .. } => unsafe {
                rows_k::attention_grad_kv::launch_unchecked::<F, A, R>(
                    c, count, dim, arg(x[0]), arg(x[1]), arg(x[2]), arg(x[3]), arg(x[4]), arg(x[5]),
                    arg(&result), arg(&acc), arg(&meta), arg(seed), own_lo, own_hi, threshold, keep, scale,
                    *wrt == AttentionInput::Value, drop,
                )
            },
            _ => unreachable!("matched above"),
        }
    }, {
        return Err(Error::dtype(op.name(), format!("attends over floats, not {dtype}")));
    });
    Ok((result, kept_lse))
}

/// Whether the device multiplies 16×16×16 tiles of `dtype` (a half float) into f32 on
/// its tensor cores as cooperative matrices.
fn has_half_mma<R: KilnRuntime>(dev: &DeviceState<R>, dtype: DType) -> bool {
    half_mma_config(dtype, 16).is_some_and(|c| dev.client.features().matmul.cmma.contains(&c))
}

/// Whether `dev` multiplies `dtype` (bf16 or f16) on tensor cores through fragments in
/// registers (PTX `mma.sync` m16n8k16 with f32 accumulators: CUDA on sm80 and later),
/// which [`flash::flash_forward_mma`] needs.
fn has_half_mma_registers<R: KilnRuntime>(dev: &DeviceState<R>, dtype: DType) -> bool {
    half_mma_config(dtype, 8).is_some_and(|c| dev.client.features().matmul.mma.contains(&c))
}

/// The 16×`n`×16 product of `dtype` (bf16 or f16) into f32; `None` for other dtypes.
fn half_mma_config(dtype: DType, n: u32) -> Option<MmaConfig> {
    let kind = match dtype {
        DType::BF16 => FloatKind::BF16,
        DType::F16 => FloatKind::F16,
        _ => return None,
    };
    let half = StorageType::Scalar(ElemType::Float(kind));
    Some(MmaConfig {
        a_type: half,
        b_type: half,
        cd_type: StorageType::Scalar(ElemType::Float(FloatKind::F32)),
        m: 16,
        n,
        k: 16,
    })
}

/// What the kernels draw dropout's factors with: the seed buffer (two words the kernels
/// xor with `own`), the op's own seed as two words (zeros when the buffer holds the
/// whole seed), the threshold and the kept weights' factor. Scalars, not metadata: a
/// captured step keeps them in its launches while the seed buffer changes.
struct Draws<'a, R: KilnRuntime> {
    seed: Option<SeedBuffer<'a, R>>,
    own: [u32; 2],
    threshold: u32,
    keep: f64,
}

/// The two words the kernels xor with their own seed.
enum SeedBuffer<'a, R: KilnRuntime> {
    /// Uploaded here: the whole seed, mixed on the host.
    Host(CubeStorage<R>),
    /// A captured step's seed in device memory.
    Device(&'a CubeStorage<R>),
}

impl<'a, R: KilnRuntime> Draws<'a, R> {
    fn new(
        dev: &Arc<DeviceState<R>>,
        dropout: Option<AttentionDropout>,
        device_seed: Option<&'a CubeStorage<R>>,
    ) -> Result<Self> {
        let split = |seed: u64| [seed as u32, (seed >> 32) as u32];
        let Some(d) = dropout else {
            return Ok(Draws {
                seed: None,
                own: [0; 2],
                threshold: 0,
                keep: 1.0,
            });
        };
        let (own, seed) = match device_seed {
            Some(buffer) => (split(d.seed), SeedBuffer::Device(buffer)),
            None => {
                // A replay would draw the same weights again.
                dev.refuse_in_capture(
                    "drawing attention dropout with a seed on the host (a replay would repeat the same draw)",
                )?;
                ([0, 0], SeedBuffer::Host(dev.metadata(&split(d.seed))?))
            }
        };
        Ok(Draws {
            seed: Some(seed),
            own,
            threshold: d.threshold(),
            keep: d.keep_scale(),
        })
    }

    /// The seed buffer the kernels read, or `unread` (any buffer) without dropout.
    fn buffer<'b>(&'b self, unread: &'b CubeStorage<R>) -> &'b CubeStorage<R> {
        match &self.seed {
            Some(SeedBuffer::Host(buffer)) => buffer,
            Some(SeedBuffer::Device(buffer)) => buffer,
            None => unread,
        }
    }
}

/// The sizes the tiled and tensor-core kernels share: their metadata
/// (`[batch, tq, tk, causal, e, ev]`) and their grid.
struct Tiles {
    batch: usize,
    tq: usize,
    tk: usize,
    e: usize,
    ev: usize,
    causal: bool,
    /// Rows per batch element of the side a cube owns (queries or keys).
    own_rows: usize,
    /// Elements of the result.
    result_len: usize,
}

impl Tiles {
    /// The metadata and a grid of cubes of `units` owning `rows_per_cube` rows each.
    fn launch<R: KilnRuntime>(
        &self,
        dev: &Arc<DeviceState<R>>,
        rows_per_cube: u32,
        units: u32,
    ) -> Result<(CubeStorage<R>, CubeCount, CubeDim)> {
        let words = [
            self.batch,
            self.tq,
            self.tk,
            self.causal as usize,
            self.e,
            self.ev,
        ]
        .iter()
        .map(|&v| word(v))
        .collect::<Result<Vec<u32>>>()?;
        word(self.result_len)?;
        let meta = dev.metadata(&words)?;
        let cubes = self.batch * self.own_rows.div_ceil(rows_per_cube as usize);
        let (count, dim) = grid_per_item(cubes, units);
        Ok((meta, count, dim))
    }
}
