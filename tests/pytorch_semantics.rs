//! Where the op table's rules meet the edges PyTorch defines: NaN and infinite inputs,
//! dtypes an op cannot average, windows made only of padding, batch statistics of one
//! value. Each expectation is PyTorch 2's behaviour on the same input (its
//! `derivatives.yaml` rules for the gradients), or its refusal.

use kiln::autodiff::Tape;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::nn::{LayerSpec, Mode};
use kiln::tensor::{BinaryOp, BuilderExt, DType, Eager, RawTensor, UnaryOp};

fn f32s(v: &[f32], dims: &[usize]) -> RawTensor<Cpu> {
    RawTensor::from_vec(v.to_vec(), dims, &CpuDevice).unwrap()
}

fn values(t: &RawTensor<Cpu>) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn relu_passes_the_gradient_of_a_nan() {
    let mut tape = Tape::<Cpu>::new(CpuDevice);
    let x = tape.leaf(f32s(&[f32::NAN, 2.0, -1.0, 0.0], &[4]));
    let y = tape.unary(UnaryOp::Relu, &x).unwrap();
    let s = tape.sum_all(&y).unwrap();
    let g = tape.gradients(&s).unwrap();
    // threshold_backward: zero where x <= 0, the gradient elsewhere (NaN included).
    assert_eq!(values(g.get(&x).unwrap()), vec![1.0, 1.0, 0.0, 0.0]);
}

#[test]
fn maximum_and_minimum_give_a_nan_pair_the_whole_gradient() {
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let mut tape = Tape::<Cpu>::new(CpuDevice);
        let a = tape.leaf(f32s(&[f32::NAN, 1.0, 2.0, 3.0], &[4]));
        let b = tape.leaf(f32s(&[1.0, f32::NAN, 2.0, 1.0], &[4]));
        let y = tape.binary(op, &a, &b).unwrap();
        let s = tape.sum_all(&y).unwrap();
        let g = tape.gradients(&s).unwrap();
        let (ga, gb) = (values(g.get(&a).unwrap()), values(g.get(&b).unwrap()));
        // NaN on either side: both whole; a tie: halves; else the winner.
        let (wa, wb) = if op == BinaryOp::Max {
            (vec![1.0, 1.0, 0.5, 1.0], vec![1.0, 1.0, 0.5, 0.0])
        } else {
            (vec![1.0, 1.0, 0.5, 0.0], vec![1.0, 1.0, 0.5, 1.0])
        };
        assert_eq!((ga, gb), (wa, wb), "{op:?}");
    }
}

#[test]
fn logsumexp_of_an_infinite_row_is_that_infinity() {
    let mut e = Eager::<Cpu>::new(CpuDevice);
    let x = f32s(
        &[
            f32::INFINITY,
            1.0,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            1.0,
            2.0,
        ],
        &[3, 2],
    );
    let r = values(&e.logsumexp(&x, 1, false).unwrap());
    assert_eq!(r[0], f32::INFINITY);
    assert_eq!(r[1], f32::NEG_INFINITY);
    let want = (1f32.exp() + 2f32.exp()).ln();
    assert!((r[2] - want).abs() < 1e-6, "{} vs {want}", r[2]);
}

#[test]
fn log_softmax_of_a_row_holding_inf_is_nan_as_softmax_is() {
    let mut e = Eager::<Cpu>::new(CpuDevice);
    let rows = [
        [f32::INFINITY, 1.0, -2.0],
        [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY],
        [f32::NEG_INFINITY, 0.0, 0.0],
    ];
    let x = f32s(&rows.concat(), &[3, 3]);
    let log_p = values(&e.log_softmax(&x, 1).unwrap());
    let p = values(&e.softmax(&x, 1).unwrap());
    // PyTorch: torch.log_softmax([inf, 1, -2]) and of an all -inf row are all NaN.
    for (r, row) in rows.iter().enumerate().take(2) {
        assert!(
            log_p[r * 3..r * 3 + 3].iter().all(|v| v.is_nan()),
            "{row:?}: {log_p:?}"
        );
        assert!(
            p[r * 3..r * 3 + 3].iter().all(|v| v.is_nan()),
            "{row:?}: {p:?}"
        );
    }
    // A masked entry beside finite ones is -inf, the others log(1/2).
    assert_eq!(log_p[6], f32::NEG_INFINITY);
    for v in &log_p[7..] {
        assert!((v - 0.5f32.ln()).abs() < 1e-6, "{log_p:?}");
    }
}

#[test]
fn mean_refuses_integers() {
    let mut e = Eager::<Cpu>::new(CpuDevice);
    let x = RawTensor::<Cpu>::from_vec(vec![1i32, 2, 4], &[3], &CpuDevice).unwrap();
    let err = e.mean_all(&x).unwrap_err().to_string();
    assert!(err.contains("averages floats, not i32"), "{err}");
}

#[test]
fn pooling_refuses_padding_past_half_the_kernel() {
    let mut e = Eager::<Cpu>::new(CpuDevice);
    let x = RawTensor::<Cpu>::zeros(&[1, 1, 4, 4], DType::F32, &CpuDevice).unwrap();
    let err = e
        .max_pool2d(&x, [2, 2], [1, 1], [2, 2])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_pool2d") && err.contains("more than half"),
        "{err}"
    );
    assert!(e.avg_pool2d(&x, [3, 3], [1, 1], [2, 2]).is_err());
    // Half the kernel is allowed.
    assert!(e.max_pool2d(&x, [2, 2], [1, 1], [1, 1]).is_ok());
}

#[test]
fn batch_norm_training_needs_more_than_one_value_per_channel() {
    let spec = LayerSpec::BatchNorm2d { channels: 2 };
    let params: Vec<RawTensor<Cpu>> = [[1.0f32, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
        .iter()
        .map(|v| f32s(v, &[2]))
        .collect();
    let refs: Vec<&RawTensor<Cpu>> = params.iter().collect();
    let mut e = Eager::<Cpu>::new(CpuDevice);
    let one = RawTensor::<Cpu>::zeros(&[1, 2, 1, 1], DType::F32, &CpuDevice).unwrap();
    let train = Mode::Train { seed: 0 };
    let err = spec
        .forward(&mut e, &refs, &one, train)
        .err()
        .expect("one value per channel is refused")
        .to_string();
    assert!(err.contains("more than one value per channel"), "{err}");
    // Evaluation uses the running statistics: one value is fine.
    assert!(spec.forward(&mut e, &refs, &one, Mode::Eval).is_ok());
    let two = RawTensor::<Cpu>::zeros(&[2, 2, 1, 1], DType::F32, &CpuDevice).unwrap();
    assert!(spec.forward(&mut e, &refs, &two, train).is_ok());
}
