//! Launching gather and scatter-add.

use super::elementwise::arg;
use crate::device::{DeviceState, KilnRuntime};
use crate::kernels::index as k;
use crate::storage::{device_size, CubeStorage};
use crate::strided::{grid, grid_per_item, word, BLOCK};
use crate::CubeBackend;
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::sync::Arc;

type V<'a, R> = View<'a, CubeBackend<R>>;

/// The message of an out-of-range index the kernel reported (its bits in `detail`).
fn bad_index(op: &'static str, detail: u32, signed: bool, axis: usize, size: usize) -> Error {
    let index = if signed {
        (detail as i32) as i64
    } else {
        detail as i64
    };
    Error::invalid(
        op,
        format!(
            "index {index} is out of range for axis {axis} of size {size} (kernels run \
             asynchronously: reported at the next read or synchronisation)"
        ),
    )
}

/// `torch.gather` along `axis`.
pub fn gather<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    data: V<'_, R>,
    index: V<'_, R>,
    axis: usize,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let n: usize = out.dims.iter().product();
    let result = dev.alloc("gather", out.dtype, n)?;
    if n == 0 {
        return Ok(result);
    }
    let rank = out.dims.len();
    let mut w = vec![word(n)?];
    for &d in &out.dims {
        w.push(word(d)?);
    }
    w.push(word(data.layout.dims()[axis])?);
    w.push(word(data.layout.offset())?);
    for &s in data.layout.strides() {
        w.push(word(s)?);
    }
    w.push(word(index.layout.offset())?);
    for &s in index.layout.strides() {
        w.push(word(s)?);
    }
    let m = dev.metadata(&w)?;
    // Zero in any dtype (the kernel writes it where an index is out of range).
    let zero = dev.metadata(&[0, 0])?;
    let flags = dev.new_flag()?;
    let (count, dim) = grid(n, BLOCK);
    let (r, a) = (rank as u32, axis as u32);
    let c = &dev.client;
    macro_rules! go {
        ($T:ty, $I:ty) => {
            unsafe {
                k::gather::launch_unchecked::<$T, $I, R>(
                    c,
                    count,
                    dim,
                    arg(data.storage),
                    arg(index.storage),
                    arg(&result),
                    arg(&m),
                    arg(&flags),
                    arg(&zero),
                    r,
                    a,
                )
            }
        };
    }
    let signed = index.storage.dtype == DType::I32;
    match (device_size(out.dtype), signed) {
        (8, true) => go!(u64, i32),
        (8, false) => go!(u64, u32),
        (2, true) => go!(R::Bits16, i32),
        (2, false) => go!(R::Bits16, u32),
        (_, true) => go!(u32, i32),
        (_, false) => go!(u32, u32),
    }
    let size = data.layout.dims()[axis];
    dev.defer_check(
        &flags,
        Arc::new(move |_, detail| bad_index("gather", detail, signed, axis, size)),
    )?;
    Ok(result)
}

/// Zeros of `out`'s dims with `src` added at `index` along `axis`.
pub fn scatter_add<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    index: V<'_, R>,
    src: V<'_, R>,
    axis: usize,
    out: &TensorMeta,
) -> Result<CubeStorage<R>> {
    let n: usize = out.dims.iter().product();
    let result = dev.alloc("scatter_add", out.dtype, n)?;
    if n == 0 {
        if src.layout.numel() > 0 {
            // Every index points into an axis of size 0.
            return Err(Error::invalid(
                "scatter_add",
                format!("indices cannot address axis {axis} of size 0"),
            ));
        }
        return Ok(result);
    }
    let rank = out.dims.len();
    let mut w = vec![word(n)?];
    for &d in out.dims.iter().chain(src.layout.dims().iter()) {
        w.push(word(d)?);
    }
    w.push(word(index.layout.offset())?);
    for &s in index.layout.strides() {
        w.push(word(s)?);
    }
    w.push(word(src.layout.offset())?);
    for &s in src.layout.strides() {
        w.push(word(s)?);
    }
    let m = dev.metadata(&w)?;
    let flags = dev.new_flag()?;
    // An index constant off the axis (an embedding's row ids broadcast over its
    // columns) is read once per cube of columns, not once per output element.
    let (i_dims, i_strides) = (index.layout.dims(), index.layout.strides());
    let rows = src.layout.numel() > 0
        && (0..rank).all(|d| d == axis || i_strides[d] == 0 || i_dims[d] == 1);
    let columns = n / out.dims[axis];
    let (count, dim) = match rows {
        true => grid_per_item(out.dims[axis] * columns.div_ceil(BLOCK as usize), BLOCK),
        false => grid(n, BLOCK),
    };
    let (r, a) = (rank as u32, axis as u32);
    let c = &dev.client;
    macro_rules! go {
        ($T:ty, $A:ty, $I:ty) => {
            unsafe {
                match rows {
                    true => k::scatter_add_rows::launch_unchecked::<$T, $A, $I, R>(
                        c,
                        count,
                        dim,
                        arg(index.storage),
                        arg(src.storage),
                        arg(&result),
                        arg(&m),
                        arg(&flags),
                        r,
                        a,
                        BLOCK,
                    ),
                    false => k::scatter_add::launch_unchecked::<$T, $A, $I, R>(
                        c,
                        count,
                        dim,
                        arg(index.storage),
                        arg(src.storage),
                        arg(&result),
                        arg(&m),
                        arg(&flags),
                        r,
                        a,
                    ),
                }
            }
        };
    }
    macro_rules! by_index {
        ($T:ty, $A:ty) => {
            if index.storage.dtype == DType::I32 {
                go!($T, $A, i32)
            } else {
                go!($T, $A, u32)
            }
        };
    }
    match out.dtype {
        DType::F32 => by_index!(f32, f32),
        DType::F64 => by_index!(f64, f64),
        DType::F16 => by_index!(half::f16, f32),
        DType::BF16 => by_index!(half::bf16, f32),
        DType::I32 => by_index!(i32, i32),
        DType::U32 => by_index!(u32, u32),
        DType::Bool | DType::I8 => {
            return Err(Error::dtype(
                "scatter_add",
                format!("does not accept {}", out.dtype),
            ));
        }
    }
    let signed = index.storage.dtype == DType::I32;
    let size = out.dims[axis];
    dev.defer_check(
        &flags,
        Arc::new(move |_, detail| bad_index("scatter_add", detail, signed, axis, size)),
    )?;
    Ok(result)
}

/// Each element's index along `axis` of `dims`, as i32 (the op's rule checked the
/// sizes).
pub fn iota<R: KilnRuntime>(
    dev: &Arc<DeviceState<R>>,
    dims: &[usize],
    axis: usize,
) -> Result<CubeStorage<R>> {
    let n: usize = dims.iter().product();
    if n > u32::MAX as usize {
        return Err(Error::invalid(
            "iota",
            format!("{n} elements exceed a launch's 2^32 positions"),
        ));
    }
    let result = dev.alloc("iota", DType::I32, n)?;
    if n == 0 {
        return Ok(result);
    }
    let stride: usize = dims[axis + 1..].iter().product();
    let (count, dim) = grid(n, BLOCK);
    unsafe {
        k::iota::launch_unchecked::<R>(
            &dev.client,
            count,
            dim,
            arg(&result),
            n as u32,
            stride.max(1) as u32,
            dims[axis].max(1) as u32,
        )
    };
    Ok(result)
}
