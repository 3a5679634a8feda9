//! A short MNIST run of the `#[model]` MLP through the whole training stack (data
//! loader, build-time gradients, SGD, schedule, checkpoint round trip): it must reach
//! 95% test accuracy after one pass over 20,000 examples.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::checkpoint;
use kiln::train::optim::{Sgd, SgdConfig};
use kiln::train::schedule::CosineWithWarmup;
use kiln_models::classify::{accuracy, fit};
use kiln_models::data::ImageDataset;
use kiln_models::mlp::Mlp;

#[test]
fn mlp_reaches_95_percent_after_a_short_run() -> Result<()> {
    let dev = CpuDevice;
    let mut data = ImageDataset::mnist()?;
    data.train = data.train.take(20_000);
    let mut model = Mlp::<Cpu>::init(&dev, 1)?;
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let steps = (data.train.len() / 64) as u64;
    let schedule = CosineWithWarmup::new(0.05, 0.0005, 50, steps)?;
    let mut losses = Vec::new();
    fit::<Cpu, Mlp<Cpu>, 64>(
        &mut model,
        &mut opt,
        &schedule,
        &data.train,
        1,
        1,
        &dev,
        |_, r| {
            losses.push(r.loss);
            Ok(())
        },
    )?;
    let acc = accuracy::<Cpu, Mlp<Cpu>, 500>(&model, &data.test, &dev)?;
    assert!(acc >= 0.95, "test accuracy {acc}");
    let early: f32 = losses[..20].iter().sum::<f32>() / 20.0;
    let late: f32 = losses[losses.len() - 20..].iter().sum::<f32>() / 20.0;
    assert!(late < early / 4.0, "loss fell from {early} to only {late}");

    // The checkpoint brings back exactly this model.
    let dir = std::env::temp_dir().join(format!("kiln-mnist-short-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("mlp.safetensors");
    checkpoint::save(&model, &path)?;
    let mut again = Mlp::<Cpu>::init(&dev, 99)?;
    checkpoint::load(&mut again, &path)?;
    assert_eq!(
        accuracy::<Cpu, Mlp<Cpu>, 500>(&again, &data.test, &dev)?,
        acc
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
