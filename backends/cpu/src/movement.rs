//! Kernels that move elements without arithmetic: strided copies, concat and pad.

use crate::storage::{with_storage, CpuElement, CpuStorage};
use crate::strided::gather;
use kiln_tensor::{Dims, Layout, Result};

/// Copies a strided view into a new contiguous buffer.
pub fn contiguous(x: &CpuStorage, l: &Layout) -> CpuStorage {
    with_storage!(x, v, T => <T as CpuElement>::wrap(gather(v, l).into_owned()))
}

fn concat_typed<T: CpuElement + Sync>(
    parts: &[(&[T], &Layout)],
    axis: usize,
    out_dims: &Dims,
) -> Vec<T> {
    let outer: usize = out_dims[..axis].iter().product();
    let inner: usize = out_dims[axis + 1..].iter().product();
    let blocks: Vec<(std::borrow::Cow<'_, [T]>, usize)> = parts
        .iter()
        .map(|(d, l)| (gather(d, l), l.dims()[axis] * inner))
        .collect();
    let mut out = Vec::with_capacity(out_dims.numel());
    for o in 0..outer {
        for (data, block) in &blocks {
            out.extend_from_slice(&data[o * block..(o + 1) * block]);
        }
    }
    out
}

/// Joins views along `axis` into `out_dims`.
pub fn concat(
    parts: &[(&CpuStorage, &Layout)],
    axis: usize,
    out_dims: &Dims,
) -> Result<CpuStorage> {
    macro_rules! go {
        ($($v:ident),*) => {
            match parts[0].0 {
                $(CpuStorage::$v(_) => {
                    let typed: Vec<_> = parts
                        .iter()
                        .map(|(s, l)| match s {
                            CpuStorage::$v(d) => Ok((&d[..], *l)),
                            other => Err(crate::elementwise::unsupported("concat", other)),
                        })
                        .collect::<Result<_>>()?;
                    CpuStorage::$v(concat_typed(&typed, axis, out_dims).into())
                })*
            }
        };
    }
    Ok(go!(F32, F64, F16, BF16, I32, U32, Bool, I8))
}

/// Pads `axis` of a view with `before`/`after` elements of `value`.
pub fn pad(
    x: &CpuStorage,
    l: &Layout,
    axis: usize,
    before: usize,
    after: usize,
    value: f64,
) -> CpuStorage {
    fn go<T: CpuElement + Sync>(
        v: &[T],
        l: &Layout,
        axis: usize,
        before: usize,
        after: usize,
        value: f64,
    ) -> CpuStorage {
        let d = gather(v, l);
        let dims = l.dims();
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis + 1..].iter().product();
        let fill = T::from_f64(value);
        let (pre, mid, post) = (before * inner, dims[axis] * inner, after * inner);
        let mut out = Vec::with_capacity(outer * (pre + mid + post));
        for o in 0..outer {
            out.extend(std::iter::repeat_n(fill, pre));
            out.extend_from_slice(&d[o * mid..(o + 1) * mid]);
            out.extend(std::iter::repeat_n(fill, post));
        }
        T::wrap(out)
    }
    with_storage!(x, v, T => go::<T>(v, l, axis, before, after, value))
}
