//! `#[model]` methods whose sizes are only known at run time (`Dyn`): the planned
//! (fused) path must give what the op-by-op path gives, values or the same error, for
//! valid and invalid sizes alike, through the typed methods and `_and_grad`.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;

#[model]
pub struct DynNet {
    fc1: Linear<64, 10>,
}

#[model]
impl DynNet {
    pub fn forward(&self, x: Tensor<Dyn, 64>) -> Tensor<Dyn, 10> {
        self.fc1(x)
    }

    pub fn loss(&self, x: Tensor<Dyn, 64>, y: Tensor<Dyn, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }

    pub fn any_width(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 10> {
        self.fc1(x).relu()
    }

    pub fn rows_of_twelve(&self, x: Tensor<Dyn, 16>) -> Tensor<Dyn, 12> {
        (x * 2.0).regroup::<Dyn, 12>()
    }

    pub fn rows_of_four(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 4> {
        x.reshape::<Dyn, 4>()
    }

    pub fn regrouped_rows_of_four(&self, x: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 4> {
        x.regroup::<Dyn, 4>()
    }

    /// A hand-written mean squared error of a `[N, 1]` prediction against `[N]` targets.
    pub fn squared_error(&self, pred: Tensor<Dyn, 1>, target: Tensor<Dyn>) -> Tensor {
        (pred - target).square().mean_all()
    }

    /// The outer difference written out: one operand broadcast explicitly.
    pub fn outer_difference<const N: usize>(&self, a: Tensor<N, 1>, b: Tensor<N>) -> Tensor<N, N> {
        a.broadcast_to::<N, N>() - b
    }

    pub fn pair_sum(&self, a: Tensor<Dyn, 4>, b: Tensor<Dyn, 4>) -> Tensor {
        (a * b).sum_all()
    }
}

type Rows<const N: usize> = (Dyn, Const<N>);

fn input<const N: usize>(rows: usize, seed: u64) -> Tensor<Cpu, Rows<N>> {
    let raw = RawTensor::<Cpu>::rand(
        &[rows, N],
        kiln::tensor::RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        seed,
        kiln::tensor::DType::F32,
        &CpuDevice,
    )
    .unwrap();
    Tensor::from_raw(raw).unwrap()
}

fn labels(n: usize) -> Tensor<Cpu, (Dyn,), i32> {
    let ids: Vec<i32> = (0..n as i32).map(|i| i % 10).collect();
    let raw = RawTensor::<Cpu>::from_vec(ids, &[n], &CpuDevice).unwrap();
    Tensor::from_raw(raw).unwrap()
}

/// Runs `f` on the model fused and unfused; both must agree (values within `1e-5`, or
/// the same error). Returns the fused outcome.
fn both<T>(
    model: &DynNet<Cpu>,
    f: impl Fn(&DynNet<Cpu>) -> Result<T>,
    values: impl Fn(&T) -> Vec<f32>,
) -> std::result::Result<Vec<f32>, String> {
    model.set_fused(true);
    let fused = f(model).map(|t| values(&t)).map_err(|e| e.to_string());
    model.set_fused(false);
    let unfused = f(model).map(|t| values(&t)).map_err(|e| e.to_string());
    model.set_fused(true);
    match (&fused, &unfused) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{x} fused, {y} unfused"
                );
            }
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("fused {fused:?}, unfused {unfused:?}"),
    }
    fused
}

fn flat<S: Shape>(t: &Tensor<Cpu, S>) -> Vec<f32> {
    t.raw().to_vec::<f32>().unwrap()
}

#[test]
fn labels_must_match_the_rows() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let x = input::<64>(3, 2);
    for n in [5, 2] {
        let y = labels(n);
        let e = both(&model, |m| m.loss(&x, &y), flat).unwrap_err();
        assert!(
            e.contains(&format!("logits [3, 10] need labels [3], got [{n}]")),
            "{e}"
        );
        let e = both(&model, |m| m.loss_and_grad(&x, &y), |(l, _)| flat(l)).unwrap_err();
        assert!(e.contains("need labels [3]"), "{e}");
    }
    let y = labels(3);
    both(&model, |m| m.loss(&x, &y), flat).unwrap();
    both(
        &model,
        |m| m.loss_and_grad(&x, &y),
        |(l, g)| {
            let mut v = flat(l);
            v.extend(g.fc1.weight.raw().to_vec::<f32>().unwrap());
            v
        },
    )
    .unwrap();
}

#[test]
fn a_dyn_width_is_checked_against_the_layer() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let wrong = Tensor::<Cpu, (Dyn, Dyn)>::from_raw(input::<63>(3, 4).into_raw()).unwrap();
    let e = both(&model, |m| m.any_width(&wrong), flat).unwrap_err();
    assert!(
        e.contains("Linear<64, 10> expects input [.., 64], got [3, 63]"),
        "{e}"
    );
    let right = Tensor::<Cpu, (Dyn, Dyn)>::from_raw(input::<64>(3, 4).into_raw()).unwrap();
    both(&model, |m| m.any_width(&right), flat).unwrap();
}

#[test]
fn a_reshape_to_dyn_resolves_at_run_time() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let got = both(&model, |m| m.rows_of_twelve(&input::<16>(3, 5)), flat).unwrap();
    assert_eq!(got.len(), 48);
    let e = both(&model, |m| m.rows_of_twelve(&input::<16>(2, 5)), flat).unwrap_err();
    assert!(e.contains("32 is not a multiple of 12"), "{e}");
}

#[test]
fn dyn_operands_broadcast_or_are_refused_alike() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let a = input::<4>(3, 6);
    for rows in [3, 1, 2] {
        let b = input::<4>(rows, 7);
        let _ = both(&model, |m| m.pair_sum(&a, &b), flat);
    }
}

#[model]
pub struct Tied {
    tok: Embedding<16, 8>,
    pos: Embedding<4, 8>,
}

#[model]
impl Tied {
    pub fn embed<const B: usize, const T: usize>(&self, ids: Tensor<B, T, i32>) -> Tensor<B, T, 8> {
        self.tok(ids) + self.pos.positions(ids)
    }

    pub fn scores(&self, h: Tensor<Dyn, Dyn>) -> Tensor<Dyn, 16> {
        self.tok.attend(h)
    }
}

/// Runs `f` on `model` fused and unfused; both must give the same outcome.
fn tied_both<T>(
    model: &Tied<Cpu>,
    f: impl Fn(&Tied<Cpu>) -> Result<T>,
) -> std::result::Result<(), String> {
    model.set_fused(true);
    let fused = f(model).map(|_| ()).map_err(|e| e.to_string());
    model.set_fused(false);
    let unfused = f(model).map(|_| ()).map_err(|e| e.to_string());
    model.set_fused(true);
    assert_eq!(fused, unfused);
    fused
}

#[test]
fn a_const_generic_context_longer_than_the_position_table_is_refused_by_name() {
    let model = Tied::<Cpu>::init(&CpuDevice, 1).unwrap();
    let ids = |t: usize| -> Tensor<Cpu, (Const<1>, Dyn), i32> {
        let raw = RawTensor::<Cpu>::from_vec(vec![1i32; t], &[1, t], &CpuDevice).unwrap();
        Tensor::from_raw(raw).unwrap()
    };
    let fits = |t: usize| {
        let raw = ids(t).into_raw();
        match t {
            4 => tied_both(&model, |m| m.embed::<1, 4>(&Tensor::from_raw(raw.clone())?)),
            _ => tied_both(&model, |m| m.embed::<1, 5>(&Tensor::from_raw(raw.clone())?)),
        }
    };
    fits(4).unwrap();
    let e = fits(5).unwrap_err();
    assert_eq!(
        e,
        "shape mismatch in `positions`: ids [1, 5] hold 5 positions but the position table has 4 rows"
    );
}

#[test]
fn a_tied_head_takes_a_dyn_width_and_checks_it_when_it_runs() {
    let model = Tied::<Cpu>::init(&CpuDevice, 1).unwrap();
    let rows = |w: usize| -> Tensor<Cpu, (Dyn, Dyn)> {
        Tensor::from_raw(input::<1>(3 * w, 9).into_raw().reshape(&[3, w]).unwrap()).unwrap()
    };
    tied_both(&model, |m| m.scores(&rows(8))).unwrap();
    let e = tied_both(&model, |m| m.scores(&rows(7))).unwrap_err();
    assert_eq!(
        e,
        "shape mismatch in `attend`: scores rows of 8 features against its table [16, 8], got [3, 7]"
    );
}

fn raw(dims: &[usize], seed: u64) -> RawTensor<Cpu> {
    let dist = kiln::tensor::RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    RawTensor::<Cpu>::rand(dims, dist, seed, kiln::tensor::DType::F32, &CpuDevice).unwrap()
}

#[test]
fn a_broadcast_that_expands_both_operands_is_refused_when_it_runs() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let pred = |n: usize| Tensor::<Cpu, (Dyn, Const<1>)>::from_raw(raw(&[n, 1], 3)).unwrap();
    let target = |n: usize| Tensor::<Cpu, (Dyn,)>::from_raw(raw(&[n], 4)).unwrap();
    let e = both(&model, |m| m.squared_error(&pred(3), &target(3)), flat).unwrap_err();
    assert_eq!(
        e,
        "shape mismatch in `sub`: broadcasting [3, 1] with [3] expands both operands, to [3, 3], an outer product: give them one shape (`.reshape::<..>()` adds the size-1 axis where it belongs), or, if the outer product is meant, write it with `.broadcast_to::<..>()` on one operand"
    );
    let e = both(&model, |m| m.squared_error(&pred(2), &target(5)), flat).unwrap_err();
    assert!(e.contains("expands both operands, to [2, 5]"), "{e}");
    // One row: nothing is expanded past size 1.
    let one = both(&model, |m| m.squared_error(&pred(1), &target(1)), flat).unwrap();
    assert_eq!(one.len(), 1);
    // The dynamic path refuses it with the same words.
    let lazy = |t: RawTensor<Cpu>| kiln::dynamic::LazyTensor::<Cpu>::from_raw(t);
    let e = match lazy(raw(&[3, 1], 3)).sub(&lazy(raw(&[3], 4))) {
        Ok(_) => panic!("the dynamic path refuses an outer broadcast"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("broadcasting [3, 1] with [3] expands both operands"),
        "{e}"
    );
}

#[test]
fn an_outer_product_written_with_broadcast_to_runs() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let a = Tensor::<Cpu, (Const<3>, Const<1>)>::from_raw(
        RawTensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3, 1], &CpuDevice).unwrap(),
    )
    .unwrap();
    let b = Tensor::<Cpu, (Const<3>,)>::from_raw(
        RawTensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3], &CpuDevice).unwrap(),
    )
    .unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        let d = model.outer_difference::<3>(&a, &b).unwrap();
        assert_eq!(
            flat(&d),
            vec![-9.0, -19.0, -29.0, -8.0, -18.0, -28.0, -7.0, -17.0, -27.0]
        );
    }
    model.set_fused(true);
}

#[test]
fn a_dyn_reshape_keeps_rows_whole_unless_it_regroups() {
    let model = DynNet::<Cpu>::init(&CpuDevice, 1).unwrap();
    let x = |rows: usize, cols: usize| {
        Tensor::<Cpu, (Dyn, Dyn)>::from_raw(raw(&[rows, cols], 8)).unwrap()
    };
    let e = both(&model, |m| m.rows_of_four(&x(2, 10)), flat).unwrap_err();
    assert_eq!(
        e,
        "shape mismatch in `reshape`: reshaping [2, 10] into [5, 4] regroups rows: the result's rows of 4 elements cut across the input's rows of 10 (neither count divides the other); keep rows whole (a count per row that divides 10 or is a multiple of it), or write `.regroup::<..>()` if regrouping rows is meant"
    );
    // Rows split whole, or merged whole, are kept.
    assert_eq!(
        both(&model, |m| m.rows_of_four(&x(2, 12)), flat)
            .unwrap()
            .len(),
        24
    );
    assert_eq!(
        both(&model, |m| m.rows_of_four(&x(4, 2)), flat)
            .unwrap()
            .len(),
        8
    );
    // Written as a regroup, the same reshape runs, on both paths alike.
    let got = both(&model, |m| m.regrouped_rows_of_four(&x(2, 10)), flat).unwrap();
    assert_eq!(got, flat(&x(2, 10)));
    // The typed API keeps the same rule.
    let e = x(2, 10)
        .reshape::<(Dyn, Const<4>)>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("regroups rows"), "{e}");
    x(2, 10).regroup::<(Dyn, Const<4>)>().unwrap();
}
