//! The smallest complete training program: the README's MLP (`kiln_models::mlp`)
//! trained on MNIST for one epoch with SGD by the Learner, which prints the epoch's
//! loss and test accuracy. One model, one
//! batch size, no command line: what `scripts/edit_compile_time.sh` rebuilds as the
//! "one-model binary".
//!
//! `cargo run --release -p kiln-models --example mnist_mlp`

use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{DataLoader, LastBatch, LoaderConfig};
use kiln::prelude::*;
use kiln::train::learner::Learner;
use kiln::train::metrics::TopK;
use kiln::train::optim::{Sgd, SgdConfig};
use kiln::train::schedule::CosineWithWarmup;
use kiln_models::classify::Examples;
use kiln_models::data::ImageDataset;
use kiln_models::mlp::Mlp;
use std::sync::Arc;

fn main() -> Result<()> {
    let data = ImageDataset::mnist()?;
    let batches = LoaderConfig {
        batch_size: 64,
        seed: 1,
        last_batch: LastBatch::Drop,
        workers: 1,
        ..LoaderConfig::default()
    };
    let train = DataLoader::new(
        Examples::of::<Cpu, Mlp<Cpu>>(Arc::new(data.train))?,
        batches,
    )?;
    let test = DataLoader::new(
        Examples::of::<Cpu, Mlp<Cpu>>(Arc::new(data.test))?,
        LoaderConfig {
            batch_size: 500,
            ..batches.for_evaluation()
        },
    )?;
    let opt = Sgd::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let steps = train.batches_per_epoch() as u64;
    let mut learner = Learner::new(Mlp::<Cpu>::init(&CpuDevice, 1)?, opt, CpuDevice)
        .schedule(CosineWithWarmup::new(0.05, 0.0005, 200, steps)?)
        .metric(TopK::accuracy());
    learner.fit(&train, Some(&test))?;
    Ok(())
}
