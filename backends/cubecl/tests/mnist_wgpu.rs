//! A short MNIST run of the `#[model]` MLP (784-1024-1024-10) on wgpu through the
//! whole training stack (data loader, build-time gradients, SGD with momentum, the
//! schedule), with the recipe of kiln-models' CPU short run: one pass over 20,000
//! examples must reach 95% on the 10,000 test images, and the loss must fall
//! fourfold. About eight minutes on lavapipe on a 2-core CI machine.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_models::classify::{accuracy, fit};
use kiln_models::data::ImageDataset;
use kiln_models::mlp::Mlp;
use kiln_tensor::Result;
use kiln_train::optim::{Sgd, SgdConfig};
use kiln_train::schedule::CosineWithWarmup;

#[test]
fn mlp_trains_on_wgpu() -> Result<()> {
    let dev =
        WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device for the MNIST run: {e}"));
    let mut data = ImageDataset::mnist()?;
    data.train = data.train.take(20_000);
    let mut model = Mlp::<Wgpu>::init(&dev, 1)?;
    let mut opt = Sgd::<Wgpu>::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let steps = (data.train.len() / 64) as u64;
    let schedule = CosineWithWarmup::new(0.05, 0.0005, 50, steps)?;
    let mut losses = Vec::new();
    let start = std::time::Instant::now();
    fit::<Wgpu, Mlp<Wgpu>, 64>(
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
    let acc = accuracy::<Wgpu, Mlp<Wgpu>, 500>(&model, &data.test, &dev)?;
    eprintln!(
        "MNIST on wgpu: {} steps in {:.1}s, test accuracy {:.2}%",
        losses.len(),
        start.elapsed().as_secs_f64(),
        acc * 100.0
    );
    let early: f32 = losses[..20].iter().sum::<f32>() / 20.0;
    let late: f32 = losses[losses.len() - 20..].iter().sum::<f32>() / 20.0;
    assert!(late < early / 4.0, "loss fell from {early} to only {late}");
    assert!(
        acc >= 0.95,
        "test accuracy {acc} after {} steps",
        losses.len()
    );
    Ok(())
}
