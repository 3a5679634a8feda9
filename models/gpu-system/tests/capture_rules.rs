//! The rules of a CUDA graph capture, checked on every runtime (wgpu over lavapipe in
//! CI) with `CubeDevice::check_capturable`, which runs a step under them: a static
//! training step passes once it has run before, and what a replay could not repeat (a
//! host copy, a read, a first-seen kernel shape, state replaced instead of updated in
//! place, a `#[model]`'s dynamic part planning on the host, a draw or an optimizer value
//! known only on the host) is an error naming it.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_cubecl::{CubeBackend, CubeDevice, KilnRuntime};
use kiln_models::mlp::Mlp;
use kiln_tensor::nn::Module;
use kiln_tensor::{Backend, Const, Rank2, Result, Tensor};
use kiln_train::optim::{Optimizer, Sgd, SgdConfig};

/// The checks below for one runtime, as tests named after it.
macro_rules! capture_rule_tests {
    ($module:ident, $R:ty, $device:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn a_warmed_up_training_step_follows_the_rules() -> Result<()> {
                super::a_warmed_up_training_step_follows_the_rules::<$R>(&$device)
            }
            #[test]
            fn what_a_replay_cannot_repeat_is_refused() -> Result<()> {
                super::what_a_replay_cannot_repeat_is_refused::<$R>(&$device)
            }
            #[test]
            fn dropout_and_adam_read_their_step_values_from_device_memory() -> Result<()> {
                super::dropout_and_adam_read_their_step_values_from_device_memory::<$R>(&$device)
            }
            #[test]
            fn attention_dropout_reads_its_seed_from_device_memory() -> Result<()> {
                super::attention_dropout_reads_its_seed_from_device_memory::<$R>(&$device)
            }
            #[test]
            fn a_step_calling_a_dynamic_part_is_refused() -> Result<()> {
                super::a_step_calling_a_dynamic_part_is_refused::<$R>(&$device)
            }
            #[test]
            fn a_gpt_step_with_adamw_follows_the_rules() -> Result<()> {
                super::a_gpt_step_with_adamw_follows_the_rules::<$R>(&$device)
            }
            #[test]
            fn clipped_steps_follow_the_rules_and_metrics_read_once() -> Result<()> {
                super::clipped_steps_follow_the_rules_and_metrics_read_once::<$R>(&$device)
            }
        }
    };
}

#[cfg(feature = "wgpu")]
capture_rule_tests!(
    wgpu,
    kiln_cubecl::WgpuRuntime,
    kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the capture-rule tests: {e}"))
);
#[cfg(feature = "cuda")]
capture_rule_tests!(
    cuda,
    kiln_cubecl::CudaRuntime,
    kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the capture-rule tests: {e}"))
);

const BATCH: usize = 16;

fn sgd<R: KilnRuntime>(momentum: f64) -> Result<Sgd<CubeBackend<R>>> {
    Sgd::new(SgdConfig {
        lr: 0.05,
        momentum,
        ..SgdConfig::default()
    })
}

type Step<R> = (
    Tensor<CubeBackend<R>, Rank2<BATCH, 784>>,
    Tensor<CubeBackend<R>, (Const<BATCH>,), i32>,
);

fn inputs<R: KilnRuntime>(dev: &CubeDevice<R>, labels: Vec<i32>) -> Result<Step<R>> {
    Ok((
        Tensor::normal(0.0, 1.0, 3, dev)?,
        Tensor::from_vec(labels, &[BATCH], dev)?,
    ))
}

fn a_warmed_up_training_step_follows_the_rules<R: KilnRuntime>(dev: &CubeDevice<R>) -> Result<()> {
    let mut model = Mlp::<CubeBackend<R>>::init(dev, 5)?;
    let mut opt = sgd::<R>(0.9)?;
    let (x, y) = inputs(dev, (0..BATCH as i32).map(|i| i % 10).collect())?;
    let mut losses = Vec::new();
    let mut step = |model: &mut Mlp<CubeBackend<R>>| -> Result<_> {
        let (loss, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(model, &grads)?;
        Ok(loss)
    };
    losses.push(step(&mut model)?.to_vec()?[0]);
    for _ in 0..3 {
        let loss = dev.check_capturable(|| step(&mut model))?;
        losses.push(loss.to_vec()?[0]);
    }
    // The checked steps ran: the loss went down.
    assert!(losses[3] < losses[0], "{losses:?}");
    // A forward pass is capturable too, once its shapes have been seen.
    model.forward(&x)?;
    dev.check_capturable(|| model.forward(&x))?;

    // Bad labels in a checked step are reported at the next read, as outside.
    let (_, bad) = inputs(dev, (0..BATCH as i32).map(|i| i % 10 + 5).collect())?;
    dev.check_capturable(|| model.loss_and_grad(&x, &bad))?;
    let err = CubeBackend::<R>::synchronize(dev).expect_err("labels out of range are an error");
    assert!(format!("{err}").contains("out of range"), "{err}");
    CubeBackend::<R>::synchronize(dev)
}

/// Clipping by the global norm computes its scale on the device and writes it in
/// place, so a warmed-up clipped step is capturable (by value needs nothing per step);
/// and the metrics accumulate on the device, agreeing with the host's count.
fn clipped_steps_follow_the_rules_and_metrics_read_once<R: KilnRuntime>(
    dev: &CubeDevice<R>,
) -> Result<()> {
    use kiln_train::metrics::{Accuracy, Averaged, ClassCounts, Metric, Outputs};
    use kiln_train::optim::GradClip;
    let (x, y) = inputs(dev, (0..BATCH as i32).map(|i| i % 10).collect())?;
    for clip in [GradClip::Norm(0.5), GradClip::Value(0.01)] {
        let mut model = Mlp::<CubeBackend<R>>::init(dev, 5)?;
        let mut opt = sgd::<R>(0.9)?;
        opt.set_grad_clip(clip)?;
        let mut step = |model: &mut Mlp<CubeBackend<R>>| -> Result<_> {
            let (loss, grads) = model.loss_and_grad(&x, &y)?;
            opt.step(model, &grads)?;
            Ok(loss)
        };
        let first = step(&mut model)?.to_vec()?[0];
        let mut last = first;
        for _ in 0..3 {
            last = dev.check_capturable(|| step(&mut model))?.to_vec()?[0];
        }
        assert!(last < first, "{clip:?}: {first} then {last}");
    }
    let model = Mlp::<CubeBackend<R>>::init(dev, 5)?;
    let scores = model.forward(&x)?;
    let outputs = Outputs {
        scores: Some(scores.raw()),
        targets: Some(y.raw()),
        loss: None,
    };
    let mut accuracy = Accuracy::accuracy();
    let mut macro_recall = ClassCounts::new(Averaged::Recall);
    accuracy.update(&outputs)?;
    macro_recall.update(&outputs)?;
    let (s, labels) = (scores.to_vec()?, y.to_vec()?);
    let (mut hits, mut per_class) = (0, [(0.0f64, 0.0f64); 10]);
    for (i, &l) in labels.iter().enumerate() {
        let row = &s[i * 10..(i + 1) * 10];
        let best = (0..10).fold(0, |b, c| if row[c] > row[b] { c } else { b });
        let hit = best == l as usize;
        hits += usize::from(hit);
        per_class[l as usize].0 += f64::from(u8::from(hit));
        per_class[l as usize].1 += 1.0;
    }
    assert_eq!(accuracy.value()?, hits as f64 / BATCH as f64);
    // Every class occurs as a target: macro recall is the mean of per-class hit rates.
    let recall = per_class.iter().map(|(h, n)| h / n).sum::<f64>() / 10.0;
    assert!(
        (macro_recall.value()? - recall).abs() < 1e-12,
        "{} against {recall}",
        macro_recall.value()?
    );
    Ok(())
}

fn what_a_replay_cannot_repeat_is_refused<R: KilnRuntime>(dev: &CubeDevice<R>) -> Result<()> {
    let refused = |r: Result<()>, what: &str| {
        let err = r.err().unwrap_or_else(|| panic!("{what} was not refused"));
        assert!(format!("{err}").contains("captured"), "{what}: {err}");
    };
    let mut model = Mlp::<CubeBackend<R>>::init(dev, 6)?;
    let (x, y) = inputs(dev, (0..BATCH as i32).map(|i| i % 10).collect())?;
    model.forward(&x)?;
    let values = vec![0.5f32; BATCH * 784];
    refused(
        dev.check_capturable(|| {
            Tensor::<CubeBackend<R>, Rank2<BATCH, 784>>::from_vec(
                values.clone(),
                &[BATCH, 784],
                dev,
            )
            .map(|_| ())
        }),
        "an upload",
    );
    refused(
        dev.check_capturable(|| model.forward(&x)?.to_vec().map(|_| ())),
        "a read",
    );
    refused(
        dev.check_capturable(|| CubeBackend::<R>::synchronize(dev)),
        "a synchronisation",
    );
    // The step swallows the refused upload: the check still fails.
    refused(
        dev.check_capturable(|| {
            let _ = Tensor::<CubeBackend<R>, Rank2<BATCH, 784>>::from_vec(
                values.clone(),
                &[BATCH, 784],
                dev,
            );
            model.forward(&x).map(|_| ())
        }),
        "a swallowed upload",
    );
    // A batch size never run before needs new kernel metadata (a host copy) on wgpu,
    // whose matmul reads its extents from a buffer (CUDA's cuBLASLt and fused kernels
    // take theirs as launch arguments).
    if R::NAME == "wgpu" {
        let x3 = Tensor::<CubeBackend<R>, Rank2<3, 784>>::normal(0.0, 1.0, 4, dev)?;
        refused(
            dev.check_capturable(|| model.forward(&x3).map(|_| ())),
            "first-seen shapes",
        );
    }
    // Plain SGD replaces every parameter with a new buffer.
    let mut plain = sgd::<R>(0.0)?;
    let mut step = |model: &mut Mlp<CubeBackend<R>>| -> Result<()> {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        plain.step(model, &grads)
    };
    step(&mut model)?;
    let err = dev
        .check_capturable(|| step(&mut model))
        .expect_err("replaced parameters are refused");
    assert!(format!("{err}").contains("in place"), "{err}");
    // The device works on after every refusal.
    let mut opt = sgd::<R>(0.9)?;
    let (loss, grads) = model.loss_and_grad(&x, &y)?;
    opt.step(&mut model, &grads)?;
    assert!(loss.to_vec()?[0].is_finite());
    Ok(())
}

fn a_step_calling_a_dynamic_part_is_refused<R: KilnRuntime>(dev: &CubeDevice<R>) -> Result<()> {
    use kiln_models::hybrid::HybridMlp;
    let model = HybridMlp::<CubeBackend<R>>::init(dev, 7)?;
    let x = Tensor::<CubeBackend<R>, Rank2<BATCH, 16>>::normal(0.0, 1.0, 5, dev)?;
    let y = Tensor::<CubeBackend<R>, Rank2<BATCH, 4>>::normal(0.0, 1.0, 6, dev)?;
    // Warm: every kernel and plan made, so only the part itself is left to refuse.
    model.loss_and_grad(&x, &y)?;
    let err = dev
        .check_capturable(|| model.loss_and_grad(&x, &y).map(|_| ()))
        .expect_err("a dynamic part is refused");
    let err = format!("{err}");
    assert!(
        err.contains("`self.refine.forward`, a dynamic part") && err.contains("cannot be captured"),
        "{err}"
    );
    // The device works on.
    let (loss, _) = model.loss_and_grad(&x, &y)?;
    assert!(loss.to_vec()?[0].is_finite());
    Ok(())
}

/// The CNN's training step with AdamW follows the rules once its dropout seed and
/// Adam's per-step values are in device memory (written before each step, outside the
/// capture), and trains exactly as the same steps run planned with host values.
fn dropout_and_adam_read_their_step_values_from_device_memory<R: KilnRuntime>(
    dev: &CubeDevice<R>,
) -> Result<()> {
    use kiln_models::lenet::LeNet;
    use kiln_tensor::RawTensor;
    use kiln_train::learner::Supervised;
    use kiln_train::optim::{AdamW, AdamWConfig};
    type B<R> = CubeBackend<R>;
    let x = RawTensor::<B<R>>::rand(
        &[BATCH, 1, 28, 28],
        kiln_tensor::RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        11,
        kiln_tensor::DType::F32,
        dev,
    )?;
    let y =
        RawTensor::<B<R>>::from_vec((0..BATCH as i32).map(|i| i % 10).collect(), &[BATCH], dev)?;
    let adamw = || {
        AdamW::<B<R>>::new(AdamWConfig {
            lr: 1e-3,
            ..AdamWConfig::default()
        })
    };
    let (mut checked, mut planned) = (LeNet::<B<R>>::init(dev, 8)?, LeNet::<B<R>>::init(dev, 8)?);
    let (mut opt_checked, mut opt_planned) = (adamw()?, adamw()?);
    // The first step runs by value: it starts Adam's moments.
    for (model, opt) in [
        (&mut checked, &mut opt_checked),
        (&mut planned, &mut opt_planned),
    ] {
        let (_, grads) = Supervised::loss_and_grads(model, &x, &y)?;
        opt.step(model, &grads)?;
    }
    let step = |model: &mut LeNet<B<R>>, opt: &mut AdamW<B<R>>| -> Result<()> {
        let (_, grads) = Supervised::loss_and_grads(model, &x, &y)?;
        opt.step(model, &grads)
    };
    // With the seed on the host, the draw is refused; so is Adam writing its values.
    let err = dev
        .check_capturable(|| step(&mut checked, &mut opt_checked))
        .expect_err("a draw seeded on the host is refused");
    assert!(format!("{err}").contains("seed on the host"), "{err}");
    checked.step_seeds().set_steps(planned.step_seeds().steps());
    checked.step_seeds().advance_on_device(dev)?;
    let err = dev
        .check_capturable(|| step(&mut checked, &mut opt_checked))
        .expect_err("Adam's values written inside the capture are refused");
    assert!(format!("{err}").contains("prepare_step"), "{err}");
    // The refused steps updated no parameter; their seeds are taken again.
    checked.step_seeds().set_steps(planned.step_seeds().steps());
    for _ in 0..3 {
        opt_checked.prepare_step()?;
        checked.step_seeds().advance_on_device(dev)?;
        dev.check_capturable(|| step(&mut checked, &mut opt_checked))?;
        step(&mut planned, &mut opt_planned)?;
    }
    checked.step_seeds().keep_on_host();
    same_params(&checked, &planned, "device-held and host step values")
}

/// Asserts that two models' parameters are equal bit for bit; `what` names the two
/// ways they were trained.
fn same_params<Be: Backend, M: Module<Be>>(a: &M, b: &M, what: &str) -> Result<()> {
    let params = |m: &M| {
        let mut all = Vec::new();
        m.visit_params("", &mut |s| {
            all.push((s.name.to_string(), s.value.to_vec::<f32>()))
        });
        all
    };
    for ((name, x), (_, y)) in params(a).into_iter().zip(params(b)) {
        assert_eq!(x?, y?, "`{name}` differs between {what}");
    }
    Ok(())
}

/// Causal attention of width 16 in two heads with dropout on its weights.
#[kiln::model]
type DroppedAttention = kiln_models::parts::DroppedSelfAttention<16, 2>;

/// Attention with dropout on its weights follows the rules once the step's seed is in
/// device memory (refused while it is on the host), and the step draws the mask the
/// same step draws with its seed on the host: loss and gradients bit for bit.
fn attention_dropout_reads_its_seed_from_device_memory<R: KilnRuntime>(
    dev: &CubeDevice<R>,
) -> Result<()> {
    type B<R> = CubeBackend<R>;
    type Seq = (Const<2>, Const<5>, Const<16>);
    let x = Tensor::<B<R>, Seq>::normal(0.0, 1.0, 4, dev)?;
    let target = Tensor::<B<R>, Seq>::normal(0.0, 1.0, 5, dev)?;
    let model = DroppedAttention::<B<R>>::init(dev, 3)?;
    let values =
        |(loss, grads): (Tensor<B<R>, ()>, DroppedAttentionGrads<B<R>>)| -> Result<Vec<f32>> {
            let mut all = loss.raw().to_vec::<f32>()?;
            all.extend(grads.q.weight.raw().to_vec::<f32>()?);
            all.extend(grads.v.bias.raw().to_vec::<f32>()?);
            Ok(all)
        };
    // Warm-up, and the step's values with its seed on the host.
    model.step_seeds().set_steps(7);
    let on_host = values(model.loss_and_grad(&x, &target)?)?;
    model.step_seeds().set_steps(7);
    let err = dev
        .check_capturable(|| model.loss_and_grad(&x, &target).map(|_| ()))
        .expect_err("a draw seeded on the host is refused");
    assert!(format!("{err}").contains("seed on the host"), "{err}");
    model.step_seeds().set_steps(7);
    model.step_seeds().advance_on_device(dev)?;
    let mut captured = None;
    dev.check_capturable(|| {
        captured = Some(model.loss_and_grad(&x, &target)?);
        Ok(())
    })?;
    model.step_seeds().keep_on_host();
    let captured = values(captured.expect("the step ran"))?;
    assert_eq!(
        captured, on_host,
        "the device-seeded step drew another mask"
    );
    let next = values(model.loss_and_grad(&x, &target)?)?;
    assert_ne!(next, on_host, "the next step drew the same mask");
    Ok(())
}

/// The test suite's GPT (layer norms as row passes, attention, dropout).
#[kiln::model]
type TinyGpt = kiln_models::gpt::Gpt<16, 2, 2, 32>;

/// W3's step, a GPT's loss and gradients then AdamW, follows the rules once warm with
/// its seeds and Adam's step values in device memory, as a replayed step runs it, and
/// trains exactly as the same steps planned.
fn a_gpt_step_with_adamw_follows_the_rules<R: KilnRuntime>(dev: &CubeDevice<R>) -> Result<()> {
    use kiln_models::gpt::Ids;
    use kiln_train::optim::{AdamW, AdamWConfig};
    type B<R> = CubeBackend<R>;
    let corpus = kiln_models::text::Corpus::shakespeare()?;
    let (ids, next) = kiln_models::text::windows(&corpus.train, 4, 32, 3)?;
    let x = Ids::<B<R>, 4, 32>::from_vec(ids, &[4, 32], dev)?;
    let y = Ids::<B<R>, 4, 32>::from_vec(next, &[4, 32], dev)?;
    let adamw = || {
        AdamW::<B<R>>::new(AdamWConfig {
            lr: 1e-3,
            ..AdamWConfig::default()
        })
    };
    let (mut checked, mut planned) = (
        TinyGpt::<B<R>>::init(dev, 1)?,
        TinyGpt::<B<R>>::init(dev, 1)?,
    );
    let (mut opt_checked, mut opt_planned) = (adamw()?, adamw()?);
    let step = |model: &mut TinyGpt<B<R>>, opt: &mut AdamW<B<R>>| -> Result<()> {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(model, &grads)
    };
    // The first step runs by value (it starts Adam's moments), as a replayed run's does.
    step(&mut checked, &mut opt_checked)?;
    step(&mut planned, &mut opt_planned)?;
    for _ in 0..3 {
        opt_checked.prepare_step()?;
        checked.step_seeds().advance_on_device(dev)?;
        dev.check_capturable(|| step(&mut checked, &mut opt_checked))?;
        step(&mut planned, &mut opt_planned)?;
    }
    checked.step_seeds().keep_on_host();
    same_params(&checked, &planned, "checked and planned steps")
}
