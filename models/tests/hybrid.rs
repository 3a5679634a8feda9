//! A `#[model]` with a dynamic part, used wrongly at run time: a part that returns
//! another shape or dtype than its call declares, a part that fails on its input, a
//! part that cannot be built by name. Each is one clear error, the same fused, op by op
//! and in a training entry. (That such a model equals the same network all planned is
//! in dynamic_equal.rs.)

use kiln::cpu::{Cpu, CpuDevice};
use kiln::dynamic::{DynamicModule, Layer, LazyTensor};
use kiln::prelude::*;
use kiln::tensor::nn::Mode;
use kiln::tensor::{DType, Result};
use kiln::Module;

mod common;

/// A linear layer `32 -> width` (width a run-time setting; 32 fits the model), its
/// output cast to `dtype`.
#[derive(Module)]
#[module(init = Resize::init_named)]
struct Resize<Be: Backend> {
    fc: Layer<Be>,
    #[module(skip)]
    dtype: DType,
}

impl<Be: Backend> Resize<Be> {
    fn init_named(dev: &Be::Device, seed: u64, prefix: &str) -> Result<Self> {
        Self::with_width(32, 32, dev, seed, prefix)
    }

    fn with_width(
        inputs: usize,
        width: usize,
        dev: &Be::Device,
        seed: u64,
        prefix: &str,
    ) -> Result<Self> {
        Ok(Resize {
            fc: Layer::linear(
                inputs,
                width,
                dev,
                seed,
                &kiln::tensor::nn::join(prefix, "fc"),
            )?,
            dtype: DType::F32,
        })
    }
}

impl<Be: Backend> DynamicModule<Be> for Resize<Be> {
    fn forward(&self, x: &LazyTensor<Be>, mode: Mode) -> Result<LazyTensor<Be>> {
        let y = self.fc.forward(x, mode)?;
        if self.dtype == DType::F32 {
            Ok(y)
        } else {
            y.cast(self.dtype)
        }
    }
}

#[model]
struct Probe {
    input: Linear<8, 32>,
    #[dynamic]
    part: Resize,
}

#[model]
impl Probe {
    fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 32> {
        self.part.forward::<B, 32>(self.input(x))
    }

    fn loss<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor {
        self.forward(x).square().mean_all()
    }
}

/// The error of `forward` and of `loss_and_grad`, fused and op by op: all four equal,
/// returned as one.
fn errors(m: &Probe<Cpu>) -> String {
    let x = Tensor::<Cpu, Rank2<3, 8>>::from_raw(
        RawTensor::from_vec(vec![0.5f32; 24], &[3, 8], &CpuDevice).unwrap(),
    )
    .unwrap();
    let mut seen = Vec::new();
    for fused in [true, false] {
        m.set_fused(fused);
        seen.push(m.forward(&x).expect_err("the part is wrong").to_string());
        seen.push(match m.loss_and_grad(&x) {
            Ok(_) => panic!("the part is wrong"),
            Err(e) => e.to_string(),
        });
    }
    for e in &seen[1..] {
        assert_eq!(e, &seen[0], "every path gives the same error");
    }
    seen.swap_remove(0)
}

#[test]
fn a_part_returning_another_shape_is_refused_naming_both() {
    let mut m = Probe::<Cpu>::init(&CpuDevice, 1).unwrap();
    m.part = Resize::with_width(32, 31, &CpuDevice, 1, "part").unwrap();
    assert_eq!(
        errors(&m),
        "shape mismatch in `call`: `self.part.forward` returned f32 [3, 31], but the call declares f32 [3, 32] ([B, 32])"
    );
}

#[test]
fn a_part_returning_another_dtype_is_refused() {
    let mut m = Probe::<Cpu>::init(&CpuDevice, 1).unwrap();
    m.part.dtype = DType::F64;
    assert_eq!(
        errors(&m),
        "dtype mismatch in `call`: `self.part.forward` returned f64 [3, 32], but the call declares f32 [3, 32] ([B, 32])"
    );
}

#[test]
fn a_part_failing_on_its_input_says_which_part_and_what_it_was_given() {
    let mut m = Probe::<Cpu>::init(&CpuDevice, 1).unwrap();
    m.part = Resize::with_width(16, 32, &CpuDevice, 1, "part").unwrap();
    assert_eq!(
        errors(&m),
        "shape mismatch in `layer`: Linear<16, 32> expects input [.., 16], got [3, 32] (in `self.part.forward`, called on f32 [3, 32])"
    );
}

#[test]
fn a_good_part_trains_and_its_gradients_reach_the_optimizer() {
    use kiln::train::optim::{Optimizer, Sgd, SgdConfig};
    let mut m = Probe::<Cpu>::init(&CpuDevice, 1).unwrap();
    let x = Tensor::<Cpu, Rank2<3, 8>>::from_raw(
        RawTensor::from_vec(
            (0..24).map(|i| i as f32 / 24.0).collect(),
            &[3, 8],
            &CpuDevice,
        )
        .unwrap(),
    )
    .unwrap();
    let mut opt = Sgd::new(SgdConfig {
        lr: 0.1,
        ..SgdConfig::default()
    })
    .unwrap();
    let first = m.loss(&x).unwrap().raw().to_vec::<f32>().unwrap()[0];
    let before = m
        .part
        .fc
        .param("weight")
        .unwrap()
        .value()
        .to_vec::<f32>()
        .unwrap();
    for _ in 0..5 {
        let (_, g) = m.loss_and_grad(&x).unwrap();
        assert!(
            !g.part.is_empty(),
            "the part's backward pass gave its gradients"
        );
        opt.step(&mut m, &g).unwrap();
    }
    let after = m
        .part
        .fc
        .param("weight")
        .unwrap()
        .value()
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(before, after, "the optimizer updated the part's weight");
    let last = m.loss(&x).unwrap().raw().to_vec::<f32>().unwrap()[0];
    assert!(last < first, "the loss fell: {first} -> {last}");
}

/// A dynamic module without `#[module(init = ..)]`.
#[derive(Module)]
struct Bare<Be: Backend> {
    fc: Layer<Be>,
}

impl<Be: Backend> DynamicModule<Be> for Bare<Be> {
    fn forward(&self, x: &LazyTensor<Be>, mode: Mode) -> Result<LazyTensor<Be>> {
        self.fc.forward(x, mode)
    }
}

#[model]
struct Holder {
    #[dynamic]
    bare: Bare,
}

#[model]
impl Holder {
    fn forward<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.bare.forward::<B, 4>(x)
    }
}

#[test]
fn a_part_without_a_builder_by_name_is_refused_at_init() {
    let e = Holder::<Cpu>::init(&CpuDevice, 0)
        .err()
        .expect("refused")
        .to_string();
    assert_eq!(
        e,
        "invalid argument to `init`: `bare` is a dynamic module: build it with its constructor (its sizes are run-time values), or name a function that builds it by name, `#[module(init = path)]` (what a `#[model]` holding it calls)"
    );
}

#[test]
fn summary_and_plans_show_the_call() {
    use kiln_models::hybrid::HybridMlp;
    assert_eq!(
        HybridMlp::<Cpu>::summary(),
        "HybridMlp: 676 parameters outside its dynamic parts; what `forward` calls:
  layer   type               output     params
  input   Linear<16, 32>     [B, 32]       544
  refine  Refiner (dynamic)  [B, 32]  run time
  head    Linear<32, 4>      [B, 4]        132
"
    );
    let report = HybridMlp::<Cpu>::fusion_report().unwrap();
    // The call is a kernel boundary: the layers around it stay fused.
    assert!(
        report.contains("k2   call        [call part 0] (h) -> h[B, 32]"),
        "{report}"
    );
    assert!(report.contains("[backward of part 0]"), "{report}");
}

/// A model holding models that hold a dynamic part: one as a field, two in an array.
#[model]
struct Outer {
    pre: Linear<16, 16>,
    inner: kiln_models::hybrid::HybridMlp,
    pair: [kiln_models::hybrid::HybridMlp; 2],
}

#[model]
impl Outer {
    fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let h = self.pre(x);
        self.inner(h) + self.pair[0](h) + self.pair[1].forward_twice(h)
    }

    fn loss<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor {
        self.forward(x).square().mean_all()
    }
}

#[test]
fn nested_dynamic_parts_get_their_gradients() {
    use kiln::dynamic::Gradients;
    let m = Outer::<Cpu>::init(&CpuDevice, 3).unwrap();
    let x = Tensor::<Cpu, Rank2<2, 16>>::from_raw(
        RawTensor::from_vec(
            (0..32).map(|i| (i as f32).sin()).collect(),
            &[2, 16],
            &CpuDevice,
        )
        .unwrap(),
    )
    .unwrap();
    let (_, g) = m.loss_and_grad(&x).unwrap();
    // Each part's block has six parameters (norm, up and down: weights and biases); the
    // gradients of a part also hold its input's.
    let count = |g: &Gradients<Cpu>| g.len();
    assert!(count(&g.inner.refine) >= 6, "{:?}", g.inner.refine);
    assert!(count(&g.pair[0].refine) >= 6, "{:?}", g.pair[0].refine);
    assert!(count(&g.pair[1].refine) >= 6, "{:?}", g.pair[1].refine);
    // Fused and op by op agree.
    let fused = m.loss(&x).unwrap().raw().to_vec::<f32>().unwrap();
    m.set_fused(false);
    let unfused = m.loss(&x).unwrap().raw().to_vec::<f32>().unwrap();
    assert!((fused[0] - unfused[0]).abs() <= 1e-5 * fused[0].abs().max(1.0));
}

#[test]
fn gradients_through_dynamic_parts_match_finite_differences() {
    let mut model = Outer::<Cpu>::init(&CpuDevice, 4).unwrap();
    let x = Tensor::<Cpu, Rank2<2, 16>>::from_raw(
        RawTensor::from_vec(
            (0..32).map(|i| (i as f32 * 0.7).cos()).collect(),
            &[2, 16],
            &CpuDevice,
        )
        .unwrap(),
    )
    .unwrap();
    let (_, grads) = model.loss_and_grad(&x).unwrap();
    let at = [
        ("pre.weight", 21),
        ("inner.input.weight", 40),
        ("inner.refine.block.up.weight", 100),
        ("inner.refine.block.norm.bias", 3),
        ("pair.0.refine.block.down.bias", 7),
        ("pair.1.refine.block.up.weight", 9),
        ("pair.1.head.bias", 1),
    ];
    common::check_finite_differences(&mut model, &grads, &at, 1e-5, |m| {
        m.loss(&x).unwrap().raw().to_vec::<f32>().unwrap()[0]
    });
}
