//! Conformance properties of the primitives, one family per function: each draws cases
//! (op parameters, shapes, dtypes, values, input views) and checks the backend against
//! the reference interpreter with [`check_op`]. Now and then a case is one the op table
//! refuses (a rejected dtype, an out-of-range index, a degenerate window); then both
//! sides must refuse it with the same kind of error.

use super::harness::{
    check_op, check_op_within, judge, magnitude, op_tolerance, run_op, run_property, upload, OpCase,
};
use super::reference::{eval, RefTensor};
use super::strategy::{
    broadcast_operand, dim, dtype_choice, input, nonzero_dim, pick_dtype, scalar, shape,
    small_shape, window, Domain, Input,
};
use super::tolerance::is_nearest;
use super::Config;
use crate::backend::Backend;
use crate::builder::BuilderExt;
use crate::dtype::DType;
use crate::op::{BinaryOp, CmpOp, Op, RandDist, ReduceOp, UnaryOp};
use crate::raw::Eager;
use crate::unary::TestDomain;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// The input domain each unary op is tested on (its declaration's).
fn unary_domain(u: UnaryOp) -> Domain {
    domain(u.test_domain())
}

/// The strategy's domain for a declared one.
fn domain(d: TestDomain) -> Domain {
    match d {
        TestDomain::Any => Domain::Any,
        TestDomain::Positive => Domain::Positive,
        TestDomain::NonZero => Domain::NonZero,
        TestDomain::WithNan => Domain::WithNan,
        TestDomain::Small => Domain::Small,
    }
}

/// Cases of one unary op, mostly on dtypes it accepts.
pub fn unary_cases(config: &Config, u: UnaryOp) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    (dtype_choice(), shape(4))
        .prop_flat_map(move |((rejected, k), dims)| {
            let dt = pick_dtype(&dtypes, |d| u.accepts(d), rejected, k);
            input(dims, dt, unary_domain(u)).prop_map(move |x| OpCase {
                op: Op::Unary(u),
                inputs: vec![x],
            })
        })
        .boxed()
}

/// Every unary op, on every dtype it accepts.
/// Every op is checked, the failures reported together (each prints its case).
pub fn unary<B: Backend>(device: &B::Device, config: &Config) {
    let failed: Vec<&str> = UnaryOp::ALL
        .iter()
        .filter(|&&u| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_property(
                    &format!("unary {}", u.name()),
                    config.cases(48),
                    unary_cases(config, u),
                    |c| check_op_within::<B>(device, &c, config.unary_tolerance(u)),
                )
            }))
            .is_err()
        })
        .map(|u| u.name())
        .collect();
    assert!(failed.is_empty(), "unary ops failed: {failed:?}");
}

/// Cases of one binary op with operands broadcast from random compatible shapes.
pub fn binary_cases(config: &Config, b: BinaryOp) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    (dtype_choice(), shape(4), prop::bool::weighted(0.1))
        .prop_flat_map(move |((rejected, k), out, zeros)| {
            let dt = pick_dtype(&dtypes, |d| b.accepts(d), rejected, k);
            let (da, db) = match (b, b.test_domains()) {
                // Integer division by zero is an error: now and then a divisor may be 0.
                (BinaryOp::Div, (da, _)) if zeros => (domain(da), Domain::Any),
                (_, (da, db)) => (domain(da), domain(db)),
            };
            (broadcast_operand(&out), broadcast_operand(&out)).prop_flat_map(move |(sa, sb)| {
                (input(sa, dt, da), input(sb, dt, db)).prop_map(move |(x, y)| OpCase {
                    op: Op::Binary(b),
                    inputs: vec![x, y],
                })
            })
        })
        .boxed()
}

/// Every binary op, broadcasting.
pub fn binary<B: Backend>(device: &B::Device, config: &Config) {
    for &b in BinaryOp::ALL {
        run_property(
            &format!("binary {}", b.name()),
            config.cases(64),
            binary_cases(config, b),
            |c| check_op::<B>(device, &c),
        );
    }
}

/// Cases of one comparison: every dtype, NaNs and ±0 included, broadcasting.
pub fn compare_cases(config: &Config, c: CmpOp) -> BoxedStrategy<OpCase> {
    (select(config.dtypes.clone()), shape(4))
        .prop_flat_map(move |(dt, out)| {
            (broadcast_operand(&out), broadcast_operand(&out)).prop_flat_map(move |(sa, sb)| {
                (
                    input(sa, dt, Domain::WithNan),
                    input(sb, dt, Domain::WithNan),
                )
                    .prop_map(move |(x, y)| OpCase {
                        op: Op::Compare(c),
                        inputs: vec![x, y],
                    })
            })
        })
        .boxed()
}

/// Every comparison.
pub fn compare<B: Backend>(device: &B::Device, config: &Config) {
    for &c in CmpOp::ALL {
        run_property(
            &format!("compare {}", c.name()),
            config.cases(32),
            compare_cases(config, c),
            |k| check_op::<B>(device, &k),
        );
    }
}

/// `cond ? a : b` with all three broadcast.
pub fn where_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (select(config.dtypes.clone()), shape(4))
        .prop_flat_map(|(dt, out)| {
            (
                broadcast_operand(&out),
                broadcast_operand(&out),
                broadcast_operand(&out),
            )
                .prop_flat_map(move |(sc, sa, sb)| {
                    (
                        input(sc, DType::Bool, Domain::Any),
                        input(sa, dt, Domain::WithNan),
                        input(sb, dt, Domain::WithNan),
                    )
                        .prop_map(|(c, a, b)| OpCase {
                            op: Op::Where,
                            inputs: vec![c, a, b],
                        })
                })
        })
        .boxed()
}

/// `where`.
pub fn select_where<B: Backend>(device: &B::Device, config: &Config) {
    run_property("where", config.cases(128), where_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// A reduction through the builder: axes given in any order, kept or removed.
#[derive(Clone, Debug)]
pub struct ReduceCase {
    /// The reduction.
    pub op: ReduceOp,
    /// The axes, as passed to the builder (unsorted at times).
    pub axes: Vec<usize>,
    /// Whether the reduced axes stay as size 1.
    pub keepdim: bool,
    /// The reduced tensor.
    pub x: Input,
}

/// Cases of one reduction over random axis subsets.
pub fn reduce_cases(config: &Config, op: ReduceOp) -> BoxedStrategy<ReduceCase> {
    let dtypes = config.dtypes.clone();
    (
        dtype_choice(),
        shape(4),
        any::<u8>(),
        any::<usize>(),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.3),
    )
        .prop_flat_map(
            move |((rejected, k), dims, mask, pick, keepdim, reversed, same_sign)| {
                let dt = pick_dtype(&dtypes, |d| d != DType::Bool, rejected, k);
                let r = dims.len();
                let mut axes: Vec<usize> = match op {
                    ReduceOp::ArgMax | ReduceOp::ArgMin if r > 0 => vec![pick % r],
                    ReduceOp::ArgMax | ReduceOp::ArgMin => vec![],
                    _ => (0..r).filter(|i| mask & (1 << i) != 0).collect(),
                };
                if reversed {
                    axes.reverse();
                }
                // Same-sign values make rounding errors of a sum add up instead of
                // cancelling: the case that tells an accurate summation apart.
                let domain = if same_sign {
                    Domain::Positive
                } else {
                    Domain::WithNan
                };
                input(dims, dt, domain).prop_map(move |x| ReduceCase {
                    op,
                    axes: axes.clone(),
                    keepdim,
                    x,
                })
            },
        )
        .boxed()
}

/// Checks a reduction through `BuilderExt::reduce` against the reference.
pub fn check_reduce<B: Backend>(device: &B::Device, case: &ReduceCase) -> Result<(), String> {
    let x = case.x.logical().map_err(|e| e.to_string())?;
    let mut sorted = case.axes.clone();
    sorted.sort_unstable();
    let op = Op::Reduce {
        op: case.op,
        axes: sorted.clone(),
    };
    let want = eval(&op, &[&x]).map(|mut t| {
        if !case.keepdim {
            t.dims = t
                .dims
                .iter()
                .enumerate()
                .filter(|(i, _)| !sorted.contains(i))
                .map(|(_, &d)| d)
                .collect();
        }
        t
    });
    let xb = upload::<B>(device, std::slice::from_ref(&case.x))?.remove(0);
    let got = Eager::<B>::new(device.clone())
        .reduce(case.op, &xb, &case.axes, case.keepdim)
        .and_then(|t| RefTensor::from_raw(&t));
    let tol = op_tolerance(&op, x.dtype);
    let mag = magnitude(&op, &[x]);
    judge(want, got, tol, mag.as_deref())
}

/// Long sums of repeated positive values (a broadcast view of a few values): every
/// rounding error of a running sum then goes the same way, so only a summation whose
/// error grows slower than the row length stays within tolerance.
pub fn long_sum_cases(config: &Config) -> BoxedStrategy<ReduceCase> {
    let floats = config.floats();
    (
        select(floats),
        1..=3usize,
        20_000..=70_000usize,
        any::<bool>(),
    )
        .prop_flat_map(|(dt, k, n, all)| {
            let axes = if all { vec![0, 1] } else { vec![1] };
            super::strategy::fresh(vec![k, 1], dt, Domain::Positive).prop_map(move |mut x| {
                x.views.push(Op::Expand { dims: vec![k, n] });
                ReduceCase {
                    op: ReduceOp::Sum,
                    axes: axes.clone(),
                    keepdim: false,
                    x,
                }
            })
        })
        .boxed()
}

/// Every reduction, over random axis subsets, with and without keepdim.
pub fn reduce<B: Backend>(device: &B::Device, config: &Config) {
    for &op in ReduceOp::ALL {
        run_property(
            &format!("reduce {}", op.name()),
            config.cases(64),
            reduce_cases(config, op),
            |c| check_reduce::<B>(device, &c),
        );
    }
    run_property(
        "reduce long sums",
        config.cases(16),
        long_sum_cases(config),
        |c| check_reduce::<B>(device, &c),
    );
}

fn prime_factors(mut n: usize) -> Vec<usize> {
    let mut f = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            f.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        f.push(n);
    }
    f
}

/// New dims for `n` elements: its prime factors spread over 0 to 4 dims, 1s between;
/// one case in ten with a wrong element count.
fn reshape_dims(n: usize) -> BoxedStrategy<Vec<usize>> {
    (
        0..=4usize,
        vec(any::<usize>(), 24),
        prop::bool::weighted(0.1),
    )
        .prop_map(move |(rank, picks, wrong)| {
            let rank = if n == 1 { rank } else { rank.max(1) };
            let mut d = vec![1; rank];
            if n == 0 {
                for (i, x) in d.iter_mut().enumerate() {
                    *x = picks[i] % 4;
                }
                d[picks[23] % rank] = 0;
            } else {
                for (k, f) in prime_factors(n).into_iter().enumerate() {
                    d[picks[k % 24] % rank] *= f;
                }
            }
            if wrong && rank > 0 {
                d[0] += 1;
            }
            d
        })
        .boxed()
}

/// A view op valid for `dims` (one case in ten invalid).
fn view_op(dims: Vec<usize>) -> BoxedStrategy<Op> {
    let r = dims.len();
    let n: usize = dims.iter().product();
    let reshape = reshape_dims(n).prop_map(|dims| Op::Reshape { dims });
    let permute = (
        Just((0..r).collect::<Vec<_>>()).prop_shuffle(),
        prop::bool::weighted(0.1),
    )
        .prop_map(move |(mut perm, wrong)| {
            if wrong {
                match perm.len() {
                    0 => perm.push(0),
                    1 => perm[0] = 1,
                    _ => perm[0] = perm[1],
                }
            }
            Op::Permute { perm }
        });
    let d2 = dims.clone();
    let expand = (
        0..=2usize,
        vec(0..=4usize, r + 2),
        prop::bool::weighted(0.1),
    )
        .prop_map(move |(lead, sizes, wrong)| {
            let mut target: Vec<usize> = sizes[..lead].iter().map(|s| s % 3 + 1).collect();
            for (i, &d) in d2.iter().enumerate() {
                target.push(if d == 1 { sizes[lead + i] } else { d });
            }
            if wrong {
                if let Some(t) = target.iter_mut().rev().find(|t| **t > 1) {
                    *t += 1;
                }
            }
            Op::Expand { dims: target }
        });
    let d3 = dims.clone();
    let slice = (
        any::<usize>(),
        any::<usize>(),
        any::<usize>(),
        1..=4usize,
        prop::bool::weighted(0.1),
    )
        .prop_map(move |(a, s, l, step, wrong)| {
            let axis = if r == 0 { 0 } else { a % r };
            let size = d3.get(axis).copied().unwrap_or(0);
            let start = s % (size + 1);
            let end = start + l % (size - start + 1);
            if wrong {
                Op::Slice {
                    axis,
                    start,
                    end: size + 1,
                    step,
                }
            } else {
                Op::Slice {
                    axis,
                    start,
                    end,
                    step,
                }
            }
        });
    prop_oneof![reshape, permute, expand, slice].boxed()
}

/// Views of views: reshape, permute, expand and slice applied to inputs that are
/// themselves fresh or views; checked as views and after `contiguous()`.
pub fn view_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (select(config.dtypes.clone()), shape(4))
        .prop_flat_map(|(dt, dims)| {
            (input(dims.clone(), dt, Domain::Any), view_op(dims)).prop_map(|(x, op)| OpCase {
                op,
                inputs: vec![x],
            })
        })
        .boxed()
}

/// Reshape, permute, expand, slice, and contiguous copies of them.
pub fn views<B: Backend>(device: &B::Device, config: &Config) {
    run_property("views", config.cases(256), view_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// 1 to 4 inputs joined along a random axis (one case in ten with a mismatched dim).
pub fn concat_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (
        select(config.dtypes.clone()),
        small_shape(1, 4),
        any::<usize>(),
        vec(prop_oneof![1 => Just(0usize), 4 => 1..=4usize], 1..=4),
        prop::bool::weighted(0.1),
    )
        .prop_flat_map(|(dt, dims, a, lens, wrong)| {
            let axis = a % dims.len();
            let count = lens.len();
            let parts: Vec<BoxedStrategy<Input>> = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let mut d = dims.clone();
                    d[axis] = len;
                    if wrong && i == count - 1 && d.len() > 1 {
                        let other = (axis + 1) % d.len();
                        d[other] += 1;
                    }
                    input(d, dt, Domain::Any)
                })
                .collect();
            parts.prop_map(move |inputs| OpCase {
                op: Op::Concat { axis },
                inputs,
            })
        })
        .boxed()
}

/// `concat`.
pub fn concat<B: Backend>(device: &B::Device, config: &Config) {
    run_property("concat", config.cases(128), concat_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// Padding of a random axis by 0..=3 elements each side with a value of the dtype
/// (NaN, infinities and out-of-range values included: they convert like casts).
pub fn pad_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (
        select(config.dtypes.clone()),
        small_shape(1, 4),
        any::<usize>(),
        0..=3usize,
        0..=3usize,
        scalar(DType::F64, Domain::Extreme),
    )
        .prop_flat_map(|(dt, dims, a, before, after, value)| {
            let axis = a % dims.len();
            input(dims, dt, Domain::Any).prop_map(move |x| OpCase {
                op: Op::Pad {
                    axis,
                    before,
                    after,
                    value,
                },
                inputs: vec![x],
            })
        })
        .boxed()
}

/// `pad`.
pub fn pad<B: Backend>(device: &B::Device, config: &Config) {
    run_property("pad", config.cases(128), pad_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

fn matrix_dim() -> BoxedStrategy<usize> {
    prop_oneof![2 => Just(1usize), 1 => Just(0usize), 8 => 2..=7usize, 1 => 16..=40usize].boxed()
}

/// Batched products `[..a, M, K] × [..b, K, N]` with broadcast batch dims, operands as
/// views (transposed, sliced, broadcast), empty K, M or N included.
pub fn matmul_cases(config: &Config) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    (
        dtype_choice(),
        vec(dim(), 0..=2),
        matrix_dim(),
        matrix_dim(),
        matrix_dim(),
    )
        .prop_flat_map(move |((rejected, k), batch, m, kk, n)| {
            let dt = pick_dtype(&dtypes, |d| d.is_float(), rejected, k);
            (broadcast_operand(&batch), broadcast_operand(&batch)).prop_flat_map(move |(ba, bb)| {
                let mut da = ba;
                da.extend([m, kk]);
                let mut db = bb;
                db.extend([kk, n]);
                (input(da, dt, Domain::Any), input(db, dt, Domain::Any)).prop_map(|(a, b)| OpCase {
                    op: Op::MatMul,
                    inputs: vec![a, b],
                })
            })
        })
        .boxed()
}

/// `matmul`.
pub fn matmul<B: Backend>(device: &B::Device, config: &Config) {
    run_property("matmul", config.cases(128), matmul_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// Int8 products `x [..batch, M, K]` (f32, views) by `w [N, K]` (i8, now and then a
/// view) and `scale [N]` (f32 of either sign, zeros included); rows with NaN now and
/// then. One case in 10 is refused by the rule: `x` not f32, `w` not i8, K that differs.
pub fn matmul_int8_cases() -> BoxedStrategy<OpCase> {
    (
        0..10u8,
        vec(dim(), 0..=2),
        matrix_dim(),
        matrix_dim(),
        matrix_dim(),
        any::<bool>(),
    )
        .prop_flat_map(|(flaw, batch, m, k, n, nan)| {
            let mut dx = batch;
            dx.extend([m, k]);
            let (xt, wt) = match flaw {
                0 => (DType::I32, DType::I8),
                1 => (DType::F32, DType::F32),
                _ => (DType::F32, DType::I8),
            };
            let wk = if flaw == 2 { k + 1 } else { k };
            let domain = if nan { Domain::WithNan } else { Domain::Any };
            (
                input(dx, xt, domain),
                input(vec![n, wk], wt, Domain::Any),
                input(vec![n], DType::F32, Domain::Any),
            )
                .prop_map(|(x, w, s)| OpCase {
                    op: Op::MatMulInt8,
                    inputs: vec![x, w, s],
                })
        })
        .boxed()
}

/// `matmul_int8`: against the exact product within the rounding the op allows.
pub fn matmul_int8<B: Backend>(device: &B::Device, config: &Config) {
    run_property("matmul_int8", config.cases(128), matmul_int8_cases(), |c| {
        check_op::<B>(device, &c)
    });
}

/// Index dims that fit inside `outer` on every axis but `axis` (any size there).
fn inner_dims(outer: &[usize], axis: usize, sizes: &[usize]) -> Vec<usize> {
    outer
        .iter()
        .enumerate()
        .map(|(d, &o)| {
            if d == axis {
                sizes[d] % 5
            } else {
                sizes[d] % (o + 1)
            }
        })
        .collect()
}

fn index_dtype() -> BoxedStrategy<DType> {
    prop_oneof![10 => Just(DType::I32), 10 => Just(DType::U32), 1 => Just(DType::F32)].boxed()
}

/// torch.gather along a random axis; one case in 14 has an out-of-range index.
pub fn gather_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (
        select(config.dtypes.clone()),
        index_dtype(),
        small_shape(1, 4),
        any::<usize>(),
        vec(any::<usize>(), 4),
    )
        .prop_flat_map(|(dt, it, dims, a, sizes)| {
            let axis = a % dims.len();
            let idims = inner_dims(&dims, axis, &sizes);
            let bound = dims[axis];
            (
                input(dims, dt, Domain::Any),
                input(idims, it, Domain::IndexOrBad(bound)),
            )
                .prop_map(move |(x, i)| OpCase {
                    op: Op::Gather { axis },
                    inputs: vec![x, i],
                })
        })
        .boxed()
}

/// `gather`.
pub fn gather<B: Backend>(device: &B::Device, config: &Config) {
    run_property("gather", config.cases(128), gather_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// Scatter-add into zeros of random dims; repeated indices accumulate.
pub fn scatter_add_cases(config: &Config) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    (
        dtype_choice(),
        index_dtype(),
        small_shape(1, 4),
        any::<usize>(),
        vec(any::<usize>(), 4),
    )
        .prop_flat_map(move |((rejected, k), it, dims, a, sizes)| {
            let dt = pick_dtype(&dtypes, |d| d != DType::Bool, rejected, k);
            let axis = a % dims.len();
            let sdims = inner_dims(&dims, axis, &sizes);
            let bound = dims[axis];
            (
                input(sdims.clone(), it, Domain::IndexOrBad(bound)),
                input(sdims, dt, Domain::Any),
            )
                .prop_map(move |(i, s)| OpCase {
                    op: Op::ScatterAdd {
                        axis,
                        dims: dims.clone(),
                    },
                    inputs: vec![i, s],
                })
        })
        .boxed()
}

/// Scatter-add whose index is one value per position along the axis, broadcast over
/// the other dims (an embedding's gradient: row ids over the rows' columns), along
/// axes short and longer than a GPU cube (up to 600 positions, so that a backend that
/// reads the index in blocks crosses several).
pub fn scatter_add_row_cases(config: &Config) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    (
        dtype_choice(),
        index_dtype(),
        small_shape(1, 3),
        any::<usize>(),
        prop_oneof![3 => 0..5usize, 1 => 200..=600usize],
        1..=40usize,
    )
        .prop_flat_map(move |((rejected, k), it, dims, a, along, width)| {
            let dt = pick_dtype(&dtypes, |d| d != DType::Bool, rejected, k);
            let axis = a % dims.len();
            let mut sdims = dims.clone();
            sdims[axis] = along;
            if let Some(last) = (0..dims.len()).rev().find(|&d| d != axis) {
                // Wide rows, as an embedding's, cut into more than one block of columns.
                sdims[last] = (dims[last] * width).min(300);
            }
            let mut out_dims = sdims.clone();
            out_dims[axis] = dims[axis];
            let one_per_row: Vec<usize> = (0..sdims.len())
                .map(|d| if d == axis { along } else { 1 })
                .collect();
            let bound = dims[axis];
            let expanded = sdims.clone();
            (
                super::strategy::fresh(one_per_row, it, Domain::IndexOrBad(bound)),
                input(sdims, dt, Domain::Any),
            )
                .prop_map(move |(mut i, s)| {
                    i.views.push(Op::Expand {
                        dims: expanded.clone(),
                    });
                    OpCase {
                        op: Op::ScatterAdd {
                            axis,
                            dims: out_dims.clone(),
                        },
                        inputs: vec![i, s],
                    }
                })
        })
        .boxed()
}

/// `scatter_add`, with any index and with one index per position along the axis.
pub fn scatter_add<B: Backend>(device: &B::Device, config: &Config) {
    run_property(
        "scatter_add",
        config.cases(128),
        scatter_add_cases(config),
        |c| check_op::<B>(device, &c),
    );
    run_property(
        "scatter_add_rows",
        config.cases(64),
        scatter_add_row_cases(config),
        |c| check_op::<B>(device, &c),
    );
}

/// Casts between every pair of dtypes, from values that include NaN, infinities,
/// halves (rounding ties) and values beyond the integer ranges (saturation).
pub fn cast_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (
        select(config.dtypes.clone()),
        select(config.dtypes.clone()),
        shape(3),
    )
        .prop_flat_map(|(from, to, dims)| {
            input(dims, from, Domain::Extreme).prop_map(move |x| OpCase {
                op: Op::Cast { dtype: to },
                inputs: vec![x],
            })
        })
        .boxed()
}

/// A cast against the reference, and, for float targets, against the rounding rule
/// itself: every result is its input rounded to nearest, ties to even (a check that
/// does not go through any conversion routine the reference might share).
pub fn check_cast<B: Backend>(device: &B::Device, case: &OpCase) -> Result<(), String> {
    check_op::<B>(device, case)?;
    let Op::Cast { dtype } = case.op else {
        return Err(format!("{:?} is not a cast", case.op));
    };
    if !dtype.is_float() {
        return Ok(());
    }
    let x = case.inputs[0].logical().map_err(|e| e.to_string())?;
    let out = run_op::<B>(device, &case.op, &upload::<B>(device, &case.inputs)?)
        .and_then(|t| RefTensor::from_raw(&t))
        .map_err(|e| e.to_string())?;
    for (k, (&v, &r)) in x.data.iter().zip(&out.data).enumerate() {
        if !is_nearest(dtype, v, r) {
            return Err(format!(
                "casting {} {v:e} to {dtype} gave {r:e} (element {k}), not the nearest {dtype}",
                x.dtype
            ));
        }
    }
    Ok(())
}

/// `cast`.
pub fn cast<B: Backend>(device: &B::Device, config: &Config) {
    run_property("cast", config.cases(128), cast_cases(config), |c| {
        check_cast::<B>(device, &c)
    });
}

fn image_dim() -> BoxedStrategy<usize> {
    prop_oneof![1 => Just(0usize), 12 => 1..=7usize].boxed()
}

/// im2col of `[N, C, H, W]` with random windows (some larger than the input, some
/// degenerate: both must be refused).
pub fn unfold2d_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (
        select(config.dtypes.clone()),
        0..=2usize,
        prop_oneof![1 => Just(0usize), 6 => 1..=3usize],
        image_dim(),
        image_dim(),
        window(true),
    )
        .prop_flat_map(|(dt, n, c, h, w, win)| {
            input(vec![n, c, h, w], dt, Domain::Any).prop_map(move |x| OpCase {
                op: Op::Unfold2d(win),
                inputs: vec![x],
            })
        })
        .boxed()
}

/// `unfold2d`.
pub fn unfold2d<B: Backend>(device: &B::Device, config: &Config) {
    run_property("unfold2d", config.cases(192), unfold2d_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// col2im onto random `H×W` outputs; one case in ten has a column count that does
/// not tile the output.
pub fn fold2d_cases(config: &Config) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    (
        dtype_choice(),
        0..=2usize,
        0..=3usize,
        nonzero_dim(7),
        nonzero_dim(7),
        window(true),
        prop::bool::weighted(0.1),
    )
        .prop_flat_map(move |((rejected, k), n, c, h, w, win, wrong)| {
            let dt = pick_dtype(&dtypes, |d| d != DType::Bool, rejected, k);
            let windows = match (win.out_size(0, h), win.out_size(1, w)) {
                (Ok(a), Ok(b)) => a * b,
                _ => 1,
            };
            let l = windows + wrong as usize;
            let rows = c * win.kernel[0] * win.kernel[1];
            input(vec![rows, n, l], dt, Domain::Any).prop_map(move |x| OpCase {
                op: Op::Fold2d {
                    window: win,
                    height: h,
                    width: w,
                },
                inputs: vec![x],
            })
        })
        .boxed()
}

/// `fold2d`.
pub fn fold2d<B: Backend>(device: &B::Device, config: &Config) {
    run_property("fold2d", config.cases(192), fold2d_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// Dims for sources: up to rank 4, and one case in 20 of rank 9 (beyond `MAX_RANK`).
fn source_dims() -> BoxedStrategy<Vec<usize>> {
    prop_oneof![19 => shape(4), 1 => vec(Just(1usize), 9)].boxed()
}

/// Constants of every dtype, from values that round, saturate or are NaN.
pub fn full_cases(config: &Config) -> BoxedStrategy<OpCase> {
    (
        select(config.dtypes.clone()),
        source_dims(),
        scalar(DType::F64, Domain::Extreme),
    )
        .prop_map(|(dtype, dims, value)| OpCase {
            op: Op::Full { dims, value, dtype },
            inputs: vec![],
        })
        .boxed()
}

/// `full`.
pub fn full<B: Backend>(device: &B::Device, config: &Config) {
    run_property("full", config.cases(64), full_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// Positions along an axis: every axis of ranks up to 4 (and of the rank-9 case, which
/// backends refuse as the reference does).
pub fn iota_cases(_config: &Config) -> BoxedStrategy<OpCase> {
    source_dims()
        .prop_flat_map(|dims| {
            let rank = dims.len().max(1);
            (Just(dims), 0..rank)
        })
        .prop_map(|(dims, axis)| OpCase {
            op: Op::Iota { dims, axis },
            inputs: vec![],
        })
        .boxed()
}

/// `iota`.
pub fn iota<B: Backend>(device: &B::Device, config: &Config) {
    run_property("iota", config.cases(64), iota_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// Seeded draws: uniform and normal, every float dtype; bit-for-bit equal to
/// `kiln_tensor::rng` at each element index.
pub fn rand_cases(config: &Config) -> BoxedStrategy<OpCase> {
    let dtypes = config.dtypes.clone();
    let dist = prop_oneof![
        (-3.0..3.0f64, 0.0..5.0f64).prop_map(|(low, w)| RandDist::Uniform { low, high: low + w }),
        (-3.0..3.0f64, 0.0..3.0f64).prop_map(|(mean, std)| RandDist::Normal { mean, std }),
    ];
    (dtype_choice(), source_dims(), dist, any::<u64>())
        .prop_map(move |((rejected, k), dims, dist, seed)| OpCase {
            op: Op::Rand {
                dims,
                dist,
                seed,
                dtype: pick_dtype(&dtypes, |d| d.is_float(), rejected, k),
            },
            inputs: vec![],
        })
        .boxed()
}

/// `rand`.
pub fn rand<B: Backend>(device: &B::Device, config: &Config) {
    run_property("rand", config.cases(64), rand_cases(config), |c| {
        check_op::<B>(device, &c)
    });
}

/// `rand` with its seed mixed with one in device memory
/// ([`Backend::draw_with_device_seed`], what a captured training step draws with):
/// bit for bit the draw of `rand` with the seeds mixed on the host; a seed buffer that
/// is not `i32 [2]` is an error.
pub fn rand_device_seed<B: Backend>(device: &B::Device, config: &Config) {
    let cases = (rand_cases(config), any::<u64>(), 0..8u8);
    run_property(
        "rand_device_seed",
        config.cases(32),
        cases,
        |(c, seed, bad)| {
            let Ok(meta) = c.op.infer(&[]) else {
                return Ok(()); // a dtype `rand` refuses: the `rand` property covers it
            };
            let words = vec![seed as u32 as i32, (seed >> 32) as u32 as i32];
            let buffer = if bad == 0 {
                // A malformed seed buffer: three words.
                crate::RawTensor::<B>::from_vec(vec![1i32, 2, 3], &[3], device)
            } else {
                crate::RawTensor::<B>::from_vec(words, &[2], device)
            }
            .map_err(|e| e.to_string())?;
            let got = B::draw_with_device_seed(device, &c.op, &[], buffer.view(), &meta);
            if bad == 0 {
                return match got {
                    Err(e) if e.to_string().contains("i32 [2]") => Ok(()),
                    Err(e) => Err(format!(
                        "a seed of dims [3] gave the error `{e}`, not one naming i32 [2]"
                    )),
                    Ok(_) => Err("a seed of dims [3] was accepted".into()),
                };
            }
            let mixed = crate::backend::mix_device_seed(&c.op, seed).map_err(|e| e.to_string())?;
            let (got, want) = match (got, B::execute(device, &mixed, &[], &meta)) {
                (Ok(got), Ok(want)) => (got, want),
                (Err(_), Err(_)) => return Ok(()), // refused alike (dims past the maximum rank)
                (Err(e), Ok(_)) => return Err(format!("rand with a device seed failed: {e}")),
                (Ok(_), Err(e)) => {
                    return Err(format!("rand refused ({e}), but not with a device seed"))
                }
            };
            // Flat: a backend may draw more dims than a layout holds (both sides did).
            let n = meta.dims.iter().product::<usize>();
            let layout = crate::Layout::contiguous(
                crate::shape::Dims::new(&[n]).map_err(|e| e.to_string())?,
            );
            let (got, want) = (
                B::download(&got, &layout).map_err(|e| e.to_string())?,
                B::download(&want, &layout).map_err(|e| e.to_string())?,
            );
            if got != want {
                return Err(format!(
                    "{:?} with device seed {seed}: the draw differs from the host-mixed one",
                    c.op
                ));
            }
            Ok(())
        },
    );
}
