//! A captured training step reads its dropout seed and Adam's per-step values from
//! device memory. Run without a capture (the CPU), those values in device memory train
//! exactly as the values on the host do: the same masks, the same updates, bit for
//! bit, fused and op by op. (`kiln-cubecl`'s capture-rule tests check the capture.)

use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::nn::{Module, Slot};
use kiln::tensor::{DType, RandDist, RawTensor, Result};
use kiln::train::learner::Supervised;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
use kiln_models::lenet::LeNet;

fn params(model: &LeNet<Cpu>) -> Vec<(String, Vec<f32>)> {
    let mut all = Vec::new();
    let mut push = |s: Slot<'_, Cpu>| {
        all.push((s.name.to_string(), s.value.to_vec::<f32>().unwrap()));
    };
    model.visit_params("", &mut push);
    model.visit_buffers("", &mut push);
    all
}

/// Four AdamW steps of LeNet (dropout active), the step values on the device or not.
fn train(on_device: bool, fused: bool) -> Result<LeNet<Cpu>> {
    let dev = CpuDevice;
    let x = RawTensor::<Cpu>::rand(
        &[16, 1, 28, 28],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        3,
        DType::F32,
        &dev,
    )?;
    let y = RawTensor::<Cpu>::from_vec((0..16).map(|i| i % 10).collect(), &[16], &dev)?;
    let mut model = LeNet::<Cpu>::init(&dev, 4)?;
    model.set_fused(fused);
    let mut opt = AdamW::<Cpu>::new(AdamWConfig {
        lr: 1e-3,
        ..AdamWConfig::default()
    })?;
    for step in 0..4 {
        opt.set_lr(1e-3 * (1.0 + step as f64))?;
        if on_device {
            opt.prepare_step()?;
            model.step_seeds().advance_on_device(&dev)?;
        }
        let (_, grads) = Supervised::loss_and_grads(&model, &x, &y)?;
        opt.step(&mut model, &grads)?;
    }
    model.step_seeds().keep_on_host();
    Ok(model)
}

#[test]
fn step_values_in_device_memory_train_exactly_as_on_the_host() -> Result<()> {
    for fused in [true, false] {
        let (host, device) = (train(false, fused)?, train(true, fused)?);
        assert_eq!(host.step_seeds().steps(), device.step_seeds().steps());
        for ((name, a), (_, b)) in params(&host).into_iter().zip(params(&device)) {
            assert_eq!(a, b, "`{name}` differs (fused: {fused})");
        }
    }
    Ok(())
}

/// The device seed is what the step draws with: a step whose seed was not advanced
/// draws the same masks again, so it must be advanced before each step.
#[test]
fn a_seed_left_unadvanced_draws_the_same_masks() -> Result<()> {
    let dev = CpuDevice;
    let model = LeNet::<Cpu>::init(&dev, 4)?;
    let x = RawTensor::<Cpu>::full(&[16, 1, 28, 28], 0.5, DType::F32, &dev)?;
    let y = RawTensor::<Cpu>::from_vec(vec![1i32; 16], &[16], &dev)?;
    let loss = |m: &LeNet<Cpu>| -> Result<f32> {
        Ok(Supervised::loss_and_grads(m, &x, &y)?.0.to_vec::<f32>()?[0])
    };
    model.step_seeds().advance_on_device(&dev)?;
    let (a, b) = (loss(&model)?, loss(&model)?);
    assert_eq!(a, b, "the same device seed draws the same masks");
    model.step_seeds().advance_on_device(&dev)?;
    assert_ne!(loss(&model)?, a, "an advanced seed draws new masks");
    model.step_seeds().keep_on_host();
    assert_ne!(
        loss(&model)?,
        loss(&model)?,
        "host seeds advance by themselves"
    );
    Ok(())
}
