//! Mixed precision (`#[model(precision = bf16)]`): the instance's plans take bf16
//! operands for every matrix product and keep the rest f32; its parameters, gradients
//! and optimizer state stay f32; planned and op-by-op runs agree; and bf16 training of
//! the tiny GPT follows the f32 run's loss curve.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln_models::gpt::Gpt;
use kiln_models::mlp::Mlp;
use kiln_models::text::Corpus;

/// The tiny GPT of the test suite (`gpt_instances::TinyGpt`), in f32 and with bf16
/// products.
#[model]
type TinyGpt = Gpt<16, 2, 2, 32>;
#[model(precision = bf16)]
type TinyGptBf16 = Gpt<16, 2, 2, 32>;

/// The MNIST MLP with bf16 products.
#[model(precision = bf16)]
type MlpBf16 = Mlp;

#[path = "support/gpt_batches.rs"]
mod gpt_batches;
use gpt_batches::{assert_curves_agree, batch, scalar, train_curve};

/// The plan lines of `plans` that hold `what`.
fn plan_lines<'a>(plan: &'a str, what: &str) -> Vec<&'a str> {
    plan.lines().filter(|l| l.contains(what)).collect()
}

#[test]
fn every_product_takes_bf16_operands_and_the_rest_stays_f32() {
    for (title, plan) in TinyGptBf16::<Cpu>::fusion_plans() {
        let products = plan_lines(plan, " op matmul ");
        assert!(!products.is_empty(), "{title} has no product");
        for p in &products {
            assert!(p.contains(" bf16 ["), "{title}: a product is not bf16: {p}");
        }
        // Softmax, normalisation and the loss: their exp, sums and logs are f32. (A
        // backward pass also sums bf16 product gradients over broadcast batch dims:
        // accumulated in f32 by the kernel, stored bf16, as PyTorch's autocast does.)
        if title.ends_with("_and_grad") {
            continue;
        }
        for op in [
            " op exp ",
            " op log ",
            " op sum{",
            " op rsqrt ",
            " op sqrt ",
        ] {
            for l in plan_lines(plan, op) {
                assert!(l.contains(" f32 ["), "{title}: not f32: {l}");
            }
        }
    }
    for (title, plan) in TinyGpt::<Cpu>::fusion_plans() {
        assert!(
            plan_lines(plan, "bf16").is_empty(),
            "the f32 instance's {title} holds bf16"
        );
    }
}

#[test]
fn parameters_and_gradients_stay_f32_and_both_paths_agree() {
    let corpus = Corpus::shakespeare().unwrap();
    let model = TinyGptBf16::<Cpu>::init(&CpuDevice, 2).unwrap();
    let (x, y) = batch(&corpus.train, 7);
    let run = |fused: bool| {
        model.set_fused(fused);
        model.step_seeds().set_steps(5);
        let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
        assert_eq!(grads.blocks[1].attn.q.weight.raw().dtype(), DType::F32);
        let mut all = vec![scalar(&loss)];
        all.extend(grads.blocks[1].attn.q.weight.raw().to_vec::<f32>().unwrap());
        all.extend(grads.tok.weight.raw().to_vec::<f32>().unwrap());
        all
    };
    let (a, b) = (run(true), run(false));
    for (a, b) in a.iter().zip(&b) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{a} fused, {b} op by op"
        );
    }
    let mlp = MlpBf16::<Cpu>::init(&CpuDevice, 1).unwrap();
    let x = Tensor::<Cpu, Rank2<4, 784>>::normal(0.0, 1.0, 3, &CpuDevice).unwrap();
    let fused = mlp.forward(&x).unwrap().to_vec().unwrap();
    mlp.set_fused(false);
    let op_by_op = mlp.forward(&x).unwrap().to_vec().unwrap();
    assert_eq!(fused, op_by_op);
}

#[test]
fn bf16_products_round_as_bf16_and_no_further() {
    // The same weights in both precisions: bf16 products differ from f32 ones by
    // bf16's rounding of the operands (8 bits of mantissa), not by more.
    let f32_mlp = Mlp::<Cpu>::init(&CpuDevice, 4).unwrap();
    let mut bf16_mlp = MlpBf16::<Cpu>::init(&CpuDevice, 9).unwrap();
    let mut tensors = Vec::new();
    f32_mlp.visit_params("", &mut |s| tensors.push(s.value.clone()));
    let mut it = tensors.into_iter();
    bf16_mlp
        .load_named("", &mut |_, _| Ok(it.next().expect("same parameters")))
        .unwrap();
    let x = Tensor::<Cpu, Rank2<4, 784>>::normal(0.0, 1.0, 3, &CpuDevice).unwrap();
    let exact = f32_mlp.forward(&x).unwrap().to_vec().unwrap();
    let mixed = bf16_mlp.forward(&x).unwrap().to_vec().unwrap();
    let scale = exact.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    let worst = exact
        .iter()
        .zip(&mixed)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("largest logit {scale:.3}, worst bf16 difference {worst:.5}");
    assert!(worst > 0.0, "the bf16 instance computed in f32");
    assert!(worst < 0.03 * scale, "{worst} against logits up to {scale}");
}

#[test]
fn bf16_training_follows_the_f32_loss_curve() {
    let corpus = Corpus::shakespeare().unwrap();
    let (exact, _) = train_curve!(TinyGpt<Cpu>, corpus, 60u64);
    let (mixed, _) = train_curve!(TinyGptBf16<Cpu>, corpus, 60u64);
    assert_curves_agree(&exact, &mixed, "bf16");
}

#[test]
fn casts_are_fused_into_the_kernels_around_them() {
    for (title, plan) in MlpBf16::<Cpu>::fusion_plans()
        .iter()
        .chain(TinyGptBf16::<Cpu>::fusion_plans())
    {
        let line_of = |node: &str| {
            plan.lines()
                .find(|l| l.starts_with(&format!("node {node} ")))
                .unwrap_or("")
        };
        // A node's op, with the casts of mixed precision (to bf16, or from bf16 to
        // f32) marked `mixed-cast`.
        let op_of = |node: &str| {
            let line = line_of(node);
            let op = line.split_whitespace().nth(3).unwrap_or("").to_string();
            let input = line.split("in=[").nth(1).and_then(|r| r.split(']').next());
            let from_bf16 = input.is_some_and(|i| line_of(i).contains(" bf16 ["));
            match op.as_str() {
                "cast{dtype=bf16}" => "mixed-cast".to_string(),
                "cast{dtype=f32}" if from_bf16 => "mixed-cast".to_string(),
                _ => op,
            }
        };
        for kernel in plan.lines().filter(|l| l.starts_with("kernel ")) {
            let nodes: Vec<&str> = kernel
                .split("nodes=[")
                .nth(1)
                .and_then(|r| r.split(']').next())
                .unwrap_or("")
                .split(';')
                .collect();
            let ops: Vec<String> = nodes.iter().map(|n| op_of(n)).collect();
            if !ops.iter().any(|o| o == "mixed-cast") {
                continue;
            }
            assert!(
                kernel.starts_with("kernel elementwise"),
                "{title}: a cast runs outside a fused kernel: {kernel} ({ops:?})"
            );
        }
        // A product's result is widened in the kernel that adds its bias: no kernel of
        // the forward pass is a lone widening cast.
        if title.ends_with("forward") {
            for kernel in plan.lines().filter(|l| l.starts_with("kernel elementwise")) {
                let nodes = kernel
                    .split("nodes=[")
                    .nth(1)
                    .unwrap()
                    .split(']')
                    .next()
                    .unwrap();
                if !nodes.contains(';') {
                    let widening =
                        op_of(nodes) == "mixed-cast" && !line_of(nodes).contains(" bf16 [");
                    assert!(
                        !widening,
                        "{title}: a product's result is widened on its own: {kernel}"
                    );
                }
            }
        }
    }
}
