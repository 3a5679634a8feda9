//! Conformance properties of the composite ops of `BuilderExt` (softmax, norms,
//! activations, losses, conv2d, pooling, embedding, dropout), run eagerly on a backend
//! and compared with the direct f64 formulas of [`super::formulas`]. A composite rounds
//! at every primitive it is made of, so its tolerance is the dtype's widened by a
//! factor per composite, on top of the magnitudes the formulas report.

use super::formulas::{self, Conv, Expected};
use super::harness::{judge, logical, run_property, upload};
use super::reference::RefTensor;
use super::strategy::{fresh, input, shape, small_shape, Domain, Input};
use super::tolerance::Tol;
use super::Config;
use crate::backend::Backend;
use crate::builder::BuilderExt;
use crate::dtype::DType;
use crate::error::Result;
use crate::raw::{Eager, RawTensor};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// Which composite a case runs, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Composite {
    /// `softmax(x, axis)`.
    Softmax(usize),
    /// `log_softmax(x, axis)`.
    LogSoftmax(usize),
    /// `softmax(causal_mask(x), last axis)`: causal attention weights.
    CausalSoftmax,
    /// `logsumexp(x, axis, keepdim)`.
    LogSumExp(usize, bool),
    /// `mean(x, axes, keepdim)`.
    Mean(Vec<usize>, bool),
    /// `var(x, axes, keepdim)`.
    Var(Vec<usize>, bool),
    /// `layer_norm(x, norm_rank, weight?, bias?, eps)`; weight and bias are the
    /// inputs after `x` when present.
    LayerNorm {
        /// Trailing axes normalised.
        norm_rank: usize,
        /// Whether a weight input follows.
        weight: bool,
        /// Whether a bias input follows.
        bias: bool,
        /// Added to the variance.
        eps: f64,
    },
    /// `gelu_erf(x)`.
    GeluErf,
    /// `gelu_tanh(x)`.
    GeluTanh,
    /// `silu(x)`.
    Silu,
    /// `cross_entropy(logits, labels, smoothing)`.
    CrossEntropy(f64),
    /// `mse(a, b)`.
    Mse,
    /// `linear(x, w, b?)`.
    Linear(bool),
    /// `conv2d(x, w, b?, ...)`.
    Conv2d(Conv, bool),
    /// `max_pool2d` (true) or `avg_pool2d` (false) with kernel, stride, padding.
    Pool {
        /// Max or average.
        max: bool,
        /// Window size.
        kernel: [usize; 2],
        /// Step.
        stride: [usize; 2],
        /// Padding on each side.
        padding: [usize; 2],
    },
    /// `embedding(ids, weight)`.
    Embedding,
    /// `dropout(x, p, seed)`.
    Dropout(f64, u64),
}

/// A composite and its inputs.
#[derive(Clone, Debug)]
pub struct CompositeCase {
    /// What runs.
    pub composite: Composite,
    /// Its inputs, in the order of the builder method's arguments.
    pub inputs: Vec<Input>,
}

/// Runs a composite on a backend and on the formulas, and judges the pair.
pub fn check_composite<B: Backend>(device: &B::Device, case: &CompositeCase) -> Result<(), String> {
    let xs = logical(&case.inputs)?;
    let ts = upload::<B>(device, &case.inputs)?;
    let mut g = Eager::<B>::new(device.clone());
    let opt = |i: usize, present: bool| present.then(|| &ts[i]);
    let ropt = |i: usize, present: bool| present.then(|| &xs[i]);
    use Composite as C;
    // (reference, backend result, tolerance factor; 0 means exact)
    let (want, got, k): (Result<Expected>, Result<RawTensor<B>>, f64) = match &case.composite {
        C::Softmax(a) => (
            Ok(formulas::softmax(&xs[0], *a)),
            g.softmax(&ts[0], *a),
            8.0,
        ),
        C::CausalSoftmax => (
            Ok(formulas::causal_softmax(&xs[0])),
            g.causal_mask(&ts[0])
                .and_then(|m| g.softmax(&m, xs[0].dims.len() - 1)),
            8.0,
        ),
        C::LogSoftmax(a) => (
            Ok(formulas::log_softmax(&xs[0], *a)),
            g.log_softmax(&ts[0], *a),
            8.0,
        ),
        C::LogSumExp(a, keep) => (
            Ok(formulas::logsumexp(&xs[0], *a, *keep)),
            g.logsumexp(&ts[0], *a, *keep),
            8.0,
        ),
        C::Mean(axes, keep) => (
            Ok(formulas::mean(&xs[0], axes, *keep)),
            g.mean(&ts[0], axes, *keep),
            4.0,
        ),
        C::Var(axes, keep) => (
            Ok(formulas::var(&xs[0], axes, *keep)),
            g.var(&ts[0], axes, *keep),
            8.0,
        ),
        C::LayerNorm {
            norm_rank,
            weight,
            bias,
            eps,
        } => {
            let bi = 1 + *weight as usize;
            (
                Ok(formulas::layer_norm(
                    &xs[0],
                    *norm_rank,
                    ropt(1, *weight),
                    ropt(bi, *bias),
                    *eps,
                )),
                g.layer_norm(&ts[0], *norm_rank, opt(1, *weight), opt(bi, *bias), *eps),
                8.0,
            )
        }
        C::GeluErf => (Ok(formulas::gelu_erf(&xs[0])), g.gelu_erf(&ts[0]), 8.0),
        C::GeluTanh => (Ok(formulas::gelu_tanh(&xs[0])), g.gelu_tanh(&ts[0]), 8.0),
        C::Silu => (Ok(formulas::silu(&xs[0])), g.silu(&ts[0]), 8.0),
        C::CrossEntropy(s) => (
            formulas::cross_entropy(&xs[0], &xs[1], *s),
            g.cross_entropy(&ts[0], &ts[1], *s),
            8.0,
        ),
        C::Mse => (
            Ok(formulas::mse(&xs[0], &xs[1])),
            g.mse(&ts[0], &ts[1]),
            8.0,
        ),
        C::Linear(b) => (
            Ok(formulas::linear(&xs[0], &xs[1], ropt(2, *b))),
            g.linear(&ts[0], &ts[1], opt(2, *b)),
            2.0,
        ),
        C::Conv2d(conv, b) => (
            Ok(formulas::conv2d(&xs[0], &xs[1], ropt(2, *b), *conv)),
            g.conv2d(
                &ts[0],
                &ts[1],
                opt(2, *b),
                crate::builder::Conv2dOptions {
                    stride: conv.stride,
                    padding: conv.padding,
                    dilation: conv.dilation,
                    groups: conv.groups,
                },
            ),
            2.0,
        ),
        C::Pool {
            max,
            kernel,
            stride,
            padding,
        } => {
            let want = formulas::pool2d(&xs[0], *max, *kernel, *stride, *padding);
            if *max {
                (
                    Ok(want),
                    g.max_pool2d(&ts[0], *kernel, *stride, *padding),
                    0.0,
                )
            } else {
                (
                    Ok(want),
                    g.avg_pool2d(&ts[0], *kernel, *stride, *padding),
                    4.0,
                )
            }
        }
        C::Embedding => (
            formulas::embedding(&xs[0], &xs[1]),
            g.embedding(&ts[0], &ts[1]),
            0.0,
        ),
        C::Dropout(p, seed) => (
            Ok(formulas::dropout(&xs[0], *p, *seed)),
            g.dropout(&ts[0], *p, *seed),
            2.0,
        ),
    };
    let got = got.and_then(|t| RefTensor::from_raw(&t));
    let result = match want {
        Ok(e) => {
            let tol = Tol::for_dtype(e.value.dtype).times(k);
            judge(Ok(e.value), got, tol, Some(&e.mag))
        }
        Err(e) => judge(Err(e), got, Tol::EXACT, None),
    };
    result.map_err(|e| format!("{:?}: {e}", case.composite))
}

/// Values for composites: the full range in f32 and f64 (large logits test the
/// max-subtraction), [-3, 3] in f16 and bf16, whose rounding of intermediate values
/// would otherwise dominate.
fn domain(dt: DType) -> Domain {
    if dt.is_half() {
        Domain::Small
    } else {
        Domain::Any
    }
}

fn float_dtype(config: &Config) -> BoxedStrategy<DType> {
    select(config.floats()).boxed()
}

fn index_dtype() -> BoxedStrategy<DType> {
    select(vec![DType::I32, DType::U32]).boxed()
}

fn case(composite: Composite) -> impl Fn(Vec<Input>) -> CompositeCase {
    move |inputs| CompositeCase {
        composite: composite.clone(),
        inputs,
    }
}

/// softmax, log_softmax and logsumexp along a random (non-empty) axis, and causal
/// attention weights (`causal_mask` then softmax) over square scores.
pub fn softmax_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        small_shape(1, 4),
        any::<usize>(),
        0..4usize,
        any::<bool>(),
    )
        .prop_flat_map(|(dt, mut dims, a, kind, keep)| {
            let axis = a % dims.len();
            dims[axis] = dims[axis].max(1);
            if kind == 3 && dims.len() >= 2 {
                let r = dims.len();
                // Square scores: as many keys as queries.
                dims[r - 2] = dims[r - 2].max(1);
                dims[r - 1] = dims[r - 2];
                return vec(input(dims, dt, domain(dt)), 1)
                    .prop_map(case(Composite::CausalSoftmax))
                    .boxed();
            }
            let c = match kind {
                0 => Composite::Softmax(axis),
                1 => Composite::LogSoftmax(axis),
                _ => Composite::LogSumExp(axis, keep),
            };
            vec(input(dims, dt, domain(dt)), 1)
                .prop_map(case(c))
                .boxed()
        })
        .boxed()
}

/// mean and var over random axes, and layer_norm with and without weight and bias.
pub fn norm_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        small_shape(1, 4),
        any::<u8>(),
        0..3usize,
        any::<bool>(),
        (any::<usize>(), any::<bool>(), any::<bool>(), 1e-5..0.1f64),
    )
        .prop_flat_map(|(dt, dims, mask, kind, keep, (nr, w, b, eps))| {
            let r = dims.len();
            let axes: Vec<usize> = (0..r).filter(|i| mask & (1 << i) != 0).collect();
            let x = input(dims.clone(), dt, domain(dt));
            match kind {
                0 => vec(x, 1)
                    .prop_map(case(Composite::Mean(axes, keep)))
                    .boxed(),
                1 => vec(x, 1).prop_map(case(Composite::Var(axes, keep))).boxed(),
                _ => {
                    let norm_rank = nr % r + 1;
                    let trailing = dims[r - norm_rank..].to_vec();
                    let c = Composite::LayerNorm {
                        norm_rank,
                        weight: w,
                        bias: b,
                        eps,
                    };
                    let mut parts = vec![x];
                    if w {
                        parts.push(fresh(trailing.clone(), dt, domain(dt)));
                    }
                    if b {
                        parts.push(fresh(trailing, dt, domain(dt)));
                    }
                    parts.prop_map(case(c)).boxed()
                }
            }
        })
        .boxed()
}

/// gelu (both forms) and silu.
pub fn activation_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        shape(4),
        select(vec![
            Composite::GeluErf,
            Composite::GeluTanh,
            Composite::Silu,
        ]),
    )
        .prop_flat_map(|(dt, dims, c)| vec(input(dims, dt, domain(dt)), 1).prop_map(case(c)))
        .boxed()
}

/// Cross-entropy with and without label smoothing; now and then a label out of range.
pub fn cross_entropy_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        index_dtype(),
        0..=6usize,
        1..=7usize,
        prop_oneof![Just(0.0), 0.01..0.5f64],
    )
        .prop_flat_map(|(dt, it, n, c, s)| {
            vec![
                input(vec![n, c], dt, domain(dt)),
                input(vec![n], it, Domain::IndexOrBad(c)),
            ]
            .prop_map(case(Composite::CrossEntropy(s)))
        })
        .boxed()
}

/// Mean squared error of two operands of one shape, each in any layout (`mse` does
/// not broadcast: `[B, 1]` against `[B]` is refused, not averaged over `[B, B]`).
pub fn mse_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (float_dtype(config), shape(3))
        .prop_flat_map(|(dt, dims)| {
            vec![
                input(dims.clone(), dt, domain(dt)),
                input(dims, dt, domain(dt)),
            ]
            .prop_map(case(Composite::Mse))
        })
        .boxed()
}

/// `x @ wᵀ + b` for inputs of rank 2 and 3 (a rank-1 input is not a matrix, which
/// `matmul` requires).
pub fn linear_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        small_shape(1, 2),
        0..=6usize,
        0..=6usize,
        any::<bool>(),
    )
        .prop_flat_map(|(dt, mut dims, fin, fout, b)| {
            dims.push(fin);
            let mut parts = vec![
                input(dims, dt, domain(dt)),
                input(vec![fout, fin], dt, domain(dt)),
            ];
            if b {
                parts.push(fresh(vec![fout], dt, domain(dt)));
            }
            parts.prop_map(case(Composite::Linear(b)))
        })
        .boxed()
}

/// conv2d with groups, stride, padding, dilation and an optional bias.
pub fn conv2d_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        (0..=2usize, 1..=3usize, 1..=2usize, 1..=2usize),
        (
            [1..=3usize, 1..=3usize],
            [1..=2usize, 1..=2usize],
            [0..=2usize, 0..=2usize],
            [1..=2usize, 1..=2usize],
        ),
        (1..=7usize, 1..=7usize, any::<bool>()),
    )
        .prop_flat_map(
            |(dt, (n, groups, cin_g, cout_g), (kernel, stride, padding, dilation), (h, w, b))| {
                // The dilated kernel must fit inside the padded input.
                let fit = |n: usize, i: usize| {
                    n.max((dilation[i] * (kernel[i] - 1) + 1).saturating_sub(2 * padding[i]))
                        .max(1)
                };
                let (h, w) = (fit(h, 0), fit(w, 1));
                let conv = Conv {
                    stride,
                    padding,
                    dilation,
                    groups,
                };
                let mut parts = vec![
                    input(vec![n, groups * cin_g, h, w], dt, domain(dt)),
                    input(
                        vec![groups * cout_g, cin_g, kernel[0], kernel[1]],
                        dt,
                        domain(dt),
                    ),
                ];
                if b {
                    parts.push(fresh(vec![groups * cout_g], dt, domain(dt)));
                }
                parts.prop_map(case(Composite::Conv2d(conv, b)))
            },
        )
        .boxed()
}

/// Max and average pooling with padding up to half the kernel (PyTorch's limit).
pub fn pool_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        (0..=2usize, 0..=3usize, 1..=7usize, 1..=7usize),
        (
            [1..=3usize, 1..=3usize],
            [1..=3usize, 1..=3usize],
            [any::<usize>(), any::<usize>()],
        ),
        any::<bool>(),
    )
        .prop_flat_map(|(dt, (n, ch, h, w), (kernel, stride, pad), max)| {
            let padding = [pad[0] % (kernel[0] / 2 + 1), pad[1] % (kernel[1] / 2 + 1)];
            let h = h.max(kernel[0] - 2 * padding[0]);
            let w = w.max(kernel[1] - 2 * padding[1]);
            let pool = Composite::Pool {
                max,
                kernel,
                stride,
                padding,
            };
            // Values of both signs: a window overlapping the padding must still pick
            // its largest real element when all of them are negative.
            vec(input(vec![n, ch, h, w], dt, domain(dt)), 1).prop_map(case(pool))
        })
        .boxed()
}

/// Embedding lookups with ids of rank 0 to 3 (some out of range).
pub fn embedding_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        select(config.dtypes.clone()),
        index_dtype(),
        small_shape(0, 3),
        1..=6usize,
        0..=5usize,
    )
        .prop_flat_map(|(dt, it, ids, v, d)| {
            vec![
                input(ids, it, Domain::IndexOrBad(v)),
                input(vec![v, d], dt, Domain::Any),
            ]
            .prop_map(case(Composite::Embedding))
        })
        .boxed()
}

/// Dropout at probabilities 0 to 0.9 with random seeds.
pub fn dropout_cases(config: &Config) -> BoxedStrategy<CompositeCase> {
    (
        float_dtype(config),
        shape(3),
        prop_oneof![1 => Just(0.0), 4 => 0.05..0.9f64],
        any::<u64>(),
    )
        .prop_flat_map(|(dt, dims, p, seed)| {
            vec(input(dims, dt, domain(dt)), 1).prop_map(case(Composite::Dropout(p, seed)))
        })
        .boxed()
}

macro_rules! composite_tests {
    ($($(#[$m:meta])* $name:ident => $cases:ident, $n:expr;)*) => {$(
        $(#[$m])*
        pub fn $name<B: Backend>(device: &B::Device, config: &Config) {
            run_property(stringify!($name), config.cases($n), $cases(config), |c| {
                check_composite::<B>(device, &c)
            });
        }
    )*};
}

composite_tests! {
    /// softmax, log_softmax, logsumexp.
    softmax => softmax_cases, 128;
    /// mean, var, layer_norm.
    norms => norm_cases, 128;
    /// gelu (erf and tanh forms), silu.
    activations => activation_cases, 96;
    /// cross_entropy.
    cross_entropy => cross_entropy_cases, 128;
    /// mse.
    mse => mse_cases, 64;
    /// linear.
    linear => linear_cases, 96;
    /// conv2d.
    conv2d => conv2d_cases, 128;
    /// max_pool2d and avg_pool2d.
    pool2d => pool_cases, 128;
    /// embedding.
    embedding => embedding_cases, 96;
    /// dropout.
    dropout => dropout_cases, 64;
}
