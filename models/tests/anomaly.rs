//! Anomaly mode (`kiln::tensor::anomaly`): off, a NaN flows silently to the output as
//! in any framework; on, the planned path (fused or not) and the dynamic path each
//! stop at the first op whose output is not finite and name it, its node, and the
//! parameters of its layer; an input or parameter that holds one is named as given,
//! not computed. One test function: the mode is process-wide.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::dynamic::{Layer, LazyTensor};
use kiln::prelude::*;
use kiln::tensor::anomaly::set_detect;
use kiln::tensor::nn::Mode;

const DEV: CpuDevice = CpuDevice;

/// Two layers and a square root, which a negative value of `fc2`'s output makes NaN.
#[model]
struct Probe {
    fc1: Linear<4, 8>,
    fc2: Linear<8, 3>,
}

#[model]
impl Probe {
    /// The square roots of the second layer's outputs.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 3> {
        let h = self.fc1(x).relu();
        let z = self.fc2(h);
        z.sqrt()
    }
}

/// Causal weights over a sequence, not followed by values (so they stay the mask and
/// softmax written, not the fused attention op).
#[model]
struct MaskProbe {
    q: Linear<4, 4>,
}

#[model]
impl MaskProbe {
    /// Each position's causal weights over the positions up to it.
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, 4>) -> Tensor<B, T, T> {
        self.q(x).matmul(x.t()).causal_mask().softmax()
    }
}

fn input(values: Vec<f32>) -> Tensor<Cpu, Rank2<2, 4>> {
    Tensor::from_vec(values, &[2, 4], &DEV).unwrap()
}

fn nan_count(v: &[f32]) -> usize {
    v.iter().filter(|x| x.is_nan()).count()
}

#[test]
fn anomaly_mode_names_the_first_non_finite_op_on_every_path() {
    let model = Probe::<Cpu>::init(&DEV, 3).unwrap();
    let x = input((0..8).map(|i| i as f32 * 0.7 - 2.0).collect());

    // Off: NaN reaches the output and nobody says a word.
    set_detect(false);
    let out = model.forward::<2>(&x).unwrap().to_vec().unwrap();
    assert!(nan_count(&out) > 0, "the probe must produce NaN: {out:?}");

    // On, fused and op by op: the same error, naming `sqrt` and fc2's parameters.
    set_detect(true);
    for fused in [true, false] {
        model.set_fused(fused);
        let e = model.forward::<2>(&x).unwrap_err().to_string();
        assert!(
            e.starts_with("anomaly: `sqrt` is the first op whose output is not finite: NaN at"),
            "{e}"
        );
        assert!(
            e.contains("in f32 [2, 3]") && e.contains("its inputs are finite"),
            "{e}"
        );
        assert!(
            e.contains("`fc2_bias`") && e.contains("`fc2_weight`"),
            "{e}"
        );
        assert!(!e.contains("fc1_"), "only the nearest layer is named: {e}");
    }
    model.set_fused(true);

    // On, with finite values throughout: the same result as with it off.
    let calm = input(vec![0.1; 8]);
    let on = model.forward::<2>(&calm);
    set_detect(false);
    let off = model.forward::<2>(&calm).unwrap().to_vec().unwrap();
    match on {
        Ok(on) => {
            let on = on.to_vec().unwrap();
            for (a, b) in on.iter().zip(&off) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{on:?} vs {off:?}"
                );
            }
        }
        Err(e) => assert!(
            nan_count(&off) > 0,
            "anomaly mode refused finite values: {e}"
        ),
    }

    // A NaN in the input is named as given, before any op.
    set_detect(true);
    let mut bad = vec![0.5f32; 8];
    bad[5] = f32::NAN;
    let e = model
        .forward::<2>(&input(bad.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`x` holds NaN at [1, 1]") && e.contains("before any op ran"),
        "{e}"
    );

    // The dynamic path: the error comes from the op that made the value, and names the
    // parameters of the layer before it by their checkpoint names.
    let fc1 = Layer::<Cpu>::linear(4, 8, &DEV, 3, "fc1").unwrap();
    let fc2 = Layer::<Cpu>::linear(8, 3, &DEV, 3, "fc2").unwrap();
    let lazy_x = LazyTensor::<Cpu>::from_vec(
        (0..8).map(|i| i as f32 * 0.7 - 2.0).collect(),
        &[2, 4],
        &DEV,
    )
    .unwrap();
    let h = fc1.forward(&lazy_x, Mode::Eval).unwrap().relu().unwrap();
    let z = fc2.forward(&h, Mode::Eval).unwrap();
    let e = z.sqrt().unwrap_err().to_string();
    assert!(
        e.starts_with("anomaly: `sqrt` is the first op whose output is not finite: NaN at"),
        "{e}"
    );
    assert!(e.contains("after layer `fc2`"), "{e}");
    assert!(
        e.contains("`fc2.bias`") && e.contains("`fc2.weight`"),
        "{e}"
    );
    // Inside a layer: a product that overflows (finite inputs, an infinite output) is
    // named as the layer's.
    let big = LazyTensor::<Cpu>::from_vec(vec![3e38f32; 8], &[2, 4], &DEV).unwrap();
    let e = fc1.forward(&big, Mode::Eval).unwrap_err().to_string();
    assert!(
        e.starts_with("anomaly: `matmul` is the first op whose output is not finite: inf at"),
        "{e}"
    );
    assert!(
        e.contains("in layer `fc1`") && e.contains("`fc1.weight`"),
        "{e}"
    );
    // A NaN input on the dynamic path is named as given.
    let nan_x = LazyTensor::<Cpu>::from_vec(bad, &[2, 4], &DEV).unwrap();
    let e = fc1.forward(&nan_x, Mode::Eval).unwrap_err().to_string();
    assert!(
        e.contains("holds NaN at [1, 1]") && e.contains("not computed there"),
        "{e}"
    );

    // The planned path names the layer an op belongs to, as the dynamic path does.
    let big = input(vec![3e38; 8]);
    for fused in [true, false] {
        model.set_fused(fused);
        let e = model.forward::<2>(&big).unwrap_err().to_string();
        assert!(
            e.starts_with("anomaly: `matmul` is the first op whose output is not finite: inf at"),
            "{e}"
        );
        assert!(e.contains(", in layer `fc1`)"), "{e}");
    }
    model.set_fused(true);

    // A causal mask is intended, not a fault: planned and dynamic, a GPT's masked scores
    // pass (the mask pushes scores down by the largest finite value, not to -inf).
    let probe = MaskProbe::<Cpu>::init(&DEV, 5).unwrap();
    let seq = Tensor::<Cpu, (Const<2>, Const<6>, Const<4>)>::normal(0.0, 1.0, 6, &DEV).unwrap();
    for fused in [true, false] {
        probe.set_fused(fused);
        let w = probe.forward(&seq).unwrap().to_vec().unwrap();
        assert_eq!(w[1], 0.0, "the first position sees only itself: {w:?}");
    }
    let gpt = kiln_models::dynamic::DynamicGpt::<Cpu>::new(16, 2, 2, 32, &DEV, 1).unwrap();
    let ids: Vec<i32> = (0..14).map(|i| i * 31 % 256).collect();
    let next: Vec<i32> = ids.iter().map(|v| (v + 1) % 256).collect();
    let (ids, next) = (
        LazyTensor::<Cpu>::from_vec(ids, &[2, 7], &DEV).unwrap(),
        LazyTensor::<Cpu>::from_vec(next, &[2, 7], &DEV).unwrap(),
    );
    let loss = gpt.loss(&ids, &next, Mode::Train { seed: 3 }).unwrap();
    assert!(loss.to_vec::<f32>().unwrap()[0].is_finite());

    set_detect(false);
    let z = fc2.forward(&h, Mode::Eval).unwrap().sqrt().unwrap();
    assert!(nan_count(&z.to_vec::<f32>().unwrap()) > 0);
}
