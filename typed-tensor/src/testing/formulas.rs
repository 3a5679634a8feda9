//! Reference definitions of the composite ops, written directly from their textbook
//! formulas in f64 (never through `Builder`, so a mistake in a composite's recipe of
//! primitives cannot also be in its reference). Each returns the result rounded to the
//! input's dtype, and where the backend's rounding error grows with the size of
//! intermediate terms, a per-element magnitude for [`super::tolerance::compare`].

use super::reference::{broadcast_at, flat, indices, RefTensor, Sum};
use crate::error::{Error, Result};
use crate::op::erf_f64;
use crate::rng;

/// A reference result with the magnitude of the terms behind each element.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The result.
    pub value: RefTensor,
    /// Per-element magnitudes (zeros when one rounding per element is all there is).
    pub mag: Vec<f64>,
}

impl Expected {
    fn new(dims: Vec<usize>, data: Vec<f64>, mag: Vec<f64>, like: &RefTensor) -> Self {
        Expected {
            value: RefTensor::new(dims, data, like.dtype),
            mag,
        }
    }
}

/// Flat positions grouped by their coordinates outside `axes`: one group per element
/// of the reduced result, in its row-major order; positions within a group ascending.
pub fn groups(dims: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
    let kept: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let mut g = vec![Vec::new(); kept.iter().product()];
    for (k, mut idx) in indices(dims).enumerate() {
        for &a in axes {
            idx[a] = 0;
        }
        g[flat(&kept, &idx)].push(k);
    }
    g
}

/// `dims` without `axes` (or with them as 1 when `keepdim`).
fn reduced_dims(dims: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

fn max_abs(x: &RefTensor, group: &[usize]) -> f64 {
    group.iter().map(|&k| x.data[k].abs()).fold(0.0, f64::max)
}

/// `exp(x - max) / Σ exp(x - max)` along `axis`.
pub fn softmax(x: &RefTensor, axis: usize) -> Expected {
    let mut out = vec![0.0; x.numel()];
    let mut mag = vec![0.0; x.numel()];
    for g in groups(&x.dims, &[axis]) {
        let m = g
            .iter()
            .map(|&k| x.data[k])
            .fold(f64::NEG_INFINITY, f64::max);
        let s = Sum::of(g.iter().map(|&k| (x.data[k] - m).exp()));
        // exp turns the rounding error of `x - max` (relative to |x| + |max|) into a
        // relative error of the result.
        let scale = 2.0 * max_abs(x, &g) + 1.0;
        for &k in &g {
            out[k] = (x.data[k] - m).exp() / s;
            mag[k] = out[k] * scale;
        }
    }
    Expected::new(x.dims.clone(), out, mag, x)
}

/// Softmax over the last axis of the keys `j <= i` of each query `i` (the second-to-last
/// axis); the others get weight 0.
pub fn causal_softmax(x: &RefTensor) -> Expected {
    let r = x.dims.len();
    let (queries, keys) = (x.dims[r - 2], x.dims[r - 1]);
    let mut out = vec![0.0; x.numel()];
    let mut mag = vec![0.0; x.numel()];
    for g in groups(&x.dims, &[r - 1]) {
        let i = (g[0] / keys.max(1)) % queries.max(1);
        let kept = &g[..=i.min(g.len() - 1)];
        let m = kept
            .iter()
            .map(|&k| x.data[k])
            .fold(f64::NEG_INFINITY, f64::max);
        let s = Sum::of(kept.iter().map(|&k| (x.data[k] - m).exp()));
        let scale = 2.0 * max_abs(x, kept) + 1.0;
        for &k in kept {
            out[k] = (x.data[k] - m).exp() / s;
            mag[k] = out[k] * scale;
        }
    }
    Expected::new(x.dims.clone(), out, mag, x)
}

/// `x - max - ln Σ exp(x - max)` along `axis`.
pub fn log_softmax(x: &RefTensor, axis: usize) -> Expected {
    let mut out = vec![0.0; x.numel()];
    let mut mag = vec![0.0; x.numel()];
    for g in groups(&x.dims, &[axis]) {
        let m = g
            .iter()
            .map(|&k| x.data[k])
            .fold(f64::NEG_INFINITY, f64::max);
        let lse = m + Sum::of(g.iter().map(|&k| (x.data[k] - m).exp())).ln();
        for &k in &g {
            out[k] = x.data[k] - lse;
            mag[k] = 2.0 * max_abs(x, &g) + 1.0;
        }
    }
    Expected::new(x.dims.clone(), out, mag, x)
}

/// `ln Σ exp(x)` along `axis`.
pub fn logsumexp(x: &RefTensor, axis: usize, keepdim: bool) -> Expected {
    let gs = groups(&x.dims, &[axis]);
    let out: Vec<f64> = gs
        .iter()
        .map(|g| {
            let m = g
                .iter()
                .map(|&k| x.data[k])
                .fold(f64::NEG_INFINITY, f64::max);
            m + Sum::of(g.iter().map(|&k| (x.data[k] - m).exp())).ln()
        })
        .collect();
    let mag = gs.iter().map(|g| 2.0 * max_abs(x, g) + 1.0).collect();
    Expected::new(reduced_dims(&x.dims, &[axis], keepdim), out, mag, x)
}

/// The mean over `axes` (NaN for an empty group, as 0/0).
pub fn mean(x: &RefTensor, axes: &[usize], keepdim: bool) -> Expected {
    let gs = groups(&x.dims, axes);
    let n = |g: &Vec<usize>| g.len() as f64;
    let out = gs
        .iter()
        .map(|g| Sum::of(g.iter().map(|&k| x.data[k])) / n(g))
        .collect();
    let mag = gs
        .iter()
        .map(|g| g.iter().map(|&k| x.data[k].abs()).sum::<f64>() / n(g))
        .collect();
    Expected::new(reduced_dims(&x.dims, axes, keepdim), out, mag, x)
}

/// The biased variance over `axes`.
pub fn var(x: &RefTensor, axes: &[usize], keepdim: bool) -> Expected {
    let gs = groups(&x.dims, axes);
    let mut out = Vec::with_capacity(gs.len());
    let mut mag = Vec::with_capacity(gs.len());
    for g in &gs {
        let n = g.len() as f64;
        let m = Sum::of(g.iter().map(|&k| x.data[k])) / n;
        out.push(Sum::of(g.iter().map(|&k| (x.data[k] - m).powi(2))) / n);
        // The deviations carry an error proportional to |x| + |mean|.
        mag.push(
            g.iter()
                .map(|&k| (x.data[k].abs() + m.abs()).powi(2))
                .sum::<f64>()
                / n
                * 2.0,
        );
    }
    Expected::new(reduced_dims(&x.dims, axes, keepdim), out, mag, x)
}

/// `(x - mean) / √(var + eps) · w + b` over the trailing `norm_rank` axes.
pub fn layer_norm(
    x: &RefTensor,
    norm_rank: usize,
    weight: Option<&RefTensor>,
    bias: Option<&RefTensor>,
    eps: f64,
) -> Expected {
    let r = x.dims.len();
    let axes: Vec<usize> = (r - norm_rank..r).collect();
    let all: Vec<Vec<usize>> = indices(&x.dims).collect();
    let mut out = vec![0.0; x.numel()];
    let mut mag = vec![0.0; x.numel()];
    for g in groups(&x.dims, &axes) {
        let n = g.len() as f64;
        let m = Sum::of(g.iter().map(|&k| x.data[k])) / n;
        let v = Sum::of(g.iter().map(|&k| (x.data[k] - m).powi(2))) / n;
        let inv = 1.0 / (v + eps).sqrt();
        let spread = g.iter().map(|&k| x.data[k].abs()).fold(0.0, f64::max) + m.abs();
        for &k in &g {
            let idx = &all[k];
            let w = weight.map_or(1.0, |w| broadcast_at(w, idx));
            let b = bias.map_or(0.0, |b| broadcast_at(b, idx));
            out[k] = (x.data[k] - m) * inv * w + b;
            // The centred value is only as accurate as |x| + |mean| allows.
            mag[k] = spread * inv * w.abs() + b.abs();
        }
    }
    Expected::new(x.dims.clone(), out, mag, x)
}

/// GELU, erf form: `x/2 · (1 + erf(x/√2))`.
pub fn gelu_erf(x: &RefTensor) -> Expected {
    elementwise(x, |v| {
        0.5 * v * (1.0 + erf_f64(v / std::f64::consts::SQRT_2))
    })
}

/// GELU, tanh form: `x/2 · (1 + tanh(√(2/π)(x + 0.044715x³)))`.
pub fn gelu_tanh(x: &RefTensor) -> Expected {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    elementwise(x, |v| {
        0.5 * v * (1.0 + (k * (v + 0.044_715 * v.powi(3))).tanh())
    })
}

/// SiLU: `x / (1 + e^-x)`.
pub fn silu(x: &RefTensor) -> Expected {
    elementwise(x, |v| v / (1.0 + (-v).exp()))
}

fn elementwise(x: &RefTensor, f: impl Fn(f64) -> f64) -> Expected {
    // The chain of roundings inside the composite is relative to |x|.
    let mag = x.data.iter().map(|v| v.abs()).collect();
    Expected::new(
        x.dims.clone(),
        x.data.iter().map(|&v| f(v)).collect(),
        mag,
        x,
    )
}

/// Mean cross-entropy of `logits [N, C]` against `labels [N]` with label smoothing `s`:
/// `mean_n(-(1-s)·logp[n, y_n] - s·mean_c logp[n, c])`.
pub fn cross_entropy(logits: &RefTensor, labels: &RefTensor, s: f64) -> Result<Expected> {
    let (n, c) = (logits.dims[0], logits.dims[1]);
    let logp = |i: usize, j: usize| {
        let row: Vec<f64> = (0..c).map(|t| logits.data[i * c + t]).collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        row[j] - m - Sum::of(row.iter().map(|v| (v - m).exp())).ln()
    };
    let mut total = Sum::default();
    for i in 0..n {
        let y = labels.data[i];
        if y < 0.0 || y >= c as f64 {
            return Err(Error::invalid(
                "gather",
                format!("label {y} is out of range for {c} classes"),
            ));
        }
        let picked = logp(i, y as usize);
        let avg = Sum::of((0..c).map(|j| logp(i, j))) / c as f64;
        total.add(-(1.0 - s) * picked - s * avg);
    }
    let mag = 2.0 * logits.data.iter().map(|v| v.abs()).fold(0.0, f64::max) + (c as f64).ln() + 1.0;
    Ok(Expected::new(
        vec![],
        vec![total.value() / n as f64],
        vec![mag],
        logits,
    ))
}

/// Mean squared error over the broadcast shape of `a` and `b`.
pub fn mse(a: &RefTensor, b: &RefTensor) -> Expected {
    let r = a.dims.len().max(b.dims.len());
    let dims: Vec<usize> = (0..r)
        .map(|i| {
            let da = (i + a.dims.len()).checked_sub(r).map_or(1, |j| a.dims[j]);
            let db = (i + b.dims.len()).checked_sub(r).map_or(1, |j| b.dims[j]);
            if da == 1 {
                db
            } else {
                da
            }
        })
        .collect();
    let n: usize = dims.iter().product();
    let sum =
        Sum::of(indices(&dims).map(|idx| (broadcast_at(a, &idx) - broadcast_at(b, &idx)).powi(2)));
    Expected::new(vec![], vec![sum / n as f64], vec![0.0], a)
}

/// `x @ wᵀ + b` with `w [out, in]`.
pub fn linear(x: &RefTensor, w: &RefTensor, b: Option<&RefTensor>) -> Expected {
    let (out_f, in_f) = (w.dims[0], w.dims[1]);
    let mut dims = x.dims.clone();
    *dims.last_mut().expect("rank ≥ 1") = out_f;
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let mut out = Vec::with_capacity(rows * out_f);
    let mut mag = Vec::with_capacity(rows * out_f);
    for i in 0..rows {
        for o in 0..out_f {
            let bias = b.map_or(0.0, |b| b.data[o]);
            let terms = (0..in_f).map(|k| x.data[i * in_f + k] * w.data[o * in_f + k]);
            out.push(Sum::of(terms.clone()) + bias);
            mag.push(terms.map(f64::abs).sum::<f64>() + bias.abs());
        }
    }
    Expected::new(dims, out, mag, x)
}

/// The parameters of a 2-d convolution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conv {
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zeros added on each side.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

/// The input coordinate of output `o`, tap `k` on one axis, if inside `0..n`.
fn tap(
    o: usize,
    k: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    n: usize,
) -> Option<usize> {
    let p = (o * stride + k * dilation) as i64 - padding as i64;
    (p >= 0 && (p as usize) < n).then_some(p as usize)
}

/// `floor((n + 2p - d(k-1) - 1)/s) + 1`.
fn out_len(n: usize, k: usize, s: usize, p: usize, d: usize) -> usize {
    (n + 2 * p - d * (k - 1) - 1) / s + 1
}

/// Direct convolution: `y[n,o,i,j] = b[o] + Σ x[n, c, i·s-p+ki·d, j·s-p+kj·d] · w[o, c', ki, kj]`
/// over the input channels `c` of output channel `o`'s group.
pub fn conv2d(x: &RefTensor, w: &RefTensor, b: Option<&RefTensor>, conv: Conv) -> Expected {
    let [n, _c, h, wd] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [o_ch, cg, kh, kw] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
    let og = o_ch / conv.groups;
    let (s, p, d) = (conv.stride, conv.padding, conv.dilation);
    let oh = out_len(h, kh, s[0], p[0], d[0]);
    let ow = out_len(wd, kw, s[1], p[1], d[1]);
    let mut out = Vec::new();
    let mut mag = Vec::new();
    for img in 0..n {
        for o in 0..o_ch {
            let g = o / og;
            for i in 0..oh {
                for j in 0..ow {
                    let bias = b.map_or(0.0, |b| b.data[o]);
                    let (mut acc, mut m) = (Sum::default(), bias.abs());
                    acc.add(bias);
                    for c in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let (Some(si), Some(sj)) = (
                                    tap(i, ki, s[0], p[0], d[0], h),
                                    tap(j, kj, s[1], p[1], d[1], wd),
                                ) else {
                                    continue;
                                };
                                let t = x.at(&[img, g * cg + c, si, sj]) * w.at(&[o, c, ki, kj]);
                                acc.add(t);
                                m += t.abs();
                            }
                        }
                    }
                    out.push(acc.value());
                    mag.push(m);
                }
            }
        }
    }
    Expected::new(vec![n, o_ch, oh, ow], out, mag, x)
}

/// Pooling over `kernel` windows: the maximum of the taps inside the input (padding
/// never wins, as in PyTorch), or the sum of those taps over `kh·kw` (padding counts as
/// zeros, PyTorch's `count_include_pad`).
pub fn pool2d(
    x: &RefTensor,
    max: bool,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Expected {
    let [n, c, h, wd] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let oh = out_len(h, kernel[0], stride[0], padding[0], 1);
    let ow = out_len(wd, kernel[1], stride[1], padding[1], 1);
    let mut out = Vec::new();
    let mut mag = Vec::new();
    for img in 0..n {
        for ch in 0..c {
            for i in 0..oh {
                for j in 0..ow {
                    let taps: Vec<f64> = (0..kernel[0])
                        .flat_map(|ki| (0..kernel[1]).map(move |kj| (ki, kj)))
                        .filter_map(|(ki, kj)| {
                            let si = tap(i, ki, stride[0], padding[0], 1, h)?;
                            let sj = tap(j, kj, stride[1], padding[1], 1, wd)?;
                            Some(x.at(&[img, ch, si, sj]))
                        })
                        .collect();
                    if max {
                        out.push(taps.iter().copied().fold(f64::NEG_INFINITY, f64::max));
                        mag.push(0.0);
                    } else {
                        let k = (kernel[0] * kernel[1]) as f64;
                        out.push(Sum::of(taps.iter().copied()) / k);
                        mag.push(taps.iter().map(|v| v.abs()).sum::<f64>() / k);
                    }
                }
            }
        }
    }
    Expected::new(vec![n, c, oh, ow], out, mag, x)
}

/// Rows of `weight [V, D]` picked by `ids`: `[..ids, D]`; an error for an id outside
/// `0..V`.
pub fn embedding(ids: &RefTensor, weight: &RefTensor) -> Result<Expected> {
    let (v, d) = (weight.dims[0], weight.dims[1]);
    let mut out = Vec::with_capacity(ids.numel() * d);
    for &id in &ids.data {
        // An id is checked where its row is read; a table of width 0 reads none.
        if d > 0 && (id < 0.0 || id >= v as f64) {
            return Err(Error::invalid(
                "gather",
                format!("id {id} is out of range for {v} rows"),
            ));
        }
        out.extend((0..d).map(|j| weight.data[id as usize * d + j]));
    }
    let mut dims = ids.dims.clone();
    dims.push(d);
    let n = out.len();
    Ok(Expected::new(dims, out, vec![0.0; n], weight))
}

/// Dropout with the counter-based generator: element `i` is kept when its uniform draw
/// (in the tensor's dtype, from `seed`) is at least `p` (in that dtype), and kept
/// elements are scaled by `1/(1-p)`.
pub fn dropout(x: &RefTensor, p: f64, seed: u64) -> Expected {
    if p == 0.0 {
        return Expected::new(x.dims.clone(), x.data.clone(), vec![0.0; x.numel()], x);
    }
    let in_dtype = |v: f64| RefTensor::new(vec![], vec![v], x.dtype).data[0];
    let threshold = in_dtype(p);
    let out = x
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let u = in_dtype(rng::uniform(seed, i as u32, 0.0, 1.0));
            if u >= threshold {
                v / (1.0 - p)
            } else {
                0.0
            }
        })
        .collect();
    Expected::new(x.dims.clone(), out, vec![0.0; x.numel()], x)
}
