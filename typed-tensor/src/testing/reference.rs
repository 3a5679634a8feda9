//! The reference interpreter: every primitive of the op table evaluated on the host in
//! f64 with plain nested loops over multi-indices. It is deliberately naive and shares
//! nothing with any backend, so that a backend bug cannot hide behind a shared helper.
//! Shapes and dtypes come from [`Op::infer`]; elementwise values from the table's own
//! reference definitions ([`UnaryOp::eval`], [`BinaryOp::eval`], [`CmpOp::eval`]);
//! every result is rounded to its dtype through [`HostData::from_f64_slice`], so
//! integer, bool and half-precision semantics are those of the element types.

use crate::backend::Backend;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::op::{fmt_dims, BinaryOp, Op, RandDist, ReduceOp, TensorMeta, Window2d};
use crate::raw::RawTensor;
use crate::rng;
use crate::shape::Dims;
use std::fmt;

/// A host tensor in f64: the reference interpreter's values, and what backend results
/// are downloaded into for comparison.
#[derive(Clone, PartialEq)]
pub struct RefTensor {
    /// The dims.
    pub dims: Vec<usize>,
    /// The elements in row-major order, each exactly representable in `dtype`.
    pub data: Vec<f64>,
    /// The element type the values stand for.
    pub dtype: DType,
}

impl fmt::Debug for RefTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shrunk failing cases are small; a big one is cut so the report stays readable.
        const SHOWN: usize = 64;
        write!(f, "{}{}", self.dtype, fmt_dims(&self.dims))?;
        let shown: Vec<String> = self
            .data
            .iter()
            .take(SHOWN)
            .map(|v| v.to_string())
            .collect();
        let more = if self.data.len() > SHOWN { ", ..." } else { "" };
        write!(f, " [{}{more}]", shown.join(", "))
    }
}

impl RefTensor {
    /// A tensor of `dims` holding `data` rounded to `dtype` (as `Element::from_f64`
    /// rounds: to nearest for floats, toward zero and saturating for integers).
    pub fn new(dims: Vec<usize>, data: Vec<f64>, dtype: DType) -> Self {
        assert_eq!(
            data.len(),
            dims.iter().product::<usize>(),
            "{} values for dims {}",
            data.len(),
            fmt_dims(&dims)
        );
        let data = HostData::from_f64_slice(dtype, &data).to_f64_vec();
        RefTensor { dims, data, dtype }
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The dims and dtype, as shape rules see them.
    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.dims.clone(), self.dtype)
    }

    /// The element at a multi-index.
    pub fn at(&self, index: &[usize]) -> f64 {
        self.data[flat(&self.dims, index)]
    }

    /// Downloads a backend tensor (any layout) without changing its values.
    pub fn from_raw<B: Backend>(t: &RawTensor<B>) -> Result<Self> {
        let data = t.to_f64_vec()?;
        if data.len() != t.numel() {
            return Err(Error::invalid(
                "download",
                format!("{} values for a tensor of shape {}", data.len(), t.dims()),
            ));
        }
        Ok(RefTensor {
            dims: t.dims().to_vec(),
            data,
            dtype: t.dtype(),
        })
    }

    /// Uploads the values to a contiguous tensor on `device`.
    pub fn to_raw<B: Backend>(&self, device: &B::Device) -> Result<RawTensor<B>> {
        RawTensor::from_host(
            HostData::from_f64_slice(self.dtype, &self.data),
            &self.dims,
            device,
        )
    }
}

/// The row-major position of a multi-index.
pub fn flat(dims: &[usize], index: &[usize]) -> usize {
    debug_assert_eq!(dims.len(), index.len());
    index.iter().zip(dims).fold(0, |acc, (&i, &d)| {
        debug_assert!(i < d, "index {index:?} outside {dims:?}");
        acc * d + i
    })
}

/// Every multi-index of `dims`, in row-major order (none when a dim is 0, one empty
/// index for a scalar).
pub fn indices(dims: &[usize]) -> impl Iterator<Item = Vec<usize>> {
    let n: usize = dims.iter().product();
    let dims = dims.to_vec();
    let mut idx = vec![0usize; dims.len()];
    (0..n).map(move |k| {
        if k > 0 {
            for ax in (0..dims.len()).rev() {
                idx[ax] += 1;
                if idx[ax] < dims[ax] {
                    break;
                }
                idx[ax] = 0;
            }
        }
        idx.clone()
    })
}

/// The element of `x` that NumPy broadcasting maps to `index` of a (higher or equal
/// rank) result: dims aligned on the right, size-1 dims repeated.
pub fn broadcast_at(x: &RefTensor, index: &[usize]) -> f64 {
    let lead = index.len() - x.dims.len();
    let j: Vec<usize> = x
        .dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { index[lead + i] })
        .collect();
    x.at(&j)
}

/// A compensated (Neumaier) running sum: its error stays near one rounding of the
/// result however many terms it adds, so the reference stays more accurate than any
/// backend's f64 sum.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sum {
    sum: f64,
    compensation: f64,
}

impl Sum {
    /// Adds a term.
    pub fn add(&mut self, v: f64) {
        let t = self.sum + v;
        if t.is_finite() {
            // The low-order bits that `t` lost, from whichever operand was smaller.
            self.compensation += if self.sum.abs() >= v.abs() {
                (self.sum - t) + v
            } else {
                (v - t) + self.sum
            };
        }
        self.sum = t;
    }

    /// The sum so far.
    pub fn value(&self) -> f64 {
        if self.sum.is_finite() {
            self.sum + self.compensation
        } else {
            self.sum
        }
    }

    /// The compensated sum of `values`.
    pub fn of(values: impl IntoIterator<Item = f64>) -> f64 {
        let mut s = Sum::default();
        for v in values {
            s.add(v);
        }
        s.value()
    }
}

/// Wraps an exact integer result into `dtype`'s range (two's complement), as integer
/// arithmetic does; floats pass through.
fn wrap(dtype: DType, v: i128) -> f64 {
    match dtype {
        DType::I32 => v as i32 as f64,
        DType::U32 => v as u32 as f64,
        _ => v as f64,
    }
}

/// Integer binary arithmetic, exact in i128 (f64 cannot hold the product of two 32-bit
/// integers) and then wrapped to the dtype.
fn int_binary(op: BinaryOp, dtype: DType, a: f64, b: f64) -> Result<f64> {
    let (x, y) = (a as i128, b as i128);
    let r = match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => {
            if y == 0 {
                return Err(Error::invalid("div", "integer division by zero"));
            }
            // i128 division truncates toward zero, as integer division does.
            x / y
        }
        // Exact in f64: the table's definition applies as is.
        BinaryOp::Max | BinaryOp::Min | BinaryOp::Pow => return Ok(op.eval(a, b)),
    };
    Ok(wrap(dtype, r))
}

/// A checked index value from an index tensor.
fn index_value(op: &'static str, v: f64, bound: usize, axis: usize) -> Result<usize> {
    if v < 0.0 || v >= bound as f64 {
        return Err(Error::invalid(
            op,
            format!("index {v} is out of range for axis {axis} of size {bound}"),
        ));
    }
    Ok(v as usize)
}

/// The input position of output position `o` and tap `k` along one window axis, if it
/// falls inside the (unpadded) input of size `n`.
fn window_src(w: &Window2d, ax: usize, o: usize, k: usize, n: usize) -> Option<usize> {
    let p = (o * w.stride[ax] + k * w.dilation[ax]) as i64 - w.padding[ax] as i64;
    (p >= 0 && (p as usize) < n).then_some(p as usize)
}

/// Evaluates one primitive op on host tensors: the result the op table defines, or the
/// error it defines (bad shapes and dtypes through [`Op::infer`]; out-of-range indices,
/// integer division by zero and min/max/arg reductions over an empty axis at run time).
pub fn eval(op: &Op, inputs: &[&RefTensor]) -> Result<RefTensor> {
    let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
    let meta_refs: Vec<&TensorMeta> = metas.iter().collect();
    let out = op.infer(&meta_refs)?;
    // Every tensor, results included, is limited to `MAX_RANK` dims.
    Dims::new(&out.dims)?;
    let dt = out.dtype;
    let n: usize = out.dims.iter().product();
    let x = inputs.first().copied();
    let data: Vec<f64> = match op {
        Op::Unary(u) => {
            let x = x.expect("arity checked");
            x.data
                .iter()
                .map(|&v| {
                    let r = u.eval(v);
                    if dt.is_int() {
                        wrap(dt, r as i128)
                    } else {
                        r
                    }
                })
                .collect()
        }
        Op::Binary(b) => {
            let (x, y) = (inputs[0], inputs[1]);
            let mut data = Vec::with_capacity(n);
            for idx in indices(&out.dims) {
                let (p, q) = (broadcast_at(x, &idx), broadcast_at(y, &idx));
                data.push(if dt.is_int() {
                    int_binary(*b, dt, p, q)?
                } else {
                    b.eval(p, q)
                });
            }
            data
        }
        Op::Compare(c) => indices(&out.dims)
            .map(|idx| {
                let r = c.eval(broadcast_at(inputs[0], &idx), broadcast_at(inputs[1], &idx));
                if r {
                    1.0
                } else {
                    0.0
                }
            })
            .collect(),
        Op::Where => indices(&out.dims)
            .map(|idx| {
                if broadcast_at(inputs[0], &idx) != 0.0 {
                    broadcast_at(inputs[1], &idx)
                } else {
                    broadcast_at(inputs[2], &idx)
                }
            })
            .collect(),
        Op::MatMulInt8 => matmul_int8(inputs[0], inputs[1], inputs[2]),
        Op::Reduce { op: r, axes } => reduce(*r, x.expect("arity checked"), axes, &out.dims)?,
        Op::Reshape { .. } => x.expect("arity checked").data.clone(),
        Op::Permute { perm } => {
            let x = x.expect("arity checked");
            indices(&out.dims)
                .map(|idx| {
                    let mut j = vec![0; idx.len()];
                    for (k, &p) in perm.iter().enumerate() {
                        j[p] = idx[k];
                    }
                    x.at(&j)
                })
                .collect()
        }
        Op::Expand { .. } => {
            let x = x.expect("arity checked");
            indices(&out.dims)
                .map(|idx| broadcast_at(x, &idx))
                .collect()
        }
        Op::Slice {
            axis, start, step, ..
        } => {
            let x = x.expect("arity checked");
            indices(&out.dims)
                .map(|mut idx| {
                    idx[*axis] = start + idx[*axis] * step;
                    x.at(&idx)
                })
                .collect()
        }
        Op::Concat { axis } => indices(&out.dims)
            .map(|mut idx| {
                for t in inputs {
                    if idx[*axis] < t.dims[*axis] {
                        return t.at(&idx);
                    }
                    idx[*axis] -= t.dims[*axis];
                }
                unreachable!("the result's axis is the sum of the inputs'")
            })
            .collect(),
        Op::Pad {
            axis,
            before,
            value,
            ..
        } => {
            let x = x.expect("arity checked");
            indices(&out.dims)
                .map(|mut idx| {
                    let k = idx[*axis];
                    if k >= *before && k - before < x.dims[*axis] {
                        idx[*axis] = k - before;
                        x.at(&idx)
                    } else {
                        *value
                    }
                })
                .collect()
        }
        Op::MatMul => matmul(inputs[0], inputs[1], &out.dims),
        Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. } => {
            super::attention::eval(op, inputs)
        }
        Op::Gather { axis } => {
            let (x, index) = (inputs[0], inputs[1]);
            let mut data = Vec::with_capacity(n);
            for idx in indices(&index.dims) {
                let k = index_value("gather", index.at(&idx), x.dims[*axis], *axis)?;
                let mut j = idx;
                j[*axis] = k;
                data.push(x.at(&j));
            }
            data
        }
        Op::ScatterAdd { axis, dims } => {
            let (index, src) = (inputs[0], inputs[1]);
            let mut acc = Accumulator::new(dt, n);
            for idx in indices(&src.dims) {
                let k = index_value("scatter_add", index.at(&idx), dims[*axis], *axis)?;
                let v = src.at(&idx);
                let mut j = idx;
                j[*axis] = k;
                acc.add(flat(dims, &j), v);
            }
            acc.finish()
        }
        Op::Cast { .. } => x.expect("arity checked").data.clone(),
        Op::Unfold2d(w) => unfold2d(x.expect("arity checked"), w, &out.dims),
        Op::Fold2d { window, .. } => fold2d(x.expect("arity checked"), window, &out.dims),
        Op::Full { value, .. } => vec![*value; n],
        Op::Iota { axis, .. } => indices(&out.dims).map(|idx| idx[*axis] as f64).collect(),
        Op::Rand { dist, seed, .. } => (0..n)
            .map(|i| {
                let i = u32::try_from(i).expect("reference draws stay below 2^32 elements");
                match *dist {
                    RandDist::Uniform { low, high } => rng::uniform(*seed, i, low, high),
                    RandDist::Normal { mean, std } => mean + std * rng::standard_normal(*seed, i),
                }
            })
            .collect(),
    };
    Ok(RefTensor::new(out.dims, data, dt))
}

/// Sums in f64 (compensated) for floats and exactly (then wrapped) for integers.
struct Accumulator {
    dtype: DType,
    float: Vec<Sum>,
    int: Vec<i128>,
}

impl Accumulator {
    fn new(dtype: DType, n: usize) -> Self {
        let (f, i) = if dtype.is_int() { (0, n) } else { (n, 0) };
        Accumulator {
            dtype,
            float: vec![Sum::default(); f],
            int: vec![0; i],
        }
    }

    fn add(&mut self, at: usize, v: f64) {
        if self.dtype.is_int() {
            self.int[at] += v as i128;
        } else {
            self.float[at].add(v);
        }
    }

    fn finish(self) -> Vec<f64> {
        if self.dtype.is_int() {
            self.int.into_iter().map(|v| wrap(self.dtype, v)).collect()
        } else {
            self.float.iter().map(Sum::value).collect()
        }
    }
}

/// The reductions: each output element folds the input elements whose non-reduced
/// coordinates it shares, visited in row-major order (so "first" means lowest index).
fn reduce(op: ReduceOp, x: &RefTensor, axes: &[usize], out_dims: &[usize]) -> Result<Vec<f64>> {
    let extent: usize = axes.iter().map(|&a| x.dims[a]).product();
    let n: usize = out_dims.iter().product();
    if op != ReduceOp::Sum && extent == 0 {
        return Err(Error::invalid(op.name(), "cannot reduce an empty axis"));
    }
    if op == ReduceOp::Sum {
        let mut acc = Accumulator::new(x.dtype, n);
        for idx in indices(&x.dims) {
            let v = x.at(&idx);
            acc.add(out_position(&idx, axes, out_dims), v);
        }
        return Ok(acc.finish());
    }
    // (value, index along the reduced axis) of the best element so far.
    let mut best: Vec<Option<(f64, usize)>> = vec![None; n];
    let wants_max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
    for idx in indices(&x.dims) {
        let v = x.at(&idx);
        let slot = &mut best[out_position(&idx, axes, out_dims)];
        let along = axes.first().map_or(0, |&a| idx[a]);
        let better = match *slot {
            None => true,
            // A NaN, once found, wins; the first NaN is kept.
            Some((b, _)) if b.is_nan() => false,
            Some(_) if v.is_nan() => true,
            Some((b, _)) => {
                if wants_max {
                    v > b
                } else {
                    v < b
                }
            }
        };
        if better {
            *slot = Some((v, along));
        }
    }
    Ok(best
        .into_iter()
        .map(|b| {
            let (v, i) = b.expect("every output has a non-empty group");
            match op {
                ReduceOp::ArgMax | ReduceOp::ArgMin => i as f64,
                _ => v,
            }
        })
        .collect())
}

/// The output position of an input element under a reduction that keeps its axes.
fn out_position(idx: &[usize], axes: &[usize], out_dims: &[usize]) -> usize {
    let mut j = idx.to_vec();
    for &a in axes {
        j[a] = 0;
    }
    flat(out_dims, &j)
}

/// `[..a, M, K] × [..b, K, N]` with the batch dims broadcast, accumulated in f64.
fn matmul(a: &RefTensor, b: &RefTensor, out_dims: &[usize]) -> Vec<f64> {
    let r = out_dims.len();
    let k = a.dims[a.dims.len() - 1];
    // The element (i, j) of the matrix of `x` that batch index `batch` selects.
    let at = |x: &RefTensor, batch: &[usize], i: usize, j: usize| {
        let xb = x.dims.len() - 2;
        let lead = batch.len() - xb;
        let mut idx: Vec<usize> = (0..xb)
            .map(|t| if x.dims[t] == 1 { 0 } else { batch[lead + t] })
            .collect();
        idx.push(i);
        idx.push(j);
        x.at(&idx)
    };
    indices(out_dims)
        .map(|idx| {
            let (batch, i, j) = (&idx[..r - 2], idx[r - 2], idx[r - 1]);
            Sum::of((0..k).map(|p| at(a, batch, i, p) * at(b, batch, p, j)))
        })
        .collect()
}

/// `x [.., K]` by int8 `w [N, K]` scaled per row by `scale [N]`, exactly: the op's
/// definition, without the rounding of `x` a backend may add.
fn matmul_int8(x: &RefTensor, w: &RefTensor, scale: &RefTensor) -> Vec<f64> {
    let (n, k) = (w.dims[0], w.dims[1]);
    let rows: usize = x.dims[..x.dims.len() - 1].iter().product();
    (0..rows)
        .flat_map(|i| {
            let row = &x.data[i * k..(i + 1) * k];
            (0..n).map(move |j| {
                let dot = Sum::of(
                    row.iter()
                        .zip(&w.data[j * k..(j + 1) * k])
                        .map(|(a, b)| a * b),
                );
                dot * scale.data[j]
            })
        })
        .collect()
}

/// im2col: row `c·kh·kw + ki·kw + kj`, image `n`, column `oi·OW + oj`, zeros where the
/// window reaches into the padding.
fn unfold2d(x: &RefTensor, w: &Window2d, out_dims: &[usize]) -> Vec<f64> {
    let (h, wd) = (x.dims[2], x.dims[3]);
    let (oh, ow) = (
        w.out_size(0, h).expect("checked by infer"),
        w.out_size(1, wd).expect("checked by infer"),
    );
    let (kh, kw) = (w.kernel[0], w.kernel[1]);
    let mut out = vec![0.0; out_dims.iter().product()];
    for n in 0..x.dims[0] {
        for c in 0..x.dims[1] {
            for ki in 0..kh {
                for kj in 0..kw {
                    for oi in 0..oh {
                        for oj in 0..ow {
                            let (Some(si), Some(sj)) =
                                (window_src(w, 0, oi, ki, h), window_src(w, 1, oj, kj, wd))
                            else {
                                continue;
                            };
                            let row = c * kh * kw + ki * kw + kj;
                            out[flat(out_dims, &[row, n, oi * ow + oj])] = x.at(&[n, c, si, sj]);
                        }
                    }
                }
            }
        }
    }
    out
}

/// col2im, the adjoint of [`unfold2d`]: every column entry is added back to the input
/// position it was read from.
fn fold2d(x: &RefTensor, w: &Window2d, out_dims: &[usize]) -> Vec<f64> {
    let (c_out, h, wd) = (out_dims[1], out_dims[2], out_dims[3]);
    let (oh, ow) = (
        w.out_size(0, h).expect("checked by infer"),
        w.out_size(1, wd).expect("checked by infer"),
    );
    let (kh, kw) = (w.kernel[0], w.kernel[1]);
    let mut acc = Accumulator::new(x.dtype, out_dims.iter().product());
    for n in 0..x.dims[1] {
        for c in 0..c_out {
            for ki in 0..kh {
                for kj in 0..kw {
                    for oi in 0..oh {
                        for oj in 0..ow {
                            let (Some(si), Some(sj)) =
                                (window_src(w, 0, oi, ki, h), window_src(w, 1, oj, kj, wd))
                            else {
                                continue;
                            };
                            let row = c * kh * kw + ki * kw + kj;
                            acc.add(
                                flat(out_dims, &[n, c, si, sj]),
                                x.at(&[row, n, oi * ow + oj]),
                            );
                        }
                    }
                }
            }
        }
    }
    acc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{CmpOp, UnaryOp};

    fn t(dims: &[usize], data: &[f64], dtype: DType) -> RefTensor {
        RefTensor::new(dims.to_vec(), data.to_vec(), dtype)
    }

    #[test]
    fn integer_arithmetic_wraps() {
        let a = t(&[2], &[i32::MAX as f64, -7.0], DType::I32);
        let b = t(&[2], &[1.0, 2.0], DType::I32);
        let s = eval(&Op::Binary(BinaryOp::Add), &[&a, &b]).unwrap();
        assert_eq!(s.data, vec![i32::MIN as f64, -5.0]);
        let q = eval(&Op::Binary(BinaryOp::Div), &[&a, &b]).unwrap();
        assert_eq!(q.data, vec![i32::MAX as f64, -3.0]);
        let z = t(&[1], &[0.0], DType::I32);
        assert!(eval(&Op::Binary(BinaryOp::Div), &[&a, &z]).is_err());
        let u = t(&[1], &[3.0], DType::U32);
        let five = t(&[1], &[5.0], DType::U32);
        let d = eval(&Op::Binary(BinaryOp::Sub), &[&u, &five]).unwrap();
        assert_eq!(d.data, vec![(u32::MAX - 1) as f64]);
    }

    #[test]
    fn compensated_sum_keeps_small_terms() {
        // A running f64 sum loses the 1 entirely.
        assert_eq!(Sum::of([1e16, 1.0, -1e16]), 1.0);
        assert_eq!(Sum::of([0.1; 10]), 1.0);
        assert!(Sum::of([1.0, f64::INFINITY, 2.0]).is_infinite());
        assert!(Sum::of([f64::INFINITY, f64::NEG_INFINITY]).is_nan());
    }

    #[test]
    fn argmax_is_first_and_nan_wins() {
        let x = t(
            &[2, 4],
            &[1., 3., 3., 0., 2., f64::NAN, 5., f64::NAN],
            DType::F32,
        );
        let am = |op| eval(&Op::Reduce { op, axes: vec![1] }, &[&x]).unwrap().data;
        assert_eq!(am(ReduceOp::ArgMax), vec![1.0, 1.0]);
        assert_eq!(am(ReduceOp::ArgMin), vec![3.0, 1.0]);
        assert!(am(ReduceOp::Max)[1].is_nan());
        let empty = t(&[2, 0], &[], DType::F32);
        assert!(eval(
            &Op::Reduce {
                op: ReduceOp::Max,
                axes: vec![1]
            },
            &[&empty]
        )
        .is_err());
    }

    #[test]
    fn unfold_orders_rows_channel_then_kernel_then_image() {
        // One image, two channels of 2×2, a 2×1 kernel: two windows per channel.
        let x = t(&[1, 2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.], DType::F64);
        let w = Window2d {
            kernel: [2, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        };
        let u = eval(&Op::Unfold2d(w), &[&x]).unwrap();
        assert_eq!(u.dims, vec![4, 1, 2]);
        assert_eq!(u.data, vec![1., 2., 3., 4., 5., 6., 7., 8.]);
        let fold = Op::Fold2d {
            window: w,
            height: 2,
            width: 2,
        };
        assert_eq!(eval(&fold, &[&u]).unwrap().data, x.data);
        // Two images of one channel: each tap's row holds both images' windows.
        let x = t(&[2, 1, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.], DType::F64);
        let u = eval(&Op::Unfold2d(w), &[&x]).unwrap();
        assert_eq!(u.dims, vec![2, 2, 2]);
        assert_eq!(u.data, vec![1., 2., 5., 6., 3., 4., 7., 8.]);
        let f = eval(&fold, &[&u]).unwrap();
        assert_eq!((f.dims, f.data), (x.dims.clone(), x.data.clone()));
    }

    #[test]
    fn fold_is_the_adjoint_of_unfold() {
        // <unfold(x), y> = <x, fold(y)> for every window, with integer values (exact).
        let windows = [
            Window2d::square(3, 2, 1),
            Window2d {
                kernel: [2, 3],
                stride: [1, 2],
                padding: [2, 0],
                dilation: [2, 1],
            },
        ];
        for w in windows {
            let xd = [2usize, 3, 5, 6];
            let n: usize = xd.iter().product();
            let x = t(
                &xd,
                &(0..n).map(|i| (i % 7) as f64 - 3.0).collect::<Vec<_>>(),
                DType::F64,
            );
            let u = eval(&Op::Unfold2d(w), &[&x]).unwrap();
            let y: Vec<f64> = (0..u.numel()).map(|i| (i % 5) as f64 - 2.0).collect();
            let y = t(&u.dims, &y, DType::F64);
            let f = eval(
                &Op::Fold2d {
                    window: w,
                    height: 5,
                    width: 6,
                },
                &[&y],
            )
            .unwrap();
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
            assert_eq!(dot(&u.data, &y.data), dot(&x.data, &f.data), "{w:?}");
        }
    }

    #[test]
    fn elementwise_broadcasts_and_rounds() {
        let a = t(&[2, 1], &[1.0, 2.0], DType::F16);
        let b = t(&[3], &[0.1, 0.2, 0.3], DType::F16);
        let s = eval(&Op::Binary(BinaryOp::Mul), &[&a, &b]).unwrap();
        assert_eq!(s.dims, vec![2, 3]);
        assert_eq!(s.data[3], b.data[0] * 2.0);
        let c = eval(&Op::Compare(CmpOp::Lt), &[&a, &b]).unwrap();
        assert_eq!((c.dtype, c.data.iter().sum::<f64>()), (DType::Bool, 0.0));
        let e = eval(&Op::Unary(UnaryOp::Exp), &[&b]).unwrap();
        assert_eq!(
            e.data[0],
            half::f16::from_f64(b.data[0].exp()).to_f64(),
            "rounded to f16"
        );
    }
}
