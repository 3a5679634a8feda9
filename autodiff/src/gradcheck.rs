//! Checking gradients against central finite differences, like
//! `torch.autograd.gradcheck`: the tape's gradient of `Σ f(x)·v` for a random
//! cotangent `v` is compared with `(F(x+ε) − F(x−ε)) / 2ε`, element by element.
//! Run it in f64: in f32 the finite differences themselves are too coarse.

use crate::tape::{Tape, Var};
use kiln_tensor::{rng, Backend, BuilderExt, DType, Error, HostData, RawTensor, Result};

/// Tolerances of a gradient check.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// The finite-difference step.
    pub eps: f64,
    /// Allowed absolute difference.
    pub atol: f64,
    /// Allowed difference relative to the numeric gradient.
    pub rtol: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            eps: 1e-6,
            atol: 1e-6,
            rtol: 1e-5,
        }
    }
}

/// Compares the tape's gradients of `f` at `inputs` with finite differences. `inputs`
/// are `(values, dims)` in f64; `f` builds the output from the leaves. Returns an error
/// describing the first elements that disagree.
pub fn gradcheck<B: Backend>(
    device: &B::Device,
    inputs: &[(Vec<f64>, Vec<usize>)],
    f: impl Fn(&mut Tape<B>, &[Var<B>]) -> Result<Var<B>>,
    tol: Tolerance,
) -> Result<()> {
    let make = |vals: &[Vec<f64>]| -> Result<Vec<RawTensor<B>>> {
        vals.iter()
            .zip(inputs)
            .map(|(v, (_, d))| RawTensor::from_host(HostData::F64(v.clone()), d, device))
            .collect()
    };
    let base: Vec<Vec<f64>> = inputs.iter().map(|(v, _)| v.clone()).collect();

    // Analytic: gradients of Σ f(x)·v.
    let mut tape = Tape::<B>::new(device.clone());
    let leaves: Vec<Var<B>> = make(&base)?.into_iter().map(|t| tape.leaf(t)).collect();
    let out = f(&mut tape, &leaves)?;
    if out.value().dtype() != DType::F64 {
        return Err(Error::dtype("gradcheck", "the function must return f64"));
    }
    let dims = out.value().dims().to_vec();
    let key = rng::stream_key(0x6772_6164, 0);
    let cot: Vec<f64> = (0..out.value().numel() as u32)
        .map(|i| rng::unit_f32(rng::bits(key, i)) as f64 * 2.0 - 1.0)
        .collect();
    let v = tape.constant(RawTensor::from_host(
        HostData::F64(cot.clone()),
        &dims,
        device,
    )?);
    let weighted = tape.mul(&out, &v)?;
    let loss = tape.sum_all(&weighted)?;
    let grads = tape.gradients(&loss)?;

    // Numeric: central differences of the same scalar.
    let scalar = |vals: &[Vec<f64>]| -> Result<f64> {
        let mut t = Tape::<B>::new(device.clone());
        let ls: Vec<Var<B>> = make(vals)?.into_iter().map(|x| t.constant(x)).collect();
        let o = f(&mut t, &ls)?.value().to_f64_vec()?;
        Ok(o.iter().zip(&cot).map(|(a, b)| a * b).sum())
    };
    let mut report = Vec::new();
    for (i, leaf) in leaves.iter().enumerate() {
        let analytic = grads.get_or_zeros(leaf)?.to_f64_vec()?;
        for j in 0..base[i].len() {
            let mut plus = base.clone();
            plus[i][j] += tol.eps;
            let mut minus = base.clone();
            minus[i][j] -= tol.eps;
            let numeric = (scalar(&plus)? - scalar(&minus)?) / (2.0 * tol.eps);
            let diff = (analytic[j] - numeric).abs();
            if diff.is_nan() || diff > tol.atol + tol.rtol * numeric.abs() {
                report.push(format!(
                    "input {i} element {j}: analytic {} vs numeric {numeric}",
                    analytic[j]
                ));
            }
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        report.truncate(8);
        Err(Error::invalid("gradcheck", report.join("; ")))
    }
}
