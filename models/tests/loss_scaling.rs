//! f16 mixed precision (`#[model(precision = f16)]`) and its dynamic loss scaling: the
//! products take f16 operands; a training step's backward pass starts from the model's
//! loss scale and its gradients come out unscaled (the same, to f16's rounding, at any
//! scale); a step whose gradients overflow is skipped, nothing updated, and the scale
//! halved; the scale doubles after its growth interval of good steps; a training state
//! keeps the scale; and f16 training of the tiny GPT follows the f32 run's loss curve.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln_models::gpt::Gpt;
use kiln_models::mlp::Mlp;
use kiln_models::text::Corpus;
use std::collections::BTreeMap;

#[model]
type TinyGpt = Gpt<16, 2, 2, 32>;
#[model(precision = f16)]
type TinyGptF16 = Gpt<16, 2, 2, 32>;

/// The MNIST MLP with f16 products.
#[model(precision = f16)]
type MlpF16 = Mlp;

#[path = "support/gpt_batches.rs"]
mod gpt_batches;
use gpt_batches::{assert_curves_agree, batch, scalar, train_curve};

/// An f16 MLP holding the f32 one's parameters.
fn f16_copy_of(f32_mlp: &Mlp<Cpu>) -> MlpF16<Cpu> {
    let mut mlp = MlpF16::<Cpu>::init(&CpuDevice, 99).unwrap();
    let mut tensors = Vec::new();
    f32_mlp.visit_params("", &mut |s| tensors.push(s.value.clone()));
    let mut it = tensors.into_iter();
    mlp.load_named("", &mut |_, _| Ok(it.next().expect("same parameters")))
        .unwrap();
    mlp
}

/// A batch of 16 inputs of the MLP and their classes.
fn mlp_batch(seed: u64) -> (Tensor<Cpu, Rank2<16, 784>>, Tensor<Cpu, Rank1<16>, i32>) {
    let x = Tensor::<Cpu, Rank2<16, 784>>::normal(0.0, 1.0, seed, &CpuDevice).unwrap();
    let classes: Vec<i32> = (0..16)
        .map(|i| ((i * 7 + seed as i32) % 10).abs())
        .collect();
    (x, Tensor::from_vec(classes, &[16], &CpuDevice).unwrap())
}

/// Every parameter's values, in declaration order.
fn params_of(m: &impl Module<Cpu>) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    m.visit_params("", &mut |s| out.push(s.value.to_vec::<f32>().unwrap()));
    out
}

#[test]
fn products_take_f16_operands_and_the_backward_pass_starts_from_the_scale() {
    for (title, plan) in TinyGptF16::<Cpu>::fusion_plans() {
        let products: Vec<&str> = plan.lines().filter(|l| l.contains(" op matmul ")).collect();
        assert!(!products.is_empty(), "{title} has no product");
        for p in products {
            assert!(p.contains(" f16 ["), "{title}: a product is not f16: {p}");
        }
        let reads_scale = plan.contains("__loss_scale");
        assert_eq!(reads_scale, title.ends_with("_and_grad"), "{title}");
    }
}

#[test]
fn gradients_come_out_unscaled_at_any_scale() {
    let f32_mlp = Mlp::<Cpu>::init(&CpuDevice, 4).unwrap();
    let f16_mlp = f16_copy_of(&f32_mlp);
    let (x, y) = mlp_batch(3);
    // The forward pass: f16 operands are rounded to 11 bits, 8 times finer than bf16's.
    let logits = f32_mlp.forward(&x).unwrap().to_vec().unwrap();
    let mixed = f16_mlp.forward(&x).unwrap().to_vec().unwrap();
    let largest = logits.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    let worst = logits
        .iter()
        .zip(&mixed)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("largest logit {largest:.3}, worst f16 difference {worst:.2e}");
    assert!(
        worst > 0.0 && worst < 0.004 * largest,
        "{worst} against {largest}"
    );
    let (_, exact) = f32_mlp.loss_and_grad(&x, &y).unwrap();
    let exact = exact.fc1.weight.raw().to_vec::<f32>().unwrap();
    let norm = exact.iter().map(|g| g * g).sum::<f32>().sqrt();
    let mut diffs = Vec::new();
    for scale in [2f32.powi(-20), 1.0, 1024.0, 65536.0] {
        for fused in [true, false] {
            f16_mlp.set_fused(fused);
            f16_mlp.loss_scale().set_scale(scale).unwrap();
            let (_, grads) = f16_mlp.loss_and_grad(&x, &y).unwrap();
            assert_eq!(grads.fc1.weight.raw().dtype(), DType::F32);
            let mixed = grads.fc1.weight.raw().to_vec::<f32>().unwrap();
            let diff = exact
                .iter()
                .zip(&mixed)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            println!("scale {scale:e}, fused {fused}: |g| {norm:.4e}, |g - g_f16| {diff:.3e}");
            diffs.push(diff);
        }
    }
    // At 2^-20 the scaled gradients flush to zero in f16: most of the gradient is lost.
    assert!(diffs[0] > 0.5 * norm, "{diffs:?} against {norm}");
    // From 1 up, what is left is f16's rounding of the operands (and the ReLU masks it
    // flips), the same at every scale: unscaling gives the gradient back.
    for &d in &diffs[2..] {
        assert!(d > 0.0, "the f16 instance computed in f32");
        assert!(d < 0.05 * norm, "{diffs:?} against {norm}");
        assert!((d - diffs[2]).abs() <= 1e-3 * diffs[2], "{diffs:?}");
    }
}

#[test]
fn a_step_that_overflows_is_skipped_and_the_scale_halved_until_one_is_taken() {
    let mut model = MlpF16::<Cpu>::init(&CpuDevice, 5).unwrap();
    let mut opt = AdamW::<Cpu>::new(AdamWConfig::default()).unwrap();
    let (x, y) = mlp_batch(8);
    // 2^40 times a gradient of about 1/16 overflows f16's 65504 at the first product.
    model.loss_scale().set_scale(2f32.powi(40)).unwrap();
    let before = params_of(&model);
    let mut skipped = 0;
    loop {
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        let scale = model.loss_scale().scale();
        opt.step(&mut model, &grads).unwrap();
        if model.loss_scale().state().skipped == skipped {
            // Taken: the scale unchanged, the parameters moved.
            assert_eq!(model.loss_scale().scale(), scale);
            assert_ne!(params_of(&model), before);
            break;
        }
        skipped += 1;
        assert_eq!(model.loss_scale().scale(), scale / 2.0);
        assert_eq!(
            params_of(&model),
            before,
            "a skipped step updated parameters"
        );
        assert!(skipped < 40, "no step was ever taken");
    }
    assert!(skipped >= 10, "only {skipped} steps overflowed at 2^40");
    // AdamW's state advanced only at the step taken.
    let counters = opt.state().counters;
    assert!(counters.values().all(|&n| n == 1), "{counters:?}");
}

#[test]
fn gradients_that_no_scale_makes_finite_stop_training_with_one_error() {
    // A NaN in the batch makes every gradient NaN at any scale: the steps are skipped
    // and the scale halved down to 2^-24, where the next one is an error, not a silent
    // run of skipped steps.
    let mut model = MlpF16::<Cpu>::init(&CpuDevice, 9).unwrap();
    let mut opt = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let (x, y) = mlp_batch(2);
    let mut values = x.raw().to_vec::<f32>().unwrap();
    values[5] = f32::NAN;
    let x = Tensor::<Cpu, Rank2<16, 784>>::from_vec(values, &[16, 784], &CpuDevice).unwrap();
    model.loss_scale().set_scale(2f32.powi(-22)).unwrap();
    let before = params_of(&model);
    let mut results = Vec::new();
    for _ in 0..3 {
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        results.push(opt.step(&mut model, &grads).map_err(|e| e.to_string()));
    }
    assert_eq!(results[0], Ok(()));
    assert_eq!(results[1], Ok(()));
    let e = results[2].clone().unwrap_err();
    assert!(
        e.contains("not finite even with the loss scaled by 5.9604645e-8"),
        "{e}"
    );
    assert_eq!(model.loss_scale().state().skipped, 2);
    assert_eq!(params_of(&model), before);
}

#[test]
fn the_scale_doubles_after_its_growth_interval() {
    let mut model = MlpF16::<Cpu>::init(&CpuDevice, 6).unwrap();
    let mut opt = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let scale = model.loss_scale();
    scale.set_scale(256.0).unwrap();
    scale.set_growth_interval(3).unwrap();
    let mut seen = Vec::new();
    for step in 0..7 {
        let (x, y) = mlp_batch(step);
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        opt.step(&mut model, &grads).unwrap();
        seen.push(model.loss_scale().scale());
    }
    assert_eq!(seen, [256.0, 256.0, 512.0, 512.0, 512.0, 1024.0, 1024.0]);
    assert_eq!(model.loss_scale().state().skipped, 0);
    // Settings that would make unscaling inexact, or never grow, are refused.
    for bad in [3.0, 0.0, -2.0, f32::INFINITY, f32::NAN, 2f32.powi(60)] {
        let e = model.loss_scale().set_scale(bad).unwrap_err().to_string();
        assert!(e.contains("not a power of two from 2^-24 to 2^48"), "{e}");
    }
    let e = model.loss_scale().set_growth_interval(0).unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
}

#[test]
fn a_training_state_keeps_the_scale_and_refuses_one_without_it() {
    let dir = std::env::temp_dir().join(format!("kiln-loss-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.safetensors");
    let mut model = MlpF16::<Cpu>::init(&CpuDevice, 7).unwrap();
    let mut opt = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    model.loss_scale().set_scale(2f32.powi(30)).unwrap();
    let (x, y) = mlp_batch(1);
    for _ in 0..3 {
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        opt.step(&mut model, &grads).unwrap();
    }
    let saved = model.loss_scale().state();
    assert!(
        saved.skipped > 0 && saved.scale < 2f32.powi(30),
        "{saved:?}"
    );
    let run = BTreeMap::new();
    kiln::train::state::save(&path, &model, &opt, 3, &run).unwrap();
    let mut resumed = MlpF16::<Cpu>::init(&CpuDevice, 8).unwrap();
    let mut opt2 = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    kiln::train::state::load(&path, &mut resumed, &mut opt2, &run).unwrap();
    assert_eq!(resumed.loss_scale().state(), saved);
    // A state an f32 model wrote has no scale to resume from.
    let f32_model = Mlp::<Cpu>::init(&CpuDevice, 7).unwrap();
    kiln::train::state::save(&path, &f32_model, &opt, 3, &run).unwrap();
    let e = kiln::train::state::load(&path, &mut resumed, &mut opt2, &run)
        .unwrap_err()
        .to_string();
    assert!(e.contains("kiln.state.loss_scale"), "{e}");
    assert_eq!(
        resumed.loss_scale().state(),
        saved,
        "a refused load changed the scale"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn f16_training_follows_the_f32_loss_curve() {
    let corpus = Corpus::shakespeare().unwrap();
    let (exact, _) = train_curve!(TinyGpt<Cpu>, corpus, 60u64);
    let (mixed, model) = train_curve!(TinyGptF16<Cpu>, corpus, 60u64);
    assert_curves_agree(&exact, &mixed, "f16");
    println!("loss scale at the end: {:?}", model.loss_scale().state());
}
