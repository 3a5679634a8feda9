//! Bad run-time shapes and dtypes: each must come back as an `Err` of the right kind
//! whose message names the shapes (or dtypes, or index) at fault; never a panic, never
//! a result.

use super::harness::run_property;
use super::strategy::{dim, nonzero_dim, small_shape};
use crate::backend::Backend;
use crate::builder::BuilderExt;
use crate::dim::{Const, Dyn};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{fmt_dims, Window2d};
use crate::raw::RawTensor;
use crate::tensor::Tensor;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// A call that must fail.
#[derive(Clone, Debug)]
pub enum BadCase {
    /// `a @ b` whose inner dims differ.
    MatMulInner(Vec<usize>, Vec<usize>),
    /// `a + b` whose dims do not broadcast.
    Broadcast(Vec<usize>, Vec<usize>),
    /// A reshape that changes the element count.
    Reshape(Vec<usize>, Vec<usize>),
    /// A concat whose other dims differ.
    Concat(Vec<usize>, Vec<usize>, usize),
    /// A gather (data dims, axis, index value) whose index is out of range.
    GatherIndex(Vec<usize>, usize, i64),
    /// An unfold whose kernel spans more than the padded input.
    UnfoldKernel(Vec<usize>, Window2d),
    /// `a + b` of two dtypes.
    MixedDTypes(DType, DType),
    /// A matrix product of a non-float dtype.
    MatMulDType(DType),
    /// A tensor of rank above `MAX_RANK`, made in one of four ways.
    RankTooLarge(usize, u8),
    /// `from_vec` with too many or too few values.
    FromVecLength(Vec<usize>, usize),
    /// `Tensor<B, (Dyn, Const<3>)>::from_vec` with dims its type does not allow.
    TypedDims(Vec<usize>),
    /// conv2d whose input channels do not match the weight's.
    ConvChannels(Vec<usize>, Vec<usize>),
    /// cross_entropy whose labels do not match the logits' batch.
    CrossEntropyLabels(Vec<usize>, Vec<usize>),
}

/// Strategies for every kind of bad case, with random shapes, mixing only the dtypes
/// of `config` (the ones the backend holds).
pub fn bad_cases(config: &super::Config) -> BoxedStrategy<BadCase> {
    let dtypes = config.dtypes.clone();
    let d = || nonzero_dim(5);
    let two_different = || (2..=6usize, 2..=6usize).prop_filter("different", |(a, b)| a != b);
    prop_oneof![
        (vec(dim(), 0..=1), d(), two_different(), d()).prop_map(|(mut a, m, (k1, k2), n)| {
            let mut b = a.clone();
            a.extend([m, k1]);
            b.extend([k2, n]);
            BadCase::MatMulInner(a, b)
        }),
        (small_shape(1, 3), any::<usize>(), two_different()).prop_map(|(a, i, (x, y))| {
            let axis = i % a.len();
            let (mut a, mut b) = (a.clone(), a);
            a[axis] = x;
            b[axis] = y;
            BadCase::Broadcast(a, b)
        }),
        (vec(d(), 1..=3), vec(d(), 1..=3))
            .prop_filter("different counts", |(a, b)| a.iter().product::<usize>()
                != b.iter().product::<usize>())
            .prop_map(|(a, b)| BadCase::Reshape(a, b)),
        (vec(d(), 2..=3), any::<usize>(), 1..=3usize).prop_map(|(a, i, extra)| {
            let axis = i % a.len();
            let mut b = a.clone();
            let other = (axis + 1) % a.len();
            b[other] += extra;
            BadCase::Concat(a, b, axis)
        }),
        (
            vec(d(), 1..=3),
            any::<usize>(),
            prop_oneof![Just(-1i64), 0..=3i64]
        )
            .prop_map(|(a, i, k)| {
                let axis = i % a.len();
                // Negative, or at or past the end of the axis.
                let bad = if k < 0 { k } else { a[axis] as i64 + k };
                BadCase::GatherIndex(a, axis, bad)
            }),
        (d(), d(), 1..=4usize, 0..=1usize).prop_map(|(h, w, extra, p)| {
            let k = h + 2 * p + extra;
            BadCase::UnfoldKernel(
                vec![1, 2, h, w],
                Window2d {
                    kernel: [k, 1],
                    stride: [1, 1],
                    padding: [p, 0],
                    dilation: [1, 1],
                },
            )
        }),
        (select(dtypes.clone()), select(dtypes))
            .prop_filter("different", |(a, b)| a != b)
            .prop_map(|(a, b)| BadCase::MixedDTypes(a, b)),
        select(vec![DType::I32, DType::U32, DType::Bool]).prop_map(BadCase::MatMulDType),
        (9..=10usize, 0..4u8).prop_map(|(r, how)| BadCase::RankTooLarge(r, how)),
        (vec(d(), 1..=3), 0..40usize)
            .prop_filter("wrong length", |(a, n)| a.iter().product::<usize>() != *n)
            .prop_map(|(a, n)| BadCase::FromVecLength(a, n)),
        prop_oneof![
            (d(), d())
                .prop_filter("not 3", |(_, c)| *c != 3)
                .prop_map(|(r, c)| vec![r, c]),
            d().prop_map(|r| vec![r]),
            (d(), d()).prop_map(|(r, e)| vec![r, 3, e]),
        ]
        .prop_map(BadCase::TypedDims),
        (d(), two_different(), 1..=3usize).prop_map(|(n, (c, wc), k)| {
            BadCase::ConvChannels(vec![n, c, 4, 4], vec![2, wc, k, k])
        }),
        (d(), two_different(), d()).prop_map(|(c, (n, m), extra)| {
            let labels = if extra % 2 == 0 {
                vec![m]
            } else {
                vec![n, extra]
            };
            BadCase::CrossEntropyLabels(vec![n, c], labels)
        }),
    ]
    .boxed()
}

fn zeros<B: Backend>(dims: &[usize], dtype: DType, device: &B::Device) -> Result<RawTensor<B>> {
    RawTensor::zeros(dims, dtype, device)
}

/// Runs a bad case; `Ok` when it fails as it must.
pub fn check_bad<B: Backend>(device: &B::Device, case: &BadCase) -> Result<(), String> {
    let f32z = |d: &[usize]| zeros::<B>(d, DType::F32, device);
    let setup = |e: Error| format!("setting up the case failed: {e}");
    // (the outcome, the kind of error expected, what its message must mention)
    let (outcome, kind, mentions): (Result<()>, &str, Vec<String>) = match case {
        BadCase::MatMulInner(a, b) => (
            f32z(a)
                .map_err(setup)?
                .matmul(&f32z(b).map_err(setup)?)
                .map(drop),
            "shape",
            vec![fmt_dims(a), fmt_dims(b)],
        ),
        BadCase::Broadcast(a, b) => (
            f32z(a)
                .map_err(setup)?
                .add(&f32z(b).map_err(setup)?)
                .map(drop),
            "shape",
            vec![fmt_dims(a), fmt_dims(b)],
        ),
        BadCase::Reshape(a, b) => (
            f32z(a).map_err(setup)?.reshape(b).map(drop),
            "shape",
            vec![fmt_dims(a), fmt_dims(b)],
        ),
        BadCase::Concat(a, b, axis) => {
            let (x, y) = (f32z(a).map_err(setup)?, f32z(b).map_err(setup)?);
            (
                RawTensor::concat(&[&x, &y], *axis).map(drop),
                "shape",
                vec![fmt_dims(a), fmt_dims(b)],
            )
        }
        BadCase::GatherIndex(a, axis, bad) => {
            let n: usize = a.iter().product();
            let mut idx = vec![0i32; n];
            idx[n - 1] = *bad as i32;
            let index = RawTensor::<B>::from_vec(idx, a, device).map_err(setup)?;
            // Devices detect a bad index in the kernel and may report it when the
            // result is read (kernels run asynchronously), not when the op returns.
            (
                f32z(a)
                    .map_err(setup)?
                    .gather(*axis, &index)
                    .and_then(|t| t.to_host())
                    .map(drop),
                "invalid",
                vec![bad.to_string()],
            )
        }
        BadCase::UnfoldKernel(a, w) => {
            let x = f32z(a).map_err(setup)?;
            (
                x.apply(crate::op::Op::Unfold2d(*w), &[]).map(drop),
                "shape",
                vec![fmt_dims(a)],
            )
        }
        BadCase::MixedDTypes(a, b) => {
            let x = zeros::<B>(&[2, 3], *a, device).map_err(setup)?;
            let y = zeros::<B>(&[2, 3], *b, device).map_err(setup)?;
            (
                x.add(&y).map(drop),
                "dtype",
                vec![a.to_string(), b.to_string()],
            )
        }
        BadCase::MatMulDType(dt) => {
            let x = zeros::<B>(&[2, 2], *dt, device).map_err(setup)?;
            (x.matmul(&x).map(drop), "dtype", vec![dt.to_string()])
        }
        BadCase::RankTooLarge(r, how) => {
            let dims = vec![1usize; *r];
            let outcome = match how {
                0 => RawTensor::<B>::from_vec(vec![0f32], &dims, device).map(drop),
                1 => f32z(&dims).map(drop),
                2 => f32z(&[1]).map_err(setup)?.reshape(&dims).map(drop),
                _ => f32z(&[1]).map_err(setup)?.broadcast_to(&dims).map(drop),
            };
            (outcome, "invalid", vec![format!("rank {r}")])
        }
        BadCase::FromVecLength(a, n) => (
            RawTensor::<B>::from_vec(vec![0f32; *n], a, device).map(drop),
            "shape",
            vec![fmt_dims(a), n.to_string()],
        ),
        BadCase::TypedDims(a) => {
            let n = a.iter().product();
            (
                Tensor::<B, (Dyn, Const<3>)>::from_vec(vec![0f32; n], a, device).map(drop),
                "shape",
                vec![fmt_dims(a), "[?, 3]".to_string()],
            )
        }
        BadCase::ConvChannels(x, w) => {
            let (xt, wt) = (f32z(x).map_err(setup)?, f32z(w).map_err(setup)?);
            (
                xt.ops()
                    .conv2d(&xt, &wt, None, crate::builder::Conv2dOptions::default())
                    .map(drop),
                "shape",
                vec![fmt_dims(w)],
            )
        }
        BadCase::CrossEntropyLabels(l, y) => {
            let lt = f32z(l).map_err(setup)?;
            let yt = zeros::<B>(y, DType::I32, device).map_err(setup)?;
            (
                lt.ops().cross_entropy(&lt, &yt, 0.0).map(drop),
                "shape",
                vec![fmt_dims(l), fmt_dims(y)],
            )
        }
    };
    let err = match outcome {
        Ok(()) => return Err(format!("{case:?} succeeded; it must fail")),
        Err(e) => e,
    };
    let got_kind = match err {
        Error::Shape { .. } => "shape",
        Error::DType { .. } => "dtype",
        Error::Invalid { .. } => "invalid",
        _ => "other",
    };
    if got_kind != kind {
        return Err(format!(
            "{case:?} failed with a {got_kind} error, not a {kind} error: {err}"
        ));
    }
    let msg = err.to_string();
    for m in &mentions {
        if !msg.contains(m.as_str()) {
            return Err(format!(
                "{case:?}: the message `{msg}` does not mention {m}"
            ));
        }
    }
    Ok(())
}

/// Every kind of bad case, with random shapes.
pub fn bad_shapes<B: Backend>(device: &B::Device, config: &super::Config) {
    run_property("bad_shapes", config.cases(256), bad_cases(config), |c| {
        check_bad::<B>(device, &c)
    });
}
