//! Int8 buffers on CubeCL devices: the product with an int8 weight, and every other op
//! an int8 buffer reaches (views' copies, an int8 table's gathers, casts to floats) run
//! by widening it to i32, running the generic kernel, and narrowing an int8 result
//! back. The buffers hold bytes that kernels read four to a u32 word.

use super::elementwise::arg;
use super::{execute, V};
use crate::device::{CubeDevice, DeviceState, KilnRuntime};
use crate::kernels::int8 as k;
use crate::storage::CubeStorage;
use crate::strided::{grid, word, BLOCK};
use cubecl::prelude::*;
use kiln_tensor::{DType, Dims, Layout, Op, Result, TensorMeta, View};
use std::sync::Arc;

/// An int8 buffer as the u32 words its kernels read.
fn words<R: KilnRuntime>(s: &CubeStorage<R>) -> ArrayArg<R> {
    s.device.note_bound(s);
    // SAFETY: the buffer holds whole words (`storage::device_bytes`), this many.
    unsafe { ArrayArg::from_raw_parts(s.handle.clone(), s.len.div_ceil(4).max(1)) }
}

/// Rows from which the int8 product runs as a float product of the dequantised
/// weight (the weight read once for all of them, the device's best product kernel),
/// and under which as matrix-vector products over the int8 bytes.
const FLOAT_PRODUCT_ROWS: usize = 16;

/// `Op::MatMulInt8`: `x [.., K]` (f32) by the int8 weight `w [N, K]` scaled per row by
/// `scale [N]`, each operand made contiguous first where it is a view. Few rows read
/// the int8 weight directly; many run a float product of the weight dequantised once
/// (`w · scale`, the op's definition), which the device's product kernel takes.
pub fn matmul_int8<R: KilnRuntime>(
    device: &CubeDevice<R>,
    x: V<'_, R>,
    w: V<'_, R>,
    scale: V<'_, R>,
) -> Result<CubeStorage<R>> {
    let dev = &device.state;
    let plain = |v: &V<'_, R>| v.layout.offset() == 0 && v.layout.is_contiguous();
    let copy = |v: V<'_, R>| match plain(&v) {
        true => Ok(None),
        false => super::contiguous(dev, v).map(Some),
    };
    let (cx, cw, cs) = (copy(x)?, copy(w)?, copy(scale)?);
    let (n, kdim) = (w.layout.dims()[0], w.layout.dims()[1]);
    let xd = x.layout.dims();
    let m: usize = xd[..xd.rank() - 1].iter().product();
    let (xs, ws, ss) = (
        cx.as_ref().unwrap_or(x.storage),
        cw.as_ref().unwrap_or(w.storage),
        cs.as_ref().unwrap_or(scale.storage),
    );
    let (rows, cols, depth) = (word(m)?, word(n)?, word(kdim)?);
    word(m * n)?;
    word(n * kdim)?;
    if m >= FLOAT_PRODUCT_ROWS && kdim > 0 {
        let deq = dev.alloc("matmul_int8", DType::F32, n * kdim)?;
        let (count, dim) = grid(n * kdim, BLOCK);
        // SAFETY: `deq` holds `kdim · n` values, `ws` as many bytes, `ss` `n` scales.
        unsafe {
            k::dequantize_int8::launch_unchecked::<R>(
                &dev.client,
                count,
                dim,
                words(ws),
                arg(ss),
                arg(&deq),
                cols,
                depth,
            )
        };
        let xv = View {
            storage: xs,
            layout: Layout::contiguous(Dims::new(&[m, kdim])?),
        };
        let wv = View {
            storage: &deq,
            layout: Layout::contiguous(Dims::new(&[kdim, n])?),
        };
        return execute(
            device,
            &Op::MatMul,
            &[xv, wv],
            &TensorMeta::new(vec![m, n], DType::F32),
        );
    }
    let result = dev.alloc("matmul_int8", DType::F32, m * n)?;
    if m * n == 0 {
        return Ok(result);
    }
    let count = crate::strided::grid_per_item(n, k::MATVEC_BLOCK).0;
    let dim = CubeDim::new_1d(k::MATVEC_BLOCK);
    // SAFETY: the buffers hold what the sizes say (contiguous copies where needed).
    unsafe {
        k::matvec_int8::launch_unchecked::<R>(
            &dev.client,
            count,
            dim,
            arg(xs),
            words(ws),
            arg(ss),
            arg(&result),
            rows,
            cols,
            depth,
        )
    };
    Ok(result)
}

/// An int8 buffer's values as i32, element for element (a view over one reads the
/// other with the same layout).
fn widen<R: KilnRuntime>(dev: &Arc<DeviceState<R>>, s: &CubeStorage<R>) -> Result<CubeStorage<R>> {
    let out = dev.alloc("widen", DType::I32, s.len)?;
    if s.len > 0 {
        let (count, dim) = grid(s.len, BLOCK);
        let n = word(s.len)?;
        // SAFETY: `out` holds `n` values and `s` `n` bytes in whole words.
        unsafe {
            k::widen_int8::launch_unchecked::<R>(&dev.client, count, dim, words(s), arg(&out), n)
        };
    }
    Ok(out)
}

/// An i32 buffer of values in −128..=127 as an int8 one.
fn narrow<R: KilnRuntime>(dev: &Arc<DeviceState<R>>, s: &CubeStorage<R>) -> Result<CubeStorage<R>> {
    let out = dev.alloc("narrow", DType::I8, s.len)?;
    if s.len > 0 {
        let (count, dim) = grid(s.len.div_ceil(4), BLOCK);
        let n = word(s.len)?;
        // SAFETY: `s` holds `n` values and `out` `n` bytes in whole words.
        unsafe {
            k::narrow_int8::launch_unchecked::<R>(&dev.client, count, dim, arg(s), words(&out), n)
        };
    }
    Ok(out)
}

/// `op` (not the product) over inputs of which some are int8: on their values widened
/// to i32, an int8 result narrowed back.
pub fn execute_widened<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[V<'_, R>],
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let dev = &device.state;
    let wide: Vec<Option<CubeStorage<R>>> = inputs
        .iter()
        .map(|v| {
            (v.storage.dtype == DType::I8)
                .then(|| widen(dev, v.storage))
                .transpose()
        })
        .collect::<Result<_>>()?;
    let views: Vec<V<'_, R>> = inputs
        .iter()
        .zip(&wide)
        .map(|(v, w)| View {
            storage: w.as_ref().unwrap_or(v.storage),
            layout: v.layout,
        })
        .collect();
    if out.dtype != DType::I8 {
        return execute(device, op, &views, out);
    }
    let wide_out = execute(
        device,
        op,
        &views,
        &TensorMeta::new(out.dims.clone(), DType::I32),
    )?;
    narrow(dev, &wide_out)
}

/// The elements an int8 view selects, as a new contiguous int8 buffer.
pub fn contiguous<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    x: V<'_, R>,
) -> Result<CubeStorage<R>> {
    let wide = widen(dev, x.storage)?;
    let copied = super::contiguous(
        dev,
        View {
            storage: &wide,
            layout: x.layout,
        },
    )?;
    narrow(dev, &copied)
}

/// The int8 product's kernel on lavapipe and the widening round trip, against an f64
/// reference, with views that need copies first.
#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use kiln_tensor::HostData;
    use kiln_tensor::RawTensor;

    type Wg = crate::Wgpu;

    /// `n` values in [-scale, scale) from the suite's seeded generator.
    fn values(n: usize, seed: u64, scale: f32, device: &crate::WgpuDevice) -> Result<Vec<f32>> {
        let t = kiln_tensor::testing::lcg_tensor::<Wg>(&[n], seed, device)?;
        Ok(t.to_vec::<f32>()?.iter().map(|v| v * scale).collect())
    }

    #[test]
    fn the_dequantising_kernel_is_the_exact_product() -> Result<()> {
        let device = crate::WgpuDevice::first()?;
        // Matrix-vector products under 16 rows, a float product of the dequantised
        // weight from 16.
        for (m, n, k) in [
            (1, 70, 300),
            (3, 10, 1),
            (5, 33, 64),
            (2, 4, 0),
            (0, 3, 5),
            (2, 3, 7),
            (16, 9, 40),
            (37, 65, 130),
        ] {
            let xv = values(m * k, 1, 3.0, &device)?;
            let wv: Vec<i8> = values(n * k, 2, 128.0, &device)?
                .iter()
                .map(|v| v.round().clamp(-128.0, 127.0) as i8)
                .collect();
            let sv = values(n, 3, 0.01, &device)?;
            let x = RawTensor::<Wg>::from_vec(xv.clone(), &[m, k], &device)?;
            // The weight stored transposed, so the product reads a copy.
            let w = RawTensor::<Wg>::from_host(HostData::I8(wv.clone()), &[k, n], &device)?;
            let mut wl = w.view();
            wl.layout = w.layout().permute(&[1, 0])?;
            let s = RawTensor::<Wg>::from_vec(sv.clone(), &[n], &device)?;
            let out = matmul_int8(&device, x.view(), wl, s.view())?;
            let got = <Wg as kiln_tensor::Backend>::download(
                &out,
                &Layout::contiguous(Dims::new(&[m * n])?),
            )?
            .to_f64_vec();
            for r in 0..m {
                for c in 0..n {
                    let term = |j: usize| xv[r * k + j] as f64 * wv[j * n + c] as f64;
                    let exact = (0..k).map(term).sum::<f64>() * sv[c] as f64;
                    let bound =
                        (0..k).map(|j| term(j).abs()).sum::<f64>() * (sv[c] as f64).abs() * 1e-5
                            + 1e-6;
                    let g = got[r * n + c];
                    assert!(
                        (g - exact).abs() <= bound,
                        "[{r}, {c}] of {m}×{n}×{k}: {g} vs {exact}"
                    );
                }
            }
            // The transposed view read back through the widening round trip.
            let back = <Wg as kiln_tensor::Backend>::download(w.storage(), &wl.layout)?;
            let want: Vec<i8> = (0..n * k).map(|i| wv[(i % k) * n + i / k]).collect();
            assert_eq!(back, HostData::I8(want));
        }
        Ok(())
    }
}
