//! Reductions over axes: the reduced axes are moved innermost (copying only when the
//! layout requires it), then each output element reduces one contiguous row.

use crate::storage::{CpuStorage, FloatKernel};
use crate::strided::gather;
use kiln_tensor::{Error, Layout, ReduceOp, Result};
use num_traits::{Float, Zero};
use rayon::prelude::*;

/// Splits `layout` into a row-major [outer, inner] matrix with the reduced axes inner.
fn rows<'a, T: Copy + Send + Sync>(
    data: &'a [T],
    layout: &Layout,
    axes: &[usize],
) -> Result<(std::borrow::Cow<'a, [T]>, usize, usize)> {
    let r = layout.rank();
    let mut perm: Vec<usize> = (0..r).filter(|a| !axes.contains(a)).collect();
    perm.extend_from_slice(axes);
    let p = layout.permute(&perm)?;
    let inner: usize = axes.iter().map(|&a| layout.dims()[a]).product();
    let outer = layout
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, d)| *d)
        .product();
    Ok((gather(data, &p), outer, inner))
}

fn par_rows<T: Sync, O: Send + Default + Clone>(
    data: &[T],
    outer: usize,
    inner: usize,
    f: impl Fn(&[T]) -> O + Sync + Send,
) -> Vec<O> {
    if inner == 0 {
        return (0..outer).map(|_| f(&[])).collect();
    }
    if outer * inner >= crate::elementwise::GRAIN && outer > 1 {
        data.par_chunks(inner).map(&f).collect()
    } else {
        data.chunks(inner).map(f).collect()
    }
}

/// Rows longer than this are summed pairwise.
const PAIRWISE_BLOCK: usize = 128;

/// Sums a row in the compute type: blocks of up to `PAIRWISE_BLOCK` elements with 8
/// independent partial sums (so rustc can vectorise), longer rows as the sum of their
/// two halves. The rounding error then grows with log n, not n: a running sum of 40k
/// equal f32 values is off by 1e-4 relative, this by about 1e-7 (NumPy's scheme).
fn sum_row<T: FloatKernel>(row: &[T]) -> T::C {
    if row.len() > PAIRWISE_BLOCK {
        // The first half a multiple of 8, so its blocks stay whole lanes.
        let half = (row.len() / 2) & !7;
        return sum_row(&row[..half]) + sum_row(&row[half..]);
    }
    let mut acc = [T::C::zero(); 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i] + c[i].load();
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in rest {
        s = s + x.load();
    }
    s
}

fn reduce_float<T: FloatKernel>(
    op: ReduceOp,
    data: &[T],
    layout: &Layout,
    axes: &[usize],
) -> Result<CpuStorage> {
    let (d, outer, inner) = rows(data, layout, axes)?;
    if inner == 0
        && matches!(
            op,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
        )
    {
        return Err(Error::invalid(op.name(), "cannot reduce an empty axis"));
    }
    Ok(match op {
        ReduceOp::Sum => T::wrap(par_rows(&d, outer, inner, |r| T::store(sum_row(r)))),
        ReduceOp::Max => T::wrap(par_rows(&d, outer, inner, |r| {
            r.iter().copied().fold(r[0], |m, x| {
                if x.load() > m.load() || x.load().is_nan() {
                    x
                } else {
                    m
                }
            })
        })),
        ReduceOp::Min => T::wrap(par_rows(&d, outer, inner, |r| {
            r.iter().copied().fold(r[0], |m, x| {
                if x.load() < m.load() || x.load().is_nan() {
                    x
                } else {
                    m
                }
            })
        })),
        ReduceOp::ArgMax => {
            CpuStorage::I32(par_rows(&d, outer, inner, |r| arg_best(r, |a, b| a > b)).into())
        }
        ReduceOp::ArgMin => {
            CpuStorage::I32(par_rows(&d, outer, inner, |r| arg_best(r, |a, b| a < b)).into())
        }
    })
}

/// Index of the first element that `better` prefers; a NaN wins, like PyTorch.
fn arg_best<T: FloatKernel>(r: &[T], better: impl Fn(T::C, T::C) -> bool) -> i32 {
    let mut best = 0;
    let mut bv = r[0].load();
    for (i, x) in r.iter().enumerate().skip(1) {
        let v = x.load();
        if bv.is_nan() {
            break;
        }
        if better(v, bv) || v.is_nan() {
            best = i;
            bv = v;
        }
    }
    best as i32
}

macro_rules! reduce_int {
    ($t:ty, $op:expr, $data:expr, $layout:expr, $axes:expr) => {{
        let (d, outer, inner) = rows($data, $layout, $axes)?;
        if inner == 0 && !matches!($op, ReduceOp::Sum) {
            return Err(Error::invalid($op.name(), "cannot reduce an empty axis"));
        }
        let idx = |r: &[$t], better: fn($t, $t) -> bool| {
            let mut b = 0;
            for i in 1..r.len() {
                if better(r[i], r[b]) {
                    b = i;
                }
            }
            b as i32
        };
        match $op {
            ReduceOp::Sum => {
                <$t as crate::storage::CpuElement>::wrap(par_rows(&d, outer, inner, |r| {
                    r.iter().fold(0 as $t, |a, &x| a.wrapping_add(x))
                }))
            }
            ReduceOp::Max => {
                <$t as crate::storage::CpuElement>::wrap(par_rows(&d, outer, inner, |r| {
                    *r.iter().max().expect("non-empty")
                }))
            }
            ReduceOp::Min => {
                <$t as crate::storage::CpuElement>::wrap(par_rows(&d, outer, inner, |r| {
                    *r.iter().min().expect("non-empty")
                }))
            }
            ReduceOp::ArgMax => {
                CpuStorage::I32(par_rows(&d, outer, inner, |r| idx(r, |a, b| a > b)).into())
            }
            ReduceOp::ArgMin => {
                CpuStorage::I32(par_rows(&d, outer, inner, |r| idx(r, |a, b| a < b)).into())
            }
        }
    }};
}

/// Runs a reduction over `axes` (keepdim layout of the result is the caller's).
pub fn reduce(op: ReduceOp, x: &CpuStorage, layout: &Layout, axes: &[usize]) -> Result<CpuStorage> {
    if matches!(x, CpuStorage::F32(_)) {
        // Where a planned step's in-place reduction applies, the same code: the op gives
        // the same bits whichever path runs it.
        let kept = layout.numel()
            / axes
                .iter()
                .map(|&a| layout.dims()[a])
                .product::<usize>()
                .max(1);
        let mut out = vec![0f32; kept];
        if reduce_f32_into(op, x, layout, axes, &mut out) {
            return Ok(CpuStorage::F32(out.into()));
        }
    }
    Ok(match x {
        CpuStorage::F32(v) => reduce_float(op, v, layout, axes)?,
        CpuStorage::F64(v) => reduce_float(op, v, layout, axes)?,
        CpuStorage::F16(v) => reduce_float(op, v, layout, axes)?,
        CpuStorage::BF16(v) => reduce_float(op, v, layout, axes)?,
        CpuStorage::I32(v) => reduce_int!(i32, op, v, layout, axes),
        CpuStorage::U32(v) => reduce_int!(u32, op, v, layout, axes),
        CpuStorage::Bool(_) | CpuStorage::I8(_) => {
            return Err(crate::elementwise::unsupported(op.name(), x))
        }
    })
}

/// One row's f32 sum, max or min (a NaN wins max and min, as in PyTorch): what every
/// reduction of contiguous rows computes, so a row pass gives the same bits. Sum and
/// the others only; an empty row is refused before this.
pub(crate) fn reduce_row_f32(op: ReduceOp, row: &[f32]) -> f32 {
    let pick = move |m: f32, v: f32| match op {
        ReduceOp::Max if v > m || v.is_nan() => v,
        ReduceOp::Min if v < m || v.is_nan() => v,
        _ => m,
    };
    match op {
        ReduceOp::Sum => sum_row(row),
        _ => row.iter().fold(row[0], |m, &v| pick(m, v)),
    }
}

/// An f32 sum, max or min written into `out` without staging copies, when `layout` is
/// contiguous and `axes` are its leading or its trailing axes (bias gradients, row
/// statistics), one run of axes between kept ones (pooling's taps) or all but one run
/// (batch norm's statistics); `false` for every other case, which [`reduce`] handles.
pub fn reduce_f32_into(
    op: ReduceOp,
    x: &CpuStorage,
    layout: &Layout,
    axes: &[usize],
    out: &mut [f32],
) -> bool {
    let CpuStorage::F32(data) = x else {
        return false;
    };
    if !layout.is_contiguous() || !matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min) {
        return false;
    }
    let (r, d) = (layout.rank(), layout.dims());
    let k = axes.len();
    let mut sorted = [0usize; kiln_tensor::shape::MAX_RANK];
    sorted[..k].copy_from_slice(axes);
    sorted[..k].sort_unstable();
    let prefix = (0..k).all(|i| sorted[i] == i);
    let suffix = (0..k).all(|i| sorted[i] == r - k + i);
    let n = layout.numel();
    let x = &data[layout.offset()..layout.offset() + n];
    if k == 0 || n == 0 {
        return false;
    }
    let pick = move |m: f32, v: f32| match op {
        ReduceOp::Max if v > m || v.is_nan() => v,
        ReduceOp::Min if v < m || v.is_nan() => v,
        _ => m,
    };
    if suffix {
        let inner: usize = d[r - k..].iter().product();
        let rows = &mut out[..n / inner];
        let row = |(o, row): (&mut f32, &[f32])| *o = reduce_row_f32(op, row);
        if n >= crate::elementwise::GRAIN && rows.len() > 1 {
            rows.par_iter_mut().zip(x.par_chunks(inner)).for_each(row);
        } else {
            rows.iter_mut().zip(x.chunks(inner)).for_each(row);
        }
        return true;
    }
    if !prefix {
        // Kept and reduced axes alternating as [kept, reduced, kept] (a pooling window's
        // taps) or [reduced, kept, reduced] (batch norm's statistics over N, H, W).
        let reduced = |a: usize| sorted[..k].contains(&a);
        let mut runs: [(bool, usize); kiln_tensor::shape::MAX_RANK] =
            [(false, 1); kiln_tensor::shape::MAX_RANK];
        let mut count = 0;
        for a in 0..r {
            if count > 0 && runs[count - 1].0 == reduced(a) {
                runs[count - 1].1 *= d[a];
            } else {
                runs[count] = (reduced(a), d[a]);
                count += 1;
            }
        }
        match runs[..count] {
            [(false, outer), (true, taps), (false, inner)] => {
                reduce_middle_f32(op, x, outer, taps, inner, &mut out[..outer * inner]);
                return true;
            }
            [(true, outer), (false, kept), (true, inner)] => {
                reduce_around_f32(op, x, outer, kept, inner, &mut out[..kept]);
                return true;
            }
            _ => {}
        }
    }
    if prefix {
        let inner: usize = d[k..].iter().product();
        let outer = n / inner;
        // Columns in chunks, each accumulating the rows in order.
        let cols = |(c, acc): (usize, &mut [f32])| {
            let c0 = c * COLUMN_CHUNK;
            acc.copy_from_slice(&x[c0..c0 + acc.len()]);
            for i in 1..outer {
                let src = &x[i * inner + c0..i * inner + c0 + acc.len()];
                match op {
                    ReduceOp::Sum => acc.iter_mut().zip(src).for_each(|(a, &v)| *a += v),
                    _ => acc.iter_mut().zip(src).for_each(|(a, &v)| *a = pick(*a, v)),
                }
            }
        };
        let out = &mut out[..inner];
        if n >= crate::elementwise::GRAIN && inner > COLUMN_CHUNK {
            out.par_chunks_mut(COLUMN_CHUNK).enumerate().for_each(cols);
        } else {
            out.chunks_mut(COLUMN_CHUNK).enumerate().for_each(cols);
        }
        return true;
    }
    false
}

/// `x` as `[outer, taps, inner]` reduced over `taps` into `out [outer, inner]`: each
/// output row starts as the first tap's row and takes the others in order.
fn reduce_middle_f32(
    op: ReduceOp,
    x: &[f32],
    outer: usize,
    taps: usize,
    inner: usize,
    out: &mut [f32],
) {
    let row = |(o, acc): (usize, &mut [f32])| {
        let block = &x[o * taps * inner..(o + 1) * taps * inner];
        acc.copy_from_slice(&block[..inner]);
        for t in 1..taps {
            let src = &block[t * inner..(t + 1) * inner];
            let acc = &mut acc[..src.len()];
            // Index loops over equal lengths: no iterator set-up per short row (a
            // pooling window's rows are 25 to 200 elements).
            match op {
                ReduceOp::Sum => {
                    for j in 0..src.len() {
                        acc[j] += src[j];
                    }
                }
                // Selections rather than conditional stores, so the loops vectorise.
                ReduceOp::Max => {
                    for j in 0..src.len() {
                        let (v, a) = (src[j], acc[j]);
                        acc[j] = if v > a || v.is_nan() { v } else { a };
                    }
                }
                _ => {
                    for j in 0..src.len() {
                        let (v, a) = (src[j], acc[j]);
                        acc[j] = if v < a || v.is_nan() { v } else { a };
                    }
                }
            }
        }
    };
    if inner == 0 || outer == 0 {
        return;
    }
    if outer * taps * inner >= crate::elementwise::GRAIN && outer > 1 {
        out.par_chunks_mut(inner).enumerate().for_each(row);
    } else {
        out.chunks_mut(inner).enumerate().for_each(row);
    }
}

/// `x` as `[outer, kept, inner]` reduced over `outer` and `inner` into `out [kept]`:
/// each contiguous inner row reduced as a row is (pairwise sums), then the rows taken
/// in order.
fn reduce_around_f32(
    op: ReduceOp,
    x: &[f32],
    outer: usize,
    kept: usize,
    inner: usize,
    out: &mut [f32],
) {
    let one = |(c, o): (usize, &mut f32)| {
        let at = |i: usize| &x[(i * kept + c) * inner..(i * kept + c + 1) * inner];
        let mut acc = reduce_row_f32(op, at(0));
        for i in 1..outer {
            let v = reduce_row_f32(op, at(i));
            acc = match op {
                ReduceOp::Sum => acc + v,
                ReduceOp::Max if v > acc || v.is_nan() => v,
                ReduceOp::Min if v < acc || v.is_nan() => v,
                _ => acc,
            };
        }
        *o = acc;
    };
    if outer * kept * inner >= crate::elementwise::GRAIN && kept > 1 {
        out.par_iter_mut().enumerate().for_each(one);
    } else {
        out.iter_mut().enumerate().for_each(one);
    }
}

/// Columns per task of a reduction over leading axes.
const COLUMN_CHUNK: usize = 256;
