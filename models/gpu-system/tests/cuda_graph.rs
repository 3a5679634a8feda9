//! CUDA graph capture of a static training step (runs where a CUDA GPU is): the capture
//! runs the step once and replays with new inputs written between them train exactly
//! as eager steps do, with the learning rate set between replays; what a replay
//! could not repeat (a host copy, a synchronisation, state replaced instead of updated
//! in place) makes the capture fail with an error and leaves the device usable; bad
//! labels in a replay are reported at the next read, once, and the graph goes on.
//! (A graph replays on the thread that captured it: `CudaGraph` is `Send`, so that a
//! cache may keep one, and `replay` refuses any other thread.)

#![cfg(feature = "cuda")]

use kiln_cubecl::{write_into, Cuda, CudaDevice, CudaGraph};
use kiln_models::mlp::Mlp;
use kiln_tensor::{Backend, Const, HostData, Rank2, Result, Tensor};
use kiln_train::optim::{Optimizer, Sgd, SgdConfig};

const BATCH: usize = 64;
type Images = Tensor<Cuda, Rank2<BATCH, 784>>;
type Labels = Tensor<Cuda, (Const<BATCH>,), i32>;

fn device() -> CudaDevice {
    CudaDevice::first().unwrap_or_else(|e| panic!("no CUDA device for the graph tests: {e}"))
}

fn sgd(momentum: f64) -> Result<Sgd<Cuda>> {
    Sgd::new(SgdConfig {
        lr: 0.05,
        momentum,
        ..SgdConfig::default()
    })
}

/// Batch `i`: images from a seeded normal draw, labels that differ per batch.
fn batch(i: u64, dev: &CudaDevice) -> Result<(Vec<f32>, Vec<i32>)> {
    let x = Images::normal(0.0, 1.0, 100 + i, dev)?.to_vec()?;
    let y = (0..BATCH as i32).map(|k| (k * 7 + i as i32) % 10).collect();
    Ok((x, y))
}

/// One eager training step; returns the loss.
fn eager_step(
    model: &mut Mlp<Cuda>,
    opt: &mut Sgd<Cuda>,
    x: &Images,
    y: &Labels,
) -> Result<Tensor<Cuda, ()>> {
    let (loss, grads) = model.loss_and_grad(x, y)?;
    opt.step(model, &grads)?;
    Ok(loss)
}

/// Captures one training step of `model` on the input tensors `x`, `y`.
fn capture_step(
    dev: &CudaDevice,
    model: &mut Mlp<Cuda>,
    opt: &mut Sgd<Cuda>,
    x: &Images,
    y: &Labels,
) -> Result<(CudaGraph, Tensor<Cuda, ()>)> {
    dev.capture(|| eager_step(model, opt, x, y))
}

#[test]
fn replays_train_exactly_as_eager_steps() -> Result<()> {
    let dev = device();
    let (mut eager, mut graphed) = (Mlp::<Cuda>::init(&dev, 7)?, Mlp::<Cuda>::init(&dev, 7)?);
    let (mut opt_e, mut opt_g) = (sgd(0.9)?, sgd(0.9)?);
    let (x0, y0) = batch(0, &dev)?;
    let x = Images::from_vec(x0.clone(), &[BATCH, 784], &dev)?;
    let y = Labels::from_vec(y0.clone(), &[BATCH], &dev)?;
    // The warm-up step (kernels, algorithms, metadata, momentum buffers).
    eager_step(&mut eager, &mut opt_e, &x, &y)?;
    eager_step(&mut graphed, &mut opt_g, &x, &y)?;
    // Capturing runs the step once, as an eager call would.
    let (graph, loss) = capture_step(&dev, &mut graphed, &mut opt_g, &x, &y)?;
    assert!(graph.nodes() >= 20, "{} nodes", graph.nodes());
    let loss_e = eager_step(&mut eager, &mut opt_e, &x, &y)?;
    assert_eq!(loss.to_vec()?[0].to_bits(), loss_e.to_vec()?[0].to_bits());
    let probe = Images::normal(0.0, 1.0, 999, &dev)?;
    for i in 1..=4 {
        let (xi, yi) = batch(i, &dev)?;
        write_into(x.raw(), &HostData::F32(xi.clone()))?;
        write_into(y.raw(), &HostData::I32(yi.clone()))?;
        graph.replay()?;
        let xe = Images::from_vec(xi, &[BATCH, 784], &dev)?;
        let ye = Labels::from_vec(yi, &[BATCH], &dev)?;
        let loss_e = eager_step(&mut eager, &mut opt_e, &xe, &ye)?;
        let (lg, le) = (loss.to_vec()?[0], loss_e.to_vec()?[0]);
        assert_eq!(lg.to_bits(), le.to_bits(), "step {i}: loss {lg} vs {le}");
        let (pg, pe) = (
            graphed.forward(&probe)?.to_vec()?,
            eager.forward(&probe)?.to_vec()?,
        );
        assert!(
            pg.iter().zip(&pe).all(|(a, b)| a.to_bits() == b.to_bits()),
            "step {i}: the replayed model differs from the eager one"
        );
    }
    // The forward products added their biases inside cuBLASLt (its epilogue).
    assert!(dev.bias_epilogues() > 0);
    // Training moved the model: the check above compared something that changes.
    let first = Mlp::<Cuda>::init(&dev, 7)?.forward(&probe)?.to_vec()?;
    assert_ne!(first, eager.forward(&probe)?.to_vec()?);
    Ok(())
}

#[test]
fn a_graph_sent_to_another_thread_refuses_to_replay_there() -> Result<()> {
    let dev = device();
    let mut model = Mlp::<Cuda>::init(&dev, 5)?;
    let mut opt = sgd(0.9)?;
    let (x0, y0) = batch(0, &dev)?;
    let x = Images::from_vec(x0, &[BATCH, 784], &dev)?;
    let y = Labels::from_vec(y0, &[BATCH], &dev)?;
    eager_step(&mut model, &mut opt, &x, &y)?;
    let (graph, _) = capture_step(&dev, &mut model, &mut opt, &x, &y)?;
    let graph = std::thread::spawn(move || {
        let refused = graph.replay().expect_err("replayed on another thread");
        assert!(
            refused.to_string().contains("thread that captured it"),
            "{refused}"
        );
        graph
    })
    .join()
    .expect("the other thread");
    graph.replay()?;
    Cuda::synchronize(&dev)
}

#[test]
fn a_learning_rate_set_between_replays_reaches_the_captured_step() -> Result<()> {
    // SGD keeps its rate in device memory and `set_lr` rewrites it in place, so the
    // captured update reads each replay's rate (a cosine schedule on a graph).
    let dev = device();
    let (mut eager, mut graphed) = (Mlp::<Cuda>::init(&dev, 11)?, Mlp::<Cuda>::init(&dev, 11)?);
    let (mut opt_e, mut opt_g) = (sgd(0.9)?, sgd(0.9)?);
    let (x0, y0) = batch(0, &dev)?;
    let x = Images::from_vec(x0, &[BATCH, 784], &dev)?;
    let y = Labels::from_vec(y0, &[BATCH], &dev)?;
    eager_step(&mut eager, &mut opt_e, &x, &y)?;
    eager_step(&mut graphed, &mut opt_g, &x, &y)?;
    let (graph, _) = capture_step(&dev, &mut graphed, &mut opt_g, &x, &y)?;
    eager_step(&mut eager, &mut opt_e, &x, &y)?;
    let probe = Images::normal(0.0, 1.0, 998, &dev)?;
    for (i, lr) in [0.2, 0.01, 0.0, 0.08].into_iter().enumerate() {
        opt_e.set_lr(lr)?;
        opt_g.set_lr(lr)?;
        graph.replay()?;
        eager_step(&mut eager, &mut opt_e, &x, &y)?;
        let (pg, pe) = (
            graphed.forward(&probe)?.to_vec()?,
            eager.forward(&probe)?.to_vec()?,
        );
        assert!(
            pg.iter().zip(&pe).all(|(a, b)| a.to_bits() == b.to_bits()),
            "replay {i} at lr {lr}: the replayed model differs from the eager one"
        );
    }
    Ok(())
}

#[test]
fn what_a_replay_cannot_repeat_fails_the_capture() -> Result<()> {
    let dev = device();
    let mut model = Mlp::<Cuda>::init(&dev, 8)?;
    let (x0, y0) = batch(0, &dev)?;
    let x = Images::from_vec(x0.clone(), &[BATCH, 784], &dev)?;
    let y = Labels::from_vec(y0, &[BATCH], &dev)?;

    // A host copy inside the step.
    let err = dev
        .capture(|| Images::from_vec(x0.clone(), &[BATCH, 784], &dev))
        .err()
        .expect("an upload cannot be captured");
    assert!(format!("{err}").contains("cannot be captured"), "{err}");

    // A read inside the step.
    let err = dev
        .capture(|| model.forward(&x)?.to_vec())
        .err()
        .expect("a read cannot be captured");
    assert!(format!("{err}").contains("cannot be captured"), "{err}");

    // A step that swallows the refused upload still fails to capture.
    let err = dev
        .capture(|| {
            let _ = Images::from_vec(x0.clone(), &[BATCH, 784], &dev);
            model.forward(&x)
        })
        .err()
        .expect("a swallowed refusal still fails the capture");
    assert!(format!("{err}").contains("cannot be captured"), "{err}");

    // Plain SGD replaces each parameter with a new buffer: replays would read stale ones.
    let mut plain = sgd(0.0)?;
    eager_step(&mut model, &mut plain, &x, &y)?;
    let err = capture_step(&dev, &mut model, &mut plain, &x, &y)
        .err()
        .expect("replaced parameters cannot be captured");
    assert!(format!("{err}").contains("in place"), "{err}");

    // The device still runs eager work after the failed captures.
    let mut opt = sgd(0.9)?;
    let loss = eager_step(&mut model, &mut opt, &x, &y)?;
    assert!(loss.to_vec()?[0].is_finite());
    Cuda::synchronize(&dev)
}

#[test]
fn bad_labels_in_a_replay_are_reported_at_the_next_read() -> Result<()> {
    let dev = device();
    let mut model = Mlp::<Cuda>::init(&dev, 9)?;
    let mut opt = sgd(0.9)?;
    let (x0, y0) = batch(0, &dev)?;
    let x = Images::from_vec(x0, &[BATCH, 784], &dev)?;
    let y = Labels::from_vec(y0.clone(), &[BATCH], &dev)?;
    eager_step(&mut model, &mut opt, &x, &y)?;
    let (graph, loss) = capture_step(&dev, &mut model, &mut opt, &x, &y)?;
    graph.replay()?;
    assert!(loss.to_vec()?[0].is_finite());

    let mut bad = y0.clone();
    bad[5] = 10;
    write_into(y.raw(), &HostData::I32(bad))?;
    graph.replay()?;
    graph.replay()?;
    let err = Cuda::synchronize(&dev).expect_err("an out-of-range label is an error");
    assert!(format!("{err}").contains("out of range"), "{err}");
    // Reported once; good labels replay cleanly again.
    Cuda::synchronize(&dev)?;
    write_into(y.raw(), &HostData::I32(y0))?;
    graph.replay()?;
    Cuda::synchronize(&dev)?;

    // Inputs of the wrong size or dtype are refused.
    assert!(write_into(y.raw(), &HostData::I32(vec![0; BATCH - 1])).is_err());
    assert!(write_into(y.raw(), &HostData::F32(vec![0.0; BATCH])).is_err());
    Ok(())
}

/// Trains `model` for eight steps through `StepReplay` (replayed from the second step
/// when `replay`), the learning rate changing every step; its parameters and buffers.
fn trained<M, O>(dev: &CudaDevice, mut model: M, mut opt: O, replay: bool) -> Result<Vec<Vec<f32>>>
where
    M: kiln_models::classify::Classifier<Cuda>,
    O: Optimizer<Cuda>,
{
    use kiln_train::replay::{StepInput, StepReplay};
    let mut steps = StepReplay::new(dev, replay, &opt, M::draws_at_random());
    let mut image_dims = vec![BATCH];
    image_dims.extend_from_slice(M::EXAMPLE);
    for i in 0..8u64 {
        opt.set_lr(0.01 / (1.0 + i as f64))?;
        let (x, y) = batch(i, dev)?;
        let inputs = vec![
            StepInput {
                data: HostData::F32(x),
                dims: &image_dims,
            },
            StepInput {
                data: HostData::I32(y),
                dims: &[BATCH],
            },
        ];
        let outcome = steps.step(&mut model, &mut opt, inputs, &mut |m, xy| {
            m.loss_and_grads(&xy[0], &xy[1])
        })?;
        assert!(outcome.loss.is_finite());
        if replay && i == 1 {
            assert!(outcome.notice.is_some_and(|n| n.contains("captured")));
        }
    }
    assert_eq!(steps.replaying(), replay);
    steps.finish(&model);
    let mut all = Vec::new();
    let mut push = |s: kiln_tensor::nn::Slot<'_, Cuda>| all.push(s.value.to_vec::<f32>());
    model.visit_params("", &mut push);
    model.visit_buffers("", &mut push);
    all.into_iter().collect()
}

/// `StepReplay`, what `kiln-train` runs: replayed steps train every model and optimizer
/// exactly as planned ones — the MLP and the CNN (dropout drawing from the seed in
/// device memory, batch-norm statistics updated in place) with SGD and AdamW (its bias
/// corrections and decayed rate written between replays, its step count advanced on
/// the host after each).
#[test]
fn replayed_steps_train_every_model_and_optimizer_exactly_as_planned_ones() -> Result<()> {
    use kiln_models::lenet::LeNet;
    use kiln_train::optim::{AdamW, AdamWConfig};
    let dev = device();
    let adamw = || AdamW::<Cuda>::new(AdamWConfig::default());
    /// A model and optimizer trained replayed (`true`) or planned: its parameters.
    type Training<'a> = Box<dyn Fn(bool) -> Result<Vec<Vec<f32>>> + 'a>;
    let cases: [(&str, Training); 4] = [
        (
            "MLP, SGD",
            Box::new(|r| trained(&dev, Mlp::<Cuda>::init(&dev, 3)?, sgd(0.9)?, r)),
        ),
        (
            "MLP, AdamW",
            Box::new(|r| trained(&dev, Mlp::<Cuda>::init(&dev, 3)?, adamw()?, r)),
        ),
        (
            "CNN, SGD",
            Box::new(|r| trained(&dev, LeNet::<Cuda>::init(&dev, 3)?, sgd(0.9)?, r)),
        ),
        (
            "CNN, AdamW",
            Box::new(|r| trained(&dev, LeNet::<Cuda>::init(&dev, 3)?, adamw()?, r)),
        ),
    ];
    for (name, run) in &cases {
        let (planned, replayed) = (run(false)?, run(true)?);
        for (i, (p, r)) in planned.iter().zip(&replayed).enumerate() {
            assert!(
                p.iter().zip(r).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: tensor {i} differs between replayed and planned steps"
            );
        }
    }
    Ok(())
}
