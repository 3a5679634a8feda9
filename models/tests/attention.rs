//! Causal self-attention written with `#[model]` (`kiln_models::parts`): heads split and merged with
//! reshape and permute, batched products over batch and heads, `causal_mask()` before
//! the softmax. Position `t`'s output must not depend on later positions; the planned
//! and op-by-op paths must agree; gradients must match finite differences.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;

mod common;
use common::check_finite_differences;
use kiln::tensor::ir::NodeKind;
use kiln::tensor::{Op, RawTensor, UnaryOp};

/// Causal self-attention of width 16 in two heads of 8.
#[model]
type Attention = kiln_models::parts::CausalSelfAttention<16, 2>;

type Seq = (Const<2>, Const<5>, Const<16>);

fn seq(seed: u64) -> Tensor<Cpu, Seq> {
    Tensor::<Cpu, Seq>::normal(0.0, 1.0, seed, &CpuDevice).unwrap()
}

fn values(t: &RawTensor<Cpu>) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn a_position_sees_only_itself_and_earlier_ones() {
    let model = Attention::<Cpu>::init(&CpuDevice, 1).unwrap();
    let x = seq(2);
    let mut moved = values(x.raw());
    // Change the last position (t = 4) of both sequences.
    for b in 0..2 {
        for c in 0..16 {
            moved[(b * 5 + 4) * 16 + c] += 1.0;
        }
    }
    let moved = Tensor::<Cpu, Seq>::from_vec(moved, &[2, 5, 16], &CpuDevice).unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        let (a, b) = (
            values(model.forward(&x).unwrap().raw()),
            values(model.forward(&moved).unwrap().raw()),
        );
        for s in 0..2 {
            for t in 0..5 {
                let row = |v: &[f32]| v[(s * 5 + t) * 16..(s * 5 + t + 1) * 16].to_vec();
                if t < 4 {
                    assert_eq!(
                        row(&a),
                        row(&b),
                        "position {t} saw a later one (fused {fused})"
                    );
                } else {
                    assert_ne!(row(&a), row(&b), "the last position ignored itself");
                }
            }
        }
    }
}

#[test]
fn fused_and_op_by_op_agree() {
    let model = Attention::<Cpu>::init(&CpuDevice, 3).unwrap();
    let (x, target) = (seq(4), seq(5));
    let run = |fused: bool| {
        model.set_fused(fused);
        let mut all = values(model.forward(&x).unwrap().raw());
        let (loss, grads) = model.loss_and_grad(&x, &target).unwrap();
        all.extend(values(loss.raw()));
        all.extend(values(grads.q.weight.raw()));
        all.extend(values(grads.k.bias.raw()));
        all.extend(values(grads.v.weight.raw()));
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
fn gradients_match_finite_differences() {
    let mut model = Attention::<Cpu>::init(&CpuDevice, 6).unwrap();
    let (x, target) = (seq(7), seq(8));
    let (_, grads) = model.loss_and_grad(&x, &target).unwrap();
    let at = [
        ("q.weight", 5),
        ("k.weight", 40),
        ("v.bias", 3),
        ("proj.weight", 77),
    ];
    check_finite_differences(&mut model, &grads, &at, 1e-5, |m| {
        values(m.loss(&x, &target).unwrap().raw())[0]
    });
}

/// The hand-written attention is planned as the fused op: `attention` in the forward
/// plan, its row statistics and the three gradients in the backward one (the step runs
/// the attention and its statistics as one pass, the gradients as another), and no
/// softmax over the scores (no `exp` of a rank-4 value) anywhere.
#[test]
fn hand_written_attention_plans_the_fused_op() {
    let plans = Attention::<Cpu>::fusion_plans();
    let mut text = String::new();
    for (title, plan) in plans.iter() {
        text += &format!("# {title}\n{plan}\n");
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots/attention_plans.txt");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write the snapshot");
    }
    let want = std::fs::read_to_string(&path)
        .expect("tests/snapshots/attention_plans.txt (run with KILN_BLESS=1 to create it)");
    assert!(
        want == text,
        "the plans changed; review them and run with KILN_BLESS=1 to accept"
    );
    let plan = |name: &str| {
        plans
            .iter()
            .find(|(title, _)| title.ends_with(name))
            .unwrap_or_else(|| panic!("no plan {name}"))
            .1
    };
    assert_eq!(plan("::forward").matches(" op attention{").count(), 1);
    let step = plan("::loss_and_grad");
    assert_eq!(step.matches(" op attention_lse{").count(), 1, "{step}");
    for wrt in ["q", "k", "v"] {
        let op = format!(" op attention_grad{{wrt={wrt},");
        assert_eq!(step.matches(&op).count(), 1, "{step}");
    }
    // One kernel pass writes the attention and its statistics, one the three gradients.
    let parsed = kiln::fusion::Plan::parse(step).unwrap();
    let passes: Vec<Vec<&str>> = parsed
        .kernels
        .iter()
        .filter(|k| k.kind == kiln::fusion::KernelKind::OnePass)
        .map(|k| {
            k.nodes
                .iter()
                .map(|&n| match &parsed.graph.nodes[n].kind {
                    NodeKind::Op(op) => op.name(),
                    _ => "not an op",
                })
                .collect()
        })
        .collect();
    assert_eq!(
        passes,
        [
            vec!["attention", "attention_lse"],
            vec!["attention_grad"; 3]
        ],
        "{step}"
    );
    for (title, text) in plans.iter() {
        let plan = kiln::fusion::Plan::parse(text).unwrap();
        let exp_of_scores = plan.graph.nodes.iter().any(|n| {
            matches!(n.kind, NodeKind::Op(Op::Unary(UnaryOp::Exp))) && n.meta.dims.len() == 4
        });
        assert!(
            !exp_of_scores,
            "{title} still exponentiates the scores:\n{text}"
        );
    }
}

/// Causal attention of width 16 in two heads with dropout on its weights.
#[model]
type DroppedAttention = kiln_models::parts::DroppedSelfAttention<16, 2>;

/// Dropout on hand-written attention weights becomes the fused op's: the training step
/// plans one `attention` drawing its own mask (no `rand` of the scores' size), the
/// evaluation plan one without dropout; planned and op-by-op steps with the same seed
/// agree, the mask changes the loss and moves with the step.
#[test]
fn dropout_on_the_weights_is_the_fused_ops() {
    let plans = DroppedAttention::<Cpu>::fusion_plans();
    let plan = |name: &str| {
        plans
            .iter()
            .find(|(title, _)| title.ends_with(name))
            .unwrap_or_else(|| panic!("no plan {name}"))
            .1
    };
    let step = plan("::loss_and_grad");
    assert_eq!(step.matches(",dropout=0.25:0}").count(), 4, "{step}");
    assert!(
        !plan("::forward").contains("dropout="),
        "{}",
        plan("::forward")
    );
    for (title, text) in plans.iter() {
        let plan = kiln::fusion::Plan::parse(text).unwrap();
        let draws_scores = plan
            .graph
            .nodes
            .iter()
            .any(|n| matches!(n.kind, NodeKind::Op(Op::Rand { .. })) && n.meta.dims.len() == 4);
        assert!(!draws_scores, "{title} draws a mask of the scores:\n{text}");
    }
    let model = DroppedAttention::<Cpu>::init(&CpuDevice, 3).unwrap();
    let (x, target) = (seq(4), seq(5));
    let run = |fused: bool, step: u64| {
        model.set_fused(fused);
        model.step_seeds().set_steps(step);
        let (loss, grads) = model.loss_and_grad(&x, &target).unwrap();
        let mut all = values(loss.raw());
        all.extend(values(grads.q.weight.raw()));
        all.extend(values(grads.k.bias.raw()));
        all.extend(values(grads.v.weight.raw()));
        all
    };
    let (a, b) = (run(true, 10), run(false, 10));
    for (a, b) in a.iter().zip(&b) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{a} fused, {b} op by op"
        );
    }
    assert_ne!(a, run(true, 11), "the next step drew the same mask");
    let eval = values(model.loss(&x, &target).unwrap().raw())[0];
    assert_ne!(a[0], eval, "training dropped nothing");
}
