//! The tiny GPT (`kiln_models::gpt`) on the vendored Shakespeare text: its loss falls
//! within a short training run, held-out loss with it; the planned and op-by-op paths
//! agree on the loss and the gradients of nested parameters.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
#[path = "../src/gpt_instances.rs"]
#[allow(dead_code)]
mod gpt_instances;
use gpt_instances::TinyGpt;
use kiln_models::text::Corpus;

#[path = "support/gpt_batches.rs"]
mod gpt_batches;
use gpt_batches::{batch, scalar, LEN};

fn held_out_loss(model: &TinyGpt<Cpu>, corpus: &Corpus) -> f32 {
    (0..8u64)
        .map(|s| {
            let (x, y) = batch(&corpus.held_out, 1000 + s);
            scalar(&model.loss(&x, &y).unwrap())
        })
        .sum::<f32>()
        / 8.0
}

#[test]
fn the_tiny_gpt_learns_shakespeare_bytes() {
    let corpus = Corpus::shakespeare().unwrap();
    let mut model = TinyGpt::<Cpu>::init(&CpuDevice, 1).unwrap();
    let mut opt = AdamW::<Cpu>::new(AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    })
    .unwrap();
    let before = held_out_loss(&model, &corpus);
    let mut losses = Vec::new();
    for step in 0..150u64 {
        let (x, y) = batch(&corpus.train, step);
        let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
        losses.push(scalar(&loss));
        opt.step(&mut model, &grads).unwrap();
    }
    let first: f32 = losses[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
    let after = held_out_loss(&model, &corpus);
    println!("train loss {first:.3} -> {last:.3} nats/byte; held out {before:.3} -> {after:.3}");
    // About ln 256 = 5.55 untrained; byte frequencies alone are worth about 3.3, so
    // below 3.0 the model uses context.
    assert!(
        losses[0] > 5.0 && before > 5.0,
        "the untrained loss is {} ({before} held out)",
        losses[0]
    );
    assert!(
        last < 3.0,
        "the training loss only fell from {first} to {last}"
    );
    assert!(
        after < 3.1,
        "the held-out loss only fell from {before} to {after}"
    );
}

#[test]
fn planned_and_op_by_op_agree_on_the_gpt() {
    let corpus = Corpus::shakespeare().unwrap();
    let model = TinyGpt::<Cpu>::init(&CpuDevice, 2).unwrap();
    let (x, y) = batch(&corpus.train, 7);
    let run = |fused: bool| {
        model.set_fused(fused);
        // The same step counter, so both paths draw the same dropout masks.
        model.step_seeds().set_steps(5);
        let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
        let mut all = vec![scalar(&loss)];
        all.extend(grads.blocks[1].attn.q.weight.raw().to_vec::<f32>().unwrap());
        all.extend(grads.pos.weight.raw().to_vec::<f32>().unwrap());
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
}

#[test]
fn the_summary_lists_the_tree_with_shapes_and_counts() {
    let s = TinyGpt::<Cpu>::summary();
    println!("{s}");
    let model = TinyGpt::<Cpu>::init(&CpuDevice, 1).unwrap();
    use kiln::tensor::nn::Module;
    let total = model.num_params();
    let total_text = total
        .to_string()
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(",");
    assert!(
        s.starts_with(&format!("TinyGpt: {total_text} parameters")),
        "{s}"
    );
    for want in [
        "tok",
        "blocks.0",
        "GptBlock",
        "    blocks.1.attn.q",
        "[B, T, 16]",
        "[B, T, 256]",
        "Linear<16, 256>",
    ] {
        assert!(s.contains(want), "`{want}` missing from:\n{s}");
    }
}

/// Token and position embeddings over a context known only at run time.
#[model]
pub struct AnyContext {
    tok: Embedding<256, 8>,
    pos: Embedding<32, 8>,
}

#[model]
impl AnyContext {
    pub fn embed(&self, ids: Tensor<Dyn, Dyn, i32>) -> Tensor<Dyn, Dyn, 8> {
        self.tok(ids) + self.pos.positions(ids)
    }
}

#[test]
fn a_run_time_context_longer_than_the_position_table_is_refused_alike() {
    let model = AnyContext::<Cpu>::init(&CpuDevice, 1).unwrap();
    let ids = |t: usize| {
        Tensor::<Cpu, (Dyn, Dyn), i32>::from_vec(
            (0..2 * t as i32).map(|i| i % 256).collect(),
            &[2, t],
            &CpuDevice,
        )
        .unwrap()
    };
    for fused in [true, false] {
        model.set_fused(fused);
        let ok = model.embed(&ids(32)).unwrap();
        assert_eq!(ok.raw().dims().as_slice(), &[2, 32, 8]);
        let e = model.embed(&ids(40)).unwrap_err().to_string();
        assert!(
            e.contains("ids [2, 40] hold 40 positions but the position table has 32 rows"),
            "fused {fused}: {e}"
        );
    }
}

#[test]
fn any_context_length_gives_the_fixed_length_logits() {
    let corpus = Corpus::shakespeare().unwrap();
    let model = TinyGpt::<Cpu>::init(&CpuDevice, 3).unwrap();
    let (x, _) = batch(&corpus.train, 9);
    let fixed = model.logits(&x).unwrap().raw().to_vec::<f32>().unwrap();
    let any = Tensor::<Cpu, (Dyn, Dyn), i32>::from_raw(x.raw().clone()).unwrap();
    let got = model
        .logits_any(&any)
        .unwrap()
        .raw()
        .to_vec::<f32>()
        .unwrap();
    for (a, b) in fixed.iter().zip(&got) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{a} fixed, {b} any length"
        );
    }
    // A shorter context: the logits of a prefix are the prefix of the logits (causal).
    let v = x.raw().to_vec::<i32>().unwrap();
    let prefix: Vec<i32> = v[..LEN].iter().take(5).copied().collect();
    let short = Tensor::<Cpu, (Dyn, Dyn), i32>::from_vec(prefix, &[1, 5], &CpuDevice).unwrap();
    let got = model
        .logits_any(&short)
        .unwrap()
        .raw()
        .to_vec::<f32>()
        .unwrap();
    for (a, b) in fixed[..5 * 256].iter().zip(&got) {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "{a} in the window, {b} alone"
        );
    }
}
