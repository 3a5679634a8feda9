//! Data parallelism on the CPU, ranks as threads (`kiln::train::parallel`): two ranks
//! training on the halves of each batch of 256 give the gradients and the parameters
//! of one rank training on the whole batch, for the MLP and for a GPT-shaped decoder
//! (embeddings, causal self-attention, layer norm, a head over 256 bytes), with the
//! gradients sent in buckets during the backward pass (`GradExchange`, every gradient
//! from the second step on) and equal, bit for bit, to those sent after it
//! (`average_grads`); replicas initialised from different seeds start equal after
//! `broadcast_state`.
//!
//! The decoder has no dropout: a rank's dropout masks over its half of a batch are
//! drawn from its own counters, not from the whole batch's, so the zoo's GPT (10%
//! dropout) does not match one rank on the whole batch draw for draw.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::{DType, RandDist};
use kiln::train::optim::{Optimizer, Sgd, SgdConfig};
use kiln::train::parallel::{
    average_grads, broadcast_state, named_grads, GradExchange, ThreadGroup, ThreadRank,
};
use kiln_models::mlp::Mlp;
use kiln_models::parts::CausalSelfAttention;
use kiln_models::text::{windows, Corpus};
use std::rc::Rc;
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
    let named = named_grads(m, g).unwrap().into_iter();
    named
        .map(|(name, g)| (name, g.to_vec::<f32>().unwrap()))
        .collect()
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

/// What a run of [`train`] gives each rank: the first step's gradients (averaged over
/// the ranks) and the parameters after the last step.
type Outcome = (Vec<(String, Vec<f32>)>, Vec<(String, Vec<f32>)>);

/// A rank's loss and gradients on its share of a step's batch: `(model, step, rank,
/// world)`.
trait GradsAt<M: Module<Cpu>>: Fn(&M, u64, usize, usize) -> (RawTensor<Cpu>, M::Grads) + Sync {}
impl<M: Module<Cpu>, F: Fn(&M, u64, usize, usize) -> (RawTensor<Cpu>, M::Grads) + Sync> GradsAt<M>
    for F
{
}

/// Trains [`STEPS`] SGD-momentum steps on each of `world` ranks (threads), each from
/// its own initial seed `seed + 10 · rank`: one rank plainly, more ranks broadcasting
/// rank 0's parameters first and averaging their gradients as the training step does
/// ([`GradExchange`], buckets sent during the backward pass from the second step on),
/// checked bit for bit against [`average_grads`] after the backward pass.
fn train<M: Module<Cpu>>(world: usize, seed: u64, grads_at: impl GradsAt<M>) -> Vec<Outcome> {
    let ranks = ThreadGroup::new(world, Duration::from_secs(60)).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                let grads_at = &grads_at;
                s.spawn(move || {
                    let r = c.rank();
                    // Shared: the exchange holds it while the backward pass runs.
                    let c = Rc::new(c);
                    let mut model = M::init(&CpuDevice, seed + 10 * r as u64).unwrap();
                    if world > 1 {
                        broadcast_state(&*c, &mut model, 0).unwrap();
                    }
                    let mut opt = optimizer();
                    let mut first = Vec::new();
                    let mut exchange = GradExchange::new();
                    for step in 0..STEPS {
                        let g = match world {
                            1 => grads_at(&model, step, r, world).1,
                            _ => {
                                let (_, g) = exchange
                                    .run(&c, &mut model, |m| Ok(grads_at(m, step, r, world)))
                                    .unwrap();
                                // The same gradients again (no dropout), averaged after.
                                let own = grads_at(&model, step, r, world).1;
                                let after = average_grads(&*c, &mut model, &own).unwrap();
                                assert_eq!(grads(&mut model, &g), grads(&mut model, &after));
                                let (during, all) = exchange.sent_during_backward();
                                if step > 0 {
                                    assert_eq!(during, all, "step {step}: gradients sent late");
                                }
                                g
                            }
                        };
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
    })
}

/// Steps each run takes.
const STEPS: u64 = 3;

/// Holds two ranks on half batches to one rank on whole batches: the ranks agree bit
/// for bit, and their gradients and parameters equal the one rank's to rounding.
fn assert_two_ranks_match_one<M: Module<Cpu>>(seed: u64, grads_at: impl GradsAt<M>) {
    let one = train::<M>(1, seed, &grads_at).remove(0);
    let two = train::<M>(2, seed, &grads_at);
    assert_eq!(two[0], two[1], "the ranks' replicas diverged");
    assert_close("gradients", &one.0, &two[0].0, 1e-5);
    assert_close("parameters after 3 steps", &one.1, &two[0].1, 1e-5);
}

/// Rank `rank`'s share of a batch's `values`, cut in `world` equal parts.
fn share<T: Clone>(values: &[T], rank: usize, world: usize) -> Vec<T> {
    let n = values.len() / world;
    values[rank * n..(rank + 1) * n].to_vec()
}

#[test]
fn two_mlp_ranks_on_half_batches_match_one_on_the_whole() {
    assert_two_ranks_match_one::<Mlp<Cpu>>(1, |m, step, r, world| {
        let (x, y) = mlp_batch(step);
        let (x, y) = (share(&x, r, world), share(&y, r, world));
        macro_rules! at {
            ($b:literal) => {{
                let x = Tensor::<Cpu, Rank2<$b, 784>>::from_vec(x, &[$b, 784], &CpuDevice);
                let y = Tensor::<Cpu, (Const<$b>,), i32>::from_vec(y, &[$b], &CpuDevice);
                let (loss, g) = m.loss_and_grad(&x.unwrap(), &y.unwrap()).unwrap();
                (loss.raw().clone(), g)
            }};
        }
        match world {
            1 => at!(256),
            _ => at!(128),
        }
    });
}

#[test]
fn two_decoder_ranks_on_half_batches_match_one_on_the_whole() {
    let corpus = Corpus::shakespeare().unwrap();
    assert_two_ranks_match_one::<Decoder<Cpu>>(3, |m, step, r, world| {
        let (x, y) = windows(&corpus.train, 256, 32, 7 + step).unwrap();
        let (x, y) = (share(&x, r, world), share(&y, r, world));
        macro_rules! at {
            ($b:literal) => {{
                type Ids = Tensor<Cpu, (Const<$b>, Const<32>), i32>;
                let x = Ids::from_vec(x, &[$b, 32], &CpuDevice).unwrap();
                let y = Ids::from_vec(y, &[$b, 32], &CpuDevice).unwrap();
                let (loss, g) = m.loss_and_grad(&x, &y).unwrap();
                (loss.raw().clone(), g)
            }};
        }
        match world {
            1 => at!(256),
            _ => at!(128),
        }
    });
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

#[test]
fn each_rank_draws_its_own_dropout_seeds_and_rank_0_draws_the_plain_runs() {
    use kiln::tensor::nn::{StepSeed, StepSeeds};
    let seeds_of = |rank: Option<u64>| -> Vec<u64> {
        let seeds = StepSeeds::<Cpu>::new(7);
        if let Some(r) = rank {
            seeds.set_rank(r);
        }
        (0..4)
            .map(|_| match seeds.next() {
                StepSeed::Host(s) => s,
                StepSeed::Device(_) => unreachable!("seeds start on the host"),
            })
            .collect()
    };
    let plain = seeds_of(None);
    assert_eq!(seeds_of(Some(0)), plain);
    let (one, two) = (seeds_of(Some(1)), seeds_of(Some(2)));
    for (step, s) in plain.iter().enumerate() {
        assert!(
            one[step] != *s && two[step] != *s && one[step] != two[step],
            "step {step}"
        );
    }
    // A rank's draws are a function of its rank and step, the same in every process.
    assert_eq!(seeds_of(Some(1)), one);
}

/// Rank `rank`'s half of the MLP's batch of step `step`, as tensors.
fn mlp_half_batch(
    step: u64,
    rank: usize,
) -> (
    Tensor<Cpu, Rank2<128, 784>>,
    Tensor<Cpu, (Const<128>,), i32>,
) {
    let (x, y) = mlp_batch(step);
    let (x, y) = (share(&x, rank, 2), share(&y, rank, 2));
    (
        Tensor::from_vec(x, &[128, 784], &CpuDevice).unwrap(),
        Tensor::from_vec(y, &[128], &CpuDevice).unwrap(),
    )
}

/// Runs `rank` on each of two ranks (threads) of one group.
fn on_two_ranks(rank: impl Fn(ThreadRank) + Sync) {
    let ranks = ThreadGroup::new(2, Duration::from_secs(60)).unwrap();
    std::thread::scope(|s| {
        for c in ranks {
            let rank = &rank;
            s.spawn(move || rank(c));
        }
    });
}

#[test]
fn a_backward_pass_whose_plans_change_between_steps_is_still_averaged_right() {
    // From the second step on, buckets follow the outputs learnt on earlier steps. Here
    // step 1 first runs another model's plan, whose outputs come first and have the
    // same dims as the gradients learnt there: each is caught as not the gradient
    // learnt and sent again after the backward pass.
    on_two_ranks(|c| {
        let r = c.rank();
        let c = Rc::new(c);
        let mut model = Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
        let other = Mlp::<Cpu>::init(&CpuDevice, 2).unwrap();
        let mut exchange = GradExchange::new();
        let mut sent = Vec::new();
        for step in 0..3u64 {
            let (x, y) = mlp_half_batch(step, r);
            let (_, g) = exchange
                .run(&c, &mut model, |m| {
                    if step == 1 {
                        other.loss_and_grad(&x, &y)?;
                    }
                    let (loss, g) = m.loss_and_grad(&x, &y)?;
                    Ok((loss.raw().clone(), g))
                })
                .unwrap();
            let own = model.loss_and_grad(&x, &y).unwrap().1;
            let after = average_grads(&*c, &mut model, &own).unwrap();
            assert_eq!(
                grads(&mut model, &g),
                grads(&mut model, &after),
                "step {step}"
            );
            sent.push(exchange.sent_during_backward());
        }
        let all = sent[0].1;
        assert_eq!(sent, [(0, all), (0, all), (0, all)], "rank {r}");
    });
}

#[test]
fn an_exchange_after_the_backward_pass_sends_nothing_during_it_and_gives_the_same_bits() {
    // Op by op too (what anomaly mode runs): its outputs are handed out as they are
    // computed, so its gradients are sent during the backward pass as well.
    for fused in [true, false] {
        exchanges_agree(fused);
    }
}

/// [`GradExchange::new`] against [`GradExchange::after_backward`] on two ranks over
/// three MLP steps, planned or op by op.
fn exchanges_agree(fused: bool) {
    on_two_ranks(|c| {
        let r = c.rank();
        let c = Rc::new(c);
        let mut model = Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
        model.set_fused(fused);
        let (mut during, mut after) = (GradExchange::new(), GradExchange::after_backward());
        for step in 0..3u64 {
            let (x, y) = mlp_half_batch(step, r);
            let run = |exchange: &mut GradExchange, model: &mut Mlp<Cpu>| {
                let (loss, g) = exchange
                    .run(&c, model, |m| {
                        let (loss, g) = m.loss_and_grad(&x, &y)?;
                        Ok((loss.raw().clone(), g))
                    })
                    .unwrap();
                (loss.to_vec::<f32>().unwrap(), grads(model, &g))
            };
            let sent_after = run(&mut after, &mut model);
            let sent_during = run(&mut during, &mut model);
            assert_eq!(sent_after, sent_during, "step {step}");
            assert_eq!(after.sent_during_backward().0, 0);
        }
        let (sent, all) = during.sent_during_backward();
        assert_eq!(sent, all, "fused: {fused}");
        assert!(all > 0);
    });
}
