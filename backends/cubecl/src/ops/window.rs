//! Launching unfold2d and fold2d.

use super::elementwise::arg;
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::window as k;
use crate::storage::{device_size, CubeStorage};
use crate::strided::{grid, word, BLOCK};
use crate::CubeBackend;
use kiln_tensor::{DType, Error, Result, TensorMeta, View, Window2d};
use std::sync::Arc;

type V<'a, R> = View<'a, CubeBackend<R>>;

/// The window metadata shared by both kernels.
fn window_meta(
    n: usize,
    image: [usize; 4],
    w: &Window2d,
    out_hw: [usize; 2],
    offset: usize,
    strides: &[usize],
) -> Result<Vec<u32>> {
    let vals = [
        n,
        image[0],
        image[1],
        image[2],
        image[3],
        w.kernel[0],
        w.kernel[1],
        w.stride[0],
        w.stride[1],
        w.padding[0],
        w.padding[1],
        w.dilation[0],
        w.dilation[1],
        out_hw[0],
        out_hw[1],
        offset,
    ];
    vals.iter().chain(strides).map(|&v| word(v)).collect()
}

/// im2col.
pub fn unfold2d<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    x: V<'_, R>,
    w: &Window2d,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let n: usize = out.dims.iter().product();
    let result = dev.alloc("unfold2d", out.dtype, n)?;
    if n == 0 {
        return Ok(result);
    }
    let d = x.layout.dims();
    let (oh, ow) = (w.out_size(0, d[2])?, w.out_size(1, d[3])?);
    let words = window_meta(
        n,
        [d[0], d[1], d[2], d[3]],
        w,
        [oh, ow],
        x.layout.offset(),
        x.layout.strides(),
    )?;
    let m = dev.metadata(&words)?;
    // Zero in any dtype (written where the window reaches into the padding).
    let zero = dev.metadata(&[0, 0])?;
    let (count, dim) = grid(n, BLOCK);
    let c = &dev.client;
    match device_size(out.dtype) {
        8 => unsafe {
            k::unfold2d::launch_unchecked::<u64, R>(
                c,
                count,
                dim,
                arg(x.storage),
                arg(&result),
                arg(&m),
                arg(&zero),
            )
        },
        2 => unsafe {
            k::unfold2d::launch_unchecked::<R::Bits16, R>(
                c,
                count,
                dim,
                arg(x.storage),
                arg(&result),
                arg(&m),
                arg(&zero),
            )
        },
        _ => unsafe {
            k::unfold2d::launch_unchecked::<u32, R>(
                c,
                count,
                dim,
                arg(x.storage),
                arg(&result),
                arg(&m),
                arg(&zero),
            )
        },
    }
    Ok(result)
}

/// col2im.
pub fn fold2d<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    cols: V<'_, R>,
    w: &Window2d,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let n: usize = out.dims.iter().product();
    let result = dev.alloc("fold2d", out.dtype, n)?;
    if n == 0 {
        return Ok(result);
    }
    let o = &out.dims;
    let (oh, ow) = (w.out_size(0, o[2])?, w.out_size(1, o[3])?);
    let mut strides = cols.layout.strides().to_vec();
    strides.push(0);
    let words = window_meta(
        n,
        [o[0], o[1], o[2], o[3]],
        w,
        [oh, ow],
        cols.layout.offset(),
        &strides,
    )?;
    let m = dev.metadata(&words)?;
    let (count, dim) = grid(n, BLOCK);
    let c = &dev.client;
    macro_rules! go {
        ($T:ty, $A:ty) => {
            unsafe {
                k::fold2d::launch_unchecked::<$T, $A, R>(
                    c,
                    count,
                    dim,
                    arg(cols.storage),
                    arg(&result),
                    arg(&m),
                )
            }
        };
    }
    match out.dtype {
        DType::F32 => go!(f32, f32),
        DType::F64 => go!(f64, f64),
        DType::F16 => go!(half::f16, f32),
        DType::BF16 => go!(half::bf16, f32),
        DType::I32 => go!(i32, i32),
        DType::U32 => go!(u32, u32),
        DType::Bool | DType::I8 => {
            return Err(Error::dtype(
                "fold2d",
                format!("does not accept {}", out.dtype),
            ))
        }
    }
    Ok(result)
}
