//! The zoo's image classifiers ([`Classifier`] for the MLP and the CNN, and their int8
//! instances) and the short
//! MNIST recipe every backend's test suite runs.

use crate::lenet::{LeNet, LeNetInt8};
use crate::mlp::{Mlp, MlpInt8};
use kiln::prelude::*;
use kiln_harness::classifier;
use kiln_harness::classify::accuracy;

classifier!(Mlp, [784]);
classifier!(LeNet, [1, 28, 28]);
classifier!(MlpInt8, [784]);
classifier!(LeNetInt8, [1, 28, 28]);

/// What [`short_mnist_run`] and [`mnist_mlp_run`] leave: the trained MLP, the loss of every step and the
/// test accuracy.
pub struct ShortRun<B: Backend> {
    /// The trained model.
    pub model: Mlp<B>,
    /// The training loss of each step, in order.
    pub losses: Vec<f32>,
    /// Seconds the training took (the evaluation not counted).
    pub seconds: f64,
    /// The fraction of the 10,000 test images classified right.
    pub accuracy: f64,
}

impl<B: Backend> ShortRun<B> {
    /// Whether the run learned: at least 95% test accuracy, and the mean loss of the
    /// last 20 steps under a quarter of the first 20's. The reason, if not.
    pub fn learned(&self) -> std::result::Result<(), String> {
        if self.losses.len() < 40 {
            return Err(format!("only {} steps ran", self.losses.len()));
        }
        let early: f32 = self.losses[..20].iter().sum::<f32>() / 20.0;
        let late: f32 = self.losses[self.losses.len() - 20..].iter().sum::<f32>() / 20.0;
        if late >= early / 4.0 {
            return Err(format!("the loss fell from {early} to only {late}"));
        }
        if self.accuracy < 0.95 {
            return Err(format!(
                "test accuracy {} after {} steps",
                self.accuracy,
                self.losses.len()
            ));
        }
        Ok(())
    }
}

/// The short MNIST recipe every backend's test suite runs: the MLP (784-1024-1024-10,
/// seed 1), one pass over the first 20,000 training images in batches of 64, SGD
/// (momentum 0.9) under a cosine schedule from 0.05 with 50 warm-up steps, then the
/// test accuracy.
pub fn short_mnist_run<B: Backend>(device: &B::Device) -> Result<ShortRun<B>> {
    let mut data = kiln_harness::data::ImageDataset::mnist()?;
    data.train = data.train.take(20_000);
    mnist_mlp_run(device, data, 1, 50)
}

/// The MLP (784-1024-1024-10, seed 1) trained on `data` by the Learner for `epochs`
/// in shuffled batches of 64 (seed 1), SGD (momentum 0.9) under a cosine schedule from
/// 0.05 to 0.0005 after `warmup` steps, steps replayed where the backend captures
/// them; then its test accuracy.
pub fn mnist_mlp_run<B: Backend>(
    device: &B::Device,
    data: kiln_harness::data::ImageDataset,
    epochs: u64,
    warmup: u64,
) -> Result<ShortRun<B>> {
    use kiln::data::{DataLoader, LastBatch, LoaderConfig};
    use kiln::train::learner::Learner;
    use kiln::train::optim::{Sgd, SgdConfig};
    use kiln::train::schedule::CosineWithWarmup;
    use kiln_harness::classify::Examples;
    use std::sync::Arc;
    let model = Mlp::<B>::init(device, 1)?;
    let opt = Sgd::<B>::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let train = DataLoader::new(
        Examples::of::<B, Mlp<B>>(Arc::new(data.train))?,
        LoaderConfig {
            batch_size: 64,
            seed: 1,
            last_batch: LastBatch::Drop,
            workers: 1,
            ..LoaderConfig::default()
        },
    )?;
    let steps = train.batches_per_epoch() as u64 * epochs;
    let schedule = CosineWithWarmup::new(0.05, 0.0005, warmup, steps)?;
    let mut losses = Vec::new();
    let started = std::time::Instant::now();
    let model = {
        let mut learner = Learner::new(model, opt, device.clone())
            .epochs(epochs)
            .schedule(schedule)
            .replay(true)
            .on_step(|_, _, r| {
                losses.push(r.loss);
                Ok(())
            })
            .on_epoch(|_| Ok(()));
        learner.fit(&train, None::<&DataLoader<Examples>>)?;
        learner.model
    };
    let seconds = started.elapsed().as_secs_f64();
    let accuracy = accuracy(&model, Arc::new(data.test), device)?;
    Ok(ShortRun {
        model,
        losses,
        seconds,
        accuracy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln::cpu::{Cpu, CpuDevice};
    use kiln::train::learner::Supervised;
    use kiln::train::optim::Optimizer;
    use kiln_harness::classify::{images, Classifier};

    /// The classifiers run at the batch their inputs have (the generated `Supervised`
    /// reads it from the dims), and images of another shape are one error naming both.
    #[test]
    fn any_batch_size_runs_and_a_misfit_is_named() {
        let model = Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
        for n in [1, 7, 16, 500] {
            let x = images::<Cpu, Mlp<Cpu>>(vec![0.5; n * 784], n, &CpuDevice).unwrap();
            assert_eq!(model.logits(&x).unwrap().dims().as_slice(), &[n, 10]);
        }
        let x =
            kiln::tensor::RawTensor::<Cpu>::from_vec(vec![0.5f32; 2 * 780], &[2, 780], &CpuDevice)
                .unwrap();
        let e = model.logits(&x).unwrap_err().to_string();
        assert!(
            e.contains("Mlp::forward: `x` is f32 [2, 780] but the method takes f32 [B, 784]"),
            "{e}"
        );
    }

    /// Graph replay is declined only where a replay would train wrongly: SGD without
    /// momentum (it replaces parameters). Dropout and Adam keep their per-step values
    /// in device memory.
    #[test]
    fn replay_is_declined_where_it_would_train_wrongly() {
        use kiln::train::optim::{Adam, AdamConfig, AdamW, AdamWConfig, Sgd, SgdConfig};
        assert!(LeNet::<Cpu>::draws_at_random());
        assert!(!Mlp::<Cpu>::draws_at_random());
        let sgd = |momentum| {
            Sgd::<Cpu>::new(SgdConfig {
                momentum,
                ..SgdConfig::default()
            })
            .unwrap()
        };
        assert_eq!(sgd(0.9).replay_refusal(), None);
        let why = sgd(0.0).replay_refusal().unwrap();
        assert!(why.contains("replaces each parameter"), "{why}");
        let adamw = AdamW::<Cpu>::new(AdamWConfig::default()).unwrap();
        assert_eq!(adamw.replay_refusal(), None);
        let adam = Adam::<Cpu>::new(AdamConfig::default()).unwrap();
        assert_eq!(adam.replay_refusal(), None);
    }
}
