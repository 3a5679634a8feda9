//! Every method of the method table (`kiln::tensor::for_each_method!`) gives one
//! outcome on every path: equal values, or the same error text, through `#[model]`
//! (planned and op by op), the eager runtime tensor, the dynamic path's lazy tensor
//! and the typed API, on random shapes that fit and that do not. Sizes are `Dyn`, so
//! what the build cannot see is checked when the method runs; a static shape that
//! does not fit is a compile error (the ui cases).
//!
//! `case` matches `Method` without a wildcard: a method added to the table does not
//! compile here until it has its case.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::dynamic::LazyTensor;
use kiln::prelude::*;
use kiln::tensor::{DType, Method, MethodArgs, RandDist};
use proptest::prelude::*;

#[model]
pub struct Paths {
    unused: Linear<1, 1>,
}

#[model]
impl Paths {
    pub fn causal_mask(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.causal_mask()
    }
    pub fn gelu(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.gelu()
    }
    pub fn gelu_tanh(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.gelu_tanh()
    }
    pub fn silu(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.silu()
    }
    pub fn square(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.square()
    }
    pub fn sum_all(&self, x: Tensor<Dyn, Dyn>) -> Tensor {
        x.sum_all()
    }
    pub fn mean_all(&self, x: Tensor<Dyn, Dyn>) -> Tensor {
        x.mean_all()
    }
    pub fn flatten(&self, x: Tensor<Dyn, Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.flatten()
    }
    pub fn t(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.t()
    }
    pub fn softmax(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.softmax()
    }
    pub fn log_softmax(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        x.log_softmax(1)
    }
    pub fn sum(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn> {
        x.sum::<1>()
    }
    pub fn mean(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn> {
        x.mean::<0>()
    }
    pub fn max(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn> {
        x.max::<1>()
    }
    pub fn argmax(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, i32> {
        x.argmax::<1>()
    }
    pub fn reshape(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 6> {
        x.reshape::<Dyn, 6>()
    }
    pub fn regroup(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 6> {
        x.regroup::<Dyn, 6>()
    }
    pub fn broadcast_to(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 4> {
        x.broadcast_to::<Dyn, 4>()
    }
    pub fn permute(&self, x: Tensor<Dyn, Dyn, Dyn>) -> Tensor<Dyn, Dyn, Dyn> {
        x.permute::<2, 0, 1>()
    }
    pub fn narrow(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 2> {
        x.narrow::<1, 1, 2>()
    }
    pub fn cast(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn, f64> {
        x.cast::<f64>()
    }
    pub fn matmul(&self, a: Tensor<Dyn, Dyn>, b: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        a.matmul(b)
    }
    pub fn mse(&self, a: Tensor<Dyn, Dyn>, b: Tensor<Dyn, Dyn>) -> Tensor {
        a.mse(b)
    }
    pub fn cross_entropy(&self, x: Tensor<Dyn, Dyn>, y: Tensor<Dyn, i32>) -> Tensor {
        x.cross_entropy(y)
    }
    pub fn cross_entropy_smoothed(&self, x: Tensor<Dyn, Dyn>, y: Tensor<Dyn, i32>) -> Tensor {
        x.cross_entropy_smoothed(y, 0.1)
    }
    pub fn concat(&self, a: Tensor<Dyn, Dyn>, b: Tensor<Dyn, Dyn>) -> Tensor<Dyn, Dyn> {
        a.concat::<0>(b)
    }
}

/// What one path gave: the values (as f64), or the error's text.
type Outcome = std::result::Result<Vec<f64>, String>;

type R2 = (Dyn, Dyn);
type R3 = (Dyn, Dyn, Dyn);

fn read<S: Shape, E: Element>(t: kiln::Result<Tensor<Cpu, S, E>>) -> Outcome {
    t.map_err(|e| e.to_string())?
        .raw()
        .to_f64_vec()
        .map_err(|e| e.to_string())
}

fn read_raw(t: kiln::Result<RawTensor<Cpu>>) -> Outcome {
    t.map_err(|e| e.to_string())?
        .to_f64_vec()
        .map_err(|e| e.to_string())
}

fn read_lazy(t: kiln::Result<LazyTensor<Cpu>>) -> Outcome {
    read_raw(t.and_then(|t| t.value()))
}

fn typed<S: Shape, E: Element>(t: &RawTensor<Cpu>) -> Tensor<Cpu, S, E> {
    Tensor::from_raw(t.clone()).expect("the case draws the declared rank and dtype")
}

/// The operands of one case: their shapes, and for a loss the labels' classes.
#[derive(Clone, Debug)]
struct Operands {
    shapes: Vec<Vec<usize>>,
    labels: Option<usize>,
    seed: u64,
}

impl Operands {
    fn tensors(&self) -> Vec<RawTensor<Cpu>> {
        let mut out: Vec<RawTensor<Cpu>> = self
            .shapes
            .iter()
            .enumerate()
            .map(|(i, dims)| {
                let dist = RandDist::Normal {
                    mean: 0.0,
                    std: 2.0,
                };
                RawTensor::rand(dims, dist, self.seed + i as u64, DType::F32, &CpuDevice).unwrap()
            })
            .collect();
        if let Some(classes) = self.labels {
            let n = out.pop().expect("labels follow the logits").dims()[0];
            let ids: Vec<i32> = (0..n).map(|i| ((i * 7 + 3) % classes) as i32).collect();
            out.push(RawTensor::from_vec(ids, &[n], &CpuDevice).unwrap());
        }
        out
    }
}

fn size() -> impl Strategy<Value = usize> {
    1usize..=4
}

/// Shapes for `method`'s operands: each size drawn on its own, so many cases do not fit.
fn operands(method: Method) -> BoxedStrategy<Operands> {
    let rank2 = || proptest::collection::vec(size(), 2);
    let rank3 = || proptest::collection::vec(size(), 3);
    let one = |s: BoxedStrategy<Vec<usize>>| s.prop_map(|a| vec![a]).boxed();
    let (shapes, labels): (BoxedStrategy<Vec<Vec<usize>>>, bool) = match method {
        Method::Flatten | Method::Permute => (one(rank3().boxed()), false),
        Method::Matmul | Method::Mse | Method::Concat => (
            (rank2(), rank2()).prop_map(|(a, b)| vec![a, b]).boxed(),
            false,
        ),
        Method::CrossEntropy | Method::CrossEntropySmoothed => (
            (rank2(), size())
                .prop_map(|(a, n)| vec![a, vec![n]])
                .boxed(),
            true,
        ),
        _ => (one(rank2().boxed()), false),
    };
    (shapes, 0u64..1000)
        .prop_map(move |(shapes, seed)| Operands {
            labels: labels.then(|| shapes[0][1]),
            shapes,
            seed,
        })
        .boxed()
}

/// The same calls on the eager and the lazy tensor (both carry the table's methods).
macro_rules! runtime_call {
    ($method:expr, $t:expr, $ty:ty) => {{
        let t = $t;
        match $method {
            Method::CausalMask => t[0].causal_mask(),
            Method::Gelu => t[0].gelu(),
            Method::GeluTanh => t[0].gelu_tanh(),
            Method::Silu => t[0].silu(),
            Method::Square => t[0].square(),
            Method::SumAll => t[0].sum_all(),
            Method::MeanAll => t[0].mean_all(),
            Method::Flatten => t[0].flatten(),
            Method::T => t[0].t(),
            Method::Softmax => t[0].softmax(1),
            Method::LogSoftmax => t[0].log_softmax(1),
            Method::Sum => t[0].sum(&[1], false),
            Method::Mean => t[0].mean(&[0], false),
            Method::Max => t[0].max(&[1], false),
            Method::Argmax => t[0].argmax(1, false),
            // `reshape::<Dyn, 6>()`: the table's form with an open size.
            Method::Reshape => Method::Reshape.apply(
                &mut t[0].ops(),
                &t[0],
                MethodArgs::Dims(vec![None, Some(6)]),
            ),
            Method::Regroup => Method::Regroup.apply(
                &mut t[0].ops(),
                &t[0],
                MethodArgs::Dims(vec![None, Some(6)]),
            ),
            // `broadcast_to::<Dyn, 4>()`: `Dyn` keeps the input's size.
            Method::BroadcastTo => Method::BroadcastTo.apply(
                &mut t[0].ops(),
                &t[0],
                MethodArgs::Dims(vec![None, Some(4)]),
            ),
            Method::Permute => t[0].permute(&[2, 0, 1]),
            Method::Narrow => t[0].narrow(1, 1, 2),
            Method::Cast => t[0].cast(DType::F64),
            Method::Matmul => t[0].matmul(&t[1]),
            Method::Mse => t[0].mse(&t[1]),
            Method::CrossEntropy => t[0].cross_entropy(&t[1]),
            Method::CrossEntropySmoothed => t[0].cross_entropy_smoothed(&t[1], 0.1),
            Method::Concat => <$ty>::concat(&[&t[0], &t[1]], 0),
        }
    }};
}

/// The model's method for `method` (planned or op by op, as the model is set).
fn model_call(m: &Paths<Cpu>, method: Method, t: &[RawTensor<Cpu>]) -> Outcome {
    let x2 = || typed::<R2, f32>(&t[0]);
    let x3 = || typed::<R3, f32>(&t[0]);
    let y2 = || typed::<R2, f32>(&t[1]);
    let labels = || typed::<(Dyn,), i32>(&t[1]);
    match method {
        Method::CausalMask => read(m.causal_mask(&x2())),
        Method::Gelu => read(m.gelu(&x2())),
        Method::GeluTanh => read(m.gelu_tanh(&x2())),
        Method::Silu => read(m.silu(&x2())),
        Method::Square => read(m.square(&x2())),
        Method::SumAll => read(m.sum_all(&x2())),
        Method::MeanAll => read(m.mean_all(&x2())),
        Method::Flatten => read(m.flatten(&x3())),
        Method::T => read(m.t(&x2())),
        Method::Softmax => read(m.softmax(&x2())),
        Method::LogSoftmax => read(m.log_softmax(&x2())),
        Method::Sum => read(m.sum(&x2())),
        Method::Mean => read(m.mean(&x2())),
        Method::Max => read(m.max(&x2())),
        Method::Argmax => read(m.argmax(&x2())),
        Method::Reshape => read(m.reshape(&x2())),
        Method::Regroup => read(m.regroup(&x2())),
        Method::BroadcastTo => read(m.broadcast_to(&x2())),
        Method::Permute => read(m.permute(&x3())),
        Method::Narrow => read(m.narrow(&x2())),
        Method::Cast => read(m.cast(&x2())),
        Method::Matmul => read(m.matmul(&x2(), &y2())),
        Method::Mse => read(m.mse(&x2(), &y2())),
        Method::CrossEntropy => read(m.cross_entropy(&x2(), &labels())),
        Method::CrossEntropySmoothed => read(m.cross_entropy_smoothed(&x2(), &labels())),
        Method::Concat => read(m.concat(&x2(), &y2())),
    }
}

/// The typed API's method for `method`, where it has one that takes these operands.
fn typed_call(method: Method, t: &[RawTensor<Cpu>]) -> Option<Outcome> {
    let x2 = || typed::<R2, f32>(&t[0]);
    let x3 = || typed::<R3, f32>(&t[0]);
    let y2 = || typed::<R2, f32>(&t[1]);
    let labels = || typed::<(Dyn,), i32>(&t[1]);
    Some(match method {
        Method::CausalMask => read(x2().causal_mask()),
        Method::Gelu => read(x2().gelu()),
        Method::GeluTanh => read(x2().gelu_tanh()),
        Method::Silu => read(x2().silu()),
        Method::Square => read(x2().square()),
        Method::SumAll => read(x2().sum_all()),
        Method::MeanAll => read(x2().mean_all()),
        Method::T => read(x2().t()),
        Method::Softmax => read(x2().softmax()),
        Method::LogSoftmax => read(x2().log_softmax()),
        Method::Sum => read(x2().sum::<1>()),
        Method::Mean => read(x2().mean::<0>()),
        Method::Max => read(x2().max::<1>()),
        Method::Argmax => read(x2().argmax::<1>()),
        Method::Reshape => read(x2().reshape::<(Dyn, Const<6>)>()),
        Method::Regroup => read(x2().regroup::<(Dyn, Const<6>)>()),
        Method::Permute => read(x3().permute::<R3>(&[2, 0, 1])),
        Method::Cast => read(x2().cast::<f64>()),
        Method::Matmul => read(x2().matmul(&y2())),
        Method::Mse => read(x2().mse(&y2())),
        Method::CrossEntropy => read(x2().cross_entropy(&labels(), 0.0)),
        Method::CrossEntropySmoothed => read(x2().cross_entropy(&labels(), 0.1)),
        // No typed form: `flatten`, `narrow` and `concat` change a size the types
        // would have to compute.
        Method::Flatten | Method::Narrow | Method::Concat => return None,
        // The typed `broadcast_to::<S>()` takes static dims only.
        Method::BroadcastTo => return None,
    })
}

fn same(
    method: Method,
    what: &str,
    a: &Outcome,
    b: &Outcome,
) -> std::result::Result<(), TestCaseError> {
    match (a, b) {
        (Ok(x), Ok(y)) => {
            prop_assert_eq!(
                x.len(),
                y.len(),
                "{:?}: {} gave {} values",
                method,
                what,
                y.len()
            );
            for (u, v) in x.iter().zip(y) {
                let close =
                    u == v || (u - v).abs() <= 1e-5 * (1.0 + u.abs()) || (u.is_nan() && v.is_nan());
                prop_assert!(
                    close,
                    "{:?}: {} gave {} where the eager path gave {}",
                    method,
                    what,
                    v,
                    u
                );
            }
        }
        (Err(x), Err(y)) => prop_assert_eq!(x, y, "{:?}: {} refused otherwise", method, what),
        _ => prop_assert!(
            false,
            "{:?}: the eager path gave {:?}, {} gave {:?}",
            method,
            a,
            what,
            b
        ),
    }
    Ok(())
}

fn all_paths_agree(method: Method, ops: &Operands) -> std::result::Result<(), TestCaseError> {
    let t = ops.tensors();
    let eager = read_raw(runtime_call!(method, &t, RawTensor<Cpu>));
    let lazy: Vec<LazyTensor<Cpu>> = t.iter().map(|x| LazyTensor::from_raw(x.clone())).collect();
    same(
        method,
        "the dynamic path",
        &eager,
        &read_lazy(runtime_call!(method, &lazy, LazyTensor<Cpu>)),
    )?;
    let model = Paths::<Cpu>::init(&CpuDevice, 1).unwrap();
    model.set_fused(true);
    same(
        method,
        "the planned #[model] method",
        &eager,
        &model_call(&model, method, &t),
    )?;
    model.set_fused(false);
    same(
        method,
        "the #[model] method op by op",
        &eager,
        &model_call(&model, method, &t),
    )?;
    if let Some(typed) = typed_call(method, &t) {
        same(method, "the typed API", &eager, &typed)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_method_agrees_on_every_path(
        (method, ops) in proptest::sample::select(Method::ALL.to_vec())
            .prop_flat_map(|m| operands(m).prop_map(move |o| (m, o)))
    ) {
        all_paths_agree(method, &ops)?;
    }
}

/// Every method, a few shapes each (the random test above may skip one).
#[test]
fn each_method_on_fitting_and_misfitting_shapes() {
    for &method in Method::ALL {
        let two = |a: &[usize], b: &[usize]| vec![a.to_vec(), b.to_vec()];
        let cases: Vec<(Vec<Vec<usize>>, Option<usize>)> = match method {
            Method::Flatten | Method::Permute => vec![(vec![vec![2, 3, 4]], None)],
            Method::Matmul => vec![(two(&[2, 3], &[3, 4]), None), (two(&[2, 3], &[4, 3]), None)],
            Method::Mse => vec![(two(&[3, 2], &[3, 2]), None), (two(&[3, 1], &[3, 3]), None)],
            Method::Concat => vec![(two(&[1, 3], &[2, 3]), None), (two(&[2, 3], &[2, 4]), None)],
            Method::CrossEntropy | Method::CrossEntropySmoothed => {
                vec![(two(&[3, 4], &[3]), Some(4)), (two(&[3, 4], &[2]), Some(4))]
            }
            Method::CausalMask => vec![(vec![vec![3, 3]], None), (vec![vec![3, 4]], None)],
            // [2, 9] into rows of 6 regroups rows: `reshape` refuses it, `regroup` takes it.
            Method::Reshape | Method::Regroup => vec![
                (vec![vec![2, 6]], None),
                (vec![vec![2, 5]], None),
                (vec![vec![2, 9]], None),
                (vec![vec![3, 2]], None),
            ],
            Method::BroadcastTo => vec![
                (vec![vec![3, 1]], None),
                (vec![vec![3, 4]], None),
                (vec![vec![3, 2]], None),
            ],
            _ => vec![(vec![vec![3, 4]], None)],
        };
        for (shapes, labels) in cases {
            let ops = Operands {
                shapes,
                labels,
                seed: 7,
            };
            all_paths_agree(method, &ops).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The seam this test was written for: `mse` of `[B, 1]` against `[B, B]` sizes used
/// to broadcast to `[B, B]` on the planned and dynamic paths while the typed API refused.
#[test]
fn mse_refuses_operands_of_different_shapes_on_every_path() {
    let ops = Operands {
        shapes: vec![vec![3, 1], vec![3, 3]],
        labels: None,
        seed: 1,
    };
    let t = ops.tensors();
    let e = read_raw(runtime_call!(Method::Mse, &t, RawTensor<Cpu>)).unwrap_err();
    assert_eq!(
        e,
        "shape mismatch in `mse`: the operands have shapes [3, 1] and [3, 3]; they must be equal (broadcast one explicitly if that is meant)"
    );
    all_paths_agree(Method::Mse, &ops).unwrap_or_else(|e| panic!("{e}"));
}

/// `reshape` with an open leading size keeps rows whole on every path; `regroup` is
/// the same reshape written to regroup them.
#[test]
fn reshape_keeps_rows_whole_and_regroup_regroups_on_every_path() {
    let ops = Operands {
        shapes: vec![vec![2, 9]],
        labels: None,
        seed: 3,
    };
    let t = ops.tensors();
    let e = read_raw(runtime_call!(Method::Reshape, &t, RawTensor<Cpu>)).unwrap_err();
    assert!(
        e.contains("reshaping [2, 9] into [3, 6] regroups rows"),
        "{e}"
    );
    let regrouped = read_raw(runtime_call!(Method::Regroup, &t, RawTensor<Cpu>)).unwrap();
    assert_eq!(regrouped.len(), 18);
    all_paths_agree(Method::Reshape, &ops).unwrap_or_else(|e| panic!("{e}"));
    all_paths_agree(Method::Regroup, &ops).unwrap_or_else(|e| panic!("{e}"));
}
