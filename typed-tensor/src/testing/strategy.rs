//! Proptest strategies: dims (size-1 and zero-size dims included, big shapes rare),
//! values per dtype and domain, and inputs that reach an op as fresh contiguous tensors
//! or as permuted, sliced (with a step) and broadcast views of larger tensors.

use super::reference::{eval, RefTensor};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::Result;
use crate::op::{Op, Window2d};
use crate::raw::RawTensor;
use proptest::collection::vec;
use proptest::prelude::*;
use std::fmt;

/// Which values a tensor's elements are drawn from (before rounding to the dtype).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Domain {
    /// Both signs, mostly moderate, with zeros, -0.0, small integers (so that ties and
    /// exact cancellations happen) and some values of magnitude up to 100; integers
    /// over their whole range at times (to exercise wrapping).
    Any,
    /// `Any` plus NaNs, for ops whose NaN behaviour is specified.
    WithNan,
    /// Positive values in [0.01, 10]: the domain of log, sqrt and rsqrt.
    Positive,
    /// Values at least 0.1 away from zero: divisors.
    NonZero,
    /// Values in [-3, 3]: exponents, and inputs of composites in low precision.
    Small,
    /// `Any` plus NaN, infinities, values beyond the integer ranges and values at and
    /// next to the rounding ties of f32, f16 and bf16: cast sources.
    Extreme,
    /// Integer indices in `0..n`.
    Index(usize),
    /// Indices in `0..n`, and now and then `n` or -1 (out of range).
    IndexOrBad(usize),
}

/// One element drawn from `domain` for `dtype`.
pub fn scalar(dtype: DType, domain: Domain) -> BoxedStrategy<f64> {
    if let Domain::Index(n) | Domain::IndexOrBad(n) = domain {
        let good = (0..n.max(1)).prop_map(|v| v as f64);
        return if matches!(domain, Domain::Index(_)) {
            good.boxed()
        } else {
            prop_oneof![12 => good, 1 => Just(n as f64), 1 => Just(-1.0)].boxed()
        };
    }
    match dtype {
        DType::Bool => any::<bool>().prop_map(|b| b as u8 as f64).boxed(),
        DType::I32 => match domain {
            Domain::Positive => (1..=9i32).prop_map(f64::from).boxed(),
            Domain::NonZero => prop_oneof![
                4 => 1..=9i32,
                4 => -9..=-1i32,
                1 => any::<i32>().prop_filter("non-zero", |v| *v != 0)
            ]
            .prop_map(f64::from)
            .boxed(),
            Domain::Small => (-3..=3i32).prop_map(f64::from).boxed(),
            _ => prop_oneof![4 => -9..=9i32, 1 => any::<i32>()]
                .prop_map(f64::from)
                .boxed(),
        },
        DType::I8 => prop_oneof![4 => -9..=9i8, 1 => any::<i8>()]
            .prop_map(f64::from)
            .boxed(),
        DType::U32 => match domain {
            Domain::Positive | Domain::NonZero => prop_oneof![4 => 1..=9u32, 1 => 1..=u32::MAX]
                .prop_map(f64::from)
                .boxed(),
            Domain::Small => (0..=3u32).prop_map(f64::from).boxed(),
            _ => prop_oneof![4 => 0..=9u32, 1 => any::<u32>()]
                .prop_map(f64::from)
                .boxed(),
        },
        _ => float(domain),
    }
}

fn float(domain: Domain) -> BoxedStrategy<f64> {
    let any_float = || {
        prop_oneof![
            6 => -3.0..3.0f64,
            2 => (-4..=4i32).prop_map(f64::from),
            1 => -100.0..100.0f64,
            1 => Just(-0.0),
        ]
    };
    match domain {
        Domain::Positive => prop_oneof![4 => 0.01..10.0f64, 1 => (1..=4i32).prop_map(f64::from)].boxed(),
        Domain::NonZero => (0.1..5.0f64, any::<bool>())
            .prop_map(|(v, neg)| if neg { -v } else { v })
            .boxed(),
        Domain::Small => prop_oneof![4 => -3.0..3.0f64, 1 => (-3..=3i32).prop_map(f64::from)].boxed(),
        Domain::WithNan => prop_oneof![10 => any_float(), 1 => Just(f64::NAN)].boxed(),
        Domain::Extreme => prop_oneof![
            10 => any_float(),
            2 => (-5..=5i32).prop_map(|v| v as f64 + 0.5),
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            2 => (1e9..1e11f64, any::<bool>()).prop_map(|(v, neg)| if neg { -v } else { v }),
            4 => (any::<u32>(), 0..3usize, 0..3u32).prop_map(|(bits, level, d)| near_tie(bits, level, d)),
        ]
        .boxed(),
        _ => any_float().boxed(),
    }
}

/// A value one unit below, at, or one unit above (`d` = 0, 1, 2) the halfway point
/// between two neighbours of bf16 (`level` 0), f16 (1) or f32 (2), with magnitude
/// around 2^-20..2^20: where conversions that lose sticky bits or round twice go wrong.
fn near_tie(bits: u32, level: usize, d: u32) -> f64 {
    let exponent = 127 + (bits >> 23) % 41 - 20;
    let f = (bits & 0x8000_0000) | exponent << 23 | (bits & 0x007f_ffff);
    match level {
        0 => f32::from_bits((f & !0xffff) | (0x8000 + d - 1)) as f64,
        1 => f32::from_bits((f & !0x1fff) | (0x1000 + d - 1)) as f64,
        _ => {
            let wide = (f32::from_bits(f) as f64).to_bits();
            f64::from_bits((wide & !0x1fff_ffff) | ((1 << 28) + d as u64 - 1))
        }
    }
}

/// One dim size: mostly 2..=5, often 1, sometimes 0, now and then up to 13.
pub fn dim() -> BoxedStrategy<usize> {
    prop_oneof![3 => Just(1usize), 1 => Just(0usize), 12 => 2..=5usize, 2 => 6..=13usize].boxed()
}

/// A dim for windows and matrices that is never 0 but sometimes 1.
pub fn nonzero_dim(max: usize) -> BoxedStrategy<usize> {
    prop_oneof![1 => Just(1usize), 4 => 1..=max].boxed()
}

/// Dims of rank `0..=max_rank`; one case in 25 is a big shape of 30k–70k elements, so
/// that parallel code paths run too.
pub fn shape(max_rank: usize) -> BoxedStrategy<Vec<usize>> {
    prop_oneof![
        24 => vec(dim(), 0..=max_rank),
        1 => (1..=2usize, 130..=190usize, 130..=190usize)
            .prop_map(|(a, b, c)| vec![a.max(2), b, c]),
    ]
    .boxed()
}

/// Dims of rank `min_rank..=max_rank` (small shapes only).
pub fn small_shape(min_rank: usize, max_rank: usize) -> BoxedStrategy<Vec<usize>> {
    vec(dim(), min_rank..=max_rank).boxed()
}

/// Dims that broadcast to `out` under NumPy rules: leading dims dropped at times, and
/// some dims replaced by 1.
pub fn broadcast_operand(out: &[usize]) -> BoxedStrategy<Vec<usize>> {
    let out = out.to_vec();
    let r = out.len();
    (
        prop_oneof![3 => Just(0usize), 1 => 0..=r],
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(move |(drop, mask, collapse)| {
            out[drop..]
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    if collapse && mask & (1 << (i % 8)) != 0 {
                        1
                    } else {
                        d
                    }
                })
                .collect()
        })
        .boxed()
}

/// A dtype from `dtypes` that `accepts`, or one that it rejects when `rejected` (to
/// check that both sides refuse it); falls back to the other group when one is empty.
pub fn pick_dtype(
    dtypes: &[DType],
    accepts: impl Fn(DType) -> bool,
    rejected: bool,
    k: usize,
) -> DType {
    let (yes, no): (Vec<DType>, Vec<DType>) = dtypes.iter().partition(|d| accepts(**d));
    let group = if (rejected && !no.is_empty()) || yes.is_empty() {
        no
    } else {
        yes
    };
    group[k % group.len()]
}

/// A strategy for [`pick_dtype`]'s arguments: mostly accepted dtypes (1 in 12 rejected).
pub fn dtype_choice() -> BoxedStrategy<(bool, usize)> {
    (prop::bool::weighted(1.0 / 12.0), any::<usize>()).boxed()
}

/// An op's input: a contiguous base tensor and the view ops that turn it into the
/// logical input (applied with the reference interpreter on one side and as layout
/// changes on the backend on the other).
#[derive(Clone)]
pub struct Input {
    /// The uploaded tensor.
    pub base: RefTensor,
    /// Permute, slice and expand views applied to it, in order.
    pub views: Vec<Op>,
}

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.base)?;
        for v in &self.views {
            write!(f, " .{v:?}")?;
        }
        Ok(())
    }
}

impl Input {
    /// A fresh contiguous input.
    pub fn fresh(t: RefTensor) -> Self {
        Input {
            base: t,
            views: Vec::new(),
        }
    }

    /// The logical input, by the reference interpreter.
    pub fn logical(&self) -> Result<RefTensor> {
        let mut t = self.base.clone();
        for v in &self.views {
            t = eval(v, &[&t])?;
        }
        Ok(t)
    }

    /// The logical input on a backend: the base uploaded, the views applied as views.
    pub fn upload<B: Backend>(&self, device: &B::Device) -> Result<RawTensor<B>> {
        let mut t = self.base.to_raw::<B>(device)?;
        for v in &self.views {
            t = t.apply(v.clone(), &[])?;
        }
        Ok(t)
    }
}

/// The views that produce `dims`: (an optional permutation, an optional slice as
/// (axis choice, start, step, spare elements), an optional broadcast as (mask of
/// broadcast axes, number of new leading dims)). Returns the base dims and the views.
fn plan_views(
    dims: &[usize],
    perm: Option<Vec<usize>>,
    slice: Option<(usize, usize, usize, usize)>,
    expand: Option<(u8, usize)>,
) -> (Vec<usize>, Vec<Op>) {
    let mut d = dims.to_vec();
    let mut views = Vec::new();
    // Built from the outside in: the broadcast is the last view applied.
    if let Some((mask, lead)) = expand {
        let lead = lead.min(d.len());
        let pre: Vec<usize> = d
            .iter()
            .enumerate()
            .skip(lead)
            .map(|(i, &n)| if mask & (1 << (i % 8)) != 0 { 1 } else { n })
            .collect();
        views.push(Op::Expand { dims: d.clone() });
        d = pre;
    }
    if let (Some((axis, start, step, spare)), false) = (slice, d.is_empty()) {
        let axis = axis % d.len();
        let len = d[axis];
        let end = if len == 0 {
            start
        } else {
            // Any end in this range keeps `len` elements.
            start + (len - 1) * step + 1 + spare % step
        };
        views.push(Op::Slice {
            axis,
            start,
            end,
            step,
        });
        d[axis] = end + spare;
    }
    if let Some(perm) = perm {
        if perm.len() == d.len() {
            let mut pre = vec![0; d.len()];
            for (i, &p) in perm.iter().enumerate() {
                pre[p] = d[i];
            }
            views.push(Op::Permute { perm });
            d = pre;
        }
    }
    views.reverse();
    (d, views)
}

/// An input of logical `dims`, `dtype` and value `domain`, reaching the op as a fresh
/// tensor or as a view (permuted, sliced, broadcast, or a mix) of a larger one.
pub fn input(dims: Vec<usize>, dtype: DType, domain: Domain) -> BoxedStrategy<Input> {
    let r = dims.len();
    let perm = proptest::option::weighted(0.3, Just((0..r).collect::<Vec<_>>()).prop_shuffle());
    let slice = proptest::option::weighted(0.3, (0..8usize, 0..3usize, 1..=3usize, 0..3usize));
    let expand = proptest::option::weighted(0.25, (any::<u8>(), 0..=r));
    (perm, slice, expand)
        .prop_flat_map(move |(p, s, e)| {
            let (base_dims, views) = plan_views(&dims, p, s, e);
            let n: usize = base_dims.iter().product();
            vec(scalar(dtype, domain), n).prop_map(move |data| Input {
                base: RefTensor::new(base_dims.clone(), data, dtype),
                views: views.clone(),
            })
        })
        .boxed()
}

/// A contiguous input (for parameters such as weights, where views add nothing).
pub fn fresh(dims: Vec<usize>, dtype: DType, domain: Domain) -> BoxedStrategy<Input> {
    let n: usize = dims.iter().product();
    vec(scalar(dtype, domain), n)
        .prop_map(move |data| Input::fresh(RefTensor::new(dims.clone(), data, dtype)))
        .boxed()
}

/// A sliding window: kernel 1..=3, stride 1..=3, padding 0..=2, dilation 1..=2; with
/// `degenerate`, now and then a zero kernel, stride or dilation (which must be refused).
pub fn window(degenerate: bool) -> BoxedStrategy<Window2d> {
    let k = if degenerate {
        prop_oneof![30 => 1..=3usize, 1 => Just(0usize)].boxed()
    } else {
        (1..=3usize).boxed()
    };
    let dil = if degenerate {
        prop_oneof![30 => 1..=2usize, 1 => Just(0usize)].boxed()
    } else {
        (1..=2usize).boxed()
    };
    (
        [k.clone(), k.clone()],
        [k.clone(), k],
        [0..=2usize, 0..=2usize],
        [dil.clone(), dil],
    )
        .prop_map(|(kernel, stride, padding, dilation)| Window2d {
            kernel,
            stride,
            padding,
            dilation,
        })
        .boxed()
}
