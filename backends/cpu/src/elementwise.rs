//! Elementwise kernels: unary, binary, comparisons, select and casts. Inputs arrive as
//! views with the output's dims (broadcasting is a stride-0 view); the row planner
//! turns them into inner runs, which are processed in parallel chunks.

use crate::storage::{with_storage, CpuElement, CpuStorage, FloatKernel};
use crate::strided::{rows_per_task, RowPlan};
use half::{bf16, f16};
use kiln_tensor::binary::BinaryKernel;
use kiln_tensor::compare::CompareKernel;
use kiln_tensor::simd;
use kiln_tensor::unary::UnaryKernel;
use kiln_tensor::{BinaryOp, CmpOp, Dims, Element, Error, Layout, Result, UnaryOp};
use rayon::prelude::*;

/// Elements per parallel task: below this, threading costs more than it saves.
pub(crate) const GRAIN: usize = 1 << 15;

/// Fills `out` (contiguous, the plan's row-major order) row by row, in parallel for
/// large outputs. `f(row_out, bases)` writes one row.
pub(crate) fn fill_rows<O: Send>(
    plan: &RowPlan,
    out: &mut [O],
    f: impl Fn(&mut [O], &[usize]) + Sync,
) {
    let inner = plan.inner;
    if plan.rows == 0 || inner == 0 {
        return;
    }
    let per = rows_per_task(plan.rows, inner, GRAIN);
    if per >= plan.rows {
        let mut chunks = out.chunks_mut(inner);
        plan.for_rows(0, plan.rows, |_, b| {
            f(chunks.next().expect("one chunk per row"), b)
        });
        return;
    }
    out.par_chunks_mut(per * inner)
        .enumerate()
        .for_each(|(t, chunk)| {
            let r0 = t * per;
            let r1 = (r0 + per).min(plan.rows);
            let mut rows = chunk.chunks_mut(inner);
            plan.for_rows(r0, r1, |_, b| f(rows.next().expect("one chunk per row"), b));
        });
}

/// out[i] = f(x[i]) over a strided view.
pub(crate) fn map1<T: Copy + Sync, O: Copy + Default + Send>(
    data: &[T],
    l: &Layout,
    f: impl Fn(T) -> O + Sync,
) -> Vec<O> {
    let plan = RowPlan::new(l.dims(), &[l]);
    let mut out = vec![O::default(); l.numel()];
    let s = plan.inner_strides[0];
    fill_rows(&plan, &mut out, |row, b| {
        let (b, n) = (b[0], row.len());
        simd::wide(
            #[inline(always)]
            || match s {
                1 => row
                    .iter_mut()
                    .zip(&data[b..b + n])
                    .for_each(|(o, &x)| *o = f(x)),
                0 => row.fill(f(data[b])),
                _ => row
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, o)| *o = f(data[b + i * s])),
            },
        )
    });
    out
}

/// out[i] = f(a[i], b[i]) over two strided views of the same dims.
pub(crate) fn map2<A: Copy + Sync, B: Copy + Sync, O: Copy + Default + Send>(
    dims: &Dims,
    a: &[A],
    la: &Layout,
    b: &[B],
    lb: &Layout,
    f: impl Fn(A, B) -> O + Sync,
) -> Vec<O> {
    let mut out = vec![O::default(); dims.numel()];
    map2_into(dims, a, la, b, lb, &mut out, f);
    out
}

/// [`map2`] into `out` (`dims.numel()` values, contiguous).
pub(crate) fn map2_into<A: Copy + Sync, B: Copy + Sync, O: Copy + Send>(
    dims: &Dims,
    a: &[A],
    la: &Layout,
    b: &[B],
    lb: &Layout,
    out: &mut [O],
    f: impl Fn(A, B) -> O + Sync,
) {
    let plan = RowPlan::new(dims, &[la, lb]);
    let (sa, sb) = (plan.inner_strides[0], plan.inner_strides[1]);
    fill_rows(&plan, out, |row, base| {
        let (ba, bb) = (base[0], base[1]);
        let n = row.len();
        simd::wide(
            #[inline(always)]
            || match (sa, sb) {
                (1, 1) => row
                    .iter_mut()
                    .zip(&a[ba..ba + n])
                    .zip(&b[bb..bb + n])
                    .for_each(|((o, &x), &y)| *o = f(x, y)),
                (1, 0) => {
                    let y = b[bb];
                    row.iter_mut()
                        .zip(&a[ba..ba + n])
                        .for_each(|(o, &x)| *o = f(x, y))
                }
                (0, 1) => {
                    let x = a[ba];
                    row.iter_mut()
                        .zip(&b[bb..bb + n])
                        .for_each(|(o, &y)| *o = f(x, y))
                }
                _ => row
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, o)| *o = f(a[ba + i * sa], b[bb + i * sb])),
            },
        )
    });
}

/// out[i] = f(c[i], a[i], b[i]) over three strided views of the same dims.
fn map3<C: Copy + Sync, T: Copy + Sync + Default + Send>(
    dims: &Dims,
    (c, lc): (&[C], &Layout),
    (a, la): (&[T], &Layout),
    (b, lb): (&[T], &Layout),
    f: impl Fn(C, T, T) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); dims.numel()];
    map3_into(dims, (c, lc), (a, la), (b, lb), &mut out, f);
    out
}

/// [`map3`] into `out` (`dims.numel()` values, contiguous).
fn map3_into<C: Copy + Sync, T: Copy + Sync + Send>(
    dims: &Dims,
    (c, lc): (&[C], &Layout),
    (a, la): (&[T], &Layout),
    (b, lb): (&[T], &Layout),
    out: &mut [T],
    f: impl Fn(C, T, T) -> T + Sync,
) {
    let plan = RowPlan::new(dims, &[lc, la, lb]);
    let s = [
        plan.inner_strides[0],
        plan.inner_strides[1],
        plan.inner_strides[2],
    ];
    fill_rows(&plan, out, |row, base| {
        simd::wide(
            #[inline(always)]
            || {
                row.iter_mut().enumerate().for_each(|(i, o)| {
                    *o = f(
                        c[base[0] + i * s[0]],
                        a[base[1] + i * s[1]],
                        b[base[2] + i * s[2]],
                    )
                })
            },
        );
    });
}

fn unary_float<T: FloatKernel>(op: UnaryOp, x: &[T], l: &Layout) -> Vec<T> {
    struct Map<'a, T> {
        x: &'a [T],
        l: &'a Layout,
    }
    impl<T: FloatKernel> UnaryKernel<T::C> for Map<'_, T> {
        type Output = Vec<T>;
        #[inline(always)]
        fn run(self, f: impl Fn(T::C) -> T::C + Copy + Send + Sync) -> Vec<T> {
            map1(self.x, self.l, |t: T| T::store(f(t.load())))
        }
    }
    op.dispatch(Map { x, l })
}

/// Runs a unary op.
pub fn unary(op: UnaryOp, x: &CpuStorage, l: &Layout) -> Result<CpuStorage> {
    Ok(match x {
        CpuStorage::F32(v) => CpuStorage::F32(unary_float(op, v, l).into()),
        CpuStorage::F64(v) => CpuStorage::F64(unary_float(op, v, l).into()),
        CpuStorage::F16(v) => CpuStorage::F16(unary_float(op, v, l).into()),
        CpuStorage::BF16(v) => CpuStorage::BF16(unary_float(op, v, l).into()),
        CpuStorage::I32(v) => CpuStorage::I32(
            match op {
                UnaryOp::Neg => map1(v, l, |a: i32| a.wrapping_neg()),
                UnaryOp::Abs => map1(v, l, |a: i32| a.wrapping_abs()),
                UnaryOp::Sign => map1(v, l, |a: i32| a.signum()),
                UnaryOp::Relu => map1(v, l, |a: i32| a.max(0)),
                _ => return Err(unsupported(op.name(), x)),
            }
            .into(),
        ),
        CpuStorage::U32(v) => CpuStorage::U32(
            match op {
                UnaryOp::Relu => map1(v, l, |a: u32| a),
                _ => return Err(unsupported(op.name(), x)),
            }
            .into(),
        ),
        CpuStorage::Bool(v) => CpuStorage::Bool(
            match op {
                UnaryOp::Not => map1(v, l, |a: bool| !a),
                _ => return Err(unsupported(op.name(), x)),
            }
            .into(),
        ),
        CpuStorage::I8(_) => return Err(unsupported(op.name(), x)),
    })
}

fn binary_float<T: FloatKernel>(
    op: BinaryOp,
    dims: &Dims,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
) -> Vec<T> {
    struct Map<'a, T> {
        dims: &'a Dims,
        a: (&'a [T], &'a Layout),
        b: (&'a [T], &'a Layout),
    }
    impl<T: FloatKernel> BinaryKernel<T::C> for Map<'_, T> {
        type Output = Vec<T>;
        #[inline(always)]
        fn run(self, f: impl Fn(T::C, T::C) -> T::C + Copy + Send + Sync) -> Vec<T> {
            let ((a, la), (b, lb)) = (self.a, self.b);
            map2(self.dims, a, la, b, lb, |p: T, q: T| {
                T::store(f(p.load(), q.load()))
            })
        }
    }
    op.dispatch(Map {
        dims,
        a: (a, la),
        b: (b, lb),
    })
}

macro_rules! binary_int {
    ($t:ty, $op:expr, $dims:expr, $a:expr, $la:expr, $b:expr, $lb:expr) => {{
        let (a, b): (&[$t], &[$t]) = ($a, $b);
        match $op {
            BinaryOp::Add => map2($dims, a, $la, b, $lb, |x: $t, y: $t| x.wrapping_add(y)),
            BinaryOp::Sub => map2($dims, a, $la, b, $lb, |x: $t, y: $t| x.wrapping_sub(y)),
            BinaryOp::Mul => map2($dims, a, $la, b, $lb, |x: $t, y: $t| x.wrapping_mul(y)),
            BinaryOp::Div => {
                let mut zero = false;
                $lb.for_each_offset(|o| zero |= b[o] == 0);
                if zero {
                    return Err(Error::invalid("div", "integer division by zero"));
                }
                map2($dims, a, $la, b, $lb, |x: $t, y: $t| x.wrapping_div(y))
            }
            BinaryOp::Max => map2($dims, a, $la, b, $lb, |x: $t, y: $t| x.max(y)),
            BinaryOp::Min => map2($dims, a, $la, b, $lb, |x: $t, y: $t| x.min(y)),
            BinaryOp::Pow => unreachable!("the op table rejects integer pow"),
        }
        .into()
    }};
}

/// Runs a binary op (operands already broadcast to `dims`).
pub fn binary(
    op: BinaryOp,
    dims: &Dims,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    Ok(match (a, b) {
        (CpuStorage::F32(x), CpuStorage::F32(y)) => {
            CpuStorage::F32(binary_float(op, dims, x, la, y, lb).into())
        }
        (CpuStorage::F64(x), CpuStorage::F64(y)) => {
            CpuStorage::F64(binary_float(op, dims, x, la, y, lb).into())
        }
        (CpuStorage::F16(x), CpuStorage::F16(y)) => {
            CpuStorage::F16(binary_float(op, dims, x, la, y, lb).into())
        }
        (CpuStorage::BF16(x), CpuStorage::BF16(y)) => {
            CpuStorage::BF16(binary_float(op, dims, x, la, y, lb).into())
        }
        (CpuStorage::I32(x), CpuStorage::I32(y)) => {
            CpuStorage::I32(binary_int!(i32, op, dims, x, la, y, lb))
        }
        (CpuStorage::U32(x), CpuStorage::U32(y)) => {
            CpuStorage::U32(binary_int!(u32, op, dims, x, la, y, lb))
        }
        _ => return Err(unsupported(op.name(), a)),
    })
}

fn compare_typed<T: Copy + Sync + PartialOrd>(
    op: CmpOp,
    dims: &Dims,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
) -> Vec<bool> {
    let mut out = vec![false; dims.numel()];
    compare_typed_into(op, dims, (a, la), (b, lb), &mut out);
    out
}

/// [`compare_typed`] into `out` (`dims.numel()` values, contiguous).
fn compare_typed_into<T: Copy + Sync + PartialOrd>(
    op: CmpOp,
    dims: &Dims,
    a: (&[T], &Layout),
    b: (&[T], &Layout),
    out: &mut [bool],
) {
    struct Map<'a, T> {
        dims: &'a Dims,
        a: (&'a [T], &'a Layout),
        b: (&'a [T], &'a Layout),
        out: &'a mut [bool],
    }
    impl<T: Copy + Sync + PartialOrd> CompareKernel<T> for Map<'_, T> {
        type Output = ();
        #[inline(always)]
        fn run(self, f: impl Fn(T, T) -> bool + Copy + Send + Sync) {
            let ((a, la), (b, lb)) = (self.a, self.b);
            map2_into(self.dims, a, la, b, lb, self.out, f)
        }
    }
    op.dispatch(Map { dims, a, b, out })
}

/// Runs a comparison (operands already broadcast to `dims`).
pub fn compare(
    op: CmpOp,
    dims: &Dims,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    Ok(CpuStorage::Bool(
        match (a, b) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => compare_typed(op, dims, x, la, y, lb),
            (CpuStorage::F64(x), CpuStorage::F64(y)) => compare_typed(op, dims, x, la, y, lb),
            (CpuStorage::F16(x), CpuStorage::F16(y)) => compare_typed(op, dims, x, la, y, lb),
            (CpuStorage::BF16(x), CpuStorage::BF16(y)) => compare_typed(op, dims, x, la, y, lb),
            (CpuStorage::I32(x), CpuStorage::I32(y)) => compare_typed(op, dims, x, la, y, lb),
            (CpuStorage::U32(x), CpuStorage::U32(y)) => compare_typed(op, dims, x, la, y, lb),
            (CpuStorage::Bool(x), CpuStorage::Bool(y)) => compare_typed(op, dims, x, la, y, lb),
            _ => return Err(unsupported(op.name(), a)),
        }
        .into(),
    ))
}

/// Runs a comparison of two f32 views (already broadcast to `dims`) into `out`
/// (`dims.numel()` values): what a planned step's comparison writes into its slot.
/// `false` (nothing written) for other dtypes.
pub fn compare_f32_into(
    op: CmpOp,
    dims: &Dims,
    (a, la): (&CpuStorage, &Layout),
    (b, lb): (&CpuStorage, &Layout),
    out: &mut [bool],
) -> bool {
    let (CpuStorage::F32(a), CpuStorage::F32(b)) = (a, b) else {
        return false;
    };
    compare_typed_into(op, dims, (a, la), (b, lb), out);
    true
}

/// `where`'s rule: `p` where `k` holds, else `q`.
#[inline(always)]
fn pick<T>(k: bool, p: T, q: T) -> T {
    if k {
        p
    } else {
        q
    }
}

/// Runs `cond ? a : b` over f32 views (all three already broadcast to `dims`) into
/// `out` (`dims.numel()` values). `false` (nothing written) for other dtypes.
pub fn select_f32_into(
    dims: &Dims,
    (c, lc): (&CpuStorage, &Layout),
    (a, la): (&CpuStorage, &Layout),
    (b, lb): (&CpuStorage, &Layout),
    out: &mut [f32],
) -> bool {
    let (CpuStorage::Bool(c), CpuStorage::F32(a), CpuStorage::F32(b)) = (c, a, b) else {
        return false;
    };
    map3_into(dims, (c, lc), (a, la), (b, lb), out, pick);
    true
}

/// Runs `cond ? a : b` (all three already broadcast to `dims`).
pub fn select(
    dims: &Dims,
    c: &CpuStorage,
    lc: &Layout,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    let CpuStorage::Bool(c) = c else {
        return Err(Error::dtype("where", "the condition must be bool"));
    };
    macro_rules! sel {
        ($($v:ident),*) => {
            match (a, b) {
                $((CpuStorage::$v(x), CpuStorage::$v(y)) => CpuStorage::$v(map3(dims, (c, lc), (x, la), (y, lb), pick).into()),)*
                _ => return Err(unsupported("where", a)),
            }
        };
    }
    Ok(sel!(F32, F64, F16, BF16, I32, U32, Bool))
}

/// Converts a strided view to `dtype`.
pub fn cast(x: &CpuStorage, l: &Layout, dtype: kiln_tensor::DType) -> Result<CpuStorage> {
    use kiln_tensor::DType as D;
    // Fast paths for the conversions mixed-precision training uses.
    match (x, dtype) {
        (CpuStorage::F32(v), D::F16) => {
            return Ok(CpuStorage::F16(map1(v, l, f16::from_f32).into()))
        }
        (CpuStorage::F32(v), D::BF16) => {
            return Ok(CpuStorage::BF16(map1(v, l, bf16::from_f32).into()))
        }
        (CpuStorage::F16(v), D::F32) => {
            return Ok(CpuStorage::F32(map1(v, l, |h: f16| h.to_f32()).into()))
        }
        (CpuStorage::BF16(v), D::F32) => {
            return Ok(CpuStorage::F32(map1(v, l, |h: bf16| h.to_f32()).into()))
        }
        _ => {}
    }
    fn to<T: Element + Sync, U: CpuElement>(v: &[T], l: &Layout) -> CpuStorage {
        U::wrap(map1(v, l, |t: T| U::from_f64(t.to_f64())))
    }
    Ok(with_storage!(x, v, T => match dtype {
        D::F32 => to::<T, f32>(v, l),
        D::F64 => to::<T, f64>(v, l),
        D::F16 => to::<T, f16>(v, l),
        D::BF16 => to::<T, bf16>(v, l),
        D::I32 => to::<T, i32>(v, l),
        D::U32 => to::<T, u32>(v, l),
        D::Bool => to::<T, bool>(v, l),
        // The op's rule refuses casts to a storage dtype.
        D::I8 => return Err(unsupported("cast", x)),
    }))
}

pub(crate) fn unsupported(op: &str, x: &CpuStorage) -> Error {
    Error::Unsupported {
        op: op.to_string(),
        backend: "cpu",
        dtype: x.dtype(),
    }
}
