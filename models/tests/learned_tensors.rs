//! Learned tensors held without a layer (`cls: Param<1, 16>`): named by their field,
//! initialised, counted by `summary()`, differentiated (checked against finite
//! differences), equal on the planned and the op-by-op path, trained and checkpointed
//! like a layer's parameters; in a nested model, an array and a model with sizes.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;

mod common;
use common::check_finite_differences;
use kiln::tensor::nn::Module;
use kiln::tensor::RawTensor;

/// A class token prepended by hand (a ViT's first step), a learned scale and a
/// learned per-feature shift.
#[model]
pub struct Tokens {
    embed: Linear<4, 16>,
    cls: Param<1, 1, 16>,
    scale: Param<1>,
    shifts: [Param<16>; 2],
    head: Linear<16, 3>,
}

#[model]
impl Tokens {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 6, 4>) -> Tensor<B, 3> {
        let h = self.embed(x) + self.shifts[0];
        let pooled = h.mean::<1>() * self.scale + self.cls.reshape::<1, 16>();
        let mut out = pooled;
        for shift in &self.shifts {
            out = out + shift;
        }
        self.head(out)
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, 6, 4>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

mod parts {
    use kiln::prelude::*;

    /// A block holding a learned gate of its own.
    #[model]
    pub struct Gated<const D: usize> {
        fc: Linear<D, D>,
        gate: Param<D>,
    }

    #[model]
    impl<const D: usize> Gated<D> {
        pub fn forward<const B: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
            x + self.fc(x) * self.gate.sigmoid()
        }
    }
}

/// A model with sizes holding a learned tensor sized by them, and a nested one.
#[model]
pub struct Widths<const D: usize, const C: usize> {
    embed: Linear<4, D>,
    bias: Param<C>,
    block: parts::Gated<D>,
    head: Linear<D, C>,
}

#[model]
impl<const D: usize, const C: usize> Widths<D, C> {
    pub fn loss<const B: usize>(&self, x: Tensor<B, 4>, y: Tensor<B, i32>) -> Tensor {
        (self.head(self.block(self.embed(x))) + self.bias).cross_entropy(y)
    }
}

#[model]
type SixteenWide = Widths<16, 3>;

fn batch<const B: usize>(
    seed: u64,
) -> (Tensor<Cpu, Rank3<B, 6, 4>>, Tensor<Cpu, (Const<B>,), i32>) {
    let x = Tensor::<Cpu, Rank3<B, 6, 4>>::normal(0.0, 1.0, seed, &CpuDevice).unwrap();
    let y = Tensor::from_vec((0..B as i32).map(|i| i % 3).collect(), &[B], &CpuDevice).unwrap();
    (x, y)
}

fn values(t: &RawTensor<Cpu>) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn named(model: &impl Module<Cpu>) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    model.visit_params("", &mut |s| {
        out.push((
            s.name.to_string(),
            s.value.dims().as_slice().to_vec(),
            values(s.value),
        ))
    });
    out
}

#[test]
fn a_learned_tensor_is_named_by_its_field_and_starts_small_and_drawn() {
    let model = Tokens::<Cpu>::init(&CpuDevice, 1).unwrap();
    let params = named(&model);
    let names: Vec<&str> = params.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "embed.weight",
            "embed.bias",
            "cls",
            "scale",
            "shifts.0",
            "shifts.1",
            "head.weight",
            "head.bias"
        ]
    );
    let cls = &params[2];
    assert_eq!(cls.1, [1, 1, 16]);
    let std = (cls.2.iter().map(|v| v * v).sum::<f32>() / 16.0).sqrt();
    assert!(
        (0.005..0.05).contains(&std),
        "the class token's spread is {std}, not about 0.02"
    );
    // Each is drawn from its own name.
    assert_ne!(params[4].2, params[5].2);
    assert_eq!(
        model.num_params(),
        4 * 16 + 16 + 16 + 1 + 2 * 16 + 16 * 3 + 3
    );
}

#[test]
fn summary_lists_and_counts_learned_tensors() {
    let text = Tokens::<Cpu>::summary();
    assert!(text.starts_with("Tokens: 180 parameters"), "{text}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("cls"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("Param<1, 1, 16>")
            && line.contains("[1, 1, 16]")
            && line.trim_end().ends_with("16"),
        "{line}"
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("shifts.1")),
        "{text}"
    );
}

#[test]
fn gradients_of_learned_tensors_match_finite_differences() {
    let mut model = Tokens::<Cpu>::init(&CpuDevice, 3).unwrap();
    let (x, y) = batch::<5>(4);
    let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
    let at = [
        ("cls", 3),
        ("scale", 0),
        ("shifts.0", 7),
        ("shifts.1", 11),
        ("embed.weight", 5),
    ];
    check_finite_differences(&mut model, &grads, &at, 1e-4, |m| {
        m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0]
    });
    assert_eq!(grads.cls.raw().dims().as_slice(), &[1, 1, 16]);
}

#[test]
fn planned_and_op_by_op_agree_on_learned_tensors() {
    let model = Tokens::<Cpu>::init(&CpuDevice, 2).unwrap();
    let (x, y) = batch::<4>(5);
    let run = |fused: bool| {
        model.set_fused(fused);
        let mut all = values(model.forward(&x).unwrap().raw());
        let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
        all.extend(values(loss.raw()));
        for g in [
            &grads.scale.raw().clone(),
            grads.cls.raw(),
            grads.shifts[1].raw(),
        ] {
            all.extend(values(g));
        }
        all
    };
    let (fused, unfused) = (run(true), run(false));
    assert_eq!(fused.len(), unfused.len());
    for (a, b) in fused.iter().zip(&unfused) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{a} planned, {b} op by op"
        );
    }
}

#[test]
fn learned_tensors_train_and_round_trip_a_checkpoint() {
    use kiln::train::optim::{Optimizer, Sgd, SgdConfig};
    let mut model = Tokens::<Cpu>::init(&CpuDevice, 6).unwrap();
    let (x, y) = batch::<8>(7);
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.5,
        ..SgdConfig::default()
    })
    .unwrap();
    let before = values(model.cls.value.raw());
    let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
    let step = values(grads.cls.raw());
    opt.step(&mut model, &grads).unwrap();
    for ((b, a), g) in before.iter().zip(values(model.cls.value.raw())).zip(&step) {
        assert!((b - 0.5 * g - a).abs() < 1e-6, "{b} - 0.5 * {g} is not {a}");
    }
    assert!(step.iter().any(|g| *g != 0.0));

    let dir = std::env::temp_dir().join(format!("kiln-learned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokens.safetensors");
    kiln::train::checkpoint::save(&model, &path).unwrap();
    let mut again = Tokens::<Cpu>::init(&CpuDevice, 9).unwrap();
    kiln::train::checkpoint::load(&mut again, &path).unwrap();
    assert_eq!(values(again.cls.value.raw()), values(model.cls.value.raw()));
    assert_eq!(
        values(again.forward(&x).unwrap().raw()),
        values(model.forward(&x).unwrap().raw())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn learned_tensors_in_a_sized_model_and_a_nested_one() {
    let mut model = SixteenWide::<Cpu>::init(&CpuDevice, 8).unwrap();
    let names: Vec<String> = named(&model).into_iter().map(|p| p.0).collect();
    assert!(
        names.iter().any(|n| n == "bias") && names.iter().any(|n| n == "block.gate"),
        "{names:?}"
    );
    let x = Tensor::<Cpu, Rank2<6, 4>>::normal(0.0, 1.0, 3, &CpuDevice).unwrap();
    let y = Tensor::from_vec(vec![0, 1, 2, 0, 1, 2], &[6], &CpuDevice).unwrap();
    let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
    check_finite_differences(
        &mut model,
        &grads,
        &[("bias", 1), ("block.gate", 4)],
        1e-5,
        |m| m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0],
    );
}
