//! The smallest complete training program: the README's MLP (`kiln_models::mlp`)
//! trained on MNIST for one epoch with SGD, then its test accuracy. One model, one
//! batch size, no command line: what `scripts/edit_compile_time.sh` rebuilds as the
//! "one-model binary".
//!
//! `cargo run --release -p kiln-models --example mnist_mlp`

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::optim::{Sgd, SgdConfig};
use kiln::train::schedule::CosineWithWarmup;
use kiln_models::classify::{accuracy, fit};
use kiln_models::data::ImageDataset;
use kiln_models::mlp::Mlp;

fn main() -> Result<()> {
    let dev = CpuDevice;
    let data = ImageDataset::mnist()?;
    let mut model = Mlp::<Cpu>::init(&dev, 1)?;
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let steps = (data.train.len() / 64) as u64;
    let schedule = CosineWithWarmup::new(0.05, 0.0005, 200, steps)?;
    let mut last = f32::NAN;
    fit(
        &mut model,
        &mut opt,
        &schedule,
        &data.train,
        64,
        1,
        1,
        0,
        &dev,
        true,
        &mut |_, _, r| {
            last = r.loss;
            Ok(())
        },
    )?;
    let acc = accuracy(&model, &data.test, &dev)?;
    println!(
        "one epoch: last loss {last:.4}, test accuracy {:.2}%",
        acc * 100.0
    );
    Ok(())
}
