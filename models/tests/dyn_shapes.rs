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
        (x * 2.0).reshape::<Dyn, 12>()
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
