//! Running one case on a backend and on the reference, and judging the pair: both
//! results must agree within the op's tolerance, or both must fail with the same kind
//! of error. Also the property runner every conformance test goes through.

use super::reference::{eval, RefTensor};
use super::strategy::Input;
use super::tolerance::{compare, Tol};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::raw::{Eager, RawTensor};
use crate::Builder;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// One primitive op applied to some inputs.
#[derive(Clone, Debug)]
pub struct OpCase {
    /// The op.
    pub op: Op,
    /// Its inputs (none for sources).
    pub inputs: Vec<Input>,
}

/// Runs `check` on `cases` values of `strategy` (the `PROPTEST_CASES` environment
/// variable overrides the count) and panics with proptest's minimal failing case.
pub fn run_property<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), String>,
) {
    let mut config = Config {
        // Regressions are not persisted: a failure prints its minimal case instead.
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, |v| check(v).map_err(TestCaseError::fail)) {
        panic!("conformance property `{name}` failed: {e}");
    }
}

/// The logical values of a case's inputs.
pub fn logical(inputs: &[Input]) -> Result<Vec<RefTensor>, String> {
    inputs
        .iter()
        .map(|i| {
            i.logical()
                .map_err(|e| format!("invalid case input {i:?}: {e}"))
        })
        .collect()
}

/// Uploads a case's inputs (with their views) to a backend.
pub fn upload<B: Backend>(
    device: &B::Device,
    inputs: &[Input],
) -> Result<Vec<RawTensor<B>>, String> {
    inputs
        .iter()
        .map(|i| {
            i.upload::<B>(device)
                .map_err(|e| format!("uploading {i:?} failed: {e}"))
        })
        .collect()
}

/// Judges a backend outcome against the reference outcome.
pub fn judge(
    want: Result<RefTensor>,
    got: Result<RefTensor>,
    tol: Tol,
    mag: Option<&[f64]>,
) -> Result<(), String> {
    match (want, got) {
        (Ok(w), Ok(g)) => compare(&g, &w, tol, mag),
        (Err(w), Err(g)) => same_kind(&w, &g),
        (Err(w), Ok(g)) => Err(format!(
            "the reference refuses this case (`{w}`) but the backend returned {g:?}"
        )),
        (Ok(w), Err(g)) => Err(format!(
            "the backend failed with `{g}`; the reference gives {w:?}"
        )),
    }
}

/// Both sides refused: they must agree on why (shape, dtype, invalid argument...).
pub fn same_kind(want: &Error, got: &Error) -> Result<(), String> {
    if std::mem::discriminant(want) == std::mem::discriminant(got) {
        Ok(())
    } else {
        Err(format!(
            "the reference fails with `{want}` but the backend with a different kind of error: `{got}`"
        ))
    }
}

/// The tolerance of a primitive with an output of `dtype`: exact for ops that only move,
/// select, compare or convert values (and for integers); one rounding otherwise;
/// random draws to a few roundings of their range.
pub fn op_tolerance(op: &Op, dtype: crate::DType) -> Tol {
    if let Op::Rand { dist, .. } = op {
        // The generator's bits are exact everywhere; the mapping to values (`ln`, `cos`,
        // an affine map) runs in the device's compute type, whose functions differ by a
        // few ulps, so the error scales with the draw's range, not with each value.
        let scale = match *dist {
            crate::RandDist::Uniform { low, high } => low.abs().max(high.abs()),
            crate::RandDist::Normal { mean, std } => mean.abs() + 6.0 * std,
        };
        let one = Tol::for_dtype(dtype);
        return Tol {
            rtol: one.rtol,
            atol: one.atol.max(one.rtol * scale),
        };
    }
    if let Op::MatMulInt8 = op {
        // Rows of `x` may be rounded to int8, by at most half their scale: the bound
        // the op declares, which `magnitude` gives per element for `rtol` to scale.
        let one = Tol::for_dtype(dtype);
        return Tol {
            rtol: one.rtol + 1.0 / 254.0,
            atol: one.atol,
        };
    }
    let exact = match op {
        Op::Unary(u) => matches!(
            u,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu | UnaryOp::Not
        ),
        Op::Binary(b) => matches!(b, BinaryOp::Max | BinaryOp::Min),
        Op::Reduce { op, .. } => *op != ReduceOp::Sum,
        Op::MatMul
        | Op::ScatterAdd { .. }
        | Op::Fold2d { .. }
        | Op::Attention(_)
        | Op::AttentionLse(_)
        | Op::AttentionGrad { .. } => false,
        _ => true,
    };
    if exact {
        Tol::EXACT
    } else {
        Tol::for_dtype(dtype)
    }
}

/// The per-element magnitude of the terms an accumulating op adds up: the same op on
/// the absolute values of its inputs (`Σ|x|`, `Σ|a||b|`). `None` for other ops.
pub fn magnitude(op: &Op, inputs: &[RefTensor]) -> Option<Vec<f64>> {
    if let (Op::MatMulInt8, [x, w, scale]) = (op, inputs) {
        let metas = [x.meta(), w.meta(), scale.meta()];
        // Only where the rule accepts the operands (a refused case has no result).
        let fits = op.infer(&[&metas[0], &metas[1], &metas[2]]).is_ok();
        return fits.then(|| int8_magnitude(x, w, scale));
    }
    let accumulates = matches!(
        op,
        Op::Reduce {
            op: ReduceOp::Sum,
            ..
        } | Op::MatMul
            | Op::ScatterAdd { .. }
            | Op::Fold2d { .. }
    );
    // The terms are the last input (a scatter's first input is its index).
    if !accumulates || inputs.last().is_none_or(|t| !t.dtype.is_float()) {
        return None;
    }
    // In f64, so that the magnitude itself is not rounded to a coarse dtype; the
    // index of a scatter is not a term and stays as it is.
    let terms: Vec<RefTensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if matches!(op, Op::ScatterAdd { .. }) && i == 0 {
                t.clone()
            } else {
                RefTensor {
                    dims: t.dims.clone(),
                    data: t.data.iter().map(|v| v.abs()).collect(),
                    dtype: crate::DType::F64,
                }
            }
        })
        .collect();
    let refs: Vec<&RefTensor> = terms.iter().collect();
    eval(op, &refs).ok().map(|t| t.data)
}

/// `max|x row| · Σ_k |w[n, k] · scale[n]|` for each element of an int8 product: what
/// rounding its row of `x` to int8 may move it by, over 254.
fn int8_magnitude(x: &RefTensor, w: &RefTensor, scale: &RefTensor) -> Vec<f64> {
    let (n, k) = (w.dims[0], w.dims[1]);
    let rows: usize = x.dims[..x.dims.len() - 1].iter().product();
    let l1: Vec<f64> = (0..n)
        .map(|j| {
            w.data[j * k..(j + 1) * k]
                .iter()
                .map(|v| v.abs())
                .sum::<f64>()
                * scale.data[j].abs()
        })
        .collect();
    (0..rows)
        .flat_map(|i| {
            let max = x.data[i * k..(i + 1) * k]
                .iter()
                .fold(0f64, |m, v| m.max(v.abs()));
            l1.iter().map(move |l| max * l)
        })
        .collect()
}

/// Applies one primitive to uploaded inputs on a backend and downloads the result.
pub fn run_op<B: Backend>(
    device: &B::Device,
    op: &Op,
    inputs: &[RawTensor<B>],
) -> Result<RawTensor<B>> {
    let refs: Vec<&RawTensor<B>> = inputs.iter().collect();
    Eager::<B>::new(device.clone()).apply(op.clone(), &refs)
}

/// Checks one primitive on a backend against the reference. Views are also checked
/// after `contiguous()`, which must then report a contiguous layout.
pub fn check_op<B: Backend>(device: &B::Device, case: &OpCase) -> Result<(), String> {
    check_op_within::<B>(device, case, None)
}

/// [`check_op`] with `tol` replacing the op's own tolerance when given (a backend's
/// [`Config::unary_tolerances`](super::Config::unary_tolerances)).
pub fn check_op_within<B: Backend>(
    device: &B::Device,
    case: &OpCase,
    tol: Option<Tol>,
) -> Result<(), String> {
    let logical = logical(&case.inputs)?;
    let refs: Vec<&RefTensor> = logical.iter().collect();
    let want = eval(&case.op, &refs);
    let uploaded = upload::<B>(device, &case.inputs)?;
    let (got, out) = match run_op::<B>(device, &case.op, &uploaded) {
        Ok(t) => (RefTensor::from_raw(&t), Some(t)),
        Err(e) => (Err(e), None),
    };
    let dtype = want.as_ref().map_or(crate::DType::F32, |w| w.dtype);
    let mag = magnitude(&case.op, &logical);
    let tol = tol.unwrap_or_else(|| op_tolerance(&case.op, dtype));
    judge(want, got, tol, mag.as_deref())
        .map_err(|e| format!("{} on {:?}: {e}", case.op.name(), case.op))?;
    if let (true, Some(t)) = (case.op.is_view(), &out) {
        let c = t
            .contiguous()
            .map_err(|e| format!("contiguous() failed: {e}"))?;
        if !c.layout().is_contiguous() {
            return Err(format!("contiguous() returned the layout {:?}", c.layout()));
        }
        let a = RefTensor::from_raw(t).map_err(|e| e.to_string())?;
        let b = RefTensor::from_raw(&c).map_err(|e| e.to_string())?;
        compare(&b, &a, Tol::EXACT, None)
            .map_err(|e| format!("contiguous() changed the values: {e}"))?;
    }
    Ok(())
}
