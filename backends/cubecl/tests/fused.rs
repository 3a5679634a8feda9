//! The fused elementwise kernel on the GPU backends (wgpu in CI; CUDA where a GPU is)
//! against the CPU backend's fused kernels: random
//! expressions (arithmetic, comparisons, `where`, casts to bool, constants including
//! infinities, in-place reads of outputs) over inputs that are contiguous, broadcast,
//! transposed or offset views, through both the vectorised and the strided variant;
//! and bad operands are errors. Whole models' fused plans on the device are tested in
//! kiln-gpu-system (`tests/fused_models.rs`), so that this crate's tests build
//! without the model zoo.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::{
    Backend, BinaryOp, CmpOp, DType, Dims, Op, RawTensor, ReduceOp, Result, TensorMeta, UnaryOp,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// The checks below for one backend, as tests named after it.
macro_rules! fused_tests {
    ($module:ident, $B:ty, $device:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn random_expressions_match_the_cpu() {
                super::random_expressions_match_the_cpu::<$B>(&$device)
            }
            #[test]
            fn both_variants_run_a_large_expression() -> Result<()> {
                super::both_variants_run_a_large_expression::<$B>(&$device)
            }
            #[test]
            fn reductions_of_random_expressions_match_the_stored_path() {
                super::reductions_of_random_expressions_match_the_stored_path::<$B>(&$device)
            }
            #[test]
            fn bad_operands_are_errors() -> Result<()> {
                super::bad_operands_are_errors::<$B>(&$device)
            }
            #[test]
            fn groups_of_random_expressions_match_the_cpu() {
                super::groups_of_random_expressions_match_the_cpu::<$B>(&$device)
            }
        }
    };
}

#[cfg(feature = "wgpu")]
fused_tests!(
    wgpu,
    kiln_cubecl::Wgpu,
    kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the fused tests: {e}"))
);
#[cfg(feature = "cuda")]
fused_tests!(
    cuda,
    kiln_cubecl::Cuda,
    kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the fused tests: {e}"))
);

/// How an input view is laid out over the kernel's dims `[r, c]`.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Contiguous,
    /// One value broadcast everywhere (all strides 0).
    Scalar,
    /// A row `[1, c]` broadcast down.
    Row,
    /// A column `[r, 1]` broadcast across.
    Column,
    /// The transpose of a `[c, r]` buffer.
    Transposed,
    /// Rows 1.. of an `[r + 1, c]` buffer (a non-zero offset).
    Offset,
}

/// The view of `kind` over `[r, c]` built on backend `B` from `values` (as many values
/// as the kind's buffer holds).
fn view<B: Backend>(
    dev: &B::Device,
    kind: Kind,
    values: &[f32],
    r: usize,
    c: usize,
) -> Result<RawTensor<B>> {
    let t = |dims: &[usize]| RawTensor::<B>::from_vec(values.to_vec(), dims, dev);
    match kind {
        Kind::Contiguous => t(&[r, c]),
        Kind::Scalar => t(&[1, 1])?.broadcast_to(&[r, c]),
        Kind::Row => t(&[1, c])?.broadcast_to(&[r, c]),
        Kind::Column => t(&[r, 1])?.broadcast_to(&[r, c]),
        Kind::Transposed => t(&[c, r])?.transpose(0, 1),
        Kind::Offset => t(&[r + 1, c])?.slice(0, 1, r + 1, 1),
    }
}

fn buffer_len(kind: Kind, r: usize, c: usize) -> usize {
    match kind {
        Kind::Contiguous | Kind::Transposed => r * c,
        Kind::Scalar => 1,
        Kind::Row => c,
        Kind::Column => r,
        Kind::Offset => (r + 1) * c,
    }
}

/// A random expression with its input kinds, dims and values.
#[derive(Clone)]
struct Case {
    expr: FusedExpr,
    kinds: Vec<Kind>,
    dims: [usize; 2],
    inputs: Vec<Vec<f32>>,
    outputs: Vec<Vec<f32>>,
}

// The values are left out: a failing case's seed reproduces them.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} over {:?} {:?}", self.expr, self.kinds, self.dims)
    }
}

/// Values on a quarter grid, so that sums and products are exact on every device.
fn value() -> impl Strategy<Value = f32> {
    (-8i32..=8).prop_map(|q| q as f32 * 0.25)
}

fn case() -> impl Strategy<Value = Case> {
    let kind = prop::sample::select(vec![
        Kind::Contiguous,
        Kind::Contiguous,
        Kind::Scalar,
        Kind::Row,
        Kind::Column,
        Kind::Transposed,
        Kind::Offset,
    ]);
    let dims = prop_oneof![
        4 => (1usize..7, 1usize..9),
        // Rows of whole vectors: row and column broadcasts take the vectorised kernel.
        2 => (1usize..7, prop::sample::select(vec![4usize, 8, 12])),
        1 => Just((96usize, 100usize)),
        // A long column: a sum down it is cut into chunks.
        1 => Just((1500usize, 8usize)),
    ];
    (
        prop::collection::vec(kind, 1..4),
        dims,
        prop::collection::vec(
            (
                0u8..9,
                any::<u16>(),
                any::<u16>(),
                any::<u16>(),
                any::<u8>(),
            ),
            1..14,
        ),
        1usize..3,
        any::<bool>(),
    )
        .prop_flat_map(|(kinds, (r, c), raw_steps, outs, in_place)| {
            let mut steps: Vec<ExprStep> = (0..kinds.len()).map(ExprStep::Input).collect();
            if in_place {
                steps.push(ExprStep::Output(0));
            }
            for (code, a, b, s, op) in raw_steps {
                let n = steps.len();
                let (a, s) = (a as usize % n, s as usize % n);
                // Distinct operands: lavapipe's shader compiler folds `x / x` to 1 and
                // `x - x` to 0 (fast-math), which differs from IEEE for 0, ∞ and NaN;
                // CUDA (no fast-math) does not, and separate kernels never see one value twice.
                let b = (a + 1 + b as usize % (n - 1).max(1)) % n;
                let unary = [
                    UnaryOp::Neg,
                    UnaryOp::Abs,
                    UnaryOp::Relu,
                    UnaryOp::Sigmoid,
                    UnaryOp::Tanh,
                    UnaryOp::Exp,
                    UnaryOp::Sign,
                    UnaryOp::Not,
                ];
                let binary = [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Max,
                    BinaryOp::Min,
                    BinaryOp::Div,
                ];
                let cmp = [CmpOp::Lt, CmpOp::Ge, CmpOp::Eq, CmpOp::Ne];
                let consts = [0.5, -2.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, 3.0];
                // With one step so far a binary op would see it twice: a unary op instead.
                let code = if n == 1 && (2..=6).contains(&code) {
                    0
                } else {
                    code
                };
                steps.push(match code {
                    0 | 1 => ExprStep::Unary(unary[op as usize % unary.len()], a),
                    2..=4 => ExprStep::Binary(binary[op as usize % binary.len()], a, b),
                    5 => ExprStep::Compare(cmp[op as usize % cmp.len()], a, b),
                    6 => ExprStep::Select(s, a, b),
                    7 => ExprStep::ToBool(a),
                    _ => ExprStep::Const(consts[op as usize % consts.len()]),
                });
            }
            let last = steps.len() - 1;
            let results: Vec<usize> = (0..outs).map(|k| last - k.min(last)).collect();
            let expr = FusedExpr {
                inputs: kinds.len(),
                steps,
                results,
            };
            let inputs: Vec<_> = kinds
                .iter()
                .map(|&k| prop::collection::vec(value(), buffer_len(k, r, c)))
                .collect();
            let outputs = prop::collection::vec(prop::collection::vec(value(), r * c), outs);
            (Just(expr), Just(kinds), Just([r, c]), inputs, outputs)
        })
        .prop_map(|(expr, kinds, dims, inputs, outputs)| Case {
            expr,
            kinds,
            dims,
            inputs,
            outputs,
        })
}

/// Runs the case's expression on backend `B`: the outputs' values afterwards.
fn run<B: Backend>(dev: &B::Device, case: &Case) -> Result<Vec<Vec<f32>>> {
    let [r, c] = case.dims;
    let inputs = case
        .kinds
        .iter()
        .zip(&case.inputs)
        .map(|(&k, v)| view::<B>(dev, k, v, r, c))
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
    let mut outs = case
        .outputs
        .iter()
        .map(|v| RawTensor::<B>::from_vec(v.clone(), &[r * c], dev))
        .collect::<Result<Vec<_>>>()?;
    let mut storages: Vec<&mut B::Storage> = outs
        .iter_mut()
        .map(|t| t.storage_mut().expect("a fresh tensor owns its buffer"))
        .collect();
    B::fused_elementwise(
        dev,
        &case.expr,
        None,
        &views,
        &Dims::new(&case.dims)?,
        &mut storages,
    )?;
    drop(storages);
    outs.iter().map(|t| t.to_vec::<f32>()).collect()
}

/// Runs `cases` (one expression, each case a group of its own dims and values) through
/// [`Backend::fused_elementwise_groups`] on backend `B`: each group's outputs after.
fn run_groups<B: Backend>(dev: &B::Device, cases: &[Case]) -> Result<Vec<Vec<Vec<f32>>>> {
    let mut inputs = Vec::new();
    let mut outs = Vec::new();
    let mut dims = Vec::new();
    for case in cases {
        let [r, c] = case.dims;
        for (&k, v) in case.kinds.iter().zip(&case.inputs) {
            inputs.push(view::<B>(dev, k, v, r, c)?);
        }
        for v in &case.outputs {
            outs.push(RawTensor::<B>::from_vec(v.clone(), &[r * c], dev)?);
        }
        dims.push(Dims::new(&case.dims)?);
    }
    let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
    let mut storages: Vec<&mut B::Storage> = outs
        .iter_mut()
        .map(|t| t.storage_mut().expect("a fresh tensor owns its buffer"))
        .collect();
    B::fused_elementwise_groups(dev, &cases[0].expr, &views, &dims, &mut storages)?;
    drop(storages);
    let per = cases[0].outputs.len();
    let values = outs
        .iter()
        .map(|t| t.to_vec::<f32>())
        .collect::<Result<Vec<_>>>()?;
    Ok(values.chunks(per).map(|c| c.to_vec()).collect())
}

/// Groups of one random expression: up to 40 (more than one launch takes), of random
/// dims, mostly contiguous or broadcast inputs (the multi-tensor kernel's) with some
/// groups of other views or of dims not a whole number of vectors among them (each
/// run alone): every group's outputs as the CPU computes them one group at a time.
fn groups_of_random_expressions_match_the_cpu<G: Backend>(dev: &G::Device) {
    let config = Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let groups = (case(), 1usize..40, any::<bool>(), any::<u64>());
    runner
        .run(&groups, |(first, count, plain, seed)| {
            // Every group reads its inputs alike where `plain` (the kernel's case).
            let kinds: Vec<Kind> = match plain {
                true => first
                    .kinds
                    .iter()
                    .map(|&k| match k {
                        Kind::Scalar => Kind::Scalar,
                        _ => Kind::Contiguous,
                    })
                    .collect(),
                false => first.kinds.clone(),
            };
            let mut state = seed | 1;
            let mut next = move |n: u64| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % n
            };
            let shapes = [[1, 4], [3, 8], [8, 64], [5, 7], [2, 2], [96, 100], [1, 1]];
            let cases: Vec<Case> = (0..count)
                .map(|_| {
                    let [r, c] = shapes[next(shapes.len() as u64) as usize];
                    let mut value = || (next(17) as f32 - 8.0) * 0.25;
                    Case {
                        expr: first.expr.clone(),
                        kinds: kinds.clone(),
                        dims: [r, c],
                        inputs: kinds
                            .iter()
                            .map(|&k| (0..buffer_len(k, r, c)).map(|_| value()).collect())
                            .collect(),
                        outputs: (0..first.outputs.len())
                            .map(|_| (0..r * c).map(|_| value()).collect())
                            .collect(),
                    }
                })
                .collect();
            let gpu =
                run_groups::<G>(dev, &cases).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (g, case) in cases.iter().enumerate() {
                let cpu =
                    run::<Cpu>(&CpuDevice, case).map_err(|e| TestCaseError::fail(e.to_string()))?;
                for (k, (gv, cv)) in gpu[g].iter().zip(&cpu).enumerate() {
                    agree(gv, cv).map_err(|e| {
                        TestCaseError::fail(format!("group {g} of {count}, output {k}: {e}"))
                    })?;
                }
            }
            Ok(())
        })
        .unwrap();
}

/// Whether two results agree: equal NaN-ness and infinities, else within a tolerance
/// scaled by the largest finite reference value (sums of inexact terms may cancel).
fn agree(gpu: &[f32], cpu: &[f32]) -> std::result::Result<(), String> {
    let scale = cpu
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        let ok = if c.is_nan() || g.is_nan() {
            c.is_nan() && g.is_nan()
        } else if c.is_infinite() || g.is_infinite() {
            c == g
        } else {
            (g - c).abs() <= 1e-5 * scale
        };
        if !ok {
            return Err(format!("element {i}: wgpu {g}, cpu {c}"));
        }
    }
    Ok(())
}

fn random_expressions_match_the_cpu<G: Backend>(dev: &G::Device) {
    let config = Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    };
    // A fixed seed: every run checks the same expressions (each compiles a kernel).
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&case(), |case| {
            let gpu = run::<G>(dev, &case).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let cpu =
                run::<Cpu>(&CpuDevice, &case).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (k, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                agree(g, c).map_err(|e| TestCaseError::fail(format!("output {k}: {e}")))?;
            }
            Ok(())
        })
        .unwrap();
}

/// The reduction (`op` over `axes`) of the case's first result on backend `B`, computed
/// as the reduction reads it (`fused`: [`Backend::reduce_with_prologue`], which must
/// take it) or stored first and then reduced.
fn reduce_case<B: Backend>(
    dev: &B::Device,
    case: &Case,
    op: ReduceOp,
    axes: &[usize],
    fused: bool,
) -> Result<Vec<f32>> {
    let [r, c] = case.dims;
    let inputs = case
        .kinds
        .iter()
        .zip(&case.inputs)
        .map(|(&k, v)| view::<B>(dev, k, v, r, c))
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
    let reduce = Op::Reduce {
        op,
        axes: axes.to_vec(),
    };
    let out_dims: Vec<usize> = (0..2)
        .map(|d| if axes.contains(&d) { 1 } else { case.dims[d] })
        .collect();
    let meta = TensorMeta::new(out_dims.clone(), DType::F32);
    let dims = Dims::new(&case.dims)?;
    let result = if fused {
        B::reduce_with_prologue(dev, &reduce, &case.expr, &views, &dims, &meta)?
            .expect("an f32 prologue of f32 inputs is reduced as it is read")
    } else {
        let mut stored = RawTensor::<B>::from_vec(vec![0.0f32; r * c], &[r, c], dev)?;
        let buffer = stored
            .storage_mut()
            .expect("a fresh tensor owns its buffer");
        B::fused_elementwise(dev, &case.expr, None, &views, &dims, &mut [buffer])?;
        B::execute(dev, &reduce, &[stored.view()], &meta)?
    };
    RawTensor::<B>::from_storage(result, Dims::new(&out_dims)?, dev.clone())?.to_vec::<f32>()
}

/// A plan's reduction of a fused group's result, computed as it is read, against the
/// same expression stored and then reduced, on the device and on the CPU: sums (cut
/// into chunks down long columns), maxima and minima over rows, columns and both.
fn reductions_of_random_expressions_match_the_stored_path<G: Backend>(dev: &G::Device) {
    let config = Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    // One result, no outputs read: a prologue.
    let prologue = case()
        .prop_filter("a prologue reads no outputs", |case| {
            !case
                .expr
                .steps
                .iter()
                .any(|s| matches!(s, ExprStep::Output(_)))
        })
        .prop_map(|mut case| {
            case.expr.results.truncate(1);
            case.outputs.truncate(1);
            case
        });
    let ops = prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]);
    let axes = prop::sample::select(vec![vec![0usize], vec![1], vec![0, 1]]);
    runner
        .run(&(prologue, ops, axes), |(case, op, axes)| {
            let fail = |e: kiln_tensor::Error| TestCaseError::fail(e.to_string());
            let fused = reduce_case::<G>(dev, &case, op, &axes, true).map_err(fail)?;
            let stored = reduce_case::<G>(dev, &case, op, &axes, false).map_err(fail)?;
            let cpu = reduce_case::<Cpu>(&CpuDevice, &case, op, &axes, false).map_err(fail)?;
            agree(&fused, &stored).map_err(|e| {
                TestCaseError::fail(format!("{op:?} over {axes:?}, fused against stored: {e}"))
            })?;
            agree(&fused, &cpu).map_err(|e| {
                TestCaseError::fail(format!("{op:?} over {axes:?}, against the CPU: {e}"))
            })?;
            Ok(())
        })
        .unwrap();
}

fn both_variants_run_a_large_expression<G: Backend>(dev: &G::Device) -> Result<()> {
    // About 2^22 elements, contiguous (vectorised, several vectors per unit, a partial
    // last cube) and transposed (strided): the multi-row grid and every unit's index.
    let (r, c) = (2047, 2052);
    let values: Vec<f32> = (0..r * c).map(|i| (i % 97) as f32 - 48.0).collect();
    let expr = FusedExpr {
        inputs: 1,
        steps: vec![
            ExprStep::Input(0),
            ExprStep::Const(2.0),
            ExprStep::Binary(BinaryOp::Mul, 0, 1),
            ExprStep::Unary(UnaryOp::Relu, 2),
        ],
        results: vec![3],
    };
    for kind in [Kind::Contiguous, Kind::Transposed] {
        let case = Case {
            expr: expr.clone(),
            kinds: vec![kind],
            dims: [r, c],
            inputs: vec![values.clone()],
            outputs: vec![vec![0.0; r * c]],
        };
        let got = &run::<G>(dev, &case)?[0];
        let want = &run::<Cpu>(&CpuDevice, &case)?[0];
        assert!(got == want, "{kind:?}: results differ");
    }
    Ok(())
}

fn bad_operands_are_errors<G: Backend>(dev: &G::Device) -> Result<()> {
    let expr = FusedExpr {
        inputs: 1,
        steps: vec![ExprStep::Input(0), ExprStep::Unary(UnaryOp::Neg, 0)],
        results: vec![1],
    };
    let dims = Dims::new(&[8])?;
    let ints = RawTensor::<G>::from_vec(vec![1i32; 8], &[8], dev)?;
    let floats = RawTensor::<G>::from_vec(vec![1f32; 8], &[8], dev)?;
    let mut out = G::alloc(dev, DType::F32, 8)?;
    let mut short = G::alloc(dev, DType::F32, 4)?;
    let e = G::fused_elementwise(dev, &expr, None, &[ints.view()], &dims, &mut [&mut out]);
    assert!(e.unwrap_err().to_string().contains("input 0 is I32"));
    let e = G::fused_elementwise(dev, &expr, None, &[floats.view()], &dims, &mut [&mut short]);
    assert!(e.unwrap_err().to_string().contains("output 0"));
    let e = G::fused_elementwise(dev, &expr, None, &[], &dims, &mut [&mut out]);
    assert!(e.unwrap_err().to_string().contains("reads 1 inputs"));
    // Groups: each is checked as one call would be, and the counts must fit the groups.
    let two = [dims, dims];
    let views = [floats.view(), ints.view()];
    let mut other = G::alloc(dev, DType::F32, 8)?;
    let e = G::fused_elementwise_groups(dev, &expr, &views, &two, &mut [&mut out, &mut other]);
    assert!(e.unwrap_err().to_string().contains("input 0 is I32"));
    let views = [floats.view(), floats.view()];
    let e = G::fused_elementwise_groups(dev, &expr, &views, &two, &mut [&mut out, &mut short]);
    assert!(e.unwrap_err().to_string().contains("output 0"));
    let e = G::fused_elementwise_groups(dev, &expr, &views[..1], &two, &mut [&mut out, &mut other]);
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("2 groups of an expression of 1 inputs and 1 outputs need 2 inputs"));
    Ok(())
}
