//! The static path (`#[model]`) against the dynamic path (`kiln_models::dynamic`) on
//! any backend: for each model of the crate, the same initial parameters, outputs,
//! loss, gradients, batch-norm statistics, and parameters after three optimizer steps.
//! Shared by models/tests/dynamic_equal.rs (CPU) and
//! models/gpu-system/tests/dynamic_equal_wgpu.rs (wgpu).
//!
//! Tolerance: |dynamic − static| ≤ 1e-4 + 1e-3·|static| per element. Both paths run
//! the same graph through the same planner, but the static path's fused loops are
//! compiled by rustc and the dynamic path's run in the backend's interpreter or JIT,
//! which may round differently (exp, tanh), and three optimizer steps carry that on.

use kiln::dynamic::{Gradients, LazyTensor};
use kiln::prelude::*;
use kiln::tensor::nn::{step_seed, Mode, Slot};
use kiln::tensor::{DType, RandDist};
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln_models::dynamic::{
    DynamicAttention, DynamicGpt, DynamicLeNet, DynamicMlp, DynamicResidualMlp,
};
use kiln_models::hybrid::HybridMlp;
use kiln_models::lenet::LeNet;
use kiln_models::mlp::Mlp;
use kiln_models::parts::ResidualMlp;

#[path = "../../src/gpt_instances.rs"]
mod gpt_instances;
use gpt_instances::TinyGpt;

/// Causal self-attention of width 16 in two heads.
#[model]
type Attention = kiln_models::parts::CausalSelfAttention<16, 2>;

/// The refiner at depth one, as a `#[model]`: `refine.block` is a `ResidualMlp`.
#[model]
pub struct StaticRefiner {
    block: ResidualMlp,
}

#[model]
impl StaticRefiner {
    /// The block, once.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
        self.block(x)
    }
}

/// [`HybridMlp`] all planned at build time (its refiner at depth one): the twin the
/// hybrid checks hold it equal to.
#[model]
pub struct StaticHybridMlp {
    input: Linear<16, 32>,
    refine: StaticRefiner,
    head: Linear<32, 4>,
}

#[model]
impl StaticHybridMlp {
    /// The prediction for a batch of rows.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let h = self.input(x).relu();
        let h = self.refine(h);
        self.head(h)
    }

    /// Mean squared error against `y`.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, 4>) -> Tensor {
        (self.forward(x) - y).square().mean_all()
    }

    /// [`HybridMlp::forward_twice`], planned.
    pub fn forward_twice<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let h = self.input(x).relu();
        let r = self.refine(h);
        self.head(self.refine(r + h))
    }

    /// Mean squared error of `forward_twice` against `y`.
    pub fn loss_twice<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, 4>) -> Tensor {
        (self.forward_twice(x) - y).square().mean_all()
    }

    /// The refiner at depth two: the block applied twice.
    pub fn forward_deep<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let h = self.input(x).relu();
        self.head(self.refine(self.refine(h)))
    }

    /// Mean squared error of `forward_deep` against `y`.
    pub fn loss_deep<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, 4>) -> Tensor {
        (self.forward_deep(x) - y).square().mean_all()
    }
}

/// `(name, values)` of every parameter (and buffer, when `buffers`).
type Named = Vec<(String, Vec<f32>)>;

/// Checks `got` against `want` within the stated tolerance.
pub fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 + 1e-3 * w.abs();
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: dynamic {g} vs static {w}"
        );
    }
}

fn close_named(what: &str, got: &Named, want: &Named) {
    let names = |v: &Named| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}: names differ");
    for ((n, g), (_, w)) in got.iter().zip(want) {
        close(&format!("{what} {n}"), g, w);
    }
}

fn params<B: Backend, M: Module<B>>(m: &M, buffers: bool) -> Named {
    let mut out = Vec::new();
    let mut push =
        |s: Slot<'_, B>| out.push((s.name.to_string(), s.value.to_vec::<f32>().unwrap()));
    m.visit_params("", &mut push);
    if buffers {
        m.visit_buffers("", &mut push);
    }
    out
}

/// Every gradient by parameter name.
fn grads<B: Backend, M: Module<B>>(m: &mut M, g: &M::Grads) -> Named {
    let named = kiln::train::parallel::named_grads(m, g)
        .unwrap()
        .into_iter();
    named
        .map(|(name, g)| (name, g.to_vec::<f32>().unwrap()))
        .collect()
}

/// One training step compared: the static loss `sl` and gradients `sg` against the
/// dynamic loss `dl` and the gradients its `backward()` gives; then each model takes
/// its optimizer's step.
fn compare_and_step<
    B: Backend,
    S: Module<B>,
    D: Module<B, Grads = Gradients<B>>,
    O: Optimizer<B>,
>(
    step: u64,
    (s, so, sl, sg): (&mut S, &mut O, &Tensor<B, (), f32>, &S::Grads),
    (d, dopt, dl): (&mut D, &mut O, &LazyTensor<B>),
) {
    let dg = dl.backward().unwrap();
    close(
        &format!("step {step} loss"),
        &dl.to_vec::<f32>().unwrap(),
        &sl.raw().to_vec::<f32>().unwrap(),
    );
    close_named(
        &format!("step {step} gradient"),
        &grads(d, &dg),
        &grads(s, sg),
    );
    so.step(s, sg).unwrap();
    dopt.step(d, &dg).unwrap();
}

fn normal<B: Backend>(dims: &[usize], seed: u64, dev: &B::Device) -> RawTensor<B> {
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    RawTensor::rand(dims, dist, seed, DType::F32, dev).unwrap()
}

fn labels<B: Backend>(n: usize, classes: i32, seed: u64, dev: &B::Device) -> RawTensor<B> {
    let v: Vec<i32> = (0..n)
        .map(|i| ((i as u64 * 7 + seed) % classes as u64) as i32)
        .collect();
    RawTensor::from_vec(v, &[n], dev).unwrap()
}

fn sgd<B: Backend>() -> Sgd<B> {
    Sgd::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })
    .unwrap()
}

fn lazy<B: Backend>(t: &RawTensor<B>) -> LazyTensor<B> {
    LazyTensor::from_raw(t.clone())
}

/// The MNIST MLP: initial parameters, logits, loss and gradients, three SGD steps.
pub fn mlp<B: Backend>(dev: &B::Device, seed: u64) {
    let mut s = Mlp::<B>::init(dev, seed).unwrap();
    let mut d = DynamicMlp::<B>::new(784, 1024, 10, dev, seed).unwrap();
    assert_eq!(params(&d, false), params(&s, false), "initial parameters");
    let (mut so, mut dopt) = (sgd::<B>(), sgd::<B>());
    for step in 0..3 {
        let x = normal::<B>(&[4, 784], seed + step, dev);
        let y = labels::<B>(4, 10, seed + step, dev);
        let (xt, yt) = (
            Tensor::<B, Rank2<4, 784>>::from_raw(x.clone()).unwrap(),
            Tensor::<B, (Const<4>,), i32>::from_raw(y.clone()).unwrap(),
        );
        if step == 0 {
            let want = s.forward(&xt).unwrap().raw().to_vec::<f32>().unwrap();
            close(
                "logits",
                &d.forward(&lazy(&x)).unwrap().to_vec::<f32>().unwrap(),
                &want,
            );
        }
        let (sl, sg) = s.loss_and_grad(&xt, &yt).unwrap();
        let dl = d.loss(&lazy(&x), &lazy(&y)).unwrap();
        compare_and_step(step, (&mut s, &mut so, &sl, &sg), (&mut d, &mut dopt, &dl));
    }
    close_named(
        "parameters after 3 steps",
        &params(&d, false),
        &params(&s, false),
    );
}

/// The CNN in training mode (batch statistics, dropout masks): loss, gradients, running
/// statistics, three SGD steps.
pub fn lenet<B: Backend>(dev: &B::Device, seed: u64) {
    let mut s = LeNet::<B>::init(dev, seed).unwrap();
    let mut d = DynamicLeNet::<B>::new(dev, seed).unwrap();
    assert_eq!(
        params(&d, true),
        params(&s, true),
        "initial parameters and buffers"
    );
    let (mut so, mut dopt) = (sgd::<B>(), sgd::<B>());
    for step in 0..3u64 {
        let x = normal::<B>(&[2, 1, 28, 28], seed + step, dev);
        let y = labels::<B>(2, 10, seed + step, dev);
        let (xt, yt) = (
            Tensor::<B, Rank4<2, 1, 28, 28>>::from_raw(x.clone()).unwrap(),
            Tensor::<B, (Const<2>,), i32>::from_raw(y.clone()).unwrap(),
        );
        let (sl, sg) = s.loss_and_grad(&xt, &yt).unwrap();
        // A `#[model]`'s step counter starts at its init seed.
        let mode = Mode::Train {
            seed: step_seed(seed + step),
        };
        let dl = d.loss(&lazy(&x), &lazy(&y), mode).unwrap();
        compare_and_step(step, (&mut s, &mut so, &sl, &sg), (&mut d, &mut dopt, &dl));
    }
    close_named(
        "parameters and statistics after 3 steps",
        &params(&d, true),
        &params(&s, true),
    );
    let x = normal::<B>(&[2, 1, 28, 28], seed + 9, dev);
    let want = s
        .forward(&Tensor::<B, Rank4<2, 1, 28, 28>>::from_raw(x.clone()).unwrap())
        .unwrap();
    let got = kiln::dynamic::no_grad(|| {
        d.forward(&lazy(&x), Mode::Eval)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    });
    close(
        "evaluation logits",
        &got,
        &want.raw().to_vec::<f32>().unwrap(),
    );
}

/// The residual MLP part: its output.
pub fn residual<B: Backend>(dev: &B::Device, seed: u64) {
    let s = ResidualMlp::<B>::init(dev, seed).unwrap();
    let d = DynamicResidualMlp::<B>::new(32, dev, seed, "").unwrap();
    assert_eq!(params(&d, false), params(&s, false), "initial parameters");
    let x = normal::<B>(&[3, 32], seed, dev);
    let want = s
        .forward(&Tensor::<B, Rank2<3, 32>>::from_raw(x.clone()).unwrap())
        .unwrap();
    close(
        "output",
        &d.forward(&lazy(&x)).unwrap().to_vec::<f32>().unwrap(),
        &want.raw().to_vec::<f32>().unwrap(),
    );
}

/// Causal self-attention: output, gradients of an MSE loss, three SGD steps.
pub fn attention<B: Backend>(dev: &B::Device, seed: u64) {
    type Seq = (Const<2>, Const<5>, Const<16>);
    let mut s = Attention::<B>::init(dev, seed).unwrap();
    let mut d = DynamicAttention::<B>::new(16, 2, dev, seed, "").unwrap();
    assert_eq!(params(&d, false), params(&s, false), "initial parameters");
    let (mut so, mut dopt) = (sgd::<B>(), sgd::<B>());
    for step in 0..3 {
        let x = normal::<B>(&[2, 5, 16], seed + step, dev);
        let t = normal::<B>(&[2, 5, 16], seed + step + 100, dev);
        let (xt, tt) = (
            Tensor::<B, Seq>::from_raw(x.clone()).unwrap(),
            Tensor::<B, Seq>::from_raw(t.clone()).unwrap(),
        );
        if step == 0 {
            let want = s.forward(&xt).unwrap().raw().to_vec::<f32>().unwrap();
            close(
                "output",
                &d.forward(&lazy(&x)).unwrap().to_vec::<f32>().unwrap(),
                &want,
            );
        }
        let (sl, sg) = s.loss_and_grad(&xt, &tt).unwrap();
        let y = d.forward(&lazy(&x)).unwrap();
        let dl = y.ops().mse(&y, &lazy(&t)).unwrap();
        compare_and_step(step, (&mut s, &mut so, &sl, &sg), (&mut d, &mut dopt, &dl));
    }
    close_named(
        "parameters after 3 steps",
        &params(&d, false),
        &params(&s, false),
    );
}

/// The tiny GPT in training mode (dropout masks included): loss, gradients, three
/// AdamW steps.
pub fn gpt<B: Backend>(dev: &B::Device, seed: u64) {
    let mut s = TinyGpt::<B>::init(dev, seed).unwrap();
    let mut d = DynamicGpt::<B>::new(16, 2, 2, 32, dev, seed).unwrap();
    assert_eq!(params(&d, false), params(&s, false), "initial parameters");
    // eps 1e-3, not 1e-8: the key bias's gradient is zero in exact arithmetic (softmax
    // ignores a shift shared by all keys), so with a tiny eps AdamW would move it by
    // ±lr in the direction of each path's rounding noise (seen on NVIDIA's Vulkan
    // driver); with this eps noise moves it by noise, real gradients by about lr.
    let adamw = || {
        AdamW::<B>::new(AdamWConfig {
            lr: 0.01,
            eps: 1e-3,
            ..AdamWConfig::default()
        })
        .unwrap()
    };
    let (mut so, mut dopt) = (adamw(), adamw());
    for step in 0..3u64 {
        let ids: Vec<i32> = (0..2 * 7)
            .map(|i| ((i as u64 * 31 + seed + step) % 256) as i32)
            .collect();
        let next: Vec<i32> = ids.iter().map(|v| (v + 1) % 256).collect();
        let (ids, next) = (
            RawTensor::<B>::from_vec(ids, &[2, 7], dev).unwrap(),
            RawTensor::<B>::from_vec(next, &[2, 7], dev).unwrap(),
        );
        let (it, nt) = (
            Tensor::<B, (Const<2>, Const<7>), i32>::from_raw(ids.clone()).unwrap(),
            Tensor::<B, (Const<2>, Const<7>), i32>::from_raw(next.clone()).unwrap(),
        );
        let (sl, sg) = s.loss_and_grad(&it, &nt).unwrap();
        let dl = d
            .loss(
                &lazy(&ids),
                &lazy(&next),
                Mode::Train {
                    seed: step_seed(seed + step),
                },
            )
            .unwrap();
        compare_and_step(step, (&mut s, &mut so, &sl, &sg), (&mut d, &mut dopt, &dl));
    }
    close_named(
        "parameters after 3 steps",
        &params(&d, false),
        &params(&s, false),
    );
}

/// Which methods of the hybrid MLP a check runs: the refiner once at depth one, twice
/// at depth one (two call sites), or once at depth two (`StaticHybridMlp`'s
/// `forward_deep`).
#[derive(Clone, Copy, Debug)]
pub enum HybridCase {
    /// `forward` / `loss`, depth one.
    Once,
    /// `forward_twice` / `loss_twice`, depth one.
    Twice,
    /// `forward` / `loss` at depth two, against `forward_deep` / `loss_deep`.
    Deep,
}

/// A `#[model]` holding a dynamic part (`HybridMlp`) against the same network all
/// planned (`StaticHybridMlp`): initial parameters, outputs fused and op by op, loss
/// and every gradient (the part's from its own backward pass), three SGD steps.
pub fn hybrid<B: Backend>(dev: &B::Device, seed: u64, case: HybridCase) {
    type X = Rank2<5, 16>;
    type Y = Rank2<5, 4>;
    let mut s = StaticHybridMlp::<B>::init(dev, seed).unwrap();
    let mut h = HybridMlp::<B>::init(dev, seed).unwrap();
    if let HybridCase::Deep = case {
        h.refiner_mut().set_depth(2);
    }
    assert_eq!(params(&h, false), params(&s, false), "initial parameters");
    let (mut so, mut ho) = (sgd::<B>(), sgd::<B>());
    for step in 0..3 {
        let x = Tensor::<B, X>::from_raw(normal::<B>(&[5, 16], seed + step, dev)).unwrap();
        let y = Tensor::<B, Y>::from_raw(normal::<B>(&[5, 4], seed + 100 + step, dev)).unwrap();
        let forward_s = |s: &StaticHybridMlp<B>| match case {
            HybridCase::Once => s.forward(&x),
            HybridCase::Twice => s.forward_twice(&x),
            HybridCase::Deep => s.forward_deep(&x),
        };
        let forward_h = |h: &HybridMlp<B>| match case {
            HybridCase::Once | HybridCase::Deep => h.forward(&x),
            HybridCase::Twice => h.forward_twice(&x),
        };
        if step == 0 {
            let want = forward_s(&s).unwrap().raw().to_vec::<f32>().unwrap();
            for fused in [true, false] {
                h.set_fused(fused);
                let got = forward_h(&h).unwrap().raw().to_vec::<f32>().unwrap();
                close(&format!("output (fused: {fused})"), &got, &want);
            }
        }
        let (sl, sg) = match case {
            HybridCase::Once => s.loss_and_grad(&x, &y),
            HybridCase::Twice => s.loss_twice_and_grad(&x, &y),
            HybridCase::Deep => s.loss_deep_and_grad(&x, &y),
        }
        .unwrap();
        // Every other step op by op: both paths call the part the same way.
        h.set_fused(step % 2 == 0);
        let (hl, hg) = match case {
            HybridCase::Once | HybridCase::Deep => h.loss_and_grad(&x, &y),
            HybridCase::Twice => h.loss_twice_and_grad(&x, &y),
        }
        .unwrap();
        close(
            &format!("step {step} loss"),
            &hl.raw().to_vec::<f32>().unwrap(),
            &sl.raw().to_vec::<f32>().unwrap(),
        );
        close_named(
            &format!("step {step} gradient"),
            &grads(&mut h, &hg),
            &grads(&mut s, &sg),
        );
        so.step(&mut s, &sg).unwrap();
        ho.step(&mut h, &hg).unwrap();
    }
    close_named(
        "parameters after 3 steps",
        &params(&h, false),
        &params(&s, false),
    );
}
