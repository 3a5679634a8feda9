//! Data-dependent indexing: gather and its adjoint scatter-add. Indices are checked
//! against the indexed axis; an out-of-range index is an error, never a wild read.

use crate::storage::{with_storage, with_sum_storage, Accumulate, CpuElement, CpuStorage};
use crate::strided::gather as gather_view;
use kiln_tensor::{Dims, Error, Layout, Result};

/// Indices of a view as `usize`, checked against `bound`.
fn indices(index: &CpuStorage, l: &Layout, bound: usize, op: &'static str) -> Result<Vec<usize>> {
    let check = |i: i64| -> Result<usize> {
        if i < 0 || i as usize >= bound {
            Err(Error::index_out_of_range(op, i, bound))
        } else {
            Ok(i as usize)
        }
    };
    match index {
        CpuStorage::I32(v) => gather_view(v, l).iter().map(|&i| check(i as i64)).collect(),
        CpuStorage::U32(v) => gather_view(v, l).iter().map(|&i| check(i as i64)).collect(),
        other => Err(Error::dtype(
            op,
            format!("indices must be i32 or u32, not {}", other.dtype()),
        )),
    }
}

/// Visits every multi-index of `dims` in row-major order with its flat position.
fn for_each_index(dims: &Dims, mut f: impl FnMut(usize, &[usize])) {
    let n = dims.numel();
    let mut idx = vec![0usize; dims.rank()];
    for flat in 0..n {
        f(flat, &idx);
        for ax in (0..dims.rank()).rev() {
            idx[ax] += 1;
            if idx[ax] < dims[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// `out[p] = data[p with axis := index[p]]`.
pub fn gather(
    data: &CpuStorage,
    dl: &Layout,
    index: &CpuStorage,
    il: &Layout,
    axis: usize,
) -> Result<CpuStorage> {
    let idx = indices(index, il, dl.dims()[axis], "gather")?;
    let dims = *il.dims();
    fn go<T: CpuElement>(
        v: &[T],
        dl: &Layout,
        idx: &[usize],
        dims: &Dims,
        axis: usize,
    ) -> CpuStorage {
        let strides = dl.strides();
        let mut out = Vec::with_capacity(idx.len());
        for_each_index(dims, |flat, p| {
            let mut o = dl.offset();
            for (ax, (&i, &s)) in p.iter().zip(strides).enumerate() {
                o += if ax == axis { idx[flat] } else { i } * s;
            }
            out.push(v[o]);
        });
        T::wrap(out)
    }
    Ok(with_storage!(data, v, T => go::<T>(v, dl, &idx, &dims, axis)))
}

/// Zeros of `out_dims`, then `out[p with axis := index[p]] += src[p]`.
pub fn scatter_add(
    index: &CpuStorage,
    il: &Layout,
    src: &CpuStorage,
    sl: &Layout,
    axis: usize,
    out_dims: &Dims,
) -> Result<CpuStorage> {
    let idx = indices(index, il, out_dims[axis], "scatter_add")?;
    let dims = *sl.dims();
    let ostrides = out_dims.contiguous_strides();
    fn go<T: Accumulate>(
        v: &[T],
        sl: &Layout,
        idx: &[usize],
        dims: &Dims,
        axis: usize,
        out_dims: &Dims,
        os: &[usize],
    ) -> CpuStorage {
        let s = gather_view(v, sl);
        let mut acc = vec![T::zero(); out_dims.numel()];
        for_each_index(dims, |flat, p| {
            let mut o = 0;
            for (ax, &i) in p.iter().enumerate() {
                o += if ax == axis { idx[flat] } else { i } * os[ax];
            }
            acc[o] = T::add(acc[o], s[flat]);
        });
        T::wrap(acc.into_iter().map(T::finish).collect())
    }
    with_sum_storage!(src, v, T => Ok(go::<T>(v, sl, &idx, &dims, axis, out_dims, &ostrides)),
        Err(crate::elementwise::unsupported("scatter_add", src)))
}

/// The one-index-per-row case of gather and scatter-add on f32 (picking or scattering
/// the label's logit in cross-entropy), written into `out` without staging: `data` is
/// `[rows, n]` (gather) or `[rows, 1]` (scatter-add into `out` `[rows, n]`), `index`
/// `[rows, 1]` of i32, any strides. `Ok(false)` for any other case.
pub fn pick_rows_f32_into(
    data: &CpuStorage,
    dl: &Layout,
    index: &CpuStorage,
    il: &Layout,
    n: usize,
    scatter: bool,
    out: &mut [f32],
) -> Result<bool> {
    let (CpuStorage::F32(v), CpuStorage::I32(ix)) = (data, index) else {
        return Ok(false);
    };
    let (id, dd) = (il.dims(), dl.dims());
    if id.rank() != 2 || dd.rank() != 2 || id[1] != 1 || dd[0] != id[0] {
        return Ok(false);
    }
    let rows = id[0];
    let (is, ds) = (il.strides(), dl.strides());
    let at = |r: usize| ix[il.offset() + r * is[0]];
    for r in 0..rows {
        let i = at(r);
        if i < 0 || i as usize >= n {
            let op = if scatter { "scatter_add" } else { "gather" };
            return Err(kiln_tensor::Error::index_out_of_range(op, i as i64, n));
        }
    }
    if scatter {
        let out = &mut out[..rows * n];
        out.fill(0.0);
        for r in 0..rows {
            out[r * n + at(r) as usize] = v[dl.offset() + r * ds[0]];
        }
    } else {
        for (r, o) in out[..rows].iter_mut().enumerate() {
            *o = v[dl.offset() + r * ds[0] + at(r) as usize * ds[1]];
        }
    }
    Ok(true)
}

/// The embedding case of gather and scatter-add along axis 0 on f32, written into
/// `out` without staging. The index is `[r, d]` of i32 broadcast along its last axis
/// (stride 0: one row number per row). Gather reads rows of `values` (the table,
/// `[bound, d]`) into `out` `[r, d]`; scatter-add zeroes `out` `[bound, d]` and adds row
/// `r` of `values` (`[r, d]`) into row `index[r]`, rows in order, as [`scatter_add`]
/// does. `Ok(false)` for any other case.
pub fn embedding_rows_f32_into(
    values: &CpuStorage,
    vl: &Layout,
    index: &CpuStorage,
    il: &Layout,
    bound: usize,
    scatter: bool,
    out: &mut [f32],
) -> Result<bool> {
    let (CpuStorage::F32(v), CpuStorage::I32(ix)) = (values, index) else {
        return Ok(false);
    };
    let (id, vd) = (il.dims(), vl.dims());
    if id.rank() != 2 || vd.rank() != 2 || il.strides()[1] != 0 || vd[1] != id[1] {
        return Ok(false);
    }
    let (rows, width) = (id[0], id[1]);
    if (scatter && vd[0] != rows) || (!scatter && vd[0] != bound) {
        return Ok(false);
    }
    let op = if scatter { "scatter_add" } else { "gather" };
    let at = |r: usize| ix[il.offset() + r * il.strides()[0]];
    for r in 0..rows {
        let i = at(r);
        if i < 0 || i as usize >= bound {
            return Err(Error::index_out_of_range(op, i as i64, bound));
        }
    }
    let (vs, vo) = (vl.strides(), vl.offset());
    if scatter {
        let out = &mut out[..bound * width];
        out.fill(0.0);
        for r in 0..rows {
            let row = &mut out[at(r) as usize * width..][..width];
            for (c, o) in row.iter_mut().enumerate() {
                *o += v[vo + r * vs[0] + c * vs[1]];
            }
        }
    } else {
        for (r, row) in out[..rows * width].chunks_mut(width.max(1)).enumerate() {
            let first = vo + at(r) as usize * vs[0];
            if vs[1] == 1 {
                row.copy_from_slice(&v[first..first + width]);
            } else {
                for (c, o) in row.iter_mut().enumerate() {
                    *o = v[first + c * vs[1]];
                }
            }
        }
    }
    Ok(true)
}
