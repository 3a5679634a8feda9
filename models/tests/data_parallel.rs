//! Data parallelism on the CPU, ranks as threads (`kiln::train::parallel`): two ranks
//! training on the halves of each batch of 256 give the gradients and the parameters
//! of one rank training on the whole batch, for the MLP and for a GPT-shaped decoder
//! (embeddings, causal self-attention, layer norm, a head over 256 bytes); replicas
//! initialised from different seeds start equal after `broadcast_state`.
//!
//! The decoder has no dropout: a rank's dropout masks over its half of a batch are
//! drawn from its own counters, not from the whole batch's, so the zoo's GPT (10%
//! dropout) does not match one rank on the whole batch draw for draw.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::{DType, RandDist};
use kiln::train::optim::{Optimizer, Sgd, SgdConfig};
use kiln::train::parallel::{average_grads, broadcast_state, ThreadGroup};
use kiln_models::mlp::Mlp;
use kiln_models::parts::CausalSelfAttention;
use kiln_models::text::{windows, Corpus};
use std::time::Duration;

/// Causal self-attention 16 wide in 2 heads.
#[model]
type Attention = CausalSelfAttention<16, 2>;

/// A one-block decoder without dropout, 16 wide, context 32.
#[model]
struct Decoder {
    tok: Embedding<256, 16>,
    pos: Embedding<32, 16>,
    norm: LayerNorm<16>,
    attn: Attention,
    head: Linear<16, 256>,
}

#[model]
impl Decoder {
    /// Mean cross-entropy of the next bytes.
    pub fn loss<const B: usize, const T: usize>(
        &self,
        ids: Tensor<B, T, i32>,
        next: Tensor<B, T, i32>,
    ) -> Tensor {
        let h = self.tok(ids) + self.pos.positions(ids);
        let h = h + self.attn(self.norm(h));
        self.head(h)
            .reshape::<Dyn, 256>()
            .cross_entropy(next.reshape::<Dyn>())
    }
}

/// Every parameter's values, in visit order.
fn params<M: Module<Cpu>>(m: &M) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    m.visit_params("", &mut |s| {
        out.push((s.name.to_string(), s.value.to_vec::<f32>().unwrap()))
    });
    out
}

/// Every gradient's values, in visit order.
fn grads<M: Module<Cpu>>(m: &mut M, g: &M::Grads) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    m.update_params(g, "", &mut |name, _, g| {
        out.push((name.to_string(), g.to_vec::<f32>()?));
        Ok(())
    })
    .unwrap();
    out
}

/// Asserts two sets of named tensors agree within `tol` relative to each tensor's
/// largest magnitude.
fn assert_close(what: &str, a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: tensor count");
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other, "{what}: order");
        let scale = x.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        for (i, (p, q)) in x.iter().zip(y).enumerate() {
            assert!(
                (p - q).abs() <= tol * scale,
                "{what}: {name}[{i}] is {p} on one rank and {q} on two (scale {scale})"
            );
        }
    }
}

/// SGD with momentum: the optimizer steps of both runs (its update is linear in the
/// gradient, so rounding differences in the gradients stay that small in the
/// parameters; Adam's first step is about `lr · sign(g)`, which a gradient of
/// rounding size flips).
fn optimizer() -> Sgd<Cpu> {
    Sgd::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })
    .unwrap()
}

/// The MLP's batches: 256 images of normal noise and their labels, per step.
fn mlp_batch(step: u64) -> (Vec<f32>, Vec<i32>) {
    let x = RawTensor::<Cpu>::rand(
        &[256, 784],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        100 + step,
        DType::F32,
        &CpuDevice,
    )
    .unwrap();
    let y = (0..256).map(|i| (i * 7 + step as i32) % 10).collect();
    (x.to_vec::<f32>().unwrap(), y)
}

#[test]
fn two_mlp_ranks_on_half_batches_match_one_on_the_whole() {
    const STEPS: u64 = 3;
    // One rank, batches of 256.
    let mut one = Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
    let mut opt = optimizer();
    let mut first_grads = Vec::new();
    for step in 0..STEPS {
        let (x, y) = mlp_batch(step);
        let x = Tensor::<Cpu, Rank2<256, 784>>::from_vec(x, &[256, 784], &CpuDevice).unwrap();
        let y = Tensor::<Cpu, (Const<256>,), i32>::from_vec(y, &[256], &CpuDevice).unwrap();
        let (_, g) = one.loss_and_grad(&x, &y).unwrap();
        if step == 0 {
            first_grads = grads(&mut one, &g);
        }
        opt.step(&mut one, &g).unwrap();
    }
    // Two ranks, each on its half of the same batches, from different initial seeds.
    let ranks = ThreadGroup::new(2, Duration::from_secs(60)).unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    let mut model = Mlp::<Cpu>::init(&CpuDevice, 1 + 10 * r as u64).unwrap();
                    broadcast_state(&c, &mut model, 0).unwrap();
                    let mut opt = optimizer();
                    let mut first = Vec::new();
                    for step in 0..STEPS {
                        let (x, y) = mlp_batch(step);
                        let x = x[r * 128 * 784..(r + 1) * 128 * 784].to_vec();
                        let y = y[r * 128..(r + 1) * 128].to_vec();
                        let x =
                            Tensor::<Cpu, Rank2<128, 784>>::from_vec(x, &[128, 784], &CpuDevice)
                                .unwrap();
                        let y = Tensor::<Cpu, (Const<128>,), i32>::from_vec(y, &[128], &CpuDevice)
                            .unwrap();
                        let (_, g) = model.loss_and_grad(&x, &y).unwrap();
                        let g = average_grads(&c, &mut model, &g).unwrap();
                        if step == 0 {
                            first = grads(&mut model, &g);
                        }
                        opt.step(&mut model, &g).unwrap();
                    }
                    (first, params(&model))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0], results[1], "the ranks' replicas diverged");
    assert_close("gradients", &first_grads, &results[0].0, 1e-5);
    assert_close(
        "parameters after 3 steps",
        &params(&one),
        &results[0].1,
        1e-5,
    );
}

#[test]
fn two_decoder_ranks_on_half_batches_match_one_on_the_whole() {
    const STEPS: u64 = 3;
    let corpus = Corpus::shakespeare().unwrap();
    let ids = |step: u64| windows(&corpus.train, 256, 32, 7 + step).unwrap();
    let mut one = Decoder::<Cpu>::init(&CpuDevice, 3).unwrap();
    let mut opt = optimizer();
    let mut first_grads = Vec::new();
    for step in 0..STEPS {
        let (x, y) = ids(step);
        let x = Tensor::<Cpu, (Const<256>, Const<32>), i32>::from_vec(x, &[256, 32], &CpuDevice)
            .unwrap();
        let y = Tensor::<Cpu, (Const<256>, Const<32>), i32>::from_vec(y, &[256, 32], &CpuDevice)
            .unwrap();
        let (_, g) = one.loss_and_grad(&x, &y).unwrap();
        if step == 0 {
            first_grads = grads(&mut one, &g);
        }
        opt.step(&mut one, &g).unwrap();
    }
    let ranks = ThreadGroup::new(2, Duration::from_secs(60)).unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                let ids = &ids;
                s.spawn(move || {
                    let r = c.rank();
                    let mut model = Decoder::<Cpu>::init(&CpuDevice, 3 + 10 * r as u64).unwrap();
                    broadcast_state(&c, &mut model, 0).unwrap();
                    let mut opt = optimizer();
                    let mut first = Vec::new();
                    for step in 0..STEPS {
                        let (x, y) = ids(step);
                        let half = |v: Vec<i32>| v[r * 128 * 32..(r + 1) * 128 * 32].to_vec();
                        let x = Tensor::<Cpu, (Const<128>, Const<32>), i32>::from_vec(
                            half(x),
                            &[128, 32],
                            &CpuDevice,
                        )
                        .unwrap();
                        let y = Tensor::<Cpu, (Const<128>, Const<32>), i32>::from_vec(
                            half(y),
                            &[128, 32],
                            &CpuDevice,
                        )
                        .unwrap();
                        let (_, g) = model.loss_and_grad(&x, &y).unwrap();
                        let g = average_grads(&c, &mut model, &g).unwrap();
                        if step == 0 {
                            first = grads(&mut model, &g);
                        }
                        opt.step(&mut model, &g).unwrap();
                    }
                    (first, params(&model))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0], results[1], "the ranks' replicas diverged");
    assert_close("gradients", &first_grads, &results[0].0, 1e-5);
    assert_close(
        "parameters after 3 steps",
        &params(&one),
        &results[0].1,
        1e-5,
    );
}

#[test]
fn replicas_from_different_seeds_start_equal_after_the_broadcast() {
    let ranks = ThreadGroup::new(3, Duration::from_secs(60)).unwrap();
    let states: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let mut model = Decoder::<Cpu>::init(&CpuDevice, c.rank() as u64).unwrap();
                    let before = params(&model);
                    broadcast_state(&c, &mut model, 1).unwrap();
                    (before, params(&model))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_ne!(states[0].0, states[1].0, "the seeds gave equal replicas");
    for (rank, (_, after)) in states.iter().enumerate() {
        assert_eq!(
            after, &states[1].0,
            "rank {rank} does not hold rank 1's parameters"
        );
    }
}
